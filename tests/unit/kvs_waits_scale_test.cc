// Waits at scale, for correctness (the figures are bench/waits.cc's):
// 1,000 waits on distinct keys and 100 on one key, all parked before the
// keys are published, each woken with its own value. Blocking waits (one
// thread each, as a dyad-service parks a consume today) on every store,
// and StartWait (no thread) where the store has it. The embedded store
// runs against a real root (embedded_test_root.h); Redis against a real
// redis-server, and a real three-master cluster for StartWait. Every wait
// is bounded by its deadline.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "emu/redis_server.h"
#include "kvs/kvs.h"
#include "unit/embedded_test_root.h"
#ifdef DYAD_HAVE_REDIS
#include "emu/redis_cluster.h"
#endif

namespace dyad {
namespace {

using std::chrono::milliseconds;

constexpr int kDistinct = 1000;
constexpr int kShared = 100;
constexpr int64_t kDeadlineMs = 30000;
constexpr char kSecret[] = "scale-secret-0123456789abcdef0123";

std::string DistinctKey(int i) { return "d/" + std::to_string(i); }
std::string DistinctValue(int i) { return "value " + std::to_string(i); }

// The store to test and what hosts it, by parameter.
class WaitsAtScale : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string p = GetParam();
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    if (p == "redis_cluster" && test.rfind("Blocking", 0) == 0)
      GTEST_SKIP() << "blocking waits on a cluster: covered by the conformance suite";
    std::string url = p;
    if (p == "embedded") {
      std::string error;
      root_ = testing_embedded::TestRoot::Start(kSecret, 0, &error);
      ASSERT_NE(root_, nullptr) << error;
      url = root_->url();
    } else if (p == "redis") {
      redis_ = std::make_unique<emu::RedisServer>();
      if (!redis_->available()) GTEST_SKIP() << "redis-server is not installed";
      ASSERT_EQ(redis_->Start(), "");
      url = redis_->url();
    } else if (p == "redis_cluster") {
#ifdef DYAD_HAVE_REDIS
      cluster_ = std::make_unique<emu::RedisCluster>();
      if (!cluster_->available()) GTEST_SKIP() << "redis-server or redis-cli is not installed";
      ASSERT_EQ(cluster_->Start(), "");
      url = cluster_->url();
#endif
    }
    KvsOptions o;
    o.secret = kSecret;
    o.rpc_timeout_ms = 10000;
    Result<std::unique_ptr<Kvs>> kvs = OpenKvs(url, o);
    ASSERT_TRUE(kvs.ok()) << kvs.status().ToString();
    kvs_ = std::move(*kvs);
  }
  void TearDown() override {
    if (kvs_) kvs_->Shutdown();  // ends any wait a failed test left behind
    kvs_.reset();
    if (root_) root_->Stop();
  }

  // Publishes every awaited key: distinct ones first, the shared one last.
  void PublishAll() {
    for (int i = 0; i < kDistinct; ++i)
      ASSERT_TRUE(kvs_->Put("scale", DistinctKey(i), DistinctValue(i)).ok());
    ASSERT_TRUE(kvs_->Put("scale", "one", "for the hundred").ok());
  }
  // Every result is its key's value.
  void Check(const std::vector<Result<std::string>>& results) {
    int wrong = 0;
    for (int i = 0; i < kDistinct + kShared; ++i) {
      const std::string want = i < kDistinct ? DistinctValue(i) : "for the hundred";
      if (!results[static_cast<size_t>(i)].ok() || *results[static_cast<size_t>(i)] != want) {
        if (++wrong <= 5) {
          ADD_FAILURE() << "wait " << i << ": "
                        << results[static_cast<size_t>(i)].status().ToString();
        }
      }
    }
    EXPECT_EQ(wrong, 0);
  }

  std::unique_ptr<testing_embedded::TestRoot> root_;
  std::unique_ptr<emu::RedisServer> redis_;
#ifdef DYAD_HAVE_REDIS
  std::unique_ptr<emu::RedisCluster> cluster_;
#endif
  std::unique_ptr<Kvs> kvs_;
};

TEST_P(WaitsAtScale, BlockingWaitsOnDistinctKeysAndOneKey) {
  std::vector<Result<std::string>> results(kDistinct + kShared, Status(DYAD_RC_SYSFAIL, "not run"));
  std::vector<std::thread> threads;
  threads.reserve(results.size());
  for (int i = 0; i < kDistinct + kShared; ++i) {
    threads.emplace_back([&, i] {
      const std::string key = i < kDistinct ? DistinctKey(i) : "one";
      results[static_cast<size_t>(i)] = kvs_->Wait("scale", key, Deadline::AfterMs(kDeadlineMs));
    });
  }
  std::this_thread::sleep_for(milliseconds(500));  // most are parked by now
  const auto start = SteadyClock::now();
  PublishAll();
  for (std::thread& t : threads) t.join();  // bounded by the waits' deadline
  const auto ms = std::chrono::duration_cast<milliseconds>(SteadyClock::now() - start).count();
  Check(results);
  std::printf("%s: %d blocking waits woken %lld ms after publishing began\n", GetParam().c_str(),
              kDistinct + kShared, static_cast<long long>(ms));
}

TEST_P(WaitsAtScale, StartedWaitsOnDistinctKeysAndOneKey) {
  if (!kvs_->caps().async_wait) GTEST_SKIP() << GetParam() << " has no StartWait";
  std::mutex mu;
  std::vector<Result<std::string>> results(kDistinct + kShared, Status(DYAD_RC_SYSFAIL, "not run"));
  std::atomic<int> done{0};
  for (int i = 0; i < kDistinct + kShared; ++i) {
    const std::string key = i < kDistinct ? DistinctKey(i) : "one";
    Result<KvsWaitTicket> t = kvs_->StartWait("scale", key, Deadline::AfterMs(kDeadlineMs),
                                              [&, i](Result<std::string> r) {
                                                std::lock_guard<std::mutex> lk(mu);
                                                results[static_cast<size_t>(i)] = std::move(r);
                                                ++done;
                                              });
    ASSERT_TRUE(t.ok()) << t.status().ToString();
  }
  std::this_thread::sleep_for(milliseconds(500));
  PublishAll();
  ASSERT_TRUE(emu::WaitUntil(static_cast<int>(kDeadlineMs),
                             [&] { return done.load() == kDistinct + kShared; }));
  std::lock_guard<std::mutex> lk(mu);
  Check(results);
}

std::vector<std::string> ScaleParams() {
  std::vector<std::string> p{"memory", "embedded"};
  const std::vector<std::string> built = KvsBackendNames();
  if (std::find(built.begin(), built.end(), "redis") != built.end()) {
    p.push_back("redis");
    p.push_back("redis_cluster");
  }
  return p;
}

INSTANTIATE_TEST_SUITE_P(Stores, WaitsAtScale, ::testing::ValuesIn(ScaleParams()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace dyad
