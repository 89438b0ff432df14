// transport_ucx_op_test.cc: the ucx transport's TransferOps (transport.h:
// StartPull, StartPush) never wait on their peer. Both ends of a transfer
// are stepped from ONE thread here, which only works if no Step blocks;
// then one end falls silent mid-transfer (the owner stops sending after a
// few chunks, or the requester stops taking chunks and crediting) and the
// other end's Step must keep returning at once, without progress, until
// the caller's idle bound ends it (Fail), which ends the silent end at once
// too. Each case runs over UCX messages (UCX_TLS=tcp) and over the
// same-host direct path (shared memory). Full transfers through the ops
// (Transport::Pull and Push run them) are in transport_conformance_test.
#ifdef DYAD_HAVE_UCX
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/fsutil.h"
#include "common/net.h"
#include "transport/transport.h"
#include "util.h"

namespace dyad {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
// 64 KiB chunks make a 128 KiB buffer of four 32 KiB slots: a 4 MiB file is
// 128 chunks, many credit rounds before and after the silence.
constexpr uint64_t kChunk = 64 * kKiB;
constexpr uint64_t kSlot = 32 * kKiB;
constexpr uint64_t kSize = 4 * kMiB;

class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      ::setenv(name_.c_str(), old_.c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

class UcxOps : public testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = testutil::MakeTempDir("dyad-ucx-op.");
    ASSERT_FALSE(dir_.empty());
    std::string data(kSize, '\0');
    for (uint64_t i = 0; i < kSize; ++i) data[i] = static_cast<char>((i * 7919 + i / 4096) % 251);
    src_path_ = dir_ + "/src";
    UniqueFd w(::open(src_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    ASSERT_TRUE(w.valid());
    ASSERT_TRUE(WriteFully(w.get(), data.data(), data.size()).ok());
    src_fd_ = UniqueFd(::open(src_path_.c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(src_fd_.valid());
    src_.fd = src_fd_.get();
    src_.size = kSize;
    src_.path = src_path_;
    sink_ =
        UniqueFd(::open((dir_ + "/dst").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    ASSERT_TRUE(sink_.valid());
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    owner_ch_ = std::make_unique<Channel>(UniqueFd(sv[0]), Trust::kAuthenticated);
    req_ch_ = std::make_unique<Channel>(UniqueFd(sv[1]), Trust::kAuthenticated);
    // Two transports (two UCX workers, as on two nodes), whose contexts
    // read UCX_TLS as the case sets it. The idle bound is far away: only
    // the test ends a silent transfer.
    ScopedEnv tls("UCX_TLS", GetParam());
    // One buffer per pool, so a second transfer finds none (see
    // SecondTransferWaitsForTheBufferOnItsWakeFd).
    ScopedEnv pool("DYAD_UCX_POOL_BUFFERS", "1");
    TransportOptions options;
    options.chunk_size = kChunk;
    options.idle_ms = 60000;
    for (std::unique_ptr<Transport>* t : {&owner_t_, &req_t_}) {
      Result<std::unique_ptr<Transport>> made = CreateTransport("ucx", options);
      ASSERT_TRUE(made.ok()) << made.status().ToString();
      *t = std::move(made).value();
    }
    Result<std::string> args = req_t_->PrepareRequest();
    ASSERT_TRUE(args.ok()) << args.status().ToString();
    ASSERT_TRUE(owner_t_->Warm().ok());
    pull_ = req_t_->StartPull(*req_ch_, kSize, "", sink_.get(), &pulled_);
    push_ = owner_t_->StartPush(*owner_ch_, src_, *args, &pushed_);
    ASSERT_NE(pull_, nullptr) << "the ucx transport has no PullOp";
    ASSERT_NE(push_, nullptr) << "the ucx transport has no PushOp";
  }

  void TearDown() override {
    pull_.reset();
    push_.reset();
    owner_t_.reset();
    req_t_.reset();
    testutil::RemoveTree(dir_);
  }

  // Steps `op` once and checks that the step returned at once.
  Result<bool> TimedStep(TransferOp& op) {
    const auto t0 = std::chrono::steady_clock::now();
    Result<bool> r = op.Step();
    max_step_ms_ = std::max(max_step_ms_, MsSince(t0));
    return r;
  }

  // Waits (at most `ms`) for either session or either wake fd.
  void Idle(int ms) {
    std::vector<pollfd> p = {{owner_ch_->fd(), POLLIN, 0}, {req_ch_->fd(), POLLIN, 0}};
    for (TransferOp* op : {push_.get(), pull_.get()})
      if (op != nullptr && op->wake_fd() >= 0) p.push_back({op->wake_fd(), POLLIN, 0});
    (void)::poll(p.data(), p.size(), ms);
  }

  // Steps both ends on this thread until `stop` holds (false after 20 s).
  template <typename Stop>
  bool StepBothUntil(Stop stop) {
    const auto t0 = std::chrono::steady_clock::now();
    while (!stop()) {
      if (MsSince(t0) > 20000) return false;
      Result<bool> a = TimedStep(*push_);
      Result<bool> b = TimedStep(*pull_);
      if (!a.ok() || !b.ok()) {
        ADD_FAILURE() << "owner: " << a.status().ToString()
                      << "; requester: " << b.status().ToString();
        return false;
      }
      Idle(5);
    }
    return true;
  }

  // Steps `op` alone for `ms`: every step returns at once, without an
  // error, without completing, and without progress after the first
  // `settle` steps (what was already on its way may still land).
  void StepSilentPeer(TransferOp& op, int ms, const char* who) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t moved = op.moved();
    int steps = 0;
    while (MsSince(t0) < ms) {
      Result<bool> r = TimedStep(op);
      ASSERT_TRUE(r.ok()) << who << ": " << r.status().ToString();
      ASSERT_FALSE(*r) << who << " completed although its peer fell silent";
      if (++steps == 20) moved = op.moved();
      if (steps > 20) {
        ASSERT_EQ(op.moved(), moved) << who << " progressed with a silent peer";
      }
      Idle(2);
    }
    EXPECT_GT(steps, 40) << who << ": its steps were slow";
  }

  std::string dir_, src_path_;
  UniqueFd src_fd_, sink_;
  FileSource src_;
  std::unique_ptr<Channel> owner_ch_, req_ch_;
  std::unique_ptr<Transport> owner_t_, req_t_;
  TransferStats pulled_, pushed_;
  std::unique_ptr<PullOp> pull_;
  std::unique_ptr<PushOp> push_;
  double max_step_ms_ = 0;
};

// Both ends on one thread: the whole file moves, every byte checked.
TEST_P(UcxOps, BothEndsStepOnOneThread) {
  bool pull_done = false, push_done = false;
  const auto t0 = std::chrono::steady_clock::now();
  while (!(pull_done && push_done)) {
    ASSERT_LT(MsSince(t0), 20000) << "stuck at " << pulled_.bytes << " of " << kSize;
    if (!push_done) {
      Result<bool> r = TimedStep(*push_);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      push_done = *r;
    }
    if (!pull_done) {
      Result<bool> r = TimedStep(*pull_);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      pull_done = *r;
    }
    if (!(pull_done && push_done)) Idle(5);
  }
  EXPECT_EQ(pulled_.bytes, kSize);
  EXPECT_EQ(pushed_.bytes, kSize);
  // Which path the case exercised: UCX messages, or the owner writing into
  // the requester's shared buffer.
  EXPECT_EQ(pulled_.direct_bytes, std::string(GetParam()) == "tcp" ? 0 : kSize);
  std::string want(kSize, '\0'), got(kSize, '\0');
  ASSERT_TRUE(PreadFully(src_fd_.get(), want.data(), kSize, 0).ok());
  UniqueFd r(::open((dir_ + "/dst").c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(PreadFully(r.get(), got.data(), kSize, 0).ok());
  EXPECT_TRUE(want == got);
  EXPECT_FALSE(owner_ch_->broken());
  EXPECT_FALSE(req_ch_->broken());
  EXPECT_LT(max_step_ms_, 1000);
}

// The owner stops after a few chunks: the requester's steps return at once
// without progress; its idle bound (the caller's Fail) ends both ends.
TEST_P(UcxOps, OwnerFallsSilentAfterSomeChunks) {
  ASSERT_TRUE(StepBothUntil([&] { return pulled_.bytes >= 5 * kSlot; }));
  const uint64_t got = pulled_.bytes;
  EXPECT_LT(got, kSize);
  StepSilentPeer(*pull_, 400, "the requester");
  EXPECT_LT(pulled_.bytes, kSize);
  EXPECT_GE(pulled_.bytes, got);
  const Status failed = pull_->Fail(Status(DYAD_RC_TIMEOUT, "no data from peer"));
  EXPECT_EQ(failed.code(), DYAD_RC_TIMEOUT) << failed.ToString();
  EXPECT_TRUE(req_ch_->broken());
  // The owner learns at once: its next steps fail.
  Result<bool> r = false;
  const auto t0 = std::chrono::steady_clock::now();
  while (r.ok() && !*r && MsSince(t0) < 2000) {
    r = TimedStep(*push_);
    if (r.ok() && !*r) Idle(5);
  }
  EXPECT_FALSE(r.ok()) << "the owner did not notice that the requester gave up";
  EXPECT_LT(MsSince(t0), 2000);
  EXPECT_LT(max_step_ms_, 1000);
}

// The requester stops taking chunks (and so stops crediting): the owner
// sends what the free slots allow, then its steps return at once without
// progress; its idle bound ends both ends.
TEST_P(UcxOps, RequesterStopsCrediting) {
  ASSERT_TRUE(StepBothUntil([&] { return pulled_.bytes >= 5 * kSlot; }));
  StepSilentPeer(*push_, 400, "the owner");
  EXPECT_LT(pushed_.bytes, kSize);
  const Status failed = push_->Fail(Status(DYAD_RC_TIMEOUT, "the requester made no progress"));
  EXPECT_EQ(failed.code(), DYAD_RC_TIMEOUT) << failed.ToString();
  EXPECT_TRUE(owner_ch_->broken());
  Result<bool> r = false;
  const auto t0 = std::chrono::steady_clock::now();
  while (r.ok() && !*r && MsSince(t0) < 2000) {
    r = TimedStep(*pull_);
    if (r.ok() && !*r) Idle(5);
  }
  EXPECT_FALSE(r.ok()) << "the requester did not notice that the owner gave up";
  EXPECT_TRUE(req_ch_->broken());
  EXPECT_LT(max_step_ms_, 1000);
}

bool Readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

// With the requester's only receive buffer taken by a transfer, a second
// transfer's step does not wait for it: it returns at once, and its wake fd
// becomes readable when the buffer comes back (here: the first transfer
// fails), after which its next step offers the buffer to its owner.
TEST_P(UcxOps, SecondTransferWaitsForTheBufferOnItsWakeFd) {
  ASSERT_TRUE(StepBothUntil([&] { return pulled_.bytes >= 5 * kSlot; }));
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Channel owner2(UniqueFd(sv[0]), Trust::kAuthenticated);
  Channel req2(UniqueFd(sv[1]), Trust::kAuthenticated);
  UniqueFd sink2(::open((dir_ + "/dst2").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  ASSERT_TRUE(sink2.valid());
  TransferStats stats2;
  std::unique_ptr<PullOp> second = req_t_->StartPull(req2, kSize, "", sink2.get(), &stats2);
  ASSERT_NE(second, nullptr);
  for (int i = 0; i < 5; ++i) {
    Result<bool> r = TimedStep(*second);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(*r);
  }
  ASSERT_GE(second->wake_fd(), 0);
  EXPECT_FALSE(Readable(owner2.fd(), 50)) << "an offer without a buffer";
  (void)TimedStep(*second);
  EXPECT_FALSE(Readable(second->wake_fd(), 0));
  (void)pull_->Fail(Status(DYAD_RC_TIMEOUT, "no data from peer"));
  pull_.reset();  // gives the buffer back (at once: its receives were reclaimed)
  EXPECT_TRUE(Readable(second->wake_fd(), 2000)) << "the wake fd missed the buffer's return";
  Result<bool> r = TimedStep(*second);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(*r);
  EXPECT_TRUE(Readable(owner2.fd(), 2000)) << "no offer once the buffer came back";
  EXPECT_LT(max_step_ms_, 1000);
  second.reset();
}

INSTANTIATE_TEST_SUITE_P(Paths, UcxOps, testing::Values("tcp", "shm,tcp"),
                         [](const testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param[0] == 't' ? "messages" : "shared_memory");
                         });

}  // namespace
}  // namespace dyad
#endif  // DYAD_HAVE_UCX
