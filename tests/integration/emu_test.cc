// emu_test.cc: the building blocks of the emulated cluster: child processes
// (bounded waits, process-group kills, spawn errors), the deterministic file
// pattern, the worker file formats, and a cluster of many nodes (started in
// parallel, one exchange between two far nodes, nothing left at teardown).
#include <errno.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/fs.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "common/time.h"
#include "dyad/client/dyad_client.hpp"
#include "emu/cluster.h"
#include "emu/netns.h"
#include "emu/pattern.h"
#include "emu/process.h"
#include "emu/worker.h"
#include "util.h"

namespace dyad::emu {
namespace {

TEST(EmuProcessTest, ExitCodesAndCapturedOutput) {
  SpawnOptions o;
  o.argv = {"sh", "-c", "echo out; echo err >&2; exit 3"};
  auto r = RunCapture(o, 10000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->timed_out);
  EXPECT_TRUE(r->status.exited);
  EXPECT_EQ(r->status.code, 3);
  EXPECT_NE(r->output.find("out"), std::string::npos);
  EXPECT_NE(r->output.find("err"), std::string::npos);
}

TEST(EmuProcessTest, EnvironmentIsAddedAndDyadVariablesDropped) {
  ::setenv("DYAD_EMU_TEST_LEAK", "leaked", 1);
  SpawnOptions o;
  o.argv = {"sh", "-c", "echo \"[$DYAD_EMU_TEST_LEAK][$EMU_ADDED]\""};
  o.env = {{"EMU_ADDED", "yes"}};
  auto r = RunCapture(o, 10000);
  ::unsetenv("DYAD_EMU_TEST_LEAK");
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->output.find("[][yes]"), std::string::npos) << r->output;
}

TEST(EmuProcessTest, MissingProgramIsReportedAtSpawn) {
  SpawnOptions o;
  o.argv = {"/nonexistent/dyad-no-such-program"};
  auto p = Process::Spawn(o);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("no-such-program"), std::string::npos);
}

TEST(EmuProcessTest, WaitIsBoundedAndStopKillsTheWholeGroup) {
  const std::string marker = "/tmp/dyad-emu-test-" + std::to_string(::getpid());
  SpawnOptions o;
  // A grandchild that would outlive a kill of the leader alone; both
  // ignore SIGTERM.
  o.argv = {"sh", "-c", "trap '' TERM; sleep 300 & echo $! > " + marker + "; wait"};
  auto p = Process::Spawn(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  const uint64_t t0 = MonoNs();
  auto w = p->Wait(Deadline::AfterMs(200));
  EXPECT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), DYAD_RC_TIMEOUT);
  EXPECT_LT(MonoNs() - t0, 5'000'000'000ull);
  // Wait until the grandchild's pid is written.
  pid_t grandchild = 0;
  const Deadline d = Deadline::AfterMs(5000);
  while (grandchild == 0 && !d.expired()) {
    FILE* f = std::fopen(marker.c_str(), "r");
    if (f) {
      int v = 0;
      if (std::fscanf(f, "%d", &v) == 1) grandchild = v;
      std::fclose(f);
    }
    if (grandchild == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_GT(grandchild, 0);
  // The leader ignores SIGTERM, so Stop must escalate to SIGKILL.
  ExitStatus st = p->Stop(300);
  EXPECT_FALSE(st.exited);
  EXPECT_EQ(st.signal, SIGKILL);
  // The grandchild was in the same group: it is gone (or a zombie being
  // reaped by init) shortly after.
  const Deadline gone_by = Deadline::AfterMs(5000);
  bool gone = false;
  while (!gone && !gone_by.expired()) {
    char path[64];
    std::snprintf(path, sizeof path, "/proc/%d/stat", grandchild);
    FILE* f = std::fopen(path, "r");
    if (!f) {
      gone = true;
      break;
    }
    char state = 0;
    int pid = 0;
    char comm[256];
    if (std::fscanf(f, "%d %255s %c", &pid, comm, &state) == 3 && state == 'Z') gone = true;
    std::fclose(f);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_TRUE(gone) << "grandchild " << grandchild << " survived";
  ::unlink(marker.c_str());
}

TEST(EmuProcessTest, DestructorKillsARunningChild) {
  pid_t pid = 0;
  {
    SpawnOptions o;
    o.argv = {"sleep", "300"};
    auto p = Process::Spawn(o);
    ASSERT_TRUE(p.ok());
    pid = p->pid();
  }
  EXPECT_TRUE(::kill(pid, 0) != 0 && errno == ESRCH);
}

TEST(EmuPatternTest, AnyRangeMatchesTheWholeStream) {
  const uint64_t seed = PatternSeed("données finales.bin");
  EXPECT_NE(seed, PatternSeed("données finales.bim"));
  std::vector<unsigned char> whole(10000);
  FillPattern(seed, 0, whole.data(), whole.size());
  for (uint64_t off : {0ull, 1ull, 7ull, 8ull, 13ull, 4095ull, 9990ull}) {
    for (size_t len : {size_t{0}, size_t{1}, size_t{7}, size_t{9}, size_t{10}}) {
      std::vector<unsigned char> part(len);
      FillPattern(seed, off, part.data(), len);
      EXPECT_EQ(0, std::memcmp(part.data(), whole.data() + off, len)) << off << "+" << len;
    }
  }
}

TEST(EmuPatternTest, VerifyFindsSizeAndContentErrors) {
  char templ[] = "/tmp/dyad-emu-pattern-XXXXXX";
  const int raw = ::mkstemp(templ);
  ASSERT_GE(raw, 0);
  UniqueFd fd(raw);
  const std::string name = "a/b.dat";
  const uint64_t seed = PatternSeed(name);
  ASSERT_TRUE(WritePattern(fd.get(), seed, 3'000'000).ok());
  EXPECT_TRUE(VerifyPatternFile(templ, seed, 3'000'000).ok());
  EXPECT_FALSE(VerifyPatternFile(templ, seed, 3'000'001).ok());
  EXPECT_FALSE(VerifyPatternFile(templ, PatternSeed("other"), -1).ok());
  unsigned char orig;
  ASSERT_EQ(::pread(fd.get(), &orig, 1, 2'500'000), 1);
  const char flip = static_cast<char>(orig ^ 0xff);
  ASSERT_EQ(::pwrite(fd.get(), &flip, 1, 2'500'000), 1);
  Status st = VerifyPatternFile(templ, seed, 3'000'000);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("2500000"), std::string::npos) << st.ToString();
  ::unlink(templ);
}

TEST(EmuWorkerTest, ManifestAndResultsRoundTripOddNames) {
  const std::string dir = testutil::MakeTempDir("dyad-emu-worker-");
  ASSERT_FALSE(dir.empty());
  const std::string m = dir + "/m", r = dir + "/r";
  const std::vector<ManifestEntry> in = {
      {"plain.dat", 0}, {"tab\there", 5}, {"new\nline %41 100%", -1}, {"ü 文件", 1ll << 33}};
  ASSERT_TRUE(WriteManifest(m, in).ok());
  auto out = ReadManifest(m);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  ASSERT_EQ(out->size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ((*out)[i].name, in[i].name);
    EXPECT_EQ((*out)[i].size, in[i].size);
  }
  FileResult fr;
  fr.name = "tab\there";
  fr.rc = DYAD_RC_TIMEOUT;
  fr.size = 12;
  fr.start_ns = 1;
  fr.end_ns = 2;
  fr.call_ns = 3;
  fr.io_ns = 4;
  fr.version = 5;
  fr.verified = 0;
  fr.message = "line1\nline2\t%";
  const std::string line = FormatResult(fr);
  {
    UniqueFd fd(::open(r.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644));
    ASSERT_TRUE(WriteFully(fd.get(), line.data(), line.size()).ok());
    ASSERT_TRUE(WriteFully(fd.get(), line.data(), line.size()).ok());
  }
  auto res = ReadResults(r);
  ASSERT_TRUE(res.ok()) << res.status().ToString();
  ASSERT_EQ(res->size(), 2u);
  EXPECT_EQ((*res)[1].name, fr.name);
  EXPECT_EQ((*res)[1].message, fr.message);
  EXPECT_EQ((*res)[1].rc, DYAD_RC_TIMEOUT);
  EXPECT_EQ((*res)[1].verified, 0);
  EXPECT_EQ((*res)[1].version, 5u);
  EXPECT_TRUE(RemoveTree(dir).ok());
}

TEST(EmuWorkerTest, Percentiles) {
  EXPECT_EQ(Percentile({}, 50), 0);
  EXPECT_EQ(Percentile({5}, 99), 5);
  std::vector<double> v;
  for (int i = 100; i >= 1; --i) v.push_back(i);
  EXPECT_EQ(Percentile(v, 50), 50);
  EXPECT_EQ(Percentile(v, 99), 99);
  EXPECT_EQ(Percentile(v, 100), 100);
  EXPECT_EQ(Median({3, 1, 2}), 2);
}

// A client of node i's service, managing node i's directory.
client::Client NodeClient(const EmuCluster& c, int i) {
  client::Options o;
  o.producer_path = c.node(i).dmd;
  o.consumer_path = c.node(i).dmd;
  o.service_socket = c.node(i).socket;
  o.kvs_namespace = c.options().kvs_namespace;
  o.consume_timeout_ms = 20000;
  client::Client out;
  const client::Status st = client::Client::Create(o, &out);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return out;
}

// 32 nodes on one bridge: every service starts (in parallel), a file
// published on node 1 is consumed byte for byte on node 31 (neither is the
// root, so the locate, the owner's address and the transfer all cross the
// bridge), and teardown leaves no service, namespace or directory.
TEST(EmuScaleTest, ThirtyTwoNodesExchangeBetweenFarNodes) {
  constexpr int kNodes = 32;
  ClusterOptions o;
  o.bin_dir = DYAD_BUILD_BIN_DIR;
  o.extra_service_args = {"--workers", "2"};
  const auto t0 = std::chrono::steady_clock::now();
  auto c = EmuCluster::Start(kNodes, o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const double start_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RecordProperty("start_seconds", std::to_string(start_s));
  EmuCluster& cl = **c;
  ASSERT_EQ(cl.size(), kNodes);
  std::vector<pid_t> pids;
  for (int i = 0; i < kNodes; ++i) {
    ASSERT_TRUE(cl.ServiceRunning(i)) << "node " << i;
    pids.push_back(cl.ServicePid(i));
  }

  const std::string rel = "far/one.dat";
  const uint64_t size = 3 * 65536 + 17;
  {
    ASSERT_EQ(::mkdir((cl.node(1).dmd + "/far").c_str(), 0755), 0);
    UniqueFd fd(::open((cl.node(1).dmd + "/" + rel).c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644));
    ASSERT_TRUE(fd.valid());
    ASSERT_TRUE(WritePattern(fd.get(), PatternSeed(rel), size).ok());
  }
  client::Client producer = NodeClient(cl, 1);
  client::Client consumer = NodeClient(cl, kNodes - 1);
  const client::Status pub = producer.Produce(cl.node(1).dmd + "/" + rel);
  ASSERT_TRUE(pub.ok()) << pub.ToString();
  client::ConsumeInfo info;
  const client::Status got = consumer.Consume(cl.node(kNodes - 1).dmd + "/" + rel, &info);
  ASSERT_TRUE(got.ok()) << got.ToString();
  EXPECT_TRUE(info.transferred);
  EXPECT_EQ(info.metadata.owner_rank, 1u);
  const Status verified =
      VerifyPatternFile(cl.node(kNodes - 1).dmd + "/" + rel, PatternSeed(rel), size);
  EXPECT_TRUE(verified.ok()) << verified.ToString();
  auto out = cl.Counter(1, "bytes.out");
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out, size);

  std::vector<std::string> names;
  for (int i = 0; i < kNodes; ++i)
    if (!cl.node(i).netns.empty()) names.push_back(cl.node(i).netns);
  const std::string base = cl.base_dir();
  c->reset();
  struct stat st;
  EXPECT_NE(::stat(base.c_str(), &st), 0);
  const std::vector<std::string> left = ListNetns();
  for (const std::string& n : names) EXPECT_EQ(std::count(left.begin(), left.end(), n), 0) << n;
  for (pid_t p : pids) EXPECT_TRUE(::kill(p, 0) != 0 && errno == ESRCH) << p;
}

// The ext4 slowdown of repeated benchmark runs (issue 28): a cluster's
// node directories sit in a randomly named directory below one flagged as
// a "top directory", so that on ext4 each cluster starts in a block group
// of its own instead of the one where the previous run's removed files
// are (their inodes, freed seconds ago, are skipped one by one by every
// allocation there). Where the file system has no such flag (tmpfs) the
// layout is the same, without it. Everything goes at teardown.
TEST(EmuClusterTest, RepeatedRunsOnExt4StartInAFreshBlockGroup) {
  const std::string parent = testutil::MakeTempDir("dyad-emu-spread-");
  ASSERT_FALSE(parent.empty());
  ClusterOptions o;
  o.bin_dir = DYAD_BUILD_BIN_DIR;
  o.use_netns = false;
  o.tmp_parent = parent;
  std::string bases[2];
  for (std::string& base : bases) {
    auto c = EmuCluster::Start(1, o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    base = (*c)->base_dir();
    const std::string top = base.substr(0, base.rfind('/'));
    // <parent>/dyademu-XXXXXX/c-XXXXXX
    EXPECT_EQ(top.substr(0, top.rfind('/')), parent);
    EXPECT_EQ(base.substr(top.size() + 1, 2), "c-");
    struct stat st;
    EXPECT_EQ(::stat((base + "/node0/dmd").c_str(), &st), 0);
    UniqueFd fd(::open(top.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    ASSERT_TRUE(fd.valid());
    int flags = 0;
    if (::ioctl(fd.get(), FS_IOC_GETFLAGS, &flags) == 0)
      EXPECT_NE(flags & FS_TOPDIR_FL, 0) << top << " is not a top directory";
    c->reset();
    EXPECT_NE(::stat(top.c_str(), &st), 0) << top << " left behind";
  }
  // A random name each time: the allocator's start group is its hash.
  EXPECT_NE(bases[0].substr(bases[0].rfind('/')), bases[1].substr(bases[1].rfind('/')));
  EXPECT_EQ(::rmdir(parent.c_str()), 0) << "cluster directory left in " << parent;
}

// A start that fails half way (one of 16 services cannot start) removes
// every namespace, service and directory it had made.
TEST(EmuScaleTest, FailedStartOfManyNodesLeavesNothing) {
  const std::string parent = testutil::MakeTempDir("dyad-emu-scale-");
  ASSERT_FALSE(parent.empty());
  ClusterOptions o;
  o.bin_dir = DYAD_BUILD_BIN_DIR;
  o.tmp_parent = parent;
  o.node_service_args[9] = {"--no-such-option"};
  auto c = EmuCluster::Start(16, o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("node 9"), std::string::npos) << c.status().ToString();
  const std::string mine = std::string(kNetnsPrefix) + std::to_string(::getpid()) + "-";
  for (const std::string& n : ListNetns()) EXPECT_NE(n.rfind(mine, 0), 0u) << n;
  // The only thing left in the parent would be the cluster's directory.
  EXPECT_EQ(::rmdir(parent.c_str()), 0) << "cluster directory left in " << parent;
}

}  // namespace
}  // namespace dyad::emu
