// cluster_test.cc: the emulated cluster itself (tools/emu): what it creates,
// that it removes all of it, restarts, more than two nodes, and the sweep of
// namespaces left behind by dead processes.
#include <sys/stat.h>

#include <algorithm>

#include "emu/netns.h"
#include "integration/integration_util.h"

namespace dyad::it {
namespace {

emu::ClusterOptions DefaultOptions() {
  emu::ClusterOptions o;
  o.bin_dir = DYAD_BUILD_BIN_DIR;
  return o;
}

bool HasNetns(const std::string& name) {
  auto all = emu::ListNetns();
  return std::find(all.begin(), all.end(), name) != all.end();
}

TEST(EmuClusterTest, TeardownRemovesProcessesNamespacesAndFiles) {
  auto c = EmuCluster::Start(2, DefaultOptions());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const std::string base = (*c)->base_dir();
  const std::string ns0 = (*c)->node(0).netns;
  const pid_t pid0 = (*c)->ServicePid(0);
  const pid_t pid1 = (*c)->ServicePid(1);
  ASSERT_TRUE(Exists(base + "/node0/dmd"));
  ASSERT_TRUE(Exists((*c)->node(1).socket));
  EXPECT_TRUE((*c)->ServiceStatus(0).ok());
  EXPECT_TRUE((*c)->ServiceStatus(1).ok());
  if ((*c)->uses_netns()) {
    EXPECT_TRUE(HasNetns(ns0));
    EXPECT_NE((*c)->node(0).ip, (*c)->node(1).ip);
    EXPECT_EQ((*c)->node(0).ip.rfind("10.213.", 0), 0u);
  } else {
    EXPECT_NE((*c)->node(0).port, (*c)->node(1).port);
  }
  c->reset();
  EXPECT_FALSE(Exists(base));
  if (!ns0.empty()) {
    EXPECT_FALSE(HasNetns(ns0));
  }
  EXPECT_TRUE(::kill(pid0, 0) != 0 && errno == ESRCH);
  EXPECT_TRUE(::kill(pid1, 0) != 0 && errno == ESRCH);
}

TEST(EmuClusterTest, KeepLeavesTheDirectory) {
  emu::ClusterOptions o = DefaultOptions();
  o.keep = true;
  auto c = EmuCluster::Start(2, o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const std::string base = (*c)->base_dir();
  c->reset();
  EXPECT_TRUE(Exists(base + "/node1/log/service.log"));
  // The nodes' directory sits in the cluster's own <tmp>/dyademu-XXXXXX,
  // kept too: both go.
  const std::string root = base.substr(0, base.rfind('/'));
  ASSERT_NE(root.find("/dyademu-"), std::string::npos) << root;
  EXPECT_TRUE(emu::RemoveTree(root).ok());
  EXPECT_FALSE(Exists(root));
}

TEST(EmuClusterTest, StaleNamespacesOfDeadProcessesAreSwept) {
  if (!emu::NetnsAvailable()) GTEST_SKIP() << emu::NetnsUnavailableReason();
  // A pid that is certainly dead: a child we started and reaped.
  emu::SpawnOptions so;
  so.argv = {"true"};
  auto p = emu::Process::Spawn(so);
  ASSERT_TRUE(p.ok());
  const pid_t dead = p->pid();
  ASSERT_TRUE(p->Wait(Deadline::AfterMs(5000)).ok());
  const std::string stale = std::string(emu::kNetnsPrefix) + std::to_string(dead) + "-0-0";
  ASSERT_TRUE(emu::CreateNetns(stale).ok());
  auto c = EmuCluster::Start(2, DefaultOptions());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_FALSE(HasNetns(stale));
  (void)emu::DeleteNetns(stale);
}

TEST(EmuClusterTest, ServiceRestartKeepsItsAddress) {
  auto c = EmuCluster::Start(2, DefaultOptions());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const std::string before = (*c)->node(0).address();
  const pid_t old_pid = (*c)->ServicePid(0);
  ASSERT_TRUE((*c)->RestartService(0).ok());
  EXPECT_EQ((*c)->node(0).address(), before);
  EXPECT_NE((*c)->ServicePid(0), old_pid);
  EXPECT_TRUE((*c)->ServiceRunning(0));
  ASSERT_TRUE((*c)->KillService(1).ok());
  EXPECT_FALSE((*c)->ServiceRunning(1));
  ASSERT_TRUE((*c)->StartService(1).ok());
  EXPECT_TRUE((*c)->ServiceStatus(1).ok());
}

TEST(EmuClusterTest, ServiceThatCannotStartReportsItsLog) {
  emu::ClusterOptions o = DefaultOptions();
  o.extra_service_args = {"--no-such-option"};
  o.ready_timeout_ms = 5000;
  auto c = EmuCluster::Start(2, o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("no-such-option"), std::string::npos)
      << c.status().ToString();
}

// Three nodes exercise the bridge layout.
TEST(EmuClusterTest, ThreeNodesOverABridge) {
  auto c = EmuCluster::Start(3, DefaultOptions());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EmuCluster& cl = **c;
  const std::string dyad = emu::FindSiblingProgram("dyad-demo", DYAD_BUILD_BIN_DIR);
  ASSERT_FALSE(dyad.empty());
  const std::string manifest = cl.base_dir() + "/m";
  ASSERT_TRUE(emu::WriteManifest(manifest, {{"tri/file.dat", 777777}}).ok());
  auto run = [&](int node, const std::string& role, const std::string& result) {
    auto r = cl.RunOnNode(node, {dyad, "--role", role, "--manifest", manifest, "--result", result},
                          60000);
    EXPECT_TRUE(r.ok());
    if (r.ok()) {
      EXPECT_TRUE(r->status.success()) << r->output;
    }
  };
  run(0, "produce", cl.base_dir() + "/p0");
  run(1, "consume", cl.base_dir() + "/c1");
  run(2, "consume", cl.base_dir() + "/c2");
  for (int node : {1, 2}) {
    auto res = emu::ReadResults(cl.base_dir() + "/c" + std::to_string(node));
    ASSERT_TRUE(res.ok());
    ASSERT_EQ(res->size(), 1u);
    EXPECT_EQ((*res)[0].verified, 1) << (*res)[0].message;
    auto t = cl.Counter(node, "transfers.in");
    ASSERT_TRUE(t.ok());
    EXPECT_EQ(*t, 1u);
  }
}

}  // namespace
}  // namespace dyad::it
