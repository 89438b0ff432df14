// transport_ucx_op_test.cc: the ucx transport's two transfers (ucx_pull.cc,
// ucx_push.cc) as coroutines on the service's runtime (common/runtime.h):
//  * both ends of a transfer run on ONE runtime, whose one loop thread runs
//    both: an end that held the thread while waiting on its peer would stop
//    the other, and the transfer would never end (every size: empty,
//    inline, one chunk, exactly the slots, many credit rounds);
//  * an end whose Stop fires mid-transfer (the requester hung up, the
//    service stops), a silent peer (the idle bound, not sooner, not later),
//    a peer that hangs up: the other end ends promptly with a clear error,
//    both sessions are broken, every buffer comes back to its pool, and a
//    next transfer on a fresh session moves its file intact;
//  * waits for a pool buffer hold no thread, end at the peer's hang-up or
//    the Stop, and are bounded by the idle bound;
//  * a transfer whose coroutine is destroyed at a wait (its runtime shut
//    down) gives its buffer back.
// A peer is made silent by holding its runtime's loop (a second runtime),
// or, for a requester, by not reading the pipe it writes the file into.
// Each case runs over UCX messages (UCX_TLS=tcp) and over the same-host
// direct path (shared memory). Transfers through Transport::PullNow and
// PushNow are in transport_conformance_test.
#ifdef DYAD_HAVE_UCX
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "common/fsutil.h"
#include "common/net.h"
#include "common/runtime.h"
#include "transport/host_id.h"
#include "transport/transfer_waits.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_transfer.h"
#include "transport/ucx/ucx_wire.h"
#include "util.h"

namespace dyad::ucx {
namespace {

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
// 256 KiB chunks make a buffer of four 128 KiB slots; files of at most
// 64 KiB travel inline. A 4 MiB file is 32 chunks: many credit rounds.
constexpr uint64_t kChunk = 256 * kKiB;
constexpr uint64_t kSlot = 128 * kKiB;
constexpr uint64_t kSize = 4 * kMiB;
// The bound of every wait of the test itself.
constexpr int64_t kBoundMs = 20000;

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

std::string Pattern(uint64_t size, int seed) {
  std::string data(size, '\0');
  for (uint64_t i = 0; i < size; ++i)
    data[i] = static_cast<char>((i * 7919 + i / 4096 + static_cast<uint64_t>(seed)) % 251);
  return data;
}

Task<void> Deliver(Task<Status> task, std::shared_ptr<std::promise<Status>> done) {
  done->set_value(co_await std::move(task));
}

// Runs `task` on `rt` (spawned: never on this thread); its result arrives
// in the future.
std::future<Status> Launch(Runtime& rt, Task<Status> task) {
  auto done = std::make_shared<std::promise<Status>>();
  std::future<Status> f = done->get_future();
  rt.Spawn(Deliver(std::move(task), done));
  return f;
}

bool Ready(std::future<Status>& f, int64_t ms = 0) {
  return f.wait_for(std::chrono::milliseconds(ms)) == std::future_status::ready;
}

// The end of `f`, waited for at most `ms`.
Status Outcome(std::future<Status>& f, int64_t ms = kBoundMs) {
  if (!Ready(f, ms)) return Status(DYAD_RC_SYSFAIL, "the test's bound passed: no end");
  return f.get();
}

bool Readable(int fd, int ms) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

// One fetch: its session (owner's and requester's ends), each end's Stop
// and waits (on the runtime the end runs on), what each end counted, and
// how each ended.
struct Fetch {
  Fetch(Runtime& owner_rt, Runtime& req_rt)
      : owner_stop(owner_rt.executor(), &owner_rt.stopping()),
        req_stop(req_rt.executor(), &req_rt.stopping()),
        owner_waits(owner_rt, &owner_stop),
        req_waits(req_rt, &req_stop) {
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0) {
      owner_ch = std::make_unique<Channel>(UniqueFd(sv[0]), Trust::kAuthenticated);
      req_ch = std::make_unique<Channel>(UniqueFd(sv[1]), Trust::kAuthenticated);
    }
  }
  std::unique_ptr<Channel> owner_ch, req_ch;
  Stop owner_stop, req_stop;
  TransferWaits owner_waits, req_waits;
  FileSource src;
  TransferStats pushed, pulled;
  std::future<Status> push, pull;
};

class UcxTransfers : public testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    dir_ = testutil::MakeTempDir("dyad-ucx-co.");
    ASSERT_FALSE(dir_.empty());
    for (std::unique_ptr<Runtime>* rt : {&rt_, &rt2_}) {
      *rt = std::make_unique<Runtime>(2, 1000);
      ASSERT_TRUE((*rt)->Start().ok());
    }
  }

  void TearDown() override {
    for (auto& gate : gates_) Open(*gate);
    // Every wait names a Stop under the runtimes' own: the transfers end.
    for (std::unique_ptr<Runtime>* rt : {&rt_, &rt2_})
      if (*rt) (*rt)->Shutdown();
    // The sessions' registrations belong to the runtimes' loops.
    for (auto& f : fetches_)
      for (Channel* ch : {f->owner_ch.get(), f->req_ch.get()})
        if (ch != nullptr) ch->attachment().reset();
    fetches_.clear();
    rt_.reset();
    rt2_.reset();
    owner_.reset();
    req_.reset();
    fds_.clear();
    testutil::RemoveTree(dir_);
  }

  // The owner's and the requester's transport resources (two UCX workers,
  // as on two nodes), one buffer per pool, with UCX_TLS as the case says.
  void MakeEnds(int64_t idle_ms) {
    ScopedEnv tls("UCX_TLS", GetParam());
    ScopedEnv warn("UCX_WARN_UNUSED_ENV_VARS", "n");
    ScopedEnv pool("DYAD_UCX_POOL_BUFFERS", "1");
    TransportOptions options;
    options.chunk_size = kChunk;
    options.idle_ms = idle_ms;
    owner_ = std::make_unique<Resources>(options);
    req_ = std::make_unique<Resources>(options);
    ASSERT_TRUE(owner_->worker.Start().ok());
    ASSERT_TRUE(req_->worker.Start().ok());
    args_ = EncodeRequestArgs({req_->worker.address(), SameHostId()});
  }

  Fetch& NewFetch(Runtime& owner_rt, Runtime& req_rt) {
    fetches_.push_back(std::make_unique<Fetch>(owner_rt, req_rt));
    Fetch& f = *fetches_.back();
    EXPECT_NE(f.owner_ch, nullptr);
    return f;
  }

  // A file of `size` bytes (pattern `seed`) as the owner opened it.
  FileSource Source(uint64_t size, int seed) {
    const std::string path = dir_ + "/src" + std::to_string(seed);
    EXPECT_TRUE(testutil::WriteFile(path, Pattern(size, seed)));
    FileSource src;
    src.fd = Keep(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    src.size = size;
    src.path = path;
    return src;
  }
  // A file for the requester to land bytes in.
  int Sink(const std::string& name) {
    return Keep(
        ::open((dir_ + "/" + name).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  }
  // A pipe for the requester to land bytes in (write end); the test reads
  // `*read_end`, so the transfer goes only as far as the test lets it.
  int PipeSink(int* read_end) {
    int p[2];
    EXPECT_EQ(::pipe2(p, O_CLOEXEC), 0);
    *read_end = Keep(p[0]);
    EXPECT_EQ(::fcntl(*read_end, F_SETFL, O_NONBLOCK), 0);
    return Keep(p[1]);
  }
  int Keep(int fd) {
    EXPECT_GE(fd, 0);
    fds_.emplace_back(fd);
    return fd;
  }

  void StartPush(Fetch& f, Runtime& rt) {
    f.push = Launch(rt, PushFile(*owner_, *f.owner_ch, f.src, args_, &f.pushed, f.owner_waits));
  }
  void StartPull(Fetch& f, Runtime& rt, int sink) {
    f.pull = Launch(rt, PullFile(*req_, *f.req_ch, f.src.size, sink, &f.pulled, f.req_waits));
  }

  // Reads the pipe until `got` holds `n` bytes or `done` holds (bounded).
  template <typename Done>
  void ReadPipe(int fd, uint64_t n, std::string* got, Done done) {
    const auto t0 = std::chrono::steady_clock::now();
    char buf[64 * 1024];
    while (got->size() < n && !done() && MsSince(t0) < kBoundMs) {
      (void)Readable(fd, 10);
      const ssize_t r = ::read(fd, buf, std::min<uint64_t>(sizeof buf, n - got->size()));
      if (r > 0) got->append(buf, static_cast<size_t>(r));
    }
  }
  // Reads the pipe until both ends of `f` ended (bounded), then what they
  // left in it.
  void ReadPipeUntilBothEnd(int fd, std::string* got, Fetch& f) {
    ReadPipe(fd, UINT64_MAX, got, [&] { return Ready(f.push) && Ready(f.pull); });
    char buf[64 * 1024];
    ssize_t r;
    while ((r = ::read(fd, buf, sizeof buf)) > 0) got->append(buf, static_cast<size_t>(r));
  }

  // Holds `rt`'s loop (every task on it stands still, as a hung peer
  // would) until Open (or the test's bound).
  std::shared_ptr<std::promise<void>> HoldLoop(Runtime& rt) {
    auto gate = std::make_shared<std::promise<void>>();
    std::shared_future<void> opened = gate->get_future().share();
    auto held = std::make_shared<std::promise<void>>();
    std::future<void> holding = held->get_future();
    rt.Post([opened, held] {
      held->set_value();
      (void)opened.wait_for(std::chrono::milliseconds(kBoundMs));
    });
    EXPECT_EQ(holding.wait_for(std::chrono::milliseconds(kBoundMs)), std::future_status::ready);
    gates_.push_back(gate);
    return gate;
  }
  static void Open(std::promise<void>& gate) {
    try {
      gate.set_value();
    } catch (const std::future_error&) {  // opened already
    }
  }

  // After a failure: both sessions broken, every buffer back in its pool,
  // and a next transfer on a fresh session moves its file intact.
  void ExpectCleanAfterFailure(Fetch& f) {
    EXPECT_TRUE(f.owner_ch->broken());
    EXPECT_TRUE(f.req_ch->broken());
    ExpectPoolsFree();
    ExpectFreshTransferWorks(2 * kMiB + 5, 99);
  }
  void ExpectPoolsFree() {
    EXPECT_EQ(req_->recv_pool.in_use(), 0u) << "a receive buffer was not given back";
    EXPECT_EQ(owner_->send_pool.in_use(), 0u) << "a send buffer was not given back";
  }
  // Both ends on the one runtime rt_; bytes compared.
  void ExpectFreshTransferWorks(uint64_t size, int seed) {
    Fetch& f = NewFetch(*rt_, *rt_);
    f.src = Source(size, seed);
    const std::string name = "dst" + std::to_string(seed);
    StartPush(f, *rt_);
    StartPull(f, *rt_, Sink(name));
    const Status pushed = Outcome(f.push);
    const Status pulled = Outcome(f.pull);
    ASSERT_TRUE(pushed.ok()) << size << " bytes: " << pushed.ToString();
    ASSERT_TRUE(pulled.ok()) << size << " bytes: " << pulled.ToString();
    EXPECT_EQ(f.pulled.bytes, size);
    EXPECT_EQ(f.pushed.bytes, size);
    // Which path the case exercised: UCX messages, or the owner writing
    // into the requester's shared buffer (files past the inline size).
    const bool direct = std::string(GetParam()) != "tcp" && size > kInlineMaxBytes;
    EXPECT_EQ(f.pulled.direct_bytes, direct ? size : 0) << size << " bytes";
    EXPECT_TRUE(testutil::ReadAll(dir_ + "/" + name) == Pattern(size, seed))
        << size << " bytes arrived changed";
    EXPECT_FALSE(f.owner_ch->broken());
    EXPECT_FALSE(f.req_ch->broken());
    ExpectPoolsFree();
  }

  std::string dir_;
  std::unique_ptr<Runtime> rt_, rt2_;
  std::unique_ptr<Resources> owner_, req_;
  std::string args_;
  std::vector<UniqueFd> fds_;
  std::deque<std::unique_ptr<Fetch>> fetches_;
  std::vector<std::shared_ptr<std::promise<void>>> gates_;
};

// Both ends on one loop thread: every size moves, every byte checked.
TEST_P(UcxTransfers, BothEndsRunAsCoroutinesOnOneLoop) {
  MakeEnds(10000);
  int seed = 1;
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, kInlineMaxBytes, kInlineMaxBytes + 1, kSlot,
                        4 * kSlot, 4 * kSlot + 7, kSize}) {
    ExpectFreshTransferWorks(size, seed++);
    if (HasFatalFailure()) return;
  }
}

// Two fetches at once share one buffer per pool: the second waits for the
// buffers without holding the loop, on which the first goes on and ends.
TEST_P(UcxTransfers, TwoFetchesShareOneBufferPerPoolOnOneLoop) {
  MakeEnds(10000);
  Fetch& a = NewFetch(*rt_, *rt_);
  Fetch& b = NewFetch(*rt_, *rt_);
  a.src = Source(kSize, 1);
  b.src = Source(kSize + 3, 2);
  StartPush(a, *rt_);
  StartPull(a, *rt_, Sink("a"));
  StartPush(b, *rt_);
  StartPull(b, *rt_, Sink("b"));
  for (Fetch* f : {&a, &b}) {
    const Status pushed = Outcome(f->push);
    const Status pulled = Outcome(f->pull);
    EXPECT_TRUE(pushed.ok()) << pushed.ToString();
    EXPECT_TRUE(pulled.ok()) << pulled.ToString();
  }
  EXPECT_TRUE(testutil::ReadAll(dir_ + "/a") == Pattern(kSize, 1));
  EXPECT_TRUE(testutil::ReadAll(dir_ + "/b") == Pattern(kSize + 3, 2));
  EXPECT_EQ(req_->recv_pool.mapped(), 1u);
  ExpectPoolsFree();
}

// The requester's Stop fires mid-transfer (its requester hung up): it ends
// with the Stop's reason and tells the owner, which ends at once.
TEST_P(UcxTransfers, RequesterStopFiresMidTransfer) {
  MakeEnds(30000);
  Fetch& f = NewFetch(*rt_, *rt_);
  f.src = Source(kSize, 1);
  int rd = -1;
  const int sink = PipeSink(&rd);
  StartPush(f, *rt_);
  StartPull(f, *rt_, sink);
  std::string got;
  ReadPipe(rd, 5 * kSlot, &got, [] { return false; });
  ASSERT_EQ(got.size(), 5 * kSlot);
  const auto t0 = std::chrono::steady_clock::now();
  f.req_stop.Fire(Status(DYAD_RC_CANCELLED, "the consumer went away"));
  ReadPipeUntilBothEnd(rd, &got, f);
  const Status pulled = Outcome(f.pull);
  const Status pushed = Outcome(f.push);
  EXPECT_LT(MsSince(t0), 3000);
  EXPECT_EQ(pulled.code(), DYAD_RC_CANCELLED) << pulled.ToString();
  EXPECT_NE(pulled.message().find("ucx pull (received"), std::string::npos) << pulled.ToString();
  EXPECT_NE(pulled.message().find("the consumer went away"), std::string::npos)
      << pulled.ToString();
  EXPECT_LT(got.size(), kSize);
  ASSERT_FALSE(pushed.ok());
  EXPECT_NE(pushed.message().find("ucx push of"), std::string::npos) << pushed.ToString();
  EXPECT_TRUE(pushed.code() == DYAD_RC_CANCELLED || pushed.code() == DYAD_RC_CONNLOST)
      << pushed.ToString();
  ExpectCleanAfterFailure(f);
}

// The owner's Stop fires mid-transfer (its service stops): it ends with
// the Stop's reason and tells the requester, which ends at once.
TEST_P(UcxTransfers, OwnerStopFiresMidTransfer) {
  MakeEnds(30000);
  Fetch& f = NewFetch(*rt_, *rt_);
  f.src = Source(kSize, 1);
  int rd = -1;
  const int sink = PipeSink(&rd);
  StartPush(f, *rt_);
  StartPull(f, *rt_, sink);
  std::string got;
  ReadPipe(rd, 5 * kSlot, &got, [] { return false; });
  ASSERT_EQ(got.size(), 5 * kSlot);
  const auto t0 = std::chrono::steady_clock::now();
  f.owner_stop.Fire(Status(DYAD_RC_CANCELLED, "the owner's service stops"));
  ReadPipeUntilBothEnd(rd, &got, f);
  const Status pushed = Outcome(f.push);
  const Status pulled = Outcome(f.pull);
  EXPECT_LT(MsSince(t0), 3000);
  EXPECT_EQ(pushed.code(), DYAD_RC_CANCELLED) << pushed.ToString();
  EXPECT_NE(pushed.message().find("ucx push of"), std::string::npos) << pushed.ToString();
  EXPECT_NE(pushed.message().find("the owner's service stops"), std::string::npos)
      << pushed.ToString();
  EXPECT_LT(got.size(), kSize);
  ASSERT_FALSE(pulled.ok());
  EXPECT_NE(pulled.message().find("ucx pull (received"), std::string::npos) << pulled.ToString();
  EXPECT_TRUE(pulled.code() == DYAD_RC_CANCELLED || pulled.code() == DYAD_RC_CONNLOST)
      << pulled.ToString();
  ExpectCleanAfterFailure(f);
}

// The owner falls silent mid-transfer (its loop is held): the requester's
// idle bound ends the transfer, not sooner and not much later.
TEST_P(UcxTransfers, SilentOwnerEndsTheRequesterAtItsIdleBound) {
  MakeEnds(1500);
  Fetch& f = NewFetch(*rt2_, *rt_);
  f.src = Source(kSize, 1);
  int rd = -1;
  const int sink = PipeSink(&rd);
  StartPush(f, *rt2_);
  StartPull(f, *rt_, sink);
  std::string got;
  ReadPipe(rd, 5 * kSlot, &got, [] { return false; });
  ASSERT_EQ(got.size(), 5 * kSlot);
  std::shared_ptr<std::promise<void>> gate = HoldLoop(*rt2_);
  const auto t0 = std::chrono::steady_clock::now();
  ReadPipe(rd, UINT64_MAX, &got, [&] { return Ready(f.pull); });
  const Status pulled = Outcome(f.pull);
  const double ms = MsSince(t0);
  EXPECT_EQ(pulled.code(), DYAD_RC_TIMEOUT) << pulled.ToString();
  EXPECT_NE(pulled.message().find("no data from the owner for 1500 ms"), std::string::npos)
      << pulled.ToString();
  EXPECT_GE(ms, 1000) << "ended before its idle bound";
  EXPECT_LT(ms, 1500 + 2500) << "ended long after its idle bound";
  EXPECT_LT(got.size(), kSize);
  Open(*gate);
  // The owner learns of it as soon as it runs again.
  const Status pushed = Outcome(f.push, 3000);
  EXPECT_FALSE(pushed.ok());
  EXPECT_NE(pushed.message().find("ucx push of"), std::string::npos) << pushed.ToString();
  ExpectCleanAfterFailure(f);
}

// The requester falls silent mid-transfer (it stops taking chunks and
// crediting): the owner's idle bound ends the transfer.
TEST_P(UcxTransfers, SilentRequesterEndsTheOwnerAtItsIdleBound) {
  MakeEnds(1500);
  Fetch& f = NewFetch(*rt_, *rt2_);
  f.src = Source(kSize, 1);
  int rd = -1;
  const int sink = PipeSink(&rd);
  StartPush(f, *rt_);
  StartPull(f, *rt2_, sink);
  std::string got;
  ReadPipe(rd, 5 * kSlot, &got, [] { return false; });
  ASSERT_EQ(got.size(), 5 * kSlot);
  // The requester's loop now stands in its write to the pipe.
  const auto t0 = std::chrono::steady_clock::now();
  const Status pushed = Outcome(f.push);
  const double ms = MsSince(t0);
  EXPECT_EQ(pushed.code(), DYAD_RC_TIMEOUT) << pushed.ToString();
  EXPECT_NE(pushed.message().find("the requester made no progress for 1500 ms"), std::string::npos)
      << pushed.ToString();
  EXPECT_NE(pushed.message().find("ucx push of"), std::string::npos) << pushed.ToString();
  EXPECT_GE(ms, 1000) << "ended before its idle bound";
  EXPECT_LT(ms, 1500 + 2500) << "ended long after its idle bound";
  ReadPipe(rd, UINT64_MAX, &got, [&] { return Ready(f.pull); });
  const Status pulled = Outcome(f.pull, 3000);
  EXPECT_FALSE(pulled.ok());
  EXPECT_NE(pulled.message().find("ucx pull (received"), std::string::npos) << pulled.ToString();
  EXPECT_LT(got.size(), kSize);
  ExpectCleanAfterFailure(f);
}

// The owner hangs up mid-transfer (its process is gone: its loop stands,
// its session is shut): the requester ends at once, long before its bound.
TEST_P(UcxTransfers, OwnerHangsUpMidTransfer) {
  MakeEnds(30000);
  Fetch& f = NewFetch(*rt2_, *rt_);
  f.src = Source(kSize, 1);
  int rd = -1;
  const int sink = PipeSink(&rd);
  StartPush(f, *rt2_);
  StartPull(f, *rt_, sink);
  std::string got;
  ReadPipe(rd, 5 * kSlot, &got, [] { return false; });
  ASSERT_EQ(got.size(), 5 * kSlot);
  std::shared_ptr<std::promise<void>> gate = HoldLoop(*rt2_);
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::shutdown(f.owner_ch->fd(), SHUT_RDWR), 0);
  ReadPipe(rd, UINT64_MAX, &got, [&] { return Ready(f.pull); });
  const Status pulled = Outcome(f.pull);
  EXPECT_LT(MsSince(t0), 3000);
  EXPECT_EQ(pulled.code(), DYAD_RC_CONNLOST) << pulled.ToString();
  EXPECT_NE(pulled.message().find("ucx pull (received"), std::string::npos) << pulled.ToString();
  Open(*gate);
  const Status pushed = Outcome(f.push, 3000);
  EXPECT_FALSE(pushed.ok()) << "the owner went on with its session shut";
  ExpectCleanAfterFailure(f);
}

// The requester hangs up mid-transfer: the owner ends at once.
TEST_P(UcxTransfers, RequesterHangsUpMidTransfer) {
  MakeEnds(30000);
  Fetch& f = NewFetch(*rt_, *rt2_);
  f.src = Source(kSize, 1);
  int rd = -1;
  const int sink = PipeSink(&rd);
  StartPush(f, *rt_);
  StartPull(f, *rt2_, sink);
  std::string got;
  ReadPipe(rd, 5 * kSlot, &got, [] { return false; });
  ASSERT_EQ(got.size(), 5 * kSlot);
  // The requester's loop stands in its write to the pipe; its session goes.
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::shutdown(f.req_ch->fd(), SHUT_RDWR), 0);
  const Status pushed = Outcome(f.push);
  EXPECT_LT(MsSince(t0), 3000);
  EXPECT_EQ(pushed.code(), DYAD_RC_CONNLOST) << pushed.ToString();
  EXPECT_NE(pushed.message().find("ucx push of"), std::string::npos) << pushed.ToString();
  ReadPipe(rd, UINT64_MAX, &got, [&] { return Ready(f.pull); });
  const Status pulled = Outcome(f.pull, 3000);
  EXPECT_FALSE(pulled.ok()) << "the requester went on with its session shut";
  ExpectCleanAfterFailure(f);
}

// With the requester's only receive buffer held by a stalled fetch, a
// second fetch waits for a buffer holding no thread: it offers nothing,
// ends at once when its owner hangs up (not at its idle bound), and a third
// ends at once when its Stop fires, telling its owner why.
TEST_P(UcxTransfers, WaitForABufferEndsAtHangUpAndAtTheStop) {
  MakeEnds(30000);
  Fetch& held = NewFetch(*rt_, *rt2_);
  held.src = Source(kSize, 1);
  int rd = -1;
  const int sink = PipeSink(&rd);
  StartPush(held, *rt_);
  StartPull(held, *rt2_, sink);
  std::string got;
  ReadPipe(rd, 5 * kSlot, &got, [] { return false; });
  ASSERT_EQ(req_->recv_pool.in_use(), 1u);

  Fetch& hung = NewFetch(*rt_, *rt_);
  hung.src.size = kSize;
  StartPull(hung, *rt_, Sink("hung"));
  EXPECT_FALSE(Readable(hung.owner_ch->fd(), 300)) << "an offer without a buffer";
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(::shutdown(hung.owner_ch->fd(), SHUT_RDWR), 0);
  const Status hung_up = Outcome(hung.pull);
  EXPECT_LT(MsSince(t0), 3000);
  EXPECT_EQ(hung_up.code(), DYAD_RC_CONNLOST) << hung_up.ToString();
  EXPECT_NE(hung_up.message().find("waiting for a receive buffer"), std::string::npos)
      << hung_up.ToString();
  EXPECT_TRUE(hung.req_ch->broken());

  Fetch& stopped = NewFetch(*rt_, *rt_);
  stopped.src.size = kSize;
  StartPull(stopped, *rt_, Sink("stopped"));
  EXPECT_FALSE(Readable(stopped.owner_ch->fd(), 300)) << "an offer without a buffer";
  const auto t1 = std::chrono::steady_clock::now();
  stopped.req_stop.Fire(Status(DYAD_RC_CANCELLED, "the consumer went away"));
  const Status stop = Outcome(stopped.pull);
  EXPECT_LT(MsSince(t1), 3000);
  EXPECT_EQ(stop.code(), DYAD_RC_CANCELLED) << stop.ToString();
  EXPECT_TRUE(stopped.req_ch->broken());
  uint16_t type = 0;
  std::string payload;
  ASSERT_TRUE(stopped.owner_ch->RecvFrame(&type, &payload, Deadline::AfterMs(kBoundMs)).ok());
  EXPECT_EQ(type, kErrorFrame);
  Status told = DecodeErrorFrame(payload, "requester");
  EXPECT_EQ(told.code(), DYAD_RC_CANCELLED) << told.ToString();
  EXPECT_NE(told.message().find("the consumer went away"), std::string::npos) << told.ToString();

  // The stalled fetch goes on and ends; nothing kept a buffer.
  ReadPipeUntilBothEnd(rd, &got, held);
  EXPECT_TRUE(Outcome(held.push).ok());
  EXPECT_TRUE(Outcome(held.pull).ok());
  EXPECT_EQ(got.size(), kSize);
  EXPECT_TRUE(got == Pattern(kSize, 1));
  ExpectPoolsFree();
}

// A wait for a buffer that never comes back is bounded by the idle bound:
// cut into slices (a resting buffer's return is signalled by nobody), it
// still ends at the bound, not at a slice's end, with the bound's message.
TEST_P(UcxTransfers, WaitForABufferEndsAtTheIdleBound) {
  MakeEnds(2500);
  Fetch& held = NewFetch(*rt_, *rt2_);
  held.src = Source(kSize, 1);
  int rd = -1;
  const int sink = PipeSink(&rd);
  StartPush(held, *rt_);
  StartPull(held, *rt2_, sink);
  std::string got;
  ReadPipe(rd, 5 * kSlot, &got, [] { return false; });
  ASSERT_EQ(req_->recv_pool.in_use(), 1u);

  Fetch& waiting = NewFetch(*rt_, *rt_);
  waiting.src.size = kSize;
  const auto t0 = std::chrono::steady_clock::now();
  StartPull(waiting, *rt_, Sink("waiting"));
  const Status timed_out = Outcome(waiting.pull);
  const double ms = MsSince(t0);
  EXPECT_EQ(timed_out.code(), DYAD_RC_TIMEOUT) << timed_out.ToString();
  EXPECT_NE(timed_out.message().find("no data from the owner for 2500 ms"), std::string::npos)
      << timed_out.ToString();
  EXPECT_GE(ms, 2400) << "ended before its idle bound";
  EXPECT_LT(ms, 2500 + 2500) << "ended long after its idle bound";
  EXPECT_TRUE(waiting.req_ch->broken());
  // The held fetch's owner reached its bound too; the requester learns it.
  ReadPipeUntilBothEnd(rd, &got, held);
  EXPECT_FALSE(Outcome(held.push).ok());
  EXPECT_FALSE(Outcome(held.pull).ok());
  ExpectPoolsFree();
}

// The runtime ends while each end waits on its peer, and its waits name
// no Stop: the coroutines are destroyed at their waits, and what they held
// (the receive buffer and its posted receives; the send buffer, the
// endpoint and its sends) comes back.
TEST_P(UcxTransfers, TransferDestroyedAtAWaitGivesBackItsBuffers) {
  MakeEnds(30000);
  auto rt = std::make_unique<Runtime>(2, 1000);
  ASSERT_TRUE(rt->Start().ok());
  int sv[2], sv2[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv2), 0);
  Channel pull_session(UniqueFd(sv[0]), Trust::kAuthenticated);
  Channel silent_owner(UniqueFd(sv[1]), Trust::kAuthenticated);
  Channel push_session(UniqueFd(sv2[0]), Trust::kAuthenticated);
  Channel silent_requester(UniqueFd(sv2[1]), Trust::kAuthenticated);
  TransferWaits waits(*rt, nullptr);
  TransferStats pulled, pushed;
  const FileSource src = Source(kSize, 1);

  // The requester offers its buffer, then waits for chunks that never come.
  std::future<Status> pull =
      Launch(*rt, PullFile(*req_, pull_session, kSize, Sink("dst"), &pulled, waits));
  uint16_t type = 0;
  std::string payload;
  ASSERT_TRUE(silent_owner.RecvFrame(&type, &payload, Deadline::AfterMs(kBoundMs)).ok());
  ASSERT_EQ(type, kOfferFrame);
  EXPECT_EQ(req_->recv_pool.in_use(), 1u);

  // The owner, offered a buffer of messages that nobody receives, sends
  // what the slots allow and waits for a credit that never comes.
  Offer offer;
  offer.transfer_id = NextTransferId();
  offer.slot_bytes = kSlot;
  offer.slots = kSlots;
  ASSERT_TRUE(
      silent_requester.SendFrame(kOfferFrame, EncodeOffer(offer), Deadline::AfterMs(kBoundMs))
          .ok());
  std::future<Status> push =
      Launch(*rt, PushFile(*owner_, push_session, src, args_, &pushed, waits));
  EXPECT_TRUE(testutil::Eventually([&] { return owner_->send_pool.in_use() == 1; }, kBoundMs));
  EXPECT_FALSE(Ready(pull, 300));
  EXPECT_FALSE(Ready(push));

  rt->Shutdown(100);
  pull_session.attachment().reset();
  push_session.attachment().reset();
  rt.reset();  // destroys the suspended coroutines
  EXPECT_EQ(req_->recv_pool.in_use(), 0u) << "the pull's buffer stayed leased";
  EXPECT_EQ(owner_->send_pool.in_use(), 0u) << "the push's buffer stayed leased";
  // The pool is usable at once by the next fetch.
  ExpectFreshTransferWorks(kSize, 2);
}

INSTANTIATE_TEST_SUITE_P(Paths, UcxTransfers, testing::Values("tcp", "shm,tcp"),
                         [](const testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param[0] == 't' ? "messages" : "shared_memory");
                         });

}  // namespace
}  // namespace dyad::ucx
#endif  // DYAD_HAVE_UCX
