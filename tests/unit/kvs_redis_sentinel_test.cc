// What only a Sentinel-managed primary has (the shared contract runs in
// kvs_conformance_test.cc as "redis_sentinel"): a crash of the primary
// during waits, after which the sentinel promotes a replica, loses no
// acknowledged publication and wakes every waiter; a manual failover is
// followed through +switch-master before any command notices; a
// publication no replica acknowledged is reported, not silently at risk.
// Each test starts a real primary (append-only file, fsync always),
// replicas and one Redis Sentinel (quorum 1) on free loopback ports.
#include <gtest/gtest.h>

#ifdef DYAD_HAVE_REDIS
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "emu/redis_cluster.h"
#include "kvs/kvs.h"
#include "kvs/redis/redis_kvs.h"

namespace dyad {
namespace {

using emu::RedisCommand;
using emu::RedisSentinel;
using emu::WaitUntil;
using std::chrono::milliseconds;

class RedisSentinelTest : public ::testing::Test {
 protected:
  void Start(int replicas) {
    group_ = std::make_unique<RedisSentinel>(replicas);
    if (!group_->available()) GTEST_SKIP() << "redis-server is not installed";
    ASSERT_EQ(group_->Start(), "");
  }
  std::unique_ptr<RedisKvs> Open(const std::string& options = "") {
    KvsOptions o;
    o.rpc_timeout_ms = 5000;
    Result<std::unique_ptr<RedisKvs>> kvs = RedisKvs::Open(group_->url(options), o);
    EXPECT_TRUE(kvs.ok()) << kvs.status().ToString();
    return kvs.ok() ? std::move(*kvs) : nullptr;
  }
  int Subscribers(int port, const std::string& channel) {
    const std::string r = RedisCommand(port, {"PUBSUB", "NUMSUB", channel});
    return std::atoi(r.c_str() + r.rfind(',') + 1);
  }
  void TearDown() override { group_.reset(); }

  std::unique_ptr<RedisSentinel> group_;
};

TEST_F(RedisSentinelTest, PrimaryCrashDuringWaitsLosesNothingAndWakesEveryWaiter) {
  Start(2);
  std::unique_ptr<RedisKvs> kvs = Open();
  ASSERT_NE(kvs, nullptr);
  // Acknowledged before the crash: on the primary's disk and on a replica.
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(kvs->Put("ns", "before/" + std::to_string(i), "b" + std::to_string(i)).ok());

  // Waiters of both kinds, on distinct keys and on one shared key.
  std::vector<std::future<Result<std::string>>> blocking;
  for (int i = 0; i < 6; ++i) {
    blocking.push_back(std::async(std::launch::async, [&, i] {
      return kvs->Wait("ns", "after/" + std::to_string(i), Deadline::AfterMs(30000));
    }));
  }
  for (int i = 0; i < 3; ++i) {
    blocking.push_back(std::async(
        std::launch::async, [&] { return kvs->Wait("ns", "shared", Deadline::AfterMs(30000)); }));
  }
  std::atomic<int> async_ok{0};
  std::atomic<int> async_done{0};
  for (int i = 0; i < 6; ++i) {
    const std::string want = "a" + std::to_string(i);
    ASSERT_TRUE(kvs->StartWait("ns", "async/" + std::to_string(i), Deadline::AfterMs(30000),
                               [&, want](Result<std::string> r) {
                                 if (r.ok() && *r == want) ++async_ok;
                                 ++async_done;
                               })
                    .ok());
  }
  const int old_primary = group_->primary().port();
  ASSERT_TRUE(WaitUntil(3000, [&] {
    return Subscribers(old_primary, kvs->RedisKey("ns", "shared")) == 1 &&
           Subscribers(old_primary, kvs->RedisKey("ns", "async/5")) == 1;
  }));

  // (A failover before this point would make the test meaningless.)
  ASSERT_EQ(group_->PrimaryPort(), old_primary);
  group_->primary().Kill();  // SIGKILL: no orderly hand-over
  int new_primary = -1;
  ASSERT_TRUE(WaitUntil(15000, [&] {
    new_primary = group_->PrimaryPort();
    return new_primary > 0 && new_primary != old_primary;
  })) << "the sentinel did not fail over";
  // The other replica follows the new primary, so publications can be
  // acknowledged by a replica again (wait_replicas=1).
  ASSERT_TRUE(WaitUntil(15000, [&] { return RedisSentinel::HasReplicasOnline(new_primary, 1); }));

  for (int i = 0; i < 6; ++i) {
    Status st = kvs->Put("ns", "after/" + std::to_string(i), "p" + std::to_string(i));
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(kvs->Put("ns", "async/" + std::to_string(i), "a" + std::to_string(i)).ok());
  }
  ASSERT_TRUE(kvs->Put("ns", "shared", "for all").ok());
  for (size_t i = 0; i < blocking.size(); ++i) {
    ASSERT_EQ(blocking[i].wait_for(milliseconds(5000)), std::future_status::ready) << i;
    Result<std::string> r = blocking[i].get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, i < 6 ? "p" + std::to_string(i) : std::string("for all"));
  }
  ASSERT_TRUE(WaitUntil(5000, [&] { return async_done.load() == 6; }));
  EXPECT_EQ(async_ok.load(), 6);
  // Nothing acknowledged before the crash was lost.
  for (int i = 0; i < 20; ++i) {
    Result<std::optional<std::string>> v = kvs->Get("ns", "before/" + std::to_string(i));
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    EXPECT_EQ(*v, std::optional<std::string>("b" + std::to_string(i)));
  }
}

TEST_F(RedisSentinelTest, ManualFailoverIsFollowedThroughSwitchMaster) {
  Start(1);
  // The demoted primary rejoins as a replica only when the sentinel next
  // polls it (10 s); this test is about following the switch, so it does
  // not wait for a replica's acknowledgement.
  std::unique_ptr<RedisKvs> kvs = Open("?wait_replicas=0");
  ASSERT_NE(kvs, nullptr);
  ASSERT_TRUE(kvs->Put("ns", "warm", "x").ok());
  auto waiter = std::async(std::launch::async,
                           [&] { return kvs->Wait("ns", "k", Deadline::AfterMs(20000)); });
  const std::string channel = kvs->RedisKey("ns", "k");
  const int old_primary = group_->primary().port();
  const int replica = group_->replica(0).port();
  ASSERT_TRUE(WaitUntil(3000, [&] { return Subscribers(old_primary, channel) == 1; }));
  ASSERT_TRUE(WaitUntil(5000, [&] {
    return RedisCommand(group_->sentinel().port(),
                        {"SENTINEL", "FAILOVER", RedisSentinel::kMaster}) == "OK";
  }));
  // The old primary stays up as a replica, so no link breaks: only the
  // +switch-master announcement can move the subscription, and it must,
  // before any command of this client runs into READONLY.
  ASSERT_TRUE(WaitUntil(10000, [&] { return Subscribers(replica, channel) == 1; }))
      << "subscription not moved to the new primary";
  Status st = kvs->Put("ns", "k", "on the new primary");
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(waiter.wait_for(milliseconds(5000)), std::future_status::ready);
  Result<std::string> r = waiter.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "on the new primary");
  EXPECT_EQ(RedisCommand(replica, {"GET", channel}), "on the new primary");
}

TEST_F(RedisSentinelTest, PublicationNoReplicaAcknowledgedIsReported) {
  Start(1);
  std::unique_ptr<RedisKvs> kvs = Open("?wait_replicas_ms=300");
  ASSERT_NE(kvs, nullptr);
  // The replica acknowledges once its first synchronisation is done, which
  // on a loaded machine may take longer than the 300 ms a Put waits for it.
  ASSERT_TRUE(WaitUntil(10000, [&] { return kvs->Put("ns", "safe", "x").ok(); }))
      << "the replica never acknowledged a publication";
  group_->replica(0).Kill();
  Status st = kvs->Put("ns", "at-risk", "y");
  EXPECT_EQ(st.code(), DYAD_RC_BADCOMMIT) << st.ToString();
  EXPECT_NE(st.message().find("acknowledged by 0"), std::string::npos) << st.message();
  // Asking for no acknowledgement trades that safety for availability.
  std::unique_ptr<RedisKvs> relaxed = Open("?wait_replicas=0");
  ASSERT_NE(relaxed, nullptr);
  EXPECT_TRUE(relaxed->Put("ns", "unsafe", "z").ok());
}

}  // namespace
}  // namespace dyad

#else  // !DYAD_HAVE_REDIS

TEST(RedisSentinelTest, RedisNotCompiledIn) { GTEST_SKIP() << "built without DYAD_HAVE_REDIS"; }

#endif  // DYAD_HAVE_REDIS
