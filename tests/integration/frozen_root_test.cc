// A frozen metadata root is a hostile peer too: the requests that wait on
// it (publications, listings, consumes) hold no thread of the service, so
// `dyad status` is still answered at once.

#include <signal.h>
#include <sys/stat.h>

#include <string>
#include <vector>

#include "integration/integration_util.h"

namespace dyad::it {
namespace {

class FrozenRootTest : public TwoNodeTest {
 protected:
  static constexpr int kWaiters = 20;  // more than --workers
  emu::ClusterOptions Options() override {
    emu::ClusterOptions o;
    o.extra_service_args = {"--rpc-timeout", rpc_timeout_s_, "--workers", "2"};
    // Pool threads end 300 ms after their work (default 30 s), so what the
    // count below sees is what the waiting requests hold.
    o.service_env["DYAD_WORKER_IDLE_MS"] = "300";
    return o;
  }
  const char* rpc_timeout_s_ = "15";
};

TEST_F(FrozenRootTest, RequestsWaitingOnAFrozenRootHoldNoThread) {
  // B follows the namespace (it consumed from it) before the root freezes.
  const std::vector<ManifestEntry> before = {{"before.dat", 5000}};
  Produce(before);
  ConsumeOk(before);
  std::vector<std::string> names;
  for (int i = 0; i < kWaiters; ++i) {
    names.push_back("frozen/f" + std::to_string(i) + ".dat");
    WriteFileOn(kB, names.back(), 1000 + i);
  }
  Frozen root(cluster().ServicePid(kA));
  ASSERT_TRUE(root.ok);
  // Publications and listings on B, all waiting on the root.
  std::vector<emu::Process> waiting;
  for (int i = 0; i < kWaiters; ++i) {
    const std::vector<std::string> argv =
        i % 2 == 0 ? std::vector<std::string>{dyad_, "produce", PathOn(kB, names[i])}
                   : std::vector<std::string>{dyad_, "ls"};
    auto p = cluster().SpawnOnNode(kB, argv);
    ASSERT_TRUE(p.ok()) << Str(p.status());
    waiting.push_back(std::move(*p));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  // They hold no thread: the service runs no more than an idle one may
  // (docs/architecture.md), however many wait.
  EXPECT_LE(testutil::ThreadsOf(cluster().ServicePid(kB)), 6u);
  // What needs no root is answered at once: status. (Not a consume, even
  // of a copy here: once B's feed of the namespace finds the root silent,
  // it no longer trusts its records and stamps, and a consume asks the
  // root, as docs/consistency.md requires.)
  for (int round = 0; round < 3; ++round) {
    const uint64_t t0 = MonoNs();
    auto status = cluster().ServiceStatus(kB);
    const uint64_t took_ms = (MonoNs() - t0) / 1000000;
    ASSERT_TRUE(status.ok()) << Str(status.status());
    EXPECT_LT(took_ms, 1000u) << "status took " << took_ms << " ms with the root frozen";
  }
  // Thawed, every waiting request ends, and the publications succeeded.
  ASSERT_TRUE(root.Thaw());
  for (auto& p : waiting) {
    auto st = p.Wait(Deadline::AfterMs(30000));
    ASSERT_TRUE(st.ok()) << "a request did not end after the root thawed";
    EXPECT_TRUE(st->success()) << "a request failed after the root thawed";
  }
  auto ls = cluster().RunOnNode(kB, {dyad_, "ls"}, 20000);
  ASSERT_TRUE(ls.ok()) << Str(ls.status());
  for (int i = 0; i < kWaiters; ++i) {
    if (i % 2 == 1) continue;
    EXPECT_NE(ls->output.find(names[i]), std::string::npos) << names[i] << "\n" << ls->output;
  }
}

// Consumes of files not published yet, asked while the root is frozen:
// once the reads of their records have found the root silent (two
// --rpc-timeouts), they wait for the publication in the store's waits,
// not on a thread blocked on the root; each gets its file once the root
// is back and the files are published.
class FrozenRootConsumeTest : public FrozenRootTest {
 protected:
  static constexpr int kConsumers = 10;
  FrozenRootConsumeTest() { rpc_timeout_s_ = "2"; }
};

TEST_F(FrozenRootConsumeTest, ConsumesWaitingOnAFrozenRootHoldNoThread) {
  const std::vector<ManifestEntry> before = {{"before.dat", 5000}};
  Produce(before);
  ConsumeOk(before);
  std::vector<ManifestEntry> later;
  for (int i = 0; i < kConsumers; ++i)
    later.push_back({"later/f" + std::to_string(i) + ".dat", 3000 + i});
  Frozen root(cluster().ServicePid(kA));
  ASSERT_TRUE(root.ok);
  std::vector<emu::Process> consumers;
  for (const ManifestEntry& e : later) {
    auto p = cluster().SpawnOnNode(kB, {dyad_, "consume", "--timeout", "120", PathOn(kB, e.name)});
    ASSERT_TRUE(p.ok()) << Str(p.status());
    consumers.push_back(std::move(*p));
  }
  // Past two --rpc-timeouts: every consume's read of its record has given up.
  std::this_thread::sleep_for(std::chrono::milliseconds(6000));
  EXPECT_LE(testutil::ThreadsOf(cluster().ServicePid(kB)), 6u);
  const uint64_t t0 = MonoNs();
  auto status = cluster().ServiceStatus(kB);
  ASSERT_TRUE(status.ok()) << Str(status.status());
  EXPECT_LT((MonoNs() - t0) / 1000000, 1000u);
  for (auto& p : consumers) EXPECT_FALSE(p.Exited()) << "a consume ended before its publication";
  ASSERT_TRUE(root.Thaw());
  Produce(later);
  for (auto& p : consumers) {
    auto st = p.Wait(Deadline::AfterMs(60000));
    ASSERT_TRUE(st.ok()) << "a consume did not end after the publication";
    EXPECT_TRUE(st->success()) << "a consume failed after the root thawed";
  }
  for (const ManifestEntry& e : later) {
    struct stat st;
    ASSERT_EQ(::stat(PathOn(kB, e.name).c_str(), &st), 0) << e.name;
    EXPECT_EQ(st.st_size, e.size) << e.name;
  }
}

}  // namespace
}  // namespace dyad::it
