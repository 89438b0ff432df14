// service_parked_fetch_test.cc: a consume whose owner is slow or silent
// holds no worker of the consuming service (issue 16: "a slow or silent
// peer must never hold a thread").
//
// Real services on loopback: A (rank 0) hosts the store and owns healthy
// files; B (rank 1, two local workers) consumes. Rank 2 is a FakeOwner
// (fake_owner.h: the real handshake, then fetches never answered, or
// answered a few KiB every 30 ms). With one worker held per fetch, B's two
// workers would be taken by the first two fetches from rank 2 and every
// other consume on B would wait for them. The ucx cases (UCX moves the
// bytes off the session, signalling completions on an event fd): a silent
// ucx owner holds no worker of B, and a requester that never offers its
// buffer holds no worker of the owner A.
#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fcntl.h>

#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/fsutil.h"
#include "common/key.h"
#include "proto/auth.h"
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
    testing_services::StopAndRemove(&b_, &a_, &base_);
  }

  // `dtl_mode` is B's (the transport of its fetches); `a_workers` > 0 sets
  // A's worker count.
  void Start(LinkProtection protection, int64_t rpc_timeout_ms, const std::string& dtl_mode = "",
             uint32_t a_workers = 0) {
    base_ = testutil::MakeTempDir("dyad-parked-test.");
    ASSERT_FALSE(base_.empty()) << std::strerror(errno);
    ServiceOptions oa = FirstServiceOptions(base_);
    oa.protection = protection;
    oa.rpc_timeout_ms = rpc_timeout_ms;
    if (a_workers > 0) oa.workers = a_workers;
    a_ = std::make_unique<Service>(oa);
    ASSERT_TRUE(a_->Start().ok());
    ServiceOptions ob = SecondServiceOptions(oa, base_, "embedded://" + a_->tcp_address());
    ob.workers = 2;
    ob.dtl_mode = dtl_mode;
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
    return testing_services::CallConsume(base_ + "/b.sock", req, 30000);
  }

  // A's file, published through A, consumed on B.
  Result<ConsumeReply> ConsumeHealthy(const std::string& upath) {
    Status st = testing_services::WriteAndPublish(base_ + "/a.sock", base_ + "/a", upath, "fine");
    if (!st.ok()) return st;
    return Call(ConsumeRequestOf(upath, cons_, 10000));
  }

  uint64_t Parks() { return b_->stats().Snapshot()["consume.parked_for_owner"]; }

  // Files in the consumer directory (temporaries included).
  std::vector<std::string> ConsumerFiles() { return testutil::NamesIn(cons_); }

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
    // The file being written has no name (O_TMPFILE), or a temporary one
    // where the file system has none.
    EXPECT_LE(ConsumerFiles().size(), 1u) << "the temporary being written";
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
    if (i == 1 || i == 2) {
      EXPECT_TRUE(r->transferred) << "file " << i;
    }
    if (i == 0 || i == 3) transferred_slow0 += r->transferred ? 1 : 0;
    if (r->transferred) {
      EXPECT_EQ(r->bytes, content.size());
    }
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

#ifdef DYAD_HAVE_UCX
}  // namespace
}  // namespace dyad
#include "transport/ucx/ucx_wire.h"
namespace dyad {
namespace {

// B fetches with ucx: four consumes from an owner that answers the fetch
// (the file's size) and then sends nothing. Each fetch's pull has posted
// its receives and offered its buffer, then waits for chunks that never
// come: parked, with the session and the op's wake fd watched. A consume
// from a healthy owner meanwhile completes at once; the silent ones end at
// the idle bound (--rpc-timeout) with nothing left behind.
TEST_F(ParkedFetch, SilentUcxOwnerHoldsNoWorker) {
  Start(LinkProtection::kIntegrity, 3000, "UCX");
  StartFake(FakeOwner::Mode::kReplyThenSilent, LinkProtection::kIntegrity,
            std::string(1u << 20, 'x'));
  std::vector<std::future<Result<ConsumeReply>>> silent;
  for (int i = 0; i < 4; ++i)
    silent.push_back(std::async(std::launch::async, [this, i] {
      return ConsumeFromFake("silent" + std::to_string(i), 1u << 20);
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
    EXPECT_NE(r.status().message().find("ucx pull"), std::string::npos) << r.status().ToString();
  }
  EXPECT_EQ(ConsumerFiles(), std::vector<std::string>{"healthy"});
}

// A peer (rank 7) that asks A for a file over ucx, takes the reply, and
// then never offers its receive buffer; returns what A said next and when.
struct StalledAsk {
  Status st;          // how the session ended (A's kError, or closed)
  uint64_t ended_ns;  // MonoNs() when it did
};
StalledAsk AskAndStall(const std::string& address, const std::string& upath,
                       std::atomic<int>* replied) {
  StalledAsk out{Status::OK(), 0};
  Result<SocketAddress> addr = ParseAddress(address);
  Result<UniqueFd> fd =
      addr.ok() ? Connect(*addr, Deadline::AfterMs(2000)) : Result<UniqueFd>(addr.status());
  if (!fd.ok()) return {fd.status(), MonoNs()};
  Channel ch(std::move(*fd), Trust::kUnauthenticated);
  AuthConfig cfg;
  cfg.secret = "test-secret-0123456789abcdef0123";
  PeerIdentity a;
  Status st = Authenticator(cfg).Connect(ch, PeerIdentity{7, 0x77}, Deadline::AfterMs(3000), &a);
  if (!st.ok()) return {st, MonoNs()};
  FetchRequest req;
  req.upath = upath;
  req.transport = "ucx";
  // Decodable arguments (the owner reads them before the offer); the
  // worker address is never used, since no offer comes.
  req.transport_args = ucx::EncodeRequestArgs({"no-worker", "fake-host"});
  Encoder e;
  req.EncodeTo(e);
  st = ch.SendFrame(static_cast<uint16_t>(MsgType::kFetch), e.data(), Deadline::AfterMs(2000));
  uint16_t type = 0;
  std::string payload;
  if (st.ok()) st = ch.RecvFrame(&type, &payload, Deadline::AfterMs(3000));
  Status reply;
  std::string body;
  if (st.ok() && !DecodeReply(payload, &reply, &body)) st = Status(DYAD_RC_BADUNPACK, "bad reply");
  if (st.ok()) st = reply;
  if (!st.ok()) return {st, MonoNs()};
  ++*replied;
  // Silent from now on; wait (bounded) for A to give up.
  st = ch.RecvFrame(&type, &payload, Deadline::AfterMs(15000));
  if (st.ok()) st = Status(DYAD_RC_BADFETCH, "frame type " + std::to_string(type));
  return {st, MonoNs()};
}

// A (two workers) serves four ucx fetches whose requester never offers its
// buffer: each push waits for the offer parked, holding no worker of A
// (fetch.parked_for_peer); B's consume of another file of A meanwhile
// completes at once; A ends each stalled push at its idle bound
// (--rpc-timeout), telling the requester.
TEST_F(ParkedFetch, RequesterThatNeverOffersHoldsNoOwnerWorker) {
  Start(LinkProtection::kIntegrity, 2000, "", /*a_workers=*/2);
  {
    UniqueFd w(::open((base_ + "/a/big").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    ASSERT_TRUE(w.valid());
    ASSERT_TRUE(WriteFully(w.get(), std::string(1u << 20, 'b').data(), 1u << 20).ok());
  }
  std::atomic<int> replied{0};
  const uint64_t t_start = MonoNs();
  std::vector<std::future<StalledAsk>> asks;
  for (int i = 0; i < 4; ++i)
    asks.push_back(std::async(std::launch::async, [this, &replied] {
      return AskAndStall(a_->tcp_address(), "big", &replied);
    }));
  auto parked = [&] { return a_->stats().Snapshot()["fetch.parked_for_peer"]; };
  EXPECT_TRUE(Eventually([&] { return replied.load() == 4; }, 3000)) << replied.load();
  EXPECT_TRUE(Eventually([&] { return parked() >= 4; }, 2000)) << parked() << " parked";
  const uint64_t t0 = MonoNs();
  Result<ConsumeReply> fine = ConsumeHealthy("healthy");
  ASSERT_TRUE(fine.ok()) << fine.status().ToString();
  EXPECT_EQ(ReadAll(cons_ + "/healthy"), "fine");
  EXPECT_LT(MonoNs() - t0, 1000000000u) << "the healthy consume waited for a stalled push";
  for (auto& f : asks) {
    StalledAsk r = f.get();
    EXPECT_FALSE(r.st.ok());
    // A's kError frame (ucx's own type) or the closed session, at the bound.
    EXPECT_TRUE(r.st.code() == DYAD_RC_BADFETCH || r.st.code() == DYAD_RC_CONNLOST)
        << r.st.ToString();
    EXPECT_LT(r.ended_ns - t_start, 6000000000u) << "A held the stalled push past its bound";
  }
}
#endif  // DYAD_HAVE_UCX

}  // namespace
}  // namespace dyad
