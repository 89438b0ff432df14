// In-process tests of dyad-service: two services on loopback (the root and a
// peer), driven through the same protocol the client library speaks. They
// pin the service's semantics without the client library or namespaces.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>
#include <vector>

#include "common/auth.h"
#include "common/fsutil.h"
#include "common/key.h"
#include "common/net.h"
#include "proto/protocol.h"
#include "service/service.h"

namespace dyad {
namespace {

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

uint64_t MtimeOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return 0;
  return MtimeNs(st);
}

class TwoServices : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dyad-svc-test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    base_ = tmpl;
    dir_a_ = base_ + "/a";
    dir_b_ = base_ + "/b";
    ServiceOptions a;
    a.rank = 0;
    a.prod_path = dir_a_;
    a.listen = "127.0.0.1:0";
    a.socket_path = base_ + "/a.sock";
    a.kvs_url = "embedded";
    a.secret = "test-secret";
    a.rpc_timeout_ms = 5000;
    svc_a_ = std::make_unique<Service>(a);
    ASSERT_TRUE(svc_a_->Start().ok());
    ServiceOptions b = a;
    b.rank = 1;
    b.prod_path = dir_b_;
    b.socket_path = base_ + "/b.sock";
    b.kvs_url = "embedded://" + svc_a_->tcp_address();
    svc_b_ = std::make_unique<Service>(b);
    Status st = svc_b_->Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  void TearDown() override {
    if (svc_b_) svc_b_->Stop();
    if (svc_a_) svc_a_->Stop();
    svc_b_.reset();
    svc_a_.reset();
    std::string cmd = "rm -rf '" + base_ + "'";
    ASSERT_EQ(system(cmd.c_str()), 0);
  }

  static Result<std::string> Call(const std::string& sock, MsgType type, const std::string& req,
                                  int64_t timeout_ms = 10000) {
    Result<SocketAddress> addr = ParseAddress("unix:" + sock);
    Result<UniqueFd> fd = Connect(*addr, Deadline::AfterMs(2000));
    if (!fd.ok()) return fd.status();
    Channel ch(std::move(*fd));
    std::string body;
    Status st = CallRpc(ch, type, req, &body, Deadline::AfterMs(timeout_ms));
    if (!st.ok()) return st;
    return body;
  }

  Status Publish(const std::string& upath, const std::string& data, bool async = false) {
    const std::string path = dir_a_ + "/" + upath;
    Status st = MakeParentDirs(dir_a_, upath);
    if (!st.ok()) return st;
    WriteFile(path, data);
    PublishRequest req;
    req.ns = "t";
    req.key = GenPathKey(upath, 3, 1024);
    req.upath = upath;
    req.prod_path = CanonicalPath(dir_a_);
    req.size = data.size();
    req.version = MtimeOf(path);
    req.async = async;
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
    Result<std::string> body = Call(base_ + "/b.sock", MsgType::kConsume, e.data(), 60000);
    if (!body.ok()) return body.status();
    ConsumeReply r;
    Decoder d(*body);
    if (!r.DecodeFrom(d)) return Status(DYAD_RC_BADUNPACK, "bad consume reply");
    return r;
  }

  std::string base_, dir_a_, dir_b_;
  std::unique_ptr<Service> svc_a_, svc_b_;
};

TEST_F(TwoServices, PublishedFileArrivesIntactOnTheOtherNode) {
  std::string data(3 << 20, '\0');
  std::mt19937 rng(7);
  for (auto& c : data) c = static_cast<char>(rng());
  ASSERT_TRUE(Publish("sub dir/é file.bin", data).ok());
  Result<ConsumeReply> r = Consume("sub dir/é file.bin");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->transferred);
  EXPECT_EQ(ReadAll(dir_b_ + "/sub dir/é file.bin"), data);
  EXPECT_EQ(svc_b_->stats().Get(ServiceStats::kTransfersIn), 1u);
  EXPECT_EQ(svc_a_->stats().Get(ServiceStats::kTransfersOut), 1u);
  // Second consume: the copy is current, nothing moves.
  r = Consume("sub dir/é file.bin");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->local);
  EXPECT_EQ(svc_b_->stats().Get(ServiceStats::kTransfersIn), 1u);
}

TEST_F(TwoServices, EmptyFileIsData) {
  ASSERT_TRUE(Publish("empty", "").ok());
  Result<ConsumeReply> r = Consume("empty");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  struct stat st;
  ASSERT_EQ(::stat((dir_b_ + "/empty").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
}

TEST_F(TwoServices, ConsumerBeforeProducerBlocksThenGetsTheFile) {
  std::atomic<bool> done{false};
  Result<ConsumeReply> r = Status(DYAD_RC_SYSFAIL, "not run");
  std::thread consumer([&] {
    r = Consume("late.txt", 10000);
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(done.load());
  ASSERT_TRUE(Publish("late.txt", "hello").ok());
  consumer.join();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(ReadAll(dir_b_ + "/late.txt"), "hello");
}

TEST_F(TwoServices, TimeoutIsAClearError) {
  Result<ConsumeReply> r = Consume("never.txt", 300);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), DYAD_RC_TIMEOUT);
  EXPECT_NE(r.status().message().find("never.txt"), std::string::npos);
}

TEST_F(TwoServices, ConcurrentConsumersCauseOneTransfer) {
  std::string data(8 << 20, 'x');
  ASSERT_TRUE(Publish("shared.bin", data).ok());
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&] {
      if (Consume("shared.bin").ok()) ++ok;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 8);
  EXPECT_EQ(svc_b_->stats().Get(ServiceStats::kTransfersIn), 1u);
  EXPECT_EQ(ReadAll(dir_b_ + "/shared.bin"), data);
}

TEST_F(TwoServices, DeletedAfterPublishFailsCleanlyAndRecovers) {
  ASSERT_TRUE(Publish("gone.txt", "data").ok());
  ASSERT_EQ(::unlink((dir_a_ + "/gone.txt").c_str()), 0);
  Result<ConsumeReply> r = Consume("gone.txt");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(DYAD_IS_ERROR(r.status().code()));
  EXPECT_NE(::access((dir_b_ + "/gone.txt").c_str(), F_OK), 0);
  EXPECT_EQ(RemoveStaleTemporaries(dir_b_), 0u);
  ASSERT_TRUE(Publish("gone.txt", "data again").ok());
  r = Consume("gone.txt");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(ReadAll(dir_b_ + "/gone.txt"), "data again");
}

TEST_F(TwoServices, AsyncPublishBecomesVisible) {
  ASSERT_TRUE(Publish("async.txt", "later", true).ok());
  Result<ConsumeReply> r = Consume("async.txt", 5000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(ReadAll(dir_b_ + "/async.txt"), "later");
}

TEST_F(TwoServices, PublishOutsideServedDirectoryIsRefused) {
  PublishRequest req;
  req.ns = "t";
  req.key = GenPathKey("x", 3, 1024);
  req.upath = "x";
  req.prod_path = "/somewhere/else";
  Encoder e;
  req.EncodeTo(e);
  Result<std::string> r = Call(base_ + "/a.sock", MsgType::kPublish, e.data());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), DYAD_RC_BADMANAGEDPATH);
}

class PeerLink : public TwoServices {
 protected:
  Result<std::unique_ptr<Channel>> Open(const std::string& secret) {
    Result<SocketAddress> addr = ParseAddress(svc_a_->tcp_address());
    Result<UniqueFd> fd = Connect(*addr, Deadline::AfterMs(2000));
    if (!fd.ok()) return fd.status();
    auto ch = std::make_unique<Channel>(std::move(*fd));
    Authenticator auth(secret);
    PeerIdentity peer;
    Status st = auth.Connect(*ch, PeerIdentity{9, 1}, Deadline::AfterMs(2000), &peer);
    if (!st.ok()) return st;
    return ch;
  }
  Status Fetch(Channel& ch, const std::string& upath) {
    FetchRequest req;
    req.upath = upath;
    req.transport = "tcp";
    Encoder e;
    req.EncodeTo(e);
    std::string body;
    return CallRpc(ch, MsgType::kFetch, e.data(), &body, Deadline::AfterMs(5000));
  }
};

TEST_F(PeerLink, EscapingPathsAreRefused) {
  Result<std::unique_ptr<Channel>> ch = Open("test-secret");
  ASSERT_TRUE(ch.ok()) << ch.status().ToString();
  WriteFile(base_ + "/outside.txt", "secret");
  ASSERT_EQ(::symlink((base_ + "/outside.txt").c_str(), (dir_a_ + "/link").c_str()), 0);
  for (const char* bad : {"../outside.txt", "/etc/passwd", "link", "a/../../outside.txt"}) {
    Status st = Fetch(**ch, bad);
    EXPECT_EQ(st.code(), DYAD_RC_PERM) << bad << ": " << st.ToString();
  }
  EXPECT_GE(svc_a_->stats().Get(ServiceStats::kFetchRefused), 4u);
}

TEST_F(PeerLink, WrongSecretIsRefused) {
  Result<std::unique_ptr<Channel>> ch = Open("wrong");
  ASSERT_FALSE(ch.ok());
  EXPECT_EQ(ch.status().code(), DYAD_RC_AUTH);
}

TEST_F(PeerLink, MalformedRequestsGetErrorsAndServiceKeepsServing) {
  {
    Result<std::unique_ptr<Channel>> ch = Open("test-secret");
    ASSERT_TRUE(ch.ok());
    std::string body;
    Status st = CallRpc(**ch, MsgType::kFetch, "\x01\x02", &body, Deadline::AfterMs(2000));
    EXPECT_EQ(st.code(), DYAD_RC_BADUNPACK);
  }
  {
    // Garbage instead of a frame header: the service answers and hangs up.
    Result<std::unique_ptr<Channel>> ch = Open("test-secret");
    ASSERT_TRUE(ch.ok());
    const std::string junk(64, 'Z');
    ASSERT_TRUE((*ch)->SendAll(junk.data(), junk.size(), Deadline::AfterMs(1000)).ok());
    uint16_t type;
    std::string payload;
    (void)(*ch)->RecvFrame(&type, &payload, Deadline::AfterMs(2000));
  }
  ASSERT_TRUE(Publish("after.txt", "still fine").ok());
  Result<ConsumeReply> r = Consume("after.txt");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
}

}  // namespace
}  // namespace dyad
