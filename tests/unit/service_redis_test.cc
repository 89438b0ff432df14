// Two in-process dyad-services sharing one real redis-server as their
// metadata store (--kvs redis://127.0.0.1:PORT): what one publishes the
// other consumes, including a consumer that waits before the producer
// publishes, and the membership records land in Redis under the
// "dyad.services" namespace. Skips when redis-server is not installed.
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
#include "kvs/kvs.h"
#include "proto/protocol.h"
#include "service/service.h"
#include "unit/redis_test_server.h"

namespace dyad {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

class ServicesOnRedis : public ::testing::Test {
 protected:
  void SetUp() override {
    redis_ = std::make_unique<testing_redis::RedisTestServer>();
    if (!redis_->available()) GTEST_SKIP() << "redis-server is not installed";
    ASSERT_EQ(redis_->Start(), "");
    char tmpl[] = "/tmp/dyad-svc-redis-test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    base_ = tmpl;
    dir_a_ = base_ + "/a";
    dir_b_ = base_ + "/b";
    ServiceOptions a;
    a.rank = 0;
    a.prod_path = dir_a_;
    a.listen = "127.0.0.1:0";
    a.socket_path = base_ + "/a.sock";
    a.kvs_url = redis_->url();
    a.secret = "test-secret";
    a.rpc_timeout_ms = 5000;
    svc_a_ = std::make_unique<Service>(a);
    Status st = svc_a_->Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
    ServiceOptions b = a;
    b.rank = 1;
    b.prod_path = dir_b_;
    b.socket_path = base_ + "/b.sock";
    svc_b_ = std::make_unique<Service>(b);
    st = svc_b_->Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  void TearDown() override {
    if (svc_b_) svc_b_->Stop();
    if (svc_a_) svc_a_->Stop();
    svc_b_.reset();
    svc_a_.reset();
    if (!base_.empty()) {
      const std::string cmd = "rm -rf '" + base_ + "'";
      EXPECT_EQ(system(cmd.c_str()), 0);
    }
    redis_.reset();
  }

  static Result<std::string> Call(const std::string& sock, MsgType type, const std::string& req,
                                  int64_t timeout_ms = 10000) {
    Result<SocketAddress> addr = ParseAddress("unix:" + sock);
    if (!addr.ok()) return addr.status();
    Result<UniqueFd> fd = Connect(*addr, Deadline::AfterMs(2000));
    if (!fd.ok()) return fd.status();
    Channel ch(std::move(*fd));
    std::string body;
    Status st = CallRpc(ch, type, req, &body, Deadline::AfterMs(timeout_ms));
    if (!st.ok()) return st;
    return body;
  }

  Status Publish(const std::string& upath, const std::string& data) {
    Status st = MakeParentDirs(dir_a_, upath);
    if (!st.ok()) return st;
    const std::string path = dir_a_ + "/" + upath;
    {
      std::ofstream out(path, std::ios::binary | std::ios::trunc);
      out << data;
    }
    struct stat sb;
    if (::stat(path.c_str(), &sb) != 0) return Status(DYAD_RC_BADFIO, "stat " + path);
    PublishRequest req;
    req.ns = "t";
    req.key = GenPathKey(upath, 3, 1024);
    req.upath = upath;
    req.prod_path = CanonicalPath(dir_a_);
    req.size = data.size();
    req.version = MtimeNs(sb);
    Encoder e;
    req.EncodeTo(e);
    return Call(base_ + "/a.sock", MsgType::kPublish, e.data()).status();
  }

  Result<ConsumeReply> Consume(const std::string& upath, int64_t timeout_ms = 10000) {
    ConsumeRequest req;
    req.ns = "t";
    req.key = GenPathKey(upath, 3, 1024);
    req.upath = upath;
    req.cons_path = CanonicalPath(dir_b_);
    req.timeout_ms = timeout_ms;
    Encoder e;
    req.EncodeTo(e);
    Result<std::string> body = Call(base_ + "/b.sock", MsgType::kConsume, e.data(), 30000);
    if (!body.ok()) return body.status();
    ConsumeReply r;
    Decoder d(*body);
    if (!r.DecodeFrom(d)) return Status(DYAD_RC_BADUNPACK, "bad consume reply");
    return r;
  }

  std::unique_ptr<testing_redis::RedisTestServer> redis_;
  std::string base_, dir_a_, dir_b_;
  std::unique_ptr<Service> svc_a_, svc_b_;
};

TEST_F(ServicesOnRedis, PublishOnOneConsumeOnTheOther) {
  const std::string data(200000, 'r');
  ASSERT_TRUE(Publish("frames/f0.bin", data).ok());
  Result<ConsumeReply> r = Consume("frames/f0.bin");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->transferred);
  EXPECT_EQ(ReadAll(dir_b_ + "/frames/f0.bin"), data);
  EXPECT_EQ(svc_b_->stats().Get(ServiceStats::kTransfersIn), 1u);

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

}  // namespace
}  // namespace dyad

#else  // !DYAD_HAVE_REDIS

TEST(ServicesOnRedis, RedisNotCompiledIn) { GTEST_SKIP() << "built without DYAD_HAVE_REDIS"; }

#endif  // DYAD_HAVE_REDIS
