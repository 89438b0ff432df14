// service_parked_fetch_test.cc: a consume whose owner is slow or silent
// holds no worker of the consuming service (issue 16: "a slow or silent
// peer must never hold a thread").
//
// Real services on loopback: A (rank 0) hosts the store and owns healthy
// files; B (rank 1, two local workers) consumes. Rank 2 is a FakeOwner
// (fake_owner.h: the real handshake, then fetches never answered, or
// answered a few KiB every 30 ms). With one worker held per fetch, B's two
// workers would be taken by the first two fetches from rank 2 and every
// other consume on B would wait for them.
#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/fsutil.h"
#include "common/key.h"
#include "proto/protocol.h"
#include "service/service.h"
#include "unit/fake_owner.h"
#include "unit/service_pair.h"

namespace dyad {
namespace {

using testing_services::CallLocal;
using testing_services::ConsumeRequestOf;
using testing_services::Eventually;
using testing_services::FakeOwner;
using testing_services::FirstServiceOptions;
using testing_services::ReadAll;
using testing_services::SecondServiceOptions;

constexpr uint32_t kFakeRank = 2;

class ParkedFetch : public ::testing::Test {
 protected:
  void TearDown() override {
    fake_.reset();
    if (b_) b_->Stop();
    if (a_) a_->Stop();
    b_.reset();
    a_.reset();
    if (!base_.empty()) {
      const std::string cmd = "rm -rf '" + base_ + "'";
      if (system(cmd.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", base_.c_str());
    }
  }

  void Start(LinkProtection protection, int64_t rpc_timeout_ms) {
    char tmpl[] = "/tmp/dyad-parked-test.XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    base_ = tmpl;
    ServiceOptions oa = FirstServiceOptions(base_);
    oa.protection = protection;
    oa.rpc_timeout_ms = rpc_timeout_ms;
    a_ = std::make_unique<Service>(oa);
    ASSERT_TRUE(a_->Start().ok());
    ServiceOptions ob = SecondServiceOptions(oa, base_, "embedded://" + a_->tcp_address());
    ob.workers = 2;
    b_ = std::make_unique<Service>(ob);
    ASSERT_TRUE(b_->Start().ok());
    cons_ = base_ + "/cons";
    ASSERT_EQ(::mkdir(cons_.c_str(), 0755), 0);
    cons_ = CanonicalPath(cons_);
  }

  void StartFake(FakeOwner::Mode mode, LinkProtection protection, std::string content = {}) {
    fake_ = std::make_unique<FakeOwner>(kFakeRank, mode, protection, std::move(content));
    Status st = fake_->Start(a_->tcp_address());
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  // A consume on B of `upath` as rank 2's file of `size` bytes (the
  // record given, as dyad_consume_w_metadata does).
  Result<ConsumeReply> ConsumeFromFake(const std::string& upath, uint64_t size) {
    ConsumeRequest req = ConsumeRequestOf(upath, cons_, 20000);
    req.have_record = true;
    req.record.owner_rank = kFakeRank;
    req.record.owner_incarnation = FakeOwner::kIncarnation;
    req.record.upath = upath;
    req.record.size = size;
    req.record.version = FakeOwner::kVersion;
    return Call(req);
  }

  Result<ConsumeReply> Call(const ConsumeRequest& req) {
    Encoder e;
    req.EncodeTo(e);
    Result<std::string> body = CallLocal(base_ + "/b.sock", MsgType::kConsume, e.data(), 30000);
    if (!body.ok()) return body.status();
    ConsumeReply r;
    Decoder d(*body);
    if (!r.DecodeFrom(d)) return Status(DYAD_RC_BADUNPACK, "bad consume reply");
    return r;
  }

  // A's file, published through A, consumed on B.
  Result<ConsumeReply> ConsumeHealthy(const std::string& upath) {
    Status st = testing_services::WriteAndPublish(base_ + "/a.sock", base_ + "/a", upath, "fine");
    if (!st.ok()) return st;
    return Call(ConsumeRequestOf(upath, cons_, 10000));
  }

  uint64_t Parks() { return b_->stats().Snapshot()["consume.parked_for_owner"]; }

  // Files in the consumer directory (temporaries included).
  std::vector<std::string> ConsumerFiles() {
    std::vector<std::string> out;
    DIR* d = ::opendir(cons_.c_str());
    if (d == nullptr) return out;
    while (dirent* e = ::readdir(d)) {
      const std::string n = e->d_name;
      if (n != "." && n != "..") out.push_back(n);
    }
    ::closedir(d);
    return out;
  }

  std::string base_, cons_;
  std::unique_ptr<Service> a_, b_;
  std::unique_ptr<FakeOwner> fake_;
};

// Four consumes from a silent owner, two workers: all four reach the owner
// at once (each parked), a consume from a healthy owner meanwhile completes
// at once, and the silent ones end at their bound (--rpc-timeout) with a
// clear error and nothing left in the consumer directory.
TEST_F(ParkedFetch, SilentOwnerHoldsNoWorker) {
  Start(LinkProtection::kIntegrity, 3000);
  StartFake(FakeOwner::Mode::kSilent, LinkProtection::kIntegrity);
  std::vector<std::future<Result<ConsumeReply>>> silent;
  for (int i = 0; i < 4; ++i)
    silent.push_back(std::async(std::launch::async, [this, i] {
      return ConsumeFromFake("silent" + std::to_string(i), 100);
    }));
  EXPECT_TRUE(Eventually([&] { return fake_->fetches.load() == 4; }, 2500))
      << "fetches that reached the silent owner: " << fake_->fetches.load();
  EXPECT_TRUE(Eventually([&] { return Parks() >= 4; }, 2000)) << Parks() << " parked";
  const uint64_t t0 = MonoNs();
  Result<ConsumeReply> fine = ConsumeHealthy("healthy");
  ASSERT_TRUE(fine.ok()) << fine.status().ToString();
  EXPECT_TRUE(fine->transferred);
  EXPECT_EQ(ReadAll(cons_ + "/healthy"), "fine");
  EXPECT_LT(MonoNs() - t0, 1500000000u) << "the healthy consume waited for the silent owner";
  for (auto& f : silent) {
    Result<ConsumeReply> r = f.get();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), DYAD_RC_TIMEOUT) << r.status().ToString();
    EXPECT_NE(r.status().message().find("no reply from the owner"), std::string::npos)
        << r.status().ToString();
  }
  EXPECT_EQ(ConsumerFiles(), std::vector<std::string>{"healthy"});
}

// Consumes of a file another consume is fetching from a silent owner wait
// for that transfer without a worker too, and share its end.
TEST_F(ParkedFetch, JoinersOfASilentTransferHoldNoWorker) {
  Start(LinkProtection::kIntegrity, 3000);
  StartFake(FakeOwner::Mode::kSilent, LinkProtection::kIntegrity);
  std::vector<std::future<Result<ConsumeReply>>> waiting;
  for (int i = 0; i < 3; ++i)
    waiting.push_back(
        std::async(std::launch::async, [this] { return ConsumeFromFake("shared", 100); }));
  EXPECT_TRUE(Eventually([&] { return Parks() >= 3; }, 2500)) << Parks() << " parked";
  EXPECT_EQ(fake_->fetches.load(), 1);  // one transfer for the three
  const uint64_t t0 = MonoNs();
  Result<ConsumeReply> fine = ConsumeHealthy("healthy");
  ASSERT_TRUE(fine.ok()) << fine.status().ToString();
  EXPECT_LT(MonoNs() - t0, 1500000000u) << "the healthy consume waited for the joiners";
  for (auto& f : waiting) {
    Result<ConsumeReply> r = f.get();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), DYAD_RC_TIMEOUT) << r.status().ToString();
  }
  EXPECT_EQ(b_->stats().Get(ServiceStats::kConsumeJoined), 2u);
  EXPECT_EQ(ConsumerFiles(), std::vector<std::string>{"healthy"});
}

// A requester that hangs up while its fetch is parked ends the fetch: the
// owner's session is closed, the temporary removed, nothing stays parked.
TEST_F(ParkedFetch, HangupWhileParkedEndsTheFetch) {
  Start(LinkProtection::kIntegrity, 20000);
  StartFake(FakeOwner::Mode::kSilent, LinkProtection::kIntegrity);
  Result<SocketAddress> addr = ParseAddress("unix:" + base_ + "/b.sock");
  ASSERT_TRUE(addr.ok());
  Result<UniqueFd> fd = Connect(*addr, Deadline::AfterMs(2000));
  ASSERT_TRUE(fd.ok());
  {
    Channel ch(std::move(*fd), Trust::kUnauthenticated);
    ASSERT_TRUE(TrustLocalService(ch).ok());
    ConsumeRequest req = ConsumeRequestOf("gone", cons_, 20000);
    req.have_record = true;
    req.record.owner_rank = kFakeRank;
    req.record.owner_incarnation = FakeOwner::kIncarnation;
    req.record.upath = "gone";
    req.record.size = 100;
    req.record.version = FakeOwner::kVersion;
    Encoder e;
    req.EncodeTo(e);
    ASSERT_TRUE(
        ch.SendFrame(static_cast<uint16_t>(MsgType::kConsume), e.data(), Deadline::AfterMs(2000))
            .ok());
    ASSERT_TRUE(Eventually([&] { return Parks() >= 1; }, 3000));
    EXPECT_EQ(ConsumerFiles().size(), 1u) << "the temporary being written";
  }  // hangs up
  EXPECT_TRUE(Eventually([&] { return fake_->hung_up.load() == 1; }, 3000))
      << "the owner's session stayed open";
  EXPECT_TRUE(Eventually([&] { return ConsumerFiles().empty(); }, 3000));
  Result<ConsumeReply> fine = ConsumeHealthy("after");
  ASSERT_TRUE(fine.ok()) << fine.status().ToString();
  EXPECT_EQ(fake_->fetches.load(), 1);
}

class TrickledFetch : public ParkedFetch, public ::testing::WithParamInterface<LinkProtection> {};

// An owner that sends a few KiB every 30 ms: three such fetches at once on
// two workers (each parks between pieces), every file intact, for each
// protection of the session (raw stream, sealed frames, encrypted frames).
TEST_P(TrickledFetch, ArrivesIntactWithoutHoldingWorkers) {
  const LinkProtection protection = GetParam();
  Start(protection, 5000);
  std::string content(96u << 10, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>((i * 131 + 7) % 251);
  StartFake(FakeOwner::Mode::kTrickle, protection, content);
  std::vector<std::future<Result<ConsumeReply>>> slow;
  for (int i = 0; i < 3; ++i)
    slow.push_back(std::async(std::launch::async, [this, i, &content] {
      return ConsumeFromFake("slow" + std::to_string(i), content.size());
    }));
  // A second consume of slow0: joins its transfer (or, should it come
  // late, finds the copy in place).
  auto again = std::async(std::launch::async,
                          [this, &content] { return ConsumeFromFake("slow0", content.size()); });
  // Of the two consumes of slow0, whichever came first transferred it.
  int transferred_slow0 = 0;
  for (int i = 0; i < 4; ++i) {
    Result<ConsumeReply> r = i < 3 ? slow[i].get() : again.get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (i == 1 || i == 2) EXPECT_TRUE(r->transferred) << "file " << i;
    if (i == 0 || i == 3) transferred_slow0 += r->transferred ? 1 : 0;
    if (r->transferred) EXPECT_EQ(r->bytes, content.size());
    const std::string name = "slow" + std::to_string(i % 3);
    EXPECT_TRUE(ReadAll(cons_ + "/" + name) == content) << name;
  }
  EXPECT_EQ(transferred_slow0, 1);
  EXPECT_EQ(fake_->fetches.load(), 3);
  EXPECT_EQ(fake_->max_active.load(), 3) << "a fetch waited for a worker another one held";
  EXPECT_GE(Parks(), 3u);
}

INSTANTIATE_TEST_SUITE_P(Protections, TrickledFetch,
                         ::testing::Values(LinkProtection::kNone, LinkProtection::kIntegrity,
                                           LinkProtection::kEncrypt),
                         [](const ::testing::TestParamInfo<LinkProtection>& info) {
                           return std::string(info.param == LinkProtection::kNone ? "plain"
                                              : info.param == LinkProtection::kIntegrity
                                                  ? "integrity"
                                                  : "encrypt");
                         });

}  // namespace
}  // namespace dyad
