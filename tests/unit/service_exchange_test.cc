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

#include "common/fsutil.h"
#include "common/key.h"
#include "common/net.h"
#include "proto/auth.h"
#include "proto/protocol.h"
#include "service/service.h"
#include "unit/service_pair.h"
#include "util.h"

namespace dyad {
namespace {

using testing_services::ReadAll;
using testing_services::WriteFile;

class TwoServices : public ::testing::Test {
 protected:
  void SetUp() override {
    Status st = pair_.Start("embedded");
    ASSERT_TRUE(st.ok()) << st.ToString();
    base_ = pair_.base;
    dir_a_ = pair_.dir_a;
    dir_b_ = pair_.dir_b;
    svc_a_ = pair_.a.get();
    svc_b_ = pair_.b.get();
  }
  void TearDown() override { pair_.Stop(); }

  static Result<std::string> Call(const std::string& sock, MsgType type, const std::string& req) {
    return testing_services::CallLocal(sock, type, req);
  }
  Status Publish(const std::string& upath, const std::string& data, bool async = false) {
    return pair_.Publish(upath, data, async);
  }
  Result<ConsumeReply> Consume(const std::string& upath, int64_t timeout_ms = 10000) {
    return pair_.Consume(upath, timeout_ms);
  }

  testing_services::ServicePair pair_;
  std::string base_, dir_a_, dir_b_;
  Service* svc_a_ = nullptr;
  Service* svc_b_ = nullptr;
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

// A peer session reads ahead (one receive takes a small file's reply, its
// bytes and the verdict): the bytes read with the reply reach the file, on a
// sealed link (frames) and on an unprotected one (a raw stream after the
// reply), for sizes around the read-ahead and the inline limit, and the
// session goes on serving the next fetch.
TEST(PeerReadAhead, FilesOfEverySizeArriveWholeOnSealedAndUnprotectedLinks) {
  for (LinkProtection p : {LinkProtection::kIntegrity, LinkProtection::kNone}) {
    testing_services::ServicePair pair;
    pair.protection = p;
    Status st = pair.Start("embedded");
    ASSERT_TRUE(st.ok()) << st.ToString();
    std::mt19937 rng(11);
    const size_t sizes[] = {1, 100, 4096, 16300, 16384, 16500, 65536, 70000, 300000};
    for (size_t size : sizes) {
      std::string data(size, '\0');
      for (auto& c : data) c = static_cast<char>(rng());
      const std::string name = "ra/" + std::to_string(size);
      ASSERT_TRUE(pair.Publish(name, data).ok());
      Result<ConsumeReply> r = pair.Consume(name);
      ASSERT_TRUE(r.ok()) << r.status().ToString() << " (" << size << " bytes)";
      EXPECT_EQ(ReadAll(pair.dir_b + "/" + name), data) << size << " bytes";
    }
    EXPECT_EQ(pair.b->stats().Get(ServiceStats::kTransfersIn), std::size(sizes));
  }
}

uint64_t Named(Service* svc, const std::string& name) {
  auto all = svc->stats().Snapshot();
  auto it = all.find(name);
  return it == all.end() ? 0 : it->second;
}

// The first consume in a namespace makes B follow its records: files
// published later reach B through the store's watch feed, and their
// consumes do not ask the store. A republish between two consumes is never
// missed, whether the feed has brought it yet or not.
TEST_F(TwoServices, FollowedRecordsSkipTheStoreAndARepublishIsNeverMissed) {
  ASSERT_TRUE(Publish("first", "one").ok());
  ASSERT_TRUE(Consume("first").ok());
  ASSERT_TRUE(Publish("second", "two").ok());
  // The feed brings it, or the listing does (when B's watch started after it).
  ASSERT_TRUE(testutil::Eventually(
      [&] { return Named(svc_b_, "records.fed") + Named(svc_b_, "records.seeded") >= 1; }, 5000))
      << "B did not learn the later publication";
  const uint64_t misses = svc_b_->stats().Get(ServiceStats::kCacheMisses);
  Result<ConsumeReply> r = Consume("second");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(ReadAll(dir_b_ + "/second"), "two");
  EXPECT_EQ(svc_b_->stats().Get(ServiceStats::kCacheMisses), misses) << "asked the store";

  // Republished: consumed at once (before the feed may have told B) and
  // again later, each consume gets the new bytes.
  for (int round = 0; round < 20; ++round) {
    const std::string data = "version " + std::to_string(round) + std::string(round * 7, 'x');
    ASSERT_TRUE(Publish("second", data).ok());
    r = Consume("second");
    ASSERT_TRUE(r.ok()) << round << ": " << r.status().ToString();
    ASSERT_EQ(ReadAll(dir_b_ + "/second"), data) << "round " << round << ": a stale version";
  }
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
    auto ch = std::make_unique<Channel>(std::move(*fd), Trust::kUnauthenticated);
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
  Result<std::unique_ptr<Channel>> ch = Open("test-secret-0123456789abcdef0123");
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
    Result<std::unique_ptr<Channel>> ch = Open("test-secret-0123456789abcdef0123");
    ASSERT_TRUE(ch.ok());
    std::string body;
    Status st = CallRpc(**ch, MsgType::kFetch, "\x01\x02", &body, Deadline::AfterMs(2000));
    EXPECT_EQ(st.code(), DYAD_RC_BADUNPACK);
  }
  {
    // Garbage instead of a frame header: the service answers and hangs up.
    Result<std::unique_ptr<Channel>> ch = Open("test-secret-0123456789abcdef0123");
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
