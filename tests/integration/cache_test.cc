// The node's copies under a byte budget and read-write ownership, with real
// services on two emulated nodes and unmodified programs under the preload
// library: a reader (a shell holding a descriptor) keeps its file while the
// budget evicts another, the evicted file comes back on the next read, and
// a consumer appending to a consumed file becomes its owner.
#include <chrono>
#include <fstream>
#include <sstream>
#include <thread>

#include "integration_util.h"

namespace dyad::it {
namespace {

constexpr int kA = 0;
constexpr int kB = 1;

class CacheTest : public TwoNodeTest {
 protected:
  emu::ClusterOptions Options() override {
    emu::ClusterOptions o;
    o.node_service_args[kB] = {"--cache-bytes", "250000"};
    return o;
  }
  void SetUp() override {
    lib_ = std::string(DYAD_BUILD_BIN_DIR) + "/libdyad_wrapper.so";
    if (!Exists(lib_)) GTEST_SKIP() << "libdyad_wrapper.so not built in " << DYAD_BUILD_BIN_DIR;
    TwoNodeTest::SetUp();
    if (HasFatalFailure() || IsSkipped()) return;
    for (int n : {kA, kB}) {
      cons_[n] = cluster().node(n).dir + "/cons";
      ASSERT_EQ(::mkdir(cons_[n].c_str(), 0755), 0);
    }
  }
  // Under the library, with a consumer directory apart from the producer's
  // (the cluster's default shares one, where nothing is a copy).
  Env PreloadEnv(int node) {
    return {
        {"LD_PRELOAD", lib_}, {"DYAD_CONSUME_TIMEOUT", "30"}, {"DYAD_PATH_CONSUMER", cons_[node]}};
  }
  std::string RunOk(int node, const std::vector<std::string>& argv) {
    auto r = cluster().RunOnNode(node, argv, 60000, PreloadEnv(node));
    EXPECT_TRUE(r.ok()) << Str(r.status());
    if (!r.ok()) return "";
    EXPECT_TRUE(!r->timed_out && r->status.success()) << argv[0] << ":\n" << r->output;
    return r->output;
  }
  void Publish(const std::string& name, uint64_t size) {
    WriteFileOn(kA, name, size);
    auto r = cluster().RunOnNode(kA, {dyad_, "produce", PathOn(kA, name)}, 30000);
    ASSERT_TRUE(r.ok() && r->status.success()) << (r.ok() ? r->output : Str(r.status()));
  }
  std::string StatusJson(int node) {
    auto r = cluster().RunOnNode(node, {dyad_, "status", "--json"}, 30000);
    return r.ok() ? r->output : "";
  }
  std::string InCons(int node, const std::string& name) { return cons_[node] + "/" + name; }

  std::string lib_;
  std::string cons_[2];
};

TEST_F(CacheTest, EvictsUnderATinyBudgetButNeverAFileHeldOpen) {
  for (const char* name : {"a", "b", "c"}) Publish(name, 100000);
  // A shell on B opens a and keeps it open (its open goes through DYAD).
  const std::string out = work_ + "/holder.out";
  auto holder = cluster().SpawnOnNode(
      kB, {"sh", "-c", "exec 3< '" + InCons(kB, "a") + "' && echo opened && exec sleep 60"},
      PreloadEnv(kB), out);
  ASSERT_TRUE(holder.ok()) << Str(holder.status());
  (void)testutil::Eventually([&] { return ReadAll(out).find("opened") != std::string::npos; },
                             30000, 20);
  ASSERT_NE(ReadAll(out).find("opened"), std::string::npos) << ReadAll(out);
  RunOk(kB, {"cat", InCons(kB, "b")});
  // Past the grace period, c takes the copies past 250,000 bytes: a is the
  // least recently consumed but held open, so b goes.
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  RunOk(kB, {"cat", InCons(kB, "c")});
  EXPECT_TRUE(Exists(InCons(kB, "a")));
  EXPECT_FALSE(Exists(InCons(kB, "b")));
  EXPECT_TRUE(Exists(InCons(kB, "c")));
  EXPECT_NE(StatusJson(kB).find("\"node_cache.evictions\": 1"), std::string::npos)
      << StatusJson(kB);
  holder->Kill();
  // The evicted file is fetched again by its next read, intact.
  EXPECT_EQ(RunOk(kB, {"cat", InCons(kB, "b")}), ReadAll(PathOn(kA, "b")));
  EXPECT_TRUE(Exists(PathOn(kA, "a")));  // produced files are never touched
}

TEST_F(CacheTest, AConsumerAppendingToAConsumedFileBecomesItsOwner) {
  Publish("log", 1000);
  const std::string v1 = ReadAll(PathOn(kA, "log"));
  EXPECT_EQ(RunOk(kA, {"cat", InCons(kA, "log")}), v1);  // a copy on A too
  EXPECT_EQ(RunOk(kB, {"cat", InCons(kB, "log")}), v1);
  RunOk(kB, {"sh", "-c", "echo appended-on-B >> '" + InCons(kB, "log") + "'"});
  const std::string v2 = v1 + "appended-on-B\n";
  EXPECT_EQ(ReadAll(PathOn(kB, "log")), v2);  // now in B's producer directory
  auto owner = cluster().RunOnNode(kA, {dyad_, "ls", "--json"}, 30000);
  ASSERT_TRUE(owner.ok());
  EXPECT_NE(owner->output.find("\"owner_rank\": 1"), std::string::npos) << owner->output;
  // A's copy (found by the level-1 shortcut otherwise) was superseded.
  EXPECT_EQ(RunOk(kA, {"cat", InCons(kA, "log")}), v2);
}

}  // namespace
}  // namespace dyad::it
