// fault_redis_test.cc: the metadata store is a real redis-server with an
// append-only file synced on every write (appendonly yes, appendfsync
// always), and it crashes (SIGKILL) while consumers wait (issue 12).
//
// What docs/redis.md ("Restarts") promises and this checks: a consume that
// waits across the crash completes once its file is published after the
// restart, within its own bound (the services re-subscribe and look again);
// nothing published before the crash is lost (a fresh consume after the
// restart finds it); and the services serve as before.
//
// The nodes share the host's loopback (redis-server listens on 127.0.0.1),
// so this runs with or without network namespaces.
#include <chrono>
#include <memory>
#include <thread>

#include "emu/redis_server.h"
#include "integration/integration_util.h"

namespace dyad::it {
namespace {

class RedisRestartTest : public TwoNodeTest {
 protected:
  void SetUp() override {
    redis_ = std::make_unique<emu::RedisServer>("appendonly yes\nappendfsync always\n");
    if (!redis_->available()) GTEST_SKIP() << "redis-server is not installed";
    ASSERT_EQ(redis_->Start(), "");
    TwoNodeTest::SetUp();
  }

  void TearDown() override {
    TwoNodeTest::TearDown();
    if (HasFailure() && redis_) std::fprintf(stderr, "redis log in %s\n", redis_->dir().c_str());
    redis_.reset();
  }

  emu::ClusterOptions Options() override {
    emu::ClusterOptions o;
    o.use_netns = false;
    o.kvs = redis_->url();
    return o;
  }

  // A consumer of one file on B, parked (bounded by `timeout_s`) until the
  // file is published.
  struct Waiter {
    ManifestEntry file;
    WorkerFiles files;
    emu::Process process;
  };
  void StartWaiter(Waiter* w, const ManifestEntry& file, int timeout_s) {
    w->file = file;
    w->files = NewWorkerFiles({file});
    w->process = StartWorker(kB, "consume", w->files, {},
                             {{"DYAD_CONSUME_TIMEOUT", std::to_string(timeout_s)}});
    ASSERT_TRUE(WaitWorkerReady(w->process, w->files)) << Output(w->files);
  }

  // redis-cli against the test's server; its output, trimmed.
  std::string RedisCli(const std::vector<std::string>& args) {
    emu::SpawnOptions o;
    o.argv = {"redis-cli", "-p", std::to_string(redis_->port())};
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    Result<emu::RunResult> r = emu::RunCapture(o, 10000);
    EXPECT_TRUE(r.ok() && r->status.success()) << (r.ok() ? r->output : Str(r.status()));
    std::string out = r.ok() ? r->output : "";
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    return out;
  }

  // Polls redis-cli GET `key` (every 100 ms, at most `ms`) until `ok`.
  template <typename Pred>
  bool WaitForRecord(const std::string& key, int64_t ms, Pred ok) {
    const Deadline deadline = Deadline::AfterMs(ms);
    while (!deadline.expired()) {
      if (ok(RedisCli({"GET", key}))) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }

  std::unique_ptr<emu::RedisServer> redis_;
};

TEST_F(RedisRestartTest, WaitingConsumesAndPublicationsSurviveARedisCrash) {
  const std::vector<ManifestEntry> early = {{"early/e0.dat", 100000}, {"early/e1.dat", 262147}};
  const std::vector<ManifestEntry> kept = {{"kept/k0.dat", 150001}};
  const std::vector<ManifestEntry> late = {
      {"late/l0.dat", 70001}, {"late/l1.dat", 1048576 + 3}, {"late/l2.dat", 5}};
  constexpr int kBoundS = 25;
  std::vector<Waiter> waiters(early.size() + late.size());
  for (size_t i = 0; i < waiters.size(); ++i) {
    const ManifestEntry& f = i < early.size() ? early[i] : late[i - early.size()];
    ASSERT_NO_FATAL_FAILURE(StartWaiter(&waiters[i], f, kBoundS));
  }
  const uint64_t started = MonoNs();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // parked in the service
  for (Waiter& w : waiters) ASSERT_FALSE(w.process.Exited()) << Output(w.files);

  Produce(early);
  Produce(kept);  // published, consumed only after the crash
  redis_->Kill();
  std::this_thread::sleep_for(std::chrono::milliseconds(700));  // the services see the outage
  ASSERT_EQ(redis_->Start(), "");
  Produce(late);

  for (Waiter& w : waiters) {
    SCOPED_TRACE(w.file.name);
    std::vector<FileResult> r = FinishWorker(w.process, w.files, 40000);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].rc, DYAD_RC_OK) << r[0].message;
    EXPECT_EQ(r[0].verified, 1) << r[0].message;
  }
  EXPECT_LT(MonoNs() - started, kBoundS * 1'000'000'000ull) << "a waiter needed its whole bound";
  // Nothing published before the crash was lost: the append-only file had it.
  ConsumeOk(kept, {}, {{"DYAD_CONSUME_TIMEOUT", "10"}});
  // And the services serve new work as before.
  const std::vector<ManifestEntry> after = {{"after/a0.dat", 333333}};
  Produce(after);
  ConsumeOk(after);
  EXPECT_TRUE(PartFiles(dmd(kB)).empty());
}

// Issue 12, defect 9: a membership record removed or overwritten in the
// store (here straight in Redis, which any holder of its password can do)
// left a rank unreachable for good. Each service checks its record every
// 3 s and writes it again; the owner is reachable again after that.
TEST_F(RedisRestartTest, Defect9_RemovedOrCorruptedMembershipRecordIsRepaired) {
  const std::string key = "dyad:{dyad.services}:rank." + std::to_string(cluster().node(kA).rank);
  const std::string original = RedisCli({"GET", key});
  ASSERT_FALSE(original.empty()) << "no membership record of node A under " << key;

  ASSERT_EQ(RedisCli({"DEL", key}), "1");
  EXPECT_TRUE(WaitForRecord(key, 10000, [](const std::string& v) { return !v.empty(); }))
      << "the removed record was not written again";
  const std::vector<ManifestEntry> one = {{"members/after-removal.dat", 123457}};
  Produce(one);
  ConsumeOk(one);

  ASSERT_EQ(RedisCli({"SET", key, "garbage, not a service record"}), "OK");
  EXPECT_TRUE(WaitForRecord(key, 10000, [](const std::string& v) {
    return !v.empty() && v != "garbage, not a service record";
  })) << "the corrupted record was not repaired";
  EXPECT_NE(cluster().ServiceLogTail(kA, 1 << 20).find("was corrupted"), std::string::npos);
  const std::vector<ManifestEntry> two = {{"members/after-corruption.dat", 54321}};
  Produce(two);
  ConsumeOk(two);
}

}  // namespace
}  // namespace dyad::it
