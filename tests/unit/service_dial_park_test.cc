// service_dial_park_test.cc: taking a new session to an owner holds no
// worker of the requesting service, and one dial per owner is made at a
// time (issue 16: "a slow or silent peer must never hold a thread").
//
// Real services on loopback: A (rank 0) hosts the store and owns a healthy
// file; B (rank 1, two local workers) consumes. Rank 2 is a StuckOwner
// (stuck_owner.h): accepts TCP connections but never sends the handshake's
// challenge (a hung service), or a listening socket whose full accept queue
// drops SYNs (connects never complete), or the real handshake with another
// cluster secret. With a worker held per dial, B's two workers would be
// taken by the first two consumes of rank 2's files and every other
// consume on B would wait up to --rpc-timeout.
#include <dirent.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/fsutil.h"
#include "common/net.h"
#include "kvs/kvs.h"
#include "proto/auth.h"
#include "proto/protocol.h"
#include "service/peer_dial.h"
#include "service/peer_waits.h"
#include "service/peers.h"
#include "service/service.h"
#include "unit/service_pair.h"
#include "unit/stuck_owner.h"

namespace dyad {
namespace {

using testing_services::CallLocal;
using testing_services::ConsumeRequestOf;
using testing_services::Eventually;
using testing_services::FirstServiceOptions;
using testing_services::ReadAll;
using testing_services::SecondServiceOptions;
using testing_services::StuckOwner;

constexpr uint32_t kStuckRank = 2;

class DialPark : public ::testing::Test {
 protected:
  void TearDown() override {
    stuck_.reset();
    testing_services::StopAndRemove(&b_, &a_, &base_);
  }

  void Start(StuckOwner::Mode mode, int64_t rpc_timeout_ms) {
    base_ = testutil::MakeTempDir("dyad-dial-test.");
    ASSERT_FALSE(base_.empty()) << std::strerror(errno);
    ServiceOptions oa = FirstServiceOptions(base_);
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
    stuck_ = std::make_unique<StuckOwner>(kStuckRank, mode);
    Status st = stuck_->Start(a_->tcp_address());
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  // A consume on B of `upath` as rank 2's file (the record given, as
  // dyad_consume_w_metadata does).
  ConsumeRequest StuckRequest(const std::string& upath) {
    ConsumeRequest req = ConsumeRequestOf(upath, cons_, 30000);
    req.have_record = true;
    req.record.owner_rank = kStuckRank;
    req.record.owner_incarnation = StuckOwner::kIncarnation;
    req.record.upath = upath;
    req.record.size = 100;
    req.record.version = 1;
    return req;
  }

  Result<ConsumeReply> Call(const ConsumeRequest& req) {
    return testing_services::CallConsume(base_ + "/b.sock", req, 30000);
  }

  std::future<Result<ConsumeReply>> ConsumeStuckAsync(const std::string& upath) {
    return std::async(std::launch::async, [this, upath] { return Call(StuckRequest(upath)); });
  }

  // A consume of rank 2's file on a connection of its own, left waiting.
  std::unique_ptr<Channel> SendStuckConsume(const std::string& upath) {
    Result<SocketAddress> addr = ParseAddress("unix:" + base_ + "/b.sock");
    Result<UniqueFd> fd = Connect(*addr, Deadline::AfterMs(2000));
    if (!fd.ok()) return nullptr;
    auto ch = std::make_unique<Channel>(std::move(*fd), Trust::kUnauthenticated);
    if (!TrustLocalService(*ch).ok()) return nullptr;
    Encoder e;
    StuckRequest(upath).EncodeTo(e);
    const Status st =
        ch->SendFrame(static_cast<uint16_t>(MsgType::kConsume), e.data(), Deadline::AfterMs(2000));
    return st.ok() ? std::move(ch) : nullptr;
  }

  // A's file, published through A, consumed on B.
  Result<ConsumeReply> ConsumeHealthy(const std::string& upath) {
    Status st = testing_services::WriteAndPublish(base_ + "/a.sock", base_ + "/a", upath, "fine");
    if (!st.ok()) return st;
    return Call(ConsumeRequestOf(upath, cons_, 10000));
  }

  uint64_t Parks() { return b_->stats().Snapshot()["consume.parked_for_owner"]; }

  // A counter of B's `dyad status` (UINT64_MAX: absent or no answer).
  uint64_t StatusCounter(const std::string& name) {
    Result<std::string> body = CallLocal(base_ + "/b.sock", MsgType::kStatus, std::string(), 5000);
    if (!body.ok()) return UINT64_MAX;
    StatusReply r;
    Decoder d(*body);
    if (!r.DecodeFrom(d)) return UINT64_MAX;
    auto it = r.counters.find(name);
    return it == r.counters.end() ? UINT64_MAX : it->second;
  }

  std::vector<std::string> ConsumerFiles() { return testutil::NamesIn(cons_); }

  // The healthy consume completes while rank 2's consumes wait.
  void ExpectHealthyConsumeIsPrompt() {
    const uint64_t t0 = MonoNs();
    Result<ConsumeReply> fine = ConsumeHealthy("healthy");
    ASSERT_TRUE(fine.ok()) << fine.status().ToString();
    EXPECT_TRUE(fine->transferred);
    EXPECT_EQ(ReadAll(cons_ + "/healthy"), "fine");
    EXPECT_LT(MonoNs() - t0, 1500000000u) << "the healthy consume waited for the stuck owner";
  }

  std::string base_, cons_;
  std::unique_ptr<Service> a_, b_;
  std::unique_ptr<StuckOwner> stuck_;
};

// Four consumes of a hung owner's files on two workers: one connection to
// it (the others wait for that dial's outcome), all four parked, a healthy
// consume meanwhile at once; all four fail with the dial's timeout at
// --rpc-timeout, and the connection is closed.
TEST_F(DialPark, HungOwnerHoldsNoWorkerAndIsDialledOnce) {
  constexpr int64_t kRpcMs = 3000;  // well past the healthy consume's bound
  Start(StuckOwner::Mode::kNoChallenge, kRpcMs);
  const uint64_t t0 = MonoNs();
  std::vector<std::future<Result<ConsumeReply>>> hung;
  for (int i = 0; i < 4; ++i) hung.push_back(ConsumeStuckAsync("hung" + std::to_string(i)));
  EXPECT_TRUE(Eventually([&] { return Parks() >= 4; }, 1000)) << Parks() << " parked";
  EXPECT_EQ(stuck_->accepted(), 1) << "one dial at a time to an owner";
  EXPECT_EQ(StatusCounter("peers.dialing"), 1u);
  EXPECT_EQ(StatusCounter("peers.waiting_on_dial"), 3u);
  ExpectHealthyConsumeIsPrompt();
  for (auto& f : hung) {
    Result<ConsumeReply> r = f.get();
    ASSERT_FALSE(r.ok());
    const std::string msg = r.status().ToString();
    EXPECT_EQ(r.status().code(), DYAD_RC_TIMEOUT) << msg;
    EXPECT_NE(msg.find("connect to dyad-service rank 2 at " + stuck_->address), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("challenge"), std::string::npos) << msg;
  }
  EXPECT_LT(MonoNs() - t0, static_cast<uint64_t>(kRpcMs + 1500) * 1000000u)
      << "the waiters did not share the dial's outcome";
  EXPECT_EQ(stuck_->accepted(), 1);
  EXPECT_TRUE(Eventually([&] { return stuck_->open() == 0; }, 2000)) << "connection left open";
  EXPECT_EQ(StatusCounter("peers.dialing"), 0u);
  EXPECT_EQ(StatusCounter("peers.waiting_on_dial"), 0u);
  EXPECT_EQ(ConsumerFiles(), std::vector<std::string>{"healthy"});
}

// An address whose SYNs are dropped: the connect itself parks.
TEST_F(DialPark, UnansweredConnectHoldsNoWorker) {
  constexpr int64_t kRpcMs = 3000;
  Start(StuckOwner::Mode::kBlackHole, kRpcMs);
  std::vector<std::future<Result<ConsumeReply>>> hung;
  for (int i = 0; i < 3; ++i) hung.push_back(ConsumeStuckAsync("void" + std::to_string(i)));
  EXPECT_TRUE(Eventually([&] { return Parks() >= 3; }, 1000)) << Parks() << " parked";
  ExpectHealthyConsumeIsPrompt();
  for (auto& f : hung) {
    Result<ConsumeReply> r = f.get();
    ASSERT_FALSE(r.ok());
    const std::string msg = r.status().ToString();
    EXPECT_EQ(r.status().code(), DYAD_RC_TIMEOUT) << msg;
    EXPECT_NE(msg.find("connect to dyad-service rank 2 at " + stuck_->address), std::string::npos)
        << msg;
  }
  EXPECT_EQ(ConsumerFiles(), std::vector<std::string>{"healthy"});
}

// Requesters that hang up while parked in a dial: the one dialling closes
// its connection at once and the one waiting for it dials next; when that
// one hangs up too, nothing is left open or counted.
TEST_F(DialPark, HangupWhileDiallingClosesTheConnection) {
  Start(StuckOwner::Mode::kNoChallenge, 20000);
  std::unique_ptr<Channel> first = SendStuckConsume("gone1");
  ASSERT_NE(first, nullptr);
  ASSERT_TRUE(Eventually([&] { return Parks() >= 1 && stuck_->accepted() == 1; }, 3000));
  std::unique_ptr<Channel> second = SendStuckConsume("gone2");
  ASSERT_NE(second, nullptr);
  ASSERT_TRUE(Eventually([&] { return StatusCounter("peers.waiting_on_dial") == 1; }, 3000));
  EXPECT_TRUE(Eventually([&] { return Parks() >= 2; }, 3000));
  EXPECT_EQ(stuck_->accepted(), 1);
  first.reset();  // hangs up
  EXPECT_TRUE(Eventually([&] { return stuck_->accepted() == 2 && stuck_->open() == 1; }, 3000))
      << "accepted " << stuck_->accepted() << ", open " << stuck_->open();
  EXPECT_EQ(StatusCounter("peers.waiting_on_dial"), 0u);
  EXPECT_EQ(StatusCounter("peers.dialing"), 1u);
  second.reset();
  EXPECT_TRUE(Eventually([&] { return stuck_->open() == 0; }, 3000)) << "connection left open";
  EXPECT_TRUE(Eventually([&] { return StatusCounter("peers.dialing") == 0; }, 3000));
  EXPECT_TRUE(Eventually([&] { return ConsumerFiles().empty(); }, 3000));
}

// Dials from two threads (each runs DialPeer to its end) share the rule:
// one connection to the hung owner for two callers, both failing at the
// dial's bound.
TEST_F(DialPark, DialsFromTwoThreadsShareOne) {
  Start(StuckOwner::Mode::kNoChallenge, 1000);
  KvsOptions o;
  o.secret = "test-secret-0123456789abcdef0123";
  o.self_rank = 7;
  Result<std::unique_ptr<Kvs>> kvs = OpenKvs("embedded://" + a_->tcp_address(), o);
  ASSERT_TRUE(kvs.ok()) << kvs.status().ToString();
  Authenticator auth("test-secret-0123456789abcdef0123");
  PeerDirectory peers(kvs->get(), &auth, PeerIdentity{7, 1}, 1000);
  // The blocking caller's dial runs on a runtime, which ends before the
  // store whose pooled link waited on its loop.
  Runtime rt(2, 1000);
  ASSERT_TRUE(rt.Start().ok());
  peers.SetRuntime(&rt);
  const uint64_t t0 = MonoNs();
  auto acquire = [&] {
    PeerWaits waits(rt, &rt.stopping(), nullptr);
    return rt.RunSync(DialPeer(peers, kStuckRank, Deadline::AfterMs(5000), waits)).status();
  };
  auto one = std::async(std::launch::async, acquire);
  auto two = std::async(std::launch::async, acquire);
  for (Status st : {one.get(), two.get()}) {
    EXPECT_EQ(st.code(), DYAD_RC_TIMEOUT) << st.ToString();
    EXPECT_NE(st.message().find("connect to dyad-service rank 2"), std::string::npos)
        << st.ToString();
  }
  EXPECT_LT(MonoNs() - t0, 2500000000u);
  EXPECT_EQ(stuck_->accepted(), 1);
  EXPECT_EQ(peers.dials_in_flight(), 0u);
  EXPECT_EQ(peers.waiting_on_dial(), 0u);
}

// A hand-made owner on loopback that answers each connection with
// `answer` (on its fd; returning closes it), and ConnectPeer's dial of it.
struct RedialOwner {
  std::atomic<int> accepted{0};
  uint64_t took_ms = 0;
  bool stopped = false;

  Result<std::unique_ptr<Channel>> Dial(const std::function<void(UniqueFd)>& answer,
                                        int64_t deadline_ms) {
    SocketAddress at;
    at.host = "127.0.0.1";
    at.port = 0;
    Result<UniqueFd> listener = Listen(at);
    if (!listener.ok()) return listener.status();
    Result<SocketAddress> bound = BoundAddress(listener->get());
    if (!bound.ok()) return bound.status();
    std::atomic<bool> done{false};
    std::thread owner([&] {
      while (!done.load()) {
        Result<UniqueFd> fd = Accept(listener->get(), Deadline::AfterMs(50));
        if (!fd.ok()) continue;
        ++accepted;
        answer(std::move(*fd));
      }
    });
    Authenticator auth("test-secret-0123456789abcdef0123");
    PeerDirectory peers(nullptr, &auth, PeerIdentity{7, 1}, 1000);
    Runtime rt(1, 1000);
    Status started = rt.Start();
    peers.SetRuntime(&rt);
    PeerWaits waits(rt, &rt.stopping(), nullptr);
    PeerIdentity peer;
    const uint64_t t0 = MonoNs();
    Result<std::unique_ptr<Channel>> ch =
        started.ok() ? rt.RunSync(ConnectPeer(peers, *bound, Deadline::AfterMs(deadline_ms), waits,
                                              &peer, &stopped))
                     : Result<std::unique_ptr<Channel>>(started);
    took_ms = (MonoNs() - t0) / 1000000;
    done.store(true);
    owner.join();
    return ch;
  }
};

// An owner under a flood of connections that never authenticate closes
// the oldest handshakes to make room (docs/security.md): a handshake it
// cut is made again a few times, so that the flood slows a new session
// rather than failing it; an owner that always hangs up still fails the
// dial, in well under a second.
TEST(Redial, AHandshakeTheOwnerCutsIsMadeAgainAFewTimes) {
  RedialOwner o;
  // Closed at once: the handshake is cut.
  Result<std::unique_ptr<Channel>> ch = o.Dial([](UniqueFd) {}, 10000);
  EXPECT_EQ(ch.status().code(), DYAD_RC_CONNLOST) << ch.status().ToString();
  EXPECT_FALSE(o.stopped);
  EXPECT_EQ(o.accepted.load(), 6) << "one handshake and five more";
  EXPECT_LT(o.took_ms, 1500u);
}

// An owner that says it is busy (at its cap of handshakes, closing ours to
// make room) is dialled again, with pauses of at most 160 ms, until the
// dial's deadline: a flood delays a new session rather than fails it, and
// the error at the end says why.
TEST(Redial, AnOwnerThatSaysItIsBusyIsDialledAgainUntilTheDeadline) {
  RedialOwner o;
  Result<std::unique_ptr<Channel>> ch = o.Dial(
      [](UniqueFd fd) {
        Channel busy(std::move(fd), Trust::kUnauthenticated);
        (void)busy.SendFrame(static_cast<uint16_t>(MsgType::kReply), EncodeReply(HandshakeBusy()),
                             Deadline::AfterMs(1000));
      },
      2000);
  EXPECT_TRUE(IsHandshakeBusy(ch.status())) << ch.status().ToString();
  EXPECT_FALSE(o.stopped);
  // 10+20+40+80 ms, then 160 ms each: about 13 attempts in 2 s.
  EXPECT_GE(o.accepted.load(), 9) << "dialled again past the five redials of a silent cut";
  EXPECT_GE(o.took_ms, 1700u);
  EXPECT_LT(o.took_ms, 2600u);
}

// Dials alongside a flight are bounded per owner and counted in the
// peers.dialing gauge while they last.
TEST(DialAlone, AtMostThreePerOwnerAndCountedWhileTheyLast) {
  Authenticator auth("test-secret-0123456789abcdef0123");
  PeerDirectory peers(nullptr, &auth, PeerIdentity{7, 1}, 1000);
  for (int i = 0; i < PeerDirectory::kMaxDialsAlone; ++i) EXPECT_TRUE(peers.BeginDialAlone(2));
  EXPECT_FALSE(peers.BeginDialAlone(2)) << "a fourth dial alongside";
  EXPECT_TRUE(peers.BeginDialAlone(3)) << "another owner has its own bound";
  EXPECT_EQ(peers.dials_in_flight(), static_cast<uint64_t>(PeerDirectory::kMaxDialsAlone) + 1);
  peers.EndDialAlone(3);
  for (int i = 0; i < PeerDirectory::kMaxDialsAlone; ++i) peers.EndDialAlone(2);
  EXPECT_EQ(peers.dials_in_flight(), 0u);
  EXPECT_TRUE(peers.BeginDialAlone(2));
  peers.EndDialAlone(2);
}

// A peer with another cluster secret: DYAD_RC_AUTH, naming the setting.
TEST_F(DialPark, WrongSecretSaysWhichSetting) {
  Start(StuckOwner::Mode::kWrongSecret, 3000);
  Result<ConsumeReply> r = Call(StuckRequest("secret"));
  ASSERT_FALSE(r.ok());
  const std::string msg = r.status().ToString();
  EXPECT_EQ(r.status().code(), DYAD_RC_AUTH) << msg;
  EXPECT_NE(msg.find("authenticate with rank 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--secret-file"), std::string::npos) << msg;
}

}  // namespace
}  // namespace dyad

namespace dyad {
namespace {

// A publication of a file whose previous version is rank 2's tells rank 2
// before it returns (a version notice, docs/consistency.md). With rank 2
// hung, four such publications on B (two workers) park while they wait for
// it, a healthy consume and a plain publication on B go on at once, and
// each of the four returns (the notice is logged and skipped) near
// --rpc-timeout, over one connection to rank 2.
TEST_F(DialPark, VersionNoticeToHungOwnerHoldsNoWorker) {
  constexpr int64_t kRpcMs = 3000;
  Start(StuckOwner::Mode::kNoChallenge, kRpcMs);
  KvsOptions o;
  o.secret = "test-secret-0123456789abcdef0123";
  o.self_rank = 9;
  Result<std::unique_ptr<Kvs>> kvs = OpenKvs("embedded://" + a_->tcp_address(), o);
  ASSERT_TRUE(kvs.ok()) << kvs.status().ToString();
  // B learns that rank 2 owns the current version of old0..old3.
  for (int i = 0; i < 4; ++i) {
    const std::string upath = "old" + std::to_string(i);
    FileRecord rec;
    rec.owner_rank = kStuckRank;
    rec.owner_incarnation = StuckOwner::kIncarnation;
    rec.upath = upath;
    rec.size = 3;
    rec.version = 1;
    rec.published_ns = WallNs();
    ASSERT_TRUE((*kvs)->Put("t", GenPathKey(upath, 3, 1024), rec.Encode()).ok());
    LocateRequest lr;
    lr.ns = "t";
    lr.key = GenPathKey(upath, 3, 1024);
    Encoder e;
    lr.EncodeTo(e);
    Result<std::string> found = CallLocal(base_ + "/b.sock", MsgType::kLocate, e.data(), 5000);
    ASSERT_TRUE(found.ok()) << found.status().ToString();
  }
  const uint64_t t0 = MonoNs();
  std::vector<std::future<Status>> rewrites;
  for (int i = 0; i < 4; ++i) {
    rewrites.push_back(std::async(std::launch::async, [this, i] {
      return testing_services::WriteAndPublish(base_ + "/b.sock", base_ + "/b",
                                               "old" + std::to_string(i), "new");
    }));
  }
  auto notice_parks = [&] { return b_->stats().Snapshot()["notices.parked_for_peer"]; };
  EXPECT_TRUE(Eventually([&] { return notice_parks() >= 4; }, 2000)) << notice_parks();
  const uint64_t t1 = MonoNs();
  ASSERT_TRUE(
      testing_services::WriteAndPublish(base_ + "/b.sock", base_ + "/b", "plain", "x").ok());
  EXPECT_LT(MonoNs() - t1, 1000000000u) << "a plain publication waited for the hung owner";
  ExpectHealthyConsumeIsPrompt();
  for (auto& f : rewrites) EXPECT_TRUE(f.get().ok());
  EXPECT_LT(MonoNs() - t0, static_cast<uint64_t>(kRpcMs + 1500) * 1000000u)
      << "the notices did not share the dial's outcome";
  EXPECT_EQ(stuck_->accepted(), 1) << "one dial at a time to an owner";
  EXPECT_TRUE(Eventually([&] { return stuck_->open() == 0; }, 2000)) << "connection left open";
}

}  // namespace
}  // namespace dyad
