// Two in-process dyad-services sharing one real redis-server as their
// metadata store (--kvs redis://127.0.0.1:PORT): what one publishes the
// other consumes, including a consumer that waits before the producer
// publishes, and the membership records land in Redis under the
// "dyad.services" namespace. The same exchange through a real three-master
// Redis Cluster (--kvs redis+cluster://...). Skips when redis-server is not
// installed.
#include <gtest/gtest.h>

#ifdef DYAD_HAVE_REDIS
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "common/fsutil.h"
#include "common/key.h"
#include "common/net.h"
#include "emu/redis_cluster.h"
#include "emu/redis_server.h"
#include "kvs/kvs.h"
#include "proto/protocol.h"
#include "service/service.h"
#include "unit/service_pair.h"

namespace dyad {
namespace {

using testing_services::ReadAll;

class ServicesOnRedis : public ::testing::Test {
 protected:
  void SetUp() override {
    redis_ = std::make_unique<emu::RedisServer>();
    if (!redis_->available()) GTEST_SKIP() << "redis-server is not installed";
    ASSERT_EQ(redis_->Start(), "");
    Status st = pair_.Start(redis_->url(), redis_->url());
    ASSERT_TRUE(st.ok()) << st.ToString();
    base_ = pair_.base;
    dir_a_ = pair_.dir_a;
    dir_b_ = pair_.dir_b;
  }

  void TearDown() override {
    pair_.Stop();
    redis_.reset();
  }

  Status Publish(const std::string& upath, const std::string& data) {
    return pair_.Publish(upath, data);
  }
  Result<ConsumeReply> Consume(const std::string& upath, int64_t timeout_ms = 10000) {
    return pair_.Consume(upath, timeout_ms);
  }

  testing_services::ServicePair pair_;
  std::unique_ptr<emu::RedisServer> redis_;
  std::string base_, dir_a_, dir_b_;
};

TEST_F(ServicesOnRedis, PublishOnOneConsumeOnTheOther) {
  const std::string data(200000, 'r');
  ASSERT_TRUE(Publish("frames/f0.bin", data).ok());
  Result<ConsumeReply> r = Consume("frames/f0.bin");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->transferred);
  EXPECT_EQ(ReadAll(dir_b_ + "/frames/f0.bin"), data);
  EXPECT_EQ(pair_.b->stats().Get(ServiceStats::kTransfersIn), 1u);

  // The record and both memberships are in Redis, in their namespaces.
  Result<std::unique_ptr<Kvs>> kvs = OpenKvs(redis_->url(), KvsOptions());
  ASSERT_TRUE(kvs.ok()) << kvs.status().ToString();
  Result<std::optional<std::string>> rec = (*kvs)->Get("t", GenPathKey("frames/f0.bin", 3, 1024));
  ASSERT_TRUE(rec.ok());
  EXPECT_TRUE(rec->has_value());
  Result<std::vector<KvsEntry>> members = (*kvs)->List(kMembersNamespace, "");
  ASSERT_TRUE(members.ok()) << members.status().ToString();
  EXPECT_EQ(members->size(), 2u);
}

TEST_F(ServicesOnRedis, ConsumerWaitingBeforePublishIsWoken) {
  std::atomic<bool> done{false};
  Result<ConsumeReply> r = Status(DYAD_RC_SYSFAIL, "not run");
  std::thread consumer([&] {
    r = Consume("late.txt", 10000);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(done.load());
  const auto put_at = std::chrono::steady_clock::now();
  ASSERT_TRUE(Publish("late.txt", "hello via redis").ok());
  consumer.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(ReadAll(dir_b_ + "/late.txt"), "hello via redis");
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                  put_at)
                .count(),
            2000);
}

TEST_F(ServicesOnRedis, TimeoutIsAClearError) {
  Result<ConsumeReply> r = Consume("never.txt", 300);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), DYAD_RC_TIMEOUT) << r.status().ToString();
}

// Both services on one cluster: the records of one namespace spread over
// the masters, and a consumer parked before the publication is woken
// through the key's shard.
TEST(ServicesOnRedisCluster, ExchangeFilesThroughTheCluster) {
  emu::RedisCluster cluster;
  if (!cluster.available()) GTEST_SKIP() << "redis-server or redis-cli is not installed";
  ASSERT_EQ(cluster.Start(), "");
  testing_services::ServicePair pair;
  Status st = pair.Start(cluster.url(), cluster.url());
  ASSERT_TRUE(st.ok()) << st.ToString();

  Result<ConsumeReply> late = Status(DYAD_RC_SYSFAIL, "not run");
  std::thread consumer([&] { late = pair.Consume("waited/late.bin", 10000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (int i = 0; i < 12; ++i) {
    const std::string upath = "frames/f" + std::to_string(i) + ".bin";
    ASSERT_TRUE(pair.Publish(upath, std::string(1000 + i, static_cast<char>('a' + i))).ok());
  }
  ASSERT_TRUE(pair.Publish("waited/late.bin", "worth the wait").ok());
  consumer.join();
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  EXPECT_EQ(ReadAll(pair.dir_b + "/waited/late.bin"), "worth the wait");
  for (int i = 0; i < 12; ++i) {
    const std::string upath = "frames/f" + std::to_string(i) + ".bin";
    Result<ConsumeReply> r = pair.Consume(upath);
    ASSERT_TRUE(r.ok()) << upath << ": " << r.status().ToString();
    EXPECT_EQ(ReadAll(pair.dir_b + "/" + upath), std::string(1000 + i, static_cast<char>('a' + i)));
  }
  // The records landed on more than one master.
  int masters_with_keys = 0;
  for (size_t n = 0; n < cluster.size(); ++n)
    masters_with_keys += emu::RedisCommand(cluster.port(n), {"DBSIZE"}) != "0";
  EXPECT_GE(masters_with_keys, 2);
  pair.Stop();
}

}  // namespace
}  // namespace dyad

#else  // !DYAD_HAVE_REDIS

TEST(ServicesOnRedis, RedisNotCompiledIn) { GTEST_SKIP() << "built without DYAD_HAVE_REDIS"; }

#endif  // DYAD_HAVE_REDIS
