// transport_ofi_op_test.cc: the "ofi" transfer as coroutines (Pull, Push)
// on one runtime. Both ends of a transfer run on the runtime's one loop
// thread, so neither may hold it while it waits on its peer; the
// requester's completions wake it (a transfer of many chunks does not wait
// for the slices its waits are cut into). A peer that goes silent, hangs
// up, or whose end is stopped (its Stop fired: the requester hung up, the
// service stops) ends the other end promptly with a clear error (TIMEOUT
// within the idle bound, CONNLOST, the Stop's reason), the session broken
// and the peer told; a transfer waiting for the only registered buffer is
// woken when it is given back; a transfer whose coroutine is destroyed
// while it waits (the runtime went away) still gives back what it held.
// After every failure the pools' counters show every buffer back, and the
// next transfer, with one buffer per pool, works.
//
// Runs over FI_PROVIDER=tcp (tcp;ofi_rxm) unless the environment chooses
// (tests/CMakeLists.txt runs it once more with FI_PROVIDER=shm).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/net.h"
#include "common/runtime.h"
#include "transport/transport.h"
#include "util.h"

#ifdef DYAD_HAVE_OFI
#include "transport/ofi/ofi_transport.h"
#include "transport/ofi/ofi_wire.h"

namespace dyad {
namespace {

[[maybe_unused]] const bool g_env_set = [] {
  ::setenv("FI_PROVIDER", "tcp", /*overwrite=*/0);
  // One registered buffer per pool: a transfer that kept its buffer after
  // failing would starve the next one.
  ::setenv("DYAD_OFI_POOL_BUFFERS", "1", 1);
  return true;
}();

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr size_t kSmallChunk = 64 * kKiB;  // 32 KiB slots: many chunks per file

using Clock = std::chrono::steady_clock;
using testutil::Eventually;
using testutil::ReadAll;

int64_t MsSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

std::string Pattern(uint64_t size, uint64_t seed) {
  std::string s(static_cast<size_t>(size), '\0');
  uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
  for (char& c : s) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c = static_cast<char>(x);
  }
  return s;
}

std::unique_ptr<OfiTransport> MakeOfi(size_t chunk_size, int64_t idle_ms) {
  TransportOptions o;
  o.chunk_size = chunk_size;
  o.idle_ms = idle_ms;
  Result<std::unique_ptr<Transport>> t = CreateTransport("ofi", o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  if (!t.ok()) return nullptr;
  return std::unique_ptr<OfiTransport>(static_cast<OfiTransport*>(t->release()));
}

std::pair<std::unique_ptr<Channel>, std::unique_ptr<Channel>> Link() {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  return {std::make_unique<Channel>(UniqueFd(sv[0]), Trust::kAuthenticated),
          std::make_unique<Channel>(UniqueFd(sv[1]), Trust::kAuthenticated)};
}

// Passes frames between an owner's and a requester's session on a thread
// of its own, until told to stop passing the owner's: the owner then
// seems silent to the requester (alive, its session open), though it
// goes on (and its fabric serves the reads of what it announced). Or it
// hangs up on the requester, as if the owner's process died. Records the
// kError the requester sends.
class Relay {
 public:
  Relay(Channel& owner, Channel& requester)
      : owner_(owner), requester_(requester), thread_([this] { Run(); }) {}
  ~Relay() {
    quit_.store(true);
    thread_.join();
  }
  // The owner falls silent once `chunks` announcements went through.
  void MuteOwnerAfter(uint64_t chunks) { mute_after_.store(chunks); }
  void HangUpOnRequester() { ::shutdown(requester_.fd(), SHUT_RDWR); }
  uint64_t credits() const { return credits_.load(); }
  // What the requester told the owner when it gave up.
  Status Told() {
    if (!Eventually([&] { return told_.load(); }, 5000))
      return Status(DYAD_RC_TIMEOUT, "no kError from the requester");
    std::lock_guard<std::mutex> lk(mu_);
    return error_;
  }

 private:
  void Run() {
    bool owner_open = true, requester_open = true;
    uint64_t chunks = 0;
    while (!quit_.load() && (owner_open || requester_open)) {
      const bool from_owner = owner_open && chunks < mute_after_.load();
      pollfd p[2] = {{from_owner ? owner_.fd() : -1, POLLIN, 0},
                     {requester_open ? requester_.fd() : -1, POLLIN, 0}};
      if (::poll(p, 2, 20) <= 0) continue;
      uint16_t type = 0;
      std::string payload;
      if (p[0].revents != 0) {
        owner_open = owner_.RecvFrame(&type, &payload, Deadline::AfterMs(1000)).ok();
        if (owner_open) {
          chunks += type == kOfiChunkFrame ? 1 : 0;
          (void)requester_.SendFrame(type, payload, Deadline::AfterMs(1000));
        }
      }
      if (p[1].revents != 0) {
        requester_open = requester_.RecvFrame(&type, &payload, Deadline::AfterMs(1000)).ok();
        if (!requester_open) continue;
        if (type == kOfiCreditFrame) credits_.fetch_add(1);
        if (type == kOfiErrorFrame) {
          std::lock_guard<std::mutex> lk(mu_);
          error_ = OfiDecodeError(payload, "requester");
          told_.store(true);
        }
        (void)owner_.SendFrame(type, payload, Deadline::AfterMs(1000));
      }
    }
  }

  Channel& owner_;
  Channel& requester_;
  std::atomic<bool> quit_{false};
  std::atomic<uint64_t> mute_after_{UINT64_MAX};
  std::atomic<uint64_t> credits_{0};
  std::atomic<bool> told_{false};
  std::mutex mu_;
  Status error_;
  std::thread thread_;  // last: starts once the rest is made
};

// A file of `size` bytes and a fresh session between its owner and its
// requester (through a Relay when `relayed`), with the arguments each end
// sends the other.
struct Transfer {
  Transfer(Transport& owner, Transport& requester, const std::string& dir, const std::string& name,
           uint64_t size, bool relayed = false)
      : data(Pattern(size, size + name.size())), out(dir + "/" + name + ".out") {
    if (relayed) {
      std::tie(owner_ch, relay_owner) = Link();
      std::tie(relay_requester, req_ch) = Link();
      relay = std::make_unique<Relay>(*relay_owner, *relay_requester);
    } else {
      std::tie(owner_ch, req_ch) = Link();
    }
    const std::string in = dir + "/" + name;
    UniqueFd w(::open(in.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    EXPECT_TRUE(w.valid() && WriteFully(w.get(), data.data(), data.size()).ok());
    src_fd = UniqueFd(::open(in.c_str(), O_RDONLY | O_CLOEXEC));
    src.fd = src_fd.get();
    src.size = size;
    src.path = in;
    sink = UniqueFd(::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    Result<std::string> r = requester.PrepareRequest();
    Result<std::string> o = owner.ReplyArgs(src);
    EXPECT_TRUE(r.ok() && o.ok()) << r.status().ToString() << " / " << o.status().ToString();
    if (r.ok()) req_args = *r;
    if (o.ok()) reply_args = *o;
  }
  bool Landed() const { return ReadAll(out) == data; }

  const std::string data;
  const std::string out;
  std::unique_ptr<Channel> owner_ch, req_ch, relay_owner, relay_requester;
  std::unique_ptr<Relay> relay;  // stops before the channels close
  UniqueFd src_fd, sink;
  FileSource src;
  std::string req_args, reply_args;
};

// How one end ended (written on the loop; read once `done`).
struct Ended {
  std::atomic<bool> done{false};
  Status st;
  TransferStats stats;
  Clock::time_point at;
};

Task<void> PushTask(Transport& t, Transfer& x, TransferWaits& waits, Ended* e) {
  e->st = co_await t.Push(*x.owner_ch, x.src, x.req_args, &e->stats, waits);
  x.owner_ch->attachment().reset();  // the session's registration with this runtime
  e->at = Clock::now();
  e->done.store(true);
}

Task<void> PullTask(Transport& t, Transfer& x, TransferWaits& waits, Ended* e) {
  e->st = co_await t.Pull(*x.req_ch, x.data.size(), x.reply_args, x.sink.get(), &e->stats, waits);
  x.req_ch->attachment().reset();
  e->at = Clock::now();
  e->done.store(true);
}

// The geometry a hand-written peer must follow (both transports made
// with the same chunk size): slot bytes and slots.
OfiGeometry GeometryOf(const std::string& reply_args, uint64_t size) {
  OfiReplyArgs a;
  EXPECT_TRUE(a.Decode(reply_args).ok());
  Result<OfiGeometry> g = OfiGeometryFor(size, a.slot_bytes, a.slots, a.slot_bytes, a.slots);
  EXPECT_TRUE(g.ok());
  return g.ok() ? *g : OfiGeometry();
}

// A requester written by hand: says kReady, takes the first window of
// announcements, then sends nothing more.
class FakeRequester {
 public:
  explicit FakeRequester(Transfer& x) : x_(x), g_(GeometryOf(x.reply_args, x.data.size())) {}
  // Bytes announced (0 on failure).
  uint64_t TakeFirstWindow() {
    EXPECT_TRUE(OfiSendU64(*x_.req_ch, kOfiReadyFrame, 0, Deadline::AfterMs(2000)).ok());
    for (uint64_t i = 0; i < g_.window; ++i) {
      uint16_t type = 0;
      std::string payload;
      OfiChunk c;
      Status st = x_.req_ch->RecvFrame(&type, &payload, Deadline::AfterMs(5000));
      if (!st.ok() || type != kOfiChunkFrame || !c.Decode(payload) || c.index != i) {
        ADD_FAILURE() << "no announcement " << i << ": " << st.ToString();
        return 0;
      }
    }
    return g_.window * g_.chunk;
  }
  Status Told() {
    uint16_t type = 0;
    std::string payload;
    Status st = x_.req_ch->RecvFrame(&type, &payload, Deadline::AfterMs(5000));
    if (!st.ok()) return st.Annotate("no kError");
    if (type != kOfiErrorFrame) return Status(DYAD_RC_BADUNPACK, "not a kError frame");
    return OfiDecodeError(payload, "owner");
  }

 private:
  Transfer& x_;
  const OfiGeometry g_;
};

class OfiCoroutines : public testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    rt_ = std::make_unique<Runtime>(2, 1000);
    ASSERT_TRUE(rt_->Start().ok());
  }
  void TearDown() override { rt_.reset(); }

  // A whole transfer of `size` bytes on the runtime: the owner's Push
  // spawned, the requester's Pull run to its end from this thread.
  void ExpectTransferWorks(Transport& owner, Transport& requester, const std::string& name,
                           uint64_t size) {
    Transfer x(owner, requester, dir_.path(), name, size);
    Stop owner_stop(rt_->executor(), &rt_->stopping());
    Stop req_stop(rt_->executor(), &rt_->stopping());
    TransferWaits owner_waits(*rt_, &owner_stop), req_waits(*rt_, &req_stop);
    Ended push, pull;
    rt_->Spawn(PushTask(owner, x, owner_waits, &push));
    rt_->RunSync(PullTask(requester, x, req_waits, &pull));
    ASSERT_TRUE(Eventually([&] { return push.done.load(); }, 10000)) << "push never ended";
    ASSERT_TRUE(pull.st.ok()) << name << ": " << pull.st.ToString();
    ASSERT_TRUE(push.st.ok()) << name << ": " << push.st.ToString();
    EXPECT_TRUE(x.Landed()) << name;
    EXPECT_EQ(pull.stats.bytes, size);
    EXPECT_EQ(push.stats.bytes, size);
  }
  // Starts a relayed transfer (both ends spawned) whose owner falls
  // silent after its first window; returns the bytes the requester holds
  // by then (its credits for the window came through), 0 if it did not.
  uint64_t StartThenMuteOwner(Transport& owner, Transport& requester, Transfer& x,
                              TransferWaits& owner_waits, TransferWaits& req_waits, Ended* push,
                              Ended* pull) {
    const OfiGeometry g = GeometryOf(x.reply_args, x.data.size());
    x.relay->MuteOwnerAfter(g.window);
    rt_->Spawn(PushTask(owner, x, owner_waits, push));
    rt_->Spawn(PullTask(requester, x, req_waits, pull));
    if (!Eventually([&] { return x.relay->credits() >= g.window; }, 5000)) return 0;
    return g.window * g.chunk;
  }
  // Every buffer is back in its pool.
  static void ExpectBuffersBack(OfiTransport& t) {
    EXPECT_TRUE(Eventually([&] { return t.BuffersInUse() == 0; }, 2000))
        << t.BuffersInUse() << " buffers still lent: " << t.Details();
  }

  testutil::TempDir dir_{"dyad-ofi-co.", testing::TempDir()};
  std::unique_ptr<Runtime> rt_;
};

// The runtime's one loop thread runs both ends of each transfer: neither
// holds it while it waits for the other (the test would time out). Every
// size arrives intact, and a transfer of many chunks finishes far sooner
// than if each wait for a read's completion lasted its 1 s slice: the
// completions wake the requester.
TEST_F(OfiCoroutines, BothEndsRunOnOneLoopThreadForEverySize) {
  std::unique_ptr<OfiTransport> owner = MakeOfi(256 * kKiB, 10000);
  std::unique_ptr<OfiTransport> requester = MakeOfi(256 * kKiB, 10000);
  ASSERT_TRUE(owner && requester);
  struct Case {
    const char* name;
    uint64_t size;
    uint64_t chunks;
  };
  // 128 KiB slots: 100 KiB is one chunk (above the inline limit), 3 MiB
  // and a bit 25 chunks through a window of 4.
  for (const Case& c : {Case{"empty", 0, 0}, Case{"inline", 1000, 1},
                        Case{"one-chunk", 100 * kKiB, 1}, Case{"many-chunks", 3 * kMiB + 11, 25}}) {
    SCOPED_TRACE(c.name);
    Transfer x(*owner, *requester, dir_.path(), c.name, c.size);
    Stop owner_stop(rt_->executor(), &rt_->stopping());
    Stop req_stop(rt_->executor(), &rt_->stopping());
    TransferWaits owner_waits(*rt_, &owner_stop), req_waits(*rt_, &req_stop);
    Ended push, pull;
    const auto t0 = Clock::now();
    rt_->Spawn(PushTask(*owner, x, owner_waits, &push));
    rt_->RunSync(PullTask(*requester, x, req_waits, &pull));
    ASSERT_TRUE(Eventually([&] { return push.done.load(); }, 10000)) << "push never ended";
    const int64_t ms = MsSince(t0);
    ASSERT_TRUE(pull.st.ok()) << pull.st.ToString();
    ASSERT_TRUE(push.st.ok()) << push.st.ToString();
    EXPECT_TRUE(x.Landed());
    EXPECT_EQ(pull.stats.bytes, c.size);
    EXPECT_EQ(push.stats.bytes, c.size);
    EXPECT_EQ(pull.stats.chunks, c.chunks);
    EXPECT_EQ(push.stats.chunks, c.chunks);
    EXPECT_LT(ms, 3000) << "waits on completions lasted their slices";
    EXPECT_FALSE(x.owner_ch->broken() || x.req_ch->broken());
    ExpectBuffersBack(*owner);
    ExpectBuffersBack(*requester);
  }
}

// The owner falls silent after the first window (alive, its session
// open): the requester fails with TIMEOUT at its idle bound, not later
// (its waits are cut into 1 s slices, the last of which ends at the
// bound), tells the owner, breaks the session and gives its buffer back.
// While it waits, another transfer runs on the same loop thread.
TEST_F(OfiCoroutines, SilentOwnerFailsThePullAtItsIdleBound) {
  std::unique_ptr<OfiTransport> owner = MakeOfi(kSmallChunk, 10000);
  std::unique_ptr<OfiTransport> requester = MakeOfi(kSmallChunk, 1500);
  ASSERT_TRUE(owner && requester);
  Transfer x(*owner, *requester, dir_.path(), "silent", 4 * kMiB, /*relayed=*/true);
  Stop owner_stop(rt_->executor(), &rt_->stopping());
  Stop req_stop(rt_->executor(), &rt_->stopping());
  TransferWaits owner_waits(*rt_, &owner_stop), req_waits(*rt_, &req_stop);
  Ended push, pull;
  const uint64_t held =
      StartThenMuteOwner(*owner, *requester, x, owner_waits, req_waits, &push, &pull);
  ASSERT_GT(held, 0u);
  const auto silent_since = Clock::now();
  {
    // The loop thread is free meanwhile.
    std::unique_ptr<OfiTransport> o2 = MakeOfi(kSmallChunk, 10000);
    std::unique_ptr<OfiTransport> r2 = MakeOfi(kSmallChunk, 10000);
    ASSERT_TRUE(o2 && r2);
    ExpectTransferWorks(*o2, *r2, "meanwhile", 2 * kMiB + 5);
    EXPECT_FALSE(pull.done.load());
  }
  ASSERT_TRUE(Eventually([&] { return pull.done.load(); }, 5000)) << "pull never ended";
  const int64_t ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(pull.at - silent_since).count();
  EXPECT_EQ(pull.st.code(), DYAD_RC_TIMEOUT) << pull.st.ToString();
  EXPECT_NE(pull.st.message().find("no data from the owner for 1500 ms"), std::string::npos)
      << pull.st.ToString();
  EXPECT_NE(pull.st.message().find("ofi pull (received " + std::to_string(held) + " of " +
                                   std::to_string(4 * kMiB) + " bytes)"),
            std::string::npos)
      << pull.st.ToString();
  EXPECT_GE(ms, 1400);
  EXPECT_LT(ms, 1500 + 900) << "the wait outlasted its idle bound";
  EXPECT_TRUE(x.req_ch->broken());
  Status told = x.relay->Told();
  EXPECT_EQ(told.code(), DYAD_RC_TIMEOUT) << told.ToString();
  // The owner, told, fails too and gives its buffer back.
  ASSERT_TRUE(Eventually([&] { return push.done.load(); }, 5000)) << "push never ended";
  EXPECT_FALSE(push.st.ok());
  EXPECT_TRUE(x.owner_ch->broken());
  ExpectBuffersBack(*requester);
  ExpectBuffersBack(*owner);
  ExpectTransferWorks(*owner, *requester, "next", 2 * kMiB + 3);
}

// The requester takes the first window and then gives no credit: the
// owner fails with TIMEOUT at its idle bound, tells the requester, breaks
// the session; its send buffer is back (resting) and the next transfer
// works.
TEST_F(OfiCoroutines, SilentRequesterFailsThePushAtItsIdleBound) {
  std::unique_ptr<OfiTransport> owner = MakeOfi(kSmallChunk, 1500);
  std::unique_ptr<OfiTransport> requester = MakeOfi(kSmallChunk, 10000);
  ASSERT_TRUE(owner && requester);
  Transfer x(*owner, *requester, dir_.path(), "silent", 4 * kMiB);
  FakeRequester fake(x);
  Stop stop(rt_->executor(), &rt_->stopping());
  TransferWaits waits(*rt_, &stop);
  Ended push;
  rt_->Spawn(PushTask(*owner, x, waits, &push));
  const uint64_t announced = fake.TakeFirstWindow();
  ASSERT_GT(announced, 0u);
  const auto silent_since = Clock::now();
  ASSERT_TRUE(Eventually([&] { return push.done.load(); }, 5000)) << "push never ended";
  const int64_t ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(push.at - silent_since).count();
  EXPECT_EQ(push.st.code(), DYAD_RC_TIMEOUT) << push.st.ToString();
  EXPECT_NE(push.st.message().find("the requester made no progress for 1500 ms"), std::string::npos)
      << push.st.ToString();
  EXPECT_NE(
      push.st.message().find("ofi push of '" + x.src.path + "' (sent " + std::to_string(announced) +
                             " of " + std::to_string(4 * kMiB) + " bytes)"),
      std::string::npos)
      << push.st.ToString();
  EXPECT_GE(ms, 1400);
  EXPECT_LT(ms, 1500 + 900) << "the wait outlasted its idle bound";
  EXPECT_TRUE(x.owner_ch->broken());
  Status told = fake.Told();
  EXPECT_EQ(told.code(), DYAD_RC_TIMEOUT) << told.ToString();
  ExpectBuffersBack(*owner);
  ExpectTransferWorks(*owner, *requester, "next", 2 * kMiB + 3);
}

// The requester's Stop fires mid-transfer (its own requester hung up):
// the pull ends at once with the Stop's reason, tells the owner, breaks
// the session and gives its buffer back.
TEST_F(OfiCoroutines, StoppedPullEndsAtOnceWithTheStopsReason) {
  std::unique_ptr<OfiTransport> owner = MakeOfi(kSmallChunk, 10000);
  std::unique_ptr<OfiTransport> requester = MakeOfi(kSmallChunk, 10000);
  ASSERT_TRUE(owner && requester);
  Transfer x(*owner, *requester, dir_.path(), "stopped", 4 * kMiB, /*relayed=*/true);
  Stop owner_stop(rt_->executor(), &rt_->stopping());
  Stop req_stop(rt_->executor(), &rt_->stopping());
  TransferWaits owner_waits(*rt_, &owner_stop), req_waits(*rt_, &req_stop);
  Ended push, pull;
  ASSERT_GT(StartThenMuteOwner(*owner, *requester, x, owner_waits, req_waits, &push, &pull), 0u);
  EXPECT_FALSE(pull.done.load());
  const auto t0 = Clock::now();
  req_stop.Fire(Status(DYAD_RC_CANCELLED, "the requesting client hung up"));
  ASSERT_TRUE(Eventually([&] { return pull.done.load(); }, 5000)) << "pull never ended";
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(pull.at - t0).count(), 500);
  EXPECT_EQ(pull.st.code(), DYAD_RC_CANCELLED) << pull.st.ToString();
  EXPECT_NE(pull.st.message().find("the requesting client hung up"), std::string::npos);
  EXPECT_NE(pull.st.message().find("ofi pull (received"), std::string::npos);
  EXPECT_TRUE(x.req_ch->broken());
  Status told = x.relay->Told();
  EXPECT_EQ(told.code(), DYAD_RC_CANCELLED) << told.ToString();
  ASSERT_TRUE(Eventually([&] { return push.done.load(); }, 5000)) << "push never ended";
  EXPECT_EQ(push.st.code(), DYAD_RC_CANCELLED) << push.st.ToString();
  ExpectBuffersBack(*requester);
  ExpectBuffersBack(*owner);
  ExpectTransferWorks(*owner, *requester, "next", 2 * kMiB + 3);
}

// The owner's Stop fires while it waits for credits (its service stops):
// the push ends at once with the Stop's reason, tells the requester and
// breaks the session.
TEST_F(OfiCoroutines, StoppedPushEndsAtOnceWithTheStopsReason) {
  std::unique_ptr<OfiTransport> owner = MakeOfi(kSmallChunk, 10000);
  std::unique_ptr<OfiTransport> requester = MakeOfi(kSmallChunk, 10000);
  ASSERT_TRUE(owner && requester);
  Transfer x(*owner, *requester, dir_.path(), "stopped", 4 * kMiB);
  FakeRequester fake(x);
  Stop stop(rt_->executor(), &rt_->stopping());
  TransferWaits waits(*rt_, &stop);
  Ended push;
  rt_->Spawn(PushTask(*owner, x, waits, &push));
  ASSERT_GT(fake.TakeFirstWindow(), 0u);
  EXPECT_FALSE(push.done.load());
  const auto t0 = Clock::now();
  stop.Fire(Status(DYAD_RC_CANCELLED, "the service is stopping"));
  ASSERT_TRUE(Eventually([&] { return push.done.load(); }, 5000)) << "push never ended";
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(push.at - t0).count(), 500);
  EXPECT_EQ(push.st.code(), DYAD_RC_CANCELLED) << push.st.ToString();
  EXPECT_NE(push.st.message().find("the service is stopping"), std::string::npos);
  EXPECT_NE(push.st.message().find("ofi push of '"), std::string::npos);
  EXPECT_TRUE(x.owner_ch->broken());
  Status told = fake.Told();
  EXPECT_EQ(told.code(), DYAD_RC_CANCELLED) << told.ToString();
  ExpectBuffersBack(*owner);
  ExpectTransferWorks(*owner, *requester, "next", 2 * kMiB + 3);
}

// The owner's session closes mid-transfer (its process died): the pull
// fails at once with CONNLOST, the session broken, its buffer back.
TEST_F(OfiCoroutines, OwnerHangingUpMidTransferFailsThePullAtOnce) {
  std::unique_ptr<OfiTransport> owner = MakeOfi(kSmallChunk, 10000);
  std::unique_ptr<OfiTransport> requester = MakeOfi(kSmallChunk, 10000);
  ASSERT_TRUE(owner && requester);
  Transfer x(*owner, *requester, dir_.path(), "hangup", 4 * kMiB, /*relayed=*/true);
  Stop owner_stop(rt_->executor(), &rt_->stopping());
  Stop req_stop(rt_->executor(), &rt_->stopping());
  TransferWaits owner_waits(*rt_, &owner_stop), req_waits(*rt_, &req_stop);
  Ended push, pull;
  ASSERT_GT(StartThenMuteOwner(*owner, *requester, x, owner_waits, req_waits, &push, &pull), 0u);
  const auto t0 = Clock::now();
  x.relay->HangUpOnRequester();
  ASSERT_TRUE(Eventually([&] { return pull.done.load(); }, 5000)) << "pull never ended";
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(pull.at - t0).count(), 1000);
  EXPECT_EQ(pull.st.code(), DYAD_RC_CONNLOST) << pull.st.ToString();
  EXPECT_NE(pull.st.message().find("ofi pull (received"), std::string::npos);
  EXPECT_TRUE(x.req_ch->broken());
  ExpectBuffersBack(*requester);
  // The owner, cut off from the requester, ends at its own bound (Stop).
  owner_stop.Fire(Status(DYAD_RC_CANCELLED, "test over"));
  ASSERT_TRUE(Eventually([&] { return push.done.load(); }, 5000)) << "push never ended";
  ExpectBuffersBack(*owner);
  ExpectTransferWorks(*owner, *requester, "next", 2 * kMiB + 3);
}

// The requester never says it is ready, then hangs up: the owner, which
// waited without holding the loop, fails at once with CONNLOST and the
// session broken; it never took a send buffer.
TEST_F(OfiCoroutines, RequesterHangingUpBeforeItIsReadyFailsThePushAtOnce) {
  std::unique_ptr<OfiTransport> owner = MakeOfi(kSmallChunk, 10000);
  std::unique_ptr<OfiTransport> requester = MakeOfi(kSmallChunk, 10000);
  ASSERT_TRUE(owner && requester);
  Transfer x(*owner, *requester, dir_.path(), "hangup", 2 * kMiB);
  Stop stop(rt_->executor(), &rt_->stopping());
  TransferWaits waits(*rt_, &stop);
  Ended push;
  rt_->Spawn(PushTask(*owner, x, waits, &push));
  // It waits (nothing sent: no buffer taken) while the loop runs others.
  ExpectTransferWorks(*owner, *requester, "meanwhile", 2 * kMiB + 1);
  EXPECT_FALSE(push.done.load());
  EXPECT_EQ(owner->BuffersInUse(), 0);
  const auto t0 = Clock::now();
  ::shutdown(x.req_ch->fd(), SHUT_RDWR);
  ASSERT_TRUE(Eventually([&] { return push.done.load(); }, 5000)) << "push never ended";
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(push.at - t0).count(), 1000);
  EXPECT_EQ(push.st.code(), DYAD_RC_CONNLOST) << push.st.ToString();
  EXPECT_NE(push.st.message().find("ofi push of '"), std::string::npos);
  EXPECT_TRUE(x.owner_ch->broken());
  ExpectBuffersBack(*owner);
}

// One receive buffer: a second pull waits for it (sending nothing, so its
// owner waits too) and is woken as soon as the first gives it back, not
// at the end of its wait's slice.
TEST_F(OfiCoroutines, PullWaitingForTheBufferIsWokenWhenItIsGivenBack) {
  std::unique_ptr<OfiTransport> owner = MakeOfi(kSmallChunk, 10000);
  std::unique_ptr<OfiTransport> requester = MakeOfi(kSmallChunk, 10000);
  ASSERT_TRUE(owner && requester);
  Transfer first(*owner, *requester, dir_.path(), "a", 2 * kMiB);
  Transfer second(*owner, *requester, dir_.path(), "b", 2 * kMiB + 1);
  Stop stop(rt_->executor(), &rt_->stopping());
  TransferWaits w1(*rt_, &stop), w2(*rt_, &stop), w3(*rt_, &stop), w4(*rt_, &stop);
  Ended pull1, pull2, push1, push2;
  rt_->Spawn(PullTask(*requester, first, w1, &pull1));
  // The first holds the only buffer once its kReady is out.
  pollfd p{first.owner_ch->fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  rt_->Spawn(PullTask(*requester, second, w2, &pull2));
  const auto waiting_since = Clock::now();
  p = pollfd{second.owner_ch->fd(), POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 200), 0) << "kReady without a buffer";
  // Let the second's wait pass a slice boundary (1 s), then release the
  // buffer: a missed wake-up would leave it waiting for the next one.
  std::this_thread::sleep_for(std::chrono::milliseconds(1050) - (Clock::now() - waiting_since));
  rt_->Spawn(PushTask(*owner, first, w3, &push1));
  ASSERT_TRUE(Eventually([&] { return pull1.done.load(); }, 10000));
  ASSERT_TRUE(pull1.st.ok()) << pull1.st.ToString();
  p = pollfd{second.owner_ch->fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  EXPECT_LT(MsSince(pull1.at), 500) << "the waiting pull was not woken by the release";
  rt_->Spawn(PushTask(*owner, second, w4, &push2));
  ASSERT_TRUE(Eventually(
      [&] { return pull2.done.load() && push1.done.load() && push2.done.load(); }, 10000));
  EXPECT_TRUE(pull2.st.ok() && push1.st.ok() && push2.st.ok())
      << pull2.st.ToString() << " / " << push1.st.ToString() << " / " << push2.st.ToString();
  EXPECT_TRUE(first.Landed());
  EXPECT_TRUE(second.Landed());
  ExpectBuffersBack(*owner);
  ExpectBuffersBack(*requester);
}

// The runtime goes away while both ends wait (their waits name no Stop,
// so nothing ends them first): their coroutine frames are destroyed
// suspended, and what each transfer held still goes back, the peer told.
TEST_F(OfiCoroutines, TransferDestroyedWhileWaitingGivesBackItsBuffers) {
  std::unique_ptr<OfiTransport> owner = MakeOfi(kSmallChunk, 10000);
  std::unique_ptr<OfiTransport> requester = MakeOfi(kSmallChunk, 10000);
  ASSERT_TRUE(owner && requester);
  Transfer x(*owner, *requester, dir_.path(), "abandoned", 4 * kMiB, /*relayed=*/true);
  Ended push, pull;
  {
    TransferWaits owner_waits(*rt_, nullptr), req_waits(*rt_, nullptr);
    ASSERT_GT(StartThenMuteOwner(*owner, *requester, x, owner_waits, req_waits, &push, &pull), 0u);
    EXPECT_EQ(requester->BuffersInUse(), 1);
    EXPECT_EQ(owner->BuffersInUse(), 1);
    rt_->Shutdown(/*grace_ms=*/100);  // the loop stops with both suspended
    // Loop-owned registrations: dropped only now that it stopped.
    x.req_ch->attachment().reset();
    x.owner_ch->attachment().reset();
    rt_.reset();  // destroys the suspended frames
  }
  EXPECT_FALSE(pull.done.load());
  EXPECT_FALSE(push.done.load());
  EXPECT_EQ(requester->BuffersInUse(), 0);
  EXPECT_EQ(owner->BuffersInUse(), 0);
  EXPECT_TRUE(x.req_ch->broken());
  EXPECT_TRUE(x.owner_ch->broken());
  Status told = x.relay->Told();
  EXPECT_EQ(told.code(), DYAD_RC_CANCELLED) << told.ToString();
  EXPECT_NE(told.message().find("ofi pull abandoned"), std::string::npos) << told.ToString();
  rt_ = std::make_unique<Runtime>(2, 1000);
  ASSERT_TRUE(rt_->Start().ok());
  ExpectTransferWorks(*owner, *requester, "next", 2 * kMiB + 3);
}

}  // namespace
}  // namespace dyad

#else

TEST(OfiCoroutines, NotBuilt) { GTEST_SKIP() << "built without libfabric (DYAD_ENABLE_OFI)"; }

#endif  // DYAD_HAVE_OFI
