// transport_ofi_op_test.cc: the "ofi" transfer as resumable ops (StartPull,
// StartPush): no Step waits on the peer, so both ends of a transfer run
// interleaved on one thread; the requester's wake fd becomes readable when
// its reads complete; a transfer whose peer goes silent mid-way returns from
// every Step at once and fails cleanly at its idle bound, one whose peer
// hangs up fails at the next Step; and a transfer waiting for a registered
// buffer waits on its wake fd, which fires when the buffer is given back.
// Every failure returns the transfer's buffer: the next transfer, with one
// buffer per pool, works.
//
// Runs over FI_PROVIDER=tcp (tcp;ofi_rxm) unless the environment chooses
// (tests/CMakeLists.txt runs it once more with FI_PROVIDER=shm).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "common/net.h"
#include "transport/transport.h"
#include "util.h"

#ifdef DYAD_HAVE_OFI

namespace dyad {
namespace {

[[maybe_unused]] const bool g_env_set = [] {
  ::setenv("FI_PROVIDER", "tcp", /*overwrite=*/0);
  // One registered buffer per pool: a transfer that kept its buffer after
  // failing would starve the next one.
  ::setenv("DYAD_OFI_POOL_BUFFERS", "1", 1);
  return true;
}();

constexpr uint64_t kMiB = 1u << 20;
constexpr size_t kChunk = 64 * 1024;  // 32 KiB slots: many chunks per file

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

using testutil::ReadAll;

std::unique_ptr<Transport> MakeOfi(int64_t idle_ms) {
  TransportOptions o;
  o.chunk_size = kChunk;
  o.idle_ms = idle_ms;
  Result<std::unique_ptr<Transport>> t = CreateTransport("ofi", o);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

int64_t MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               t0)
      .count();
}

// Whether `fd` becomes readable within `ms`.
bool Readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) > 0;
}

// One transfer between two transports over a socketpair, as two ops that
// the test steps itself (nothing runs on another thread of the test).
class Transfer {
 public:
  Transfer(Transport& owner, Transport& requester, const std::string& dir, const std::string& name,
           uint64_t size)
      : data_(Pattern(size, size)), out_(dir + "/" + name + ".out") {
    int sv[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    owner_ch_ = std::make_unique<Channel>(UniqueFd(sv[0]), Trust::kAuthenticated);
    req_ch_ = std::make_unique<Channel>(UniqueFd(sv[1]), Trust::kAuthenticated);
    const std::string in = dir + "/" + name;
    UniqueFd w(::open(in.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    EXPECT_TRUE(w.valid() && WriteFully(w.get(), data_.data(), data_.size()).ok());
    src_fd_ = UniqueFd(::open(in.c_str(), O_RDONLY | O_CLOEXEC));
    src_.fd = src_fd_.get();
    src_.size = size;
    src_.path = in;
    sink_ = UniqueFd(::open(out_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    Result<std::string> req_args = requester.PrepareRequest();
    Result<std::string> reply_args = owner.ReplyArgs(src_);
    EXPECT_TRUE(req_args.ok() && reply_args.ok());
    if (!req_args.ok() || !reply_args.ok()) return;
    push = owner.StartPush(*owner_ch_, src_, *req_args, &pushed);
    pull = requester.StartPull(*req_ch_, size, *reply_args, sink_.get(), &pulled);
  }

  // Steps `op`, checking that the step returned at once (it never waits
  // on the peer; a second is far above any step's own work here).
  Result<bool> Step(TransferOp& op) {
    const auto t0 = std::chrono::steady_clock::now();
    Result<bool> r = op.Step();
    max_step_ms = std::max(max_step_ms, MsSince(t0));
    return r;
  }

  // Runs both ends on this thread until the pull ended (or `ms` passed),
  // stepping the owner only while it announced fewer than `owner_chunks`
  // (then it is silent). Counts wake-ups of the requester by its wake fd.
  Result<bool> Run(int ms, uint64_t owner_chunks = UINT64_MAX) {
    const auto t0 = std::chrono::steady_clock::now();
    bool push_done = false;
    while (MsSince(t0) < ms) {
      Result<bool> r = Step(*pull);
      if (!r.ok() || *r) {
        // The owner takes kDone (already sent).
        for (int i = 0; r.ok() && !push_done && i < 100; ++i) {
          Result<bool> p = Step(*push);
          if (!p.ok()) return p.status();
          push_done = *p || !Readable(owner_ch_->fd(), 100);
        }
        return r;
      }
      const bool owner_alive = !push_done && pushed.chunks < owner_chunks;
      if (owner_alive) {
        Result<bool> p = Step(*push);
        if (!p.ok()) return p.status();
        push_done = *p;
      }
      pollfd p[3] = {{req_ch_->fd(), POLLIN, 0},
                     {pull->wake_fd(), POLLIN, 0},
                     {owner_alive ? owner_ch_->fd() : -1, POLLIN, 0}};
      if (::poll(p, 3, 100) > 0 && p[1].revents != 0) ++wakes;
    }
    return false;
  }

  ~Transfer() {  // the ops use the sessions
    pull.reset();
    push.reset();
  }

  bool Landed() const { return pulled.bytes == data_.size() && ReadAll(out_) == data_; }
  Channel& owner_session() { return *owner_ch_; }
  Channel& requester_session() { return *req_ch_; }
  // As if the owner's process died: its end of the session closes.
  void OwnerHangsUp() { ::shutdown(owner_ch_->fd(), SHUT_RDWR); }

  std::unique_ptr<PushOp> push;
  std::unique_ptr<PullOp> pull;
  TransferStats pushed, pulled;
  int64_t max_step_ms = 0;
  int wakes = 0;

 private:
  const std::string data_;
  const std::string out_;
  std::unique_ptr<Channel> owner_ch_, req_ch_;
  UniqueFd src_fd_, sink_;
  FileSource src_;
};

class OfiOps : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testutil::MakeTempDir("dyad-ofi-op.", testing::TempDir());
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { testutil::RemoveTree(dir_); }
  // A transfer between the two afterwards works: nothing kept a buffer.
  void ExpectNextTransferWorks(Transport& owner, Transport& requester) {
    Transfer t(owner, requester, dir_, "next", 2 * kMiB + 3);
    ASSERT_TRUE(t.push && t.pull);
    Result<bool> r = t.Run(20000);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_TRUE(*r);
    EXPECT_TRUE(t.Landed());
  }
  std::string dir_;
};

// Neither end waits for the other: one thread runs both, and the
// requester learns of its completed reads through its wake fd.
TEST_F(OfiOps, BothEndsRunInterleavedOnOneThreadAndCompletionsWakeTheRequester) {
  std::unique_ptr<Transport> owner = MakeOfi(10000), requester = MakeOfi(10000);
  Transfer t(*owner, *requester, dir_, "f", 3 * kMiB + 11);
  ASSERT_TRUE(t.push && t.pull) << "no resumable ops";
  EXPECT_GE(t.pull->wake_fd(), 0);
  Result<bool> r = t.Run(30000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(*r);
  EXPECT_TRUE(t.Landed());
  EXPECT_EQ(t.pushed.bytes, 3 * kMiB + 11);
  EXPECT_GT(t.wakes, 0) << "the wake fd never fired for " << t.pulled.chunks << " reads";
  EXPECT_LT(t.max_step_ms, 1000);
}

// The owner announces its first chunks and then says nothing more (alive,
// session open): every requester Step returns at once; at the idle bound
// the caller fails the op, which tells the owner and gives back its buffer.
TEST_F(OfiOps, SilentOwnerMidTransferNeverHoldsAStepAndFailsAtTheIdleBound) {
  std::unique_ptr<Transport> owner = MakeOfi(10000), requester = MakeOfi(600);
  Transfer t(*owner, *requester, dir_, "f", 4 * kMiB);
  ASSERT_TRUE(t.push && t.pull);
  // Ready, the first announcements and their reads; then the owner is
  // silent (its fabric still serves reads of what it announced).
  Result<bool> r = t.Run(1500, /*owner_chunks=*/6);
  ASSERT_TRUE(r.ok() && !*r);
  ASSERT_GE(t.pushed.chunks, 6u);
  ASSERT_GT(t.pulled.bytes, 0u);
  ASSERT_LT(t.pulled.bytes, 4 * kMiB);
  ASSERT_TRUE(r.ok() && !*r);
  EXPECT_LT(t.max_step_ms, 500);
  EXPECT_EQ(t.pull->idle_ms(), 600);
  Status st = t.pull->Fail(Status(DYAD_RC_TIMEOUT, "no progress for 600 ms"));
  EXPECT_EQ(st.code(), DYAD_RC_TIMEOUT) << st.ToString();
  EXPECT_NE(st.message().find("ofi pull (received"), std::string::npos) << st.ToString();
  EXPECT_TRUE(t.requester_session().broken());
  // The owner hears of it at its next step.
  ASSERT_TRUE(Readable(t.owner_session().fd(), 5000));
  Result<bool> p = t.push->Step();
  EXPECT_FALSE(p.ok());
  t.pull.reset();
  t.push.reset();
  ExpectNextTransferWorks(*owner, *requester);
}

// The owner's session closes mid-transfer: the requester's next Step
// (the session is readable) fails with CONNLOST, and its buffer is free.
TEST_F(OfiOps, OwnerHangingUpMidTransferFailsTheNextStep) {
  std::unique_ptr<Transport> owner = MakeOfi(10000), requester = MakeOfi(10000);
  Transfer t(*owner, *requester, dir_, "f", 4 * kMiB);
  ASSERT_TRUE(t.push && t.pull);
  Result<bool> started = t.Run(500, /*owner_chunks=*/6);
  ASSERT_TRUE(started.ok() && !*started);
  ASSERT_GT(t.pulled.bytes, 0u);
  t.OwnerHangsUp();
  ASSERT_TRUE(Readable(t.requester_session().fd(), 5000));
  const auto t0 = std::chrono::steady_clock::now();
  Result<bool> r(false);
  for (int i = 0; i < 100 && r.ok() && !*r; ++i) {
    r = t.pull->Step();
    if (r.ok() && !*r) (void)Readable(t.requester_session().fd(), 50);
  }
  ASSERT_FALSE(r.ok());
  EXPECT_LT(MsSince(t0), 5000);
  EXPECT_EQ(r.status().code(), DYAD_RC_CONNLOST) << r.status().ToString();
  EXPECT_TRUE(t.requester_session().broken());
  t.pull.reset();
  t.push.reset();
  ExpectNextTransferWorks(*owner, *requester);
}

// The owner waits for a requester that never says it is ready: its Step
// returns at once, and the requester's hang-up fails it.
TEST_F(OfiOps, OwnerStepReturnsAtOnceForASilentRequesterAndFailsWhenItHangsUp) {
  std::unique_ptr<Transport> owner = MakeOfi(10000), requester = MakeOfi(10000);
  Transfer t(*owner, *requester, dir_, "f", 2 * kMiB);
  ASSERT_TRUE(t.push && t.pull);
  for (int i = 0; i < 3; ++i) {
    Result<bool> p = t.Step(*t.push);
    ASSERT_TRUE(p.ok() && !*p) << p.status().ToString();
  }
  EXPECT_LT(t.max_step_ms, 500);
  EXPECT_FALSE(Readable(t.push->wake_fd(), 0));
  t.pull.reset();  // gives up before it began: shuts its session down
  ASSERT_TRUE(Readable(t.owner_session().fd(), 5000));
  Result<bool> p = t.push->Step();
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(t.owner_session().broken());
}

// One receive buffer: a second pull waits for it on its wake fd (its Step
// returns at once), which fires when the first transfer gives it back.
TEST_F(OfiOps, PullWaitingForABufferIsWokenWhenItIsGivenBack) {
  std::unique_ptr<Transport> owner = MakeOfi(10000), requester = MakeOfi(10000);
  Transfer first(*owner, *requester, dir_, "a", 2 * kMiB);
  Transfer second(*owner, *requester, dir_, "b", 2 * kMiB + 1);
  ASSERT_TRUE(first.pull && second.pull && first.push && second.push);
  Result<bool> r = first.Step(*first.pull);  // takes the only buffer
  ASSERT_TRUE(r.ok() && !*r);
  r = second.Step(*second.pull);
  ASSERT_TRUE(r.ok() && !*r);
  EXPECT_LT(second.max_step_ms, 500);
  // No kReady without a buffer: the owner has nothing to read.
  EXPECT_FALSE(Readable(second.owner_session().fd(), 100));
  EXPECT_FALSE(Readable(second.pull->wake_fd(), 0));
  r = first.Run(20000);
  ASSERT_TRUE(r.ok() && *r) << (r.ok() ? "not done" : r.status().ToString());
  EXPECT_TRUE(first.Landed());
  EXPECT_TRUE(Readable(second.pull->wake_fd(), 5000)) << "not woken when the buffer came back";
  r = second.Run(20000);
  ASSERT_TRUE(r.ok() && *r) << (r.ok() ? "not done" : r.status().ToString());
  EXPECT_TRUE(second.Landed());
}

}  // namespace
}  // namespace dyad

#else

TEST(OfiOps, NotBuilt) { GTEST_SKIP() << "built without libfabric (DYAD_ENABLE_OFI)"; }

#endif  // DYAD_HAVE_OFI
