#include "common/runtime.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <sys/socket.h>

#include <algorithm>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <set>

#include "common/log.h"
#include "common/net.h"
#include "common/thread_annotations.h"
#include "common/worker_pool.h"

namespace dyad {

namespace {

asio::steady_timer::time_point Expiry(Deadline d) {
  return d.never() ? asio::steady_timer::time_point::max() : d.time_point();
}

asio::posix::stream_descriptor::wait_type WaitType(short events) {
  return (events & POLLOUT) != 0 ? asio::posix::stream_descriptor::wait_write
                                 : asio::posix::stream_descriptor::wait_read;
}

// A descriptor registered with the loop for the length of one wait: a
// duplicate, so that the caller's descriptor (and any registration of it
// elsewhere) is left alone.
struct OwnedWait {
  asio::posix::stream_descriptor sd;
  OwnedWait(asio::any_io_executor ex, int fd) : sd(ex) {
    const int dup = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup >= 0) {
      std::error_code ec;
      sd.assign(dup, ec);
      if (ec) ::close(dup);
    }
  }
};

// A channel's registration with the loop, kept with the channel. A channel
// may outlive the loop (a pooled link of a store client whose tasks ran on
// a runtime destroyed first): the loop's end releases the registrations it
// still has (LoopRegistrations), so the channel's end touches nothing of
// the loop's.
struct ChannelWait;

struct Registrations {
  Mutex mu;
  bool ended GUARDED_BY(mu) = false;           // the loop's context is being destroyed
  std::set<ChannelWait*> live GUARDED_BY(mu);  // registered and not released
};

struct ChannelWait {
  asio::any_io_executor ex;
  std::optional<asio::posix::stream_descriptor> sd;  // empty once released
  const std::shared_ptr<Registrations> regs;
  // Its loop ended (and a new loop may have the old one's address).
  std::atomic<bool> released{false};
  ChannelWait(asio::any_io_executor e, int fd, std::shared_ptr<Registrations> r)
      : ex(e), regs(std::move(r)) {
    MutexLock lk(regs->mu);
    if (regs->ended) {
      released.store(true);
      return;
    }
    sd.emplace(e);
    std::error_code ec;
    sd->assign(fd, ec);
    regs->live.insert(this);
  }
  ~ChannelWait() {
    MutexLock lk(regs->mu);
    regs->live.erase(this);
    Release();
  }
  // The channel closes its descriptor: the registration only is undone.
  void Release() REQUIRES(regs->mu) {
    released.store(true);
    if (!sd) return;
    if (sd->is_open()) (void)sd->release();
    sd.reset();
  }
};

// An asio service of each loop's context: its shutdown (the first step of
// the context's destruction, while every service still exists) releases
// the registrations of channels still alive.
class LoopRegistrations : public asio::execution_context::service {
 public:
  static inline asio::execution_context::id id;
  explicit LoopRegistrations(asio::execution_context& ctx)
      : asio::execution_context::service(ctx), regs(std::make_shared<Registrations>()) {}
  void shutdown() override {
    MutexLock lk(regs->mu);
    regs->ended = true;
    for (ChannelWait* w : regs->live) {
      w->regs->mu.AssertHeld();  // the same Registrations
      w->Release();
    }
    regs->live.clear();
  }
  const std::shared_ptr<Registrations> regs;
};

// `ch`'s registration with the loop of `ex`, made on first use. A channel
// that moves between loops (a pooled link of a store client, used by the
// service's loop and by a blocking caller's RunOnThisThread) is registered
// again with the new one.
ChannelWait* Registered(Channel& ch, const asio::any_io_executor& ex) {
  std::shared_ptr<void>& slot = ch.attachment();
  auto* mine = static_cast<ChannelWait*>(slot.get());
  if (mine == nullptr || mine->released.load() || mine->ex != ex) {
    slot.reset();  // (releases the descriptor from the other loop first)
    auto& loop = asio::use_service<LoopRegistrations>(asio::query(ex, asio::execution::context));
    slot = std::make_shared<ChannelWait>(ex, ch.fd(), loop.regs);
  }
  return static_cast<ChannelWait*>(slot.get());
}

// What every operation on the loop shares: it ends once, at the first of
// its own completion, its deadline and its Stop; ending cancels the timer
// and forgets the Stop (the operation cancels its own parts). Loop only.
class BoundedOp {
 protected:
  explicit BoundedOp(asio::any_io_executor ex) : timer_(ex) {}

  // Arms the Stop and the deadline, which end `self` with kStopped and
  // kTimeout (self->Finish(r)). False when the Stop had fired already:
  // `self` has ended, the caller starts nothing.
  template <typename Op>
  bool Arm(const std::shared_ptr<Op>& self, Deadline deadline, Stop* stop) {
    if (stop != nullptr) {
      stop_ = stop;
      stop_ticket_ = stop->OnFire([self] { self->Finish(Ready::kStopped); });
      if (stop_ticket_ == 0) {
        self->Finish(Ready::kStopped);
        return false;
      }
    }
    if (!deadline.never()) {
      timer_.expires_at(Expiry(deadline));
      timer_.async_wait([self](std::error_code ec) {
        if (!ec) self->Finish(Ready::kTimeout);
      });
    }
    return true;
  }
  // True the first time only: the caller then cancels its parts and
  // reports the outcome.
  bool Settle() {
    if (finished_) return false;
    finished_ = true;
    timer_.cancel();
    if (stop_ != nullptr && stop_ticket_ != 0) stop_->Forget(stop_ticket_);
    return true;
  }

 private:
  asio::steady_timer timer_;
  Stop* stop_ = nullptr;
  uint64_t stop_ticket_ = 0;
  bool finished_ = false;
};

// One wait: whichever of its sources ends it first (a descriptor ready, the
// deadline, its Stop, a kick), the others are cancelled one by one (never
// another wait's operation on the same descriptor).
class WaitOp : public BoundedOp, public std::enable_shared_from_this<WaitOp> {
 public:
  explicit WaitOp(asio::any_io_executor ex) : BoundedOp(ex) {}

  template <typename Handler>
  void Start(Handler handler, asio::posix::stream_descriptor* a, short events_a,
             asio::posix::stream_descriptor* b, short events_b, Deadline deadline, Stop* stop,
             std::function<void()>* kick) {
    auto h = std::make_shared<Handler>(std::move(handler));
    done_ = [h](Ready r) { (*h)(r); };
    auto self = shared_from_this();
    if (!Arm(self, deadline, stop)) return;
    if (kick != nullptr) {
      kick_ = kick;
      *kick = [self] { self->Finish(Ready::kReady); };
    }
    if (a != nullptr && a->is_open())
      a->async_wait(WaitType(events_a),
                    asio::bind_cancellation_slot(sig_a_.slot(), [self](std::error_code ec) {
                      if (!ec) self->Finish(Ready::kReady);
                    }));
    if (b != nullptr && b->is_open())
      b->async_wait(WaitType(events_b),
                    asio::bind_cancellation_slot(sig_b_.slot(), [self](std::error_code ec) {
                      if (!ec) self->Finish(Ready::kReady);
                    }));
  }

  void Finish(Ready r) {
    if (!Settle()) return;
    sig_a_.emit(asio::cancellation_type::all);
    sig_b_.emit(asio::cancellation_type::all);
    if (kick_ != nullptr) *kick_ = nullptr;
    std::function<void(Ready)> done = std::move(done_);
    done(r);
  }

 private:
  asio::cancellation_signal sig_a_, sig_b_;
  std::function<void()>* kick_ = nullptr;
  std::function<void(Ready)> done_;
};

// One read of a channel's socket into a buffer of its own (so a read that
// completes after its wait ended, by deadline or Stop, writes nowhere it
// should not), bounded like a WaitOp.
class ReadOp : public BoundedOp, public std::enable_shared_from_this<ReadOp> {
 public:
  static constexpr size_t kMaxRead = 16u << 10;
  explicit ReadOp(asio::any_io_executor ex) : BoundedOp(ex) {}

  struct Outcome {
    Ready ready = Ready::kReady;
    std::error_code ec;
    std::string bytes;
  };

  template <typename Handler>
  void Start(Handler handler, asio::posix::stream_descriptor* sd, size_t max, Deadline deadline,
             Stop* stop) {
    auto h = std::make_shared<Handler>(std::move(handler));
    done_ = [h](Outcome o) { (*h)(std::move(o)); };
    auto self = shared_from_this();
    if (!Arm(self, deadline, stop)) return;
    len_ = std::min(std::max<size_t>(max, 1), kMaxRead);
    buf_.reset(new char[len_]);  // not zeroed: a read fills what is used
    // A read, not a wait: asio tries it at once when the descriptor may
    // hold bytes, else queues it without re-arming the descriptor.
    sd->async_read_some(
        asio::buffer(buf_.get(), len_),
        asio::bind_cancellation_slot(sig_.slot(), [self](std::error_code ec, size_t n) {
          if (ec != asio::error::operation_aborted) self->Finish(Ready::kReady, ec, n);
        }));
  }

  void Finish(Ready r, std::error_code ec = {}, size_t n = 0) {
    if (!Settle()) return;
    sig_.emit(asio::cancellation_type::all);
    Outcome o;
    o.ready = r;
    o.ec = ec;
    if (r == Ready::kReady && !ec) o.bytes.assign(buf_.get(), n);
    std::function<void(Outcome)> done = std::move(done_);
    done(std::move(o));
  }

 private:
  asio::cancellation_signal sig_;
  std::unique_ptr<char[]> buf_;
  size_t len_ = 0;
  std::function<void(Outcome)> done_;
};

Task<Ready> WaitOn(asio::posix::stream_descriptor* a, short events_a,
                   asio::posix::stream_descriptor* b, short events_b, Deadline deadline, Stop* stop,
                   std::function<void()>* kick = nullptr) {
  if (stop != nullptr && stop->fired()) co_return Ready::kStopped;
  if (deadline.expired()) co_return Ready::kTimeout;
  auto ex = co_await asio::this_coro::executor;
  co_return co_await asio::async_initiate<decltype(asio::use_awaitable), void(Ready)>(
      [&](auto handler) {
        std::make_shared<WaitOp>(ex)->Start(std::move(handler), a, events_a, b, events_b, deadline,
                                            stop, kick);
      },
      asio::use_awaitable);
}

}  // namespace

// --- Stop --------------------------------------------------------------------

namespace {
thread_local bool t_on_loop = false;  // this thread runs a runtime's loop
}  // namespace

Stop::Stop(asio::any_io_executor ex, Stop* parent) : ex_(std::move(ex)), parent_(parent) {}

Stop::~Stop() {
  if (parent_ != nullptr && parent_ticket_ != 0) parent_->Forget(parent_ticket_);
}

void Stop::Fire(const Status& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (fired_.load()) return;
    why_ = why;
    fired_.store(true, std::memory_order_release);
  }
  // On the loop its waiters end now; from another thread the loop ends them
  // (a Stop fired from elsewhere outlives its waits: the service's, a test's).
  if (t_on_loop) return Notify();
  asio::post(ex_, [this] { Notify(); });
}

void Stop::Notify() {
  std::map<uint64_t, std::function<void()>> waiters;
  waiters.swap(waiters_);
  for (auto& [ticket, fn] : waiters) fn();
}

bool Stop::fired() const {
  return fired_.load(std::memory_order_acquire) || (parent_ != nullptr && parent_->fired());
}

Status Stop::why() const {
  if (fired_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lk(mu_);
    return why_;
  }
  if (parent_ != nullptr && parent_->fired()) return parent_->why();
  return Status(DYAD_RC_CANCELLED, "cancelled");
}

uint64_t Stop::OnFire(std::function<void()> fn) {
  if (fired()) return 0;
  // A parent's firing reaches this Stop's waiters through one waiter of
  // the parent's, registered while this one has any.
  if (parent_ != nullptr && parent_ticket_ == 0) {
    parent_ticket_ = parent_->OnFire([this] {
      parent_ticket_ = 0;
      Notify();
    });
    if (parent_ticket_ == 0) return 0;
  }
  const uint64_t ticket = next_++;
  waiters_.emplace(ticket, std::move(fn));
  return ticket;
}

void Stop::Forget(uint64_t ticket) {
  waiters_.erase(ticket);
  if (waiters_.empty() && parent_ != nullptr && parent_ticket_ != 0) {
    parent_->Forget(parent_ticket_);
    parent_ticket_ = 0;
  }
}

// --- waits -------------------------------------------------------------------

namespace runtime_internal {

Task<Ready> WaitKicked(std::function<void()>* kick, Deadline deadline, Stop* stop) {
  co_return co_await WaitOn(nullptr, 0, nullptr, 0, deadline, stop, kick);
}

}  // namespace runtime_internal

Task<Ready> WaitReady(int fd, short events, Deadline deadline, Stop* stop, int fd2, short events2) {
  auto ex = co_await asio::this_coro::executor;
  std::optional<OwnedWait> a, b;
  if (fd >= 0) a.emplace(ex, fd);
  if (fd2 >= 0) b.emplace(ex, fd2);
  co_return co_await WaitOn(a ? &a->sd : nullptr, events, b ? &b->sd : nullptr, events2, deadline,
                            stop);
}

Task<Ready> WaitReady(Channel& ch, short events, Deadline deadline, Stop* stop, int fd2,
                      short events2) {
  // Bytes the channel read ahead (Channel::SetReadAhead) are readable now,
  // though the socket may hold none of them.
  if ((events & POLLIN) != 0 && ch.has_unread()) co_return Ready::kReady;
  auto ex = co_await asio::this_coro::executor;
  auto* mine = Registered(ch, ex);
  std::optional<OwnedWait> b;
  if (fd2 >= 0) b.emplace(ex, fd2);
  co_return co_await WaitOn(&*mine->sd, events, b ? &b->sd : nullptr, events2, deadline, stop);
}

void StartReadInto(asio::any_io_executor ex, Channel& ch, size_t max, Deadline deadline, Stop* stop,
                   std::function<void(Ready, Status)> done) {
  auto* mine = Registered(ch, ex);
  Channel* chp = &ch;
  std::make_shared<ReadOp>(ex)->Start(
      [chp, done = std::move(done)](ReadOp::Outcome o) {
        Status error;
        if (o.ready == Ready::kReady) {
          if (o.ec == asio::error::eof) {
            error = Status(DYAD_RC_CONNLOST, "peer closed the connection");
          } else if (o.ec) {
            error = Status(DYAD_RC_CONNLOST, "read: " + o.ec.message());
          } else {
            chp->Unread(std::move(o.bytes));
          }
        }
        done(o.ready, std::move(error));
      },
      &*mine->sd, max, deadline, stop);
}

Task<Ready> ReadInto(Channel& ch, size_t max, Deadline deadline, Stop* stop, Status* error) {
  if (stop != nullptr && stop->fired()) co_return Ready::kStopped;
  if (deadline.expired()) co_return Ready::kTimeout;
  auto ex = co_await asio::this_coro::executor;
  auto [ready, st] =
      co_await asio::async_initiate<decltype(asio::use_awaitable), void(Ready, Status)>(
          [&](auto handler) {
            auto h = std::make_shared<decltype(handler)>(std::move(handler));
            StartReadInto(ex, ch, max, deadline, stop,
                          [h](Ready r, Status s) { (*h)(r, std::move(s)); });
          },
          asio::use_awaitable);
  if (!st.ok()) *error = std::move(st);
  co_return ready;
}

Task<bool> Sleep(Deadline deadline, Stop* stop) {
  std::function<void()> never;
  co_return co_await WaitOn(nullptr, 0, nullptr, 0, deadline, stop, &never) != Ready::kStopped;
}

// --- LoopTimer -------------------------------------------------------------------

struct LoopTimer::State {
  State(asio::any_io_executor e, std::function<void()> f) : ex(std::move(e)), fire(std::move(f)) {}
  const asio::any_io_executor ex;
  const std::function<void()> fire;
  Mutex mu;
  std::condition_variable idle;
  bool closed GUARDED_BY(mu) = false;
  bool firing GUARDED_BY(mu) = false;
  std::optional<SteadyClock::time_point> want GUARDED_BY(mu);  // earliest not yet served
  // The loop's pending timer, owned by its wait (loop only).
  std::weak_ptr<asio::steady_timer> timer;
};

LoopTimer::LoopTimer(std::optional<asio::any_io_executor> loop, std::function<void()> fire) {
  if (!loop) {
    own_ = std::make_unique<Runtime>(1, 1000);
    (void)own_->Start();
    loop = own_->executor();
  }
  s_ = std::make_shared<State>(std::move(*loop), std::move(fire));
}

LoopTimer::~LoopTimer() {
  Close();
  own_.reset();  // its loop ends; a pending timer goes with it
}

void LoopTimer::Arm(SteadyClock::time_point at) {
  {
    MutexLock lk(s_->mu);
    if (s_->closed || (s_->want && *s_->want <= at)) return;
    s_->want = at;
  }
  asio::post(s_->ex, [s = s_] { Rearm(s); });
}

void LoopTimer::Rearm(const std::shared_ptr<State>& s) {
  SteadyClock::time_point at;
  {
    MutexLock lk(s->mu);
    if (s->closed || !s->want) return;
    at = *s->want;
  }
  if (std::shared_ptr<asio::steady_timer> pending = s->timer.lock()) {
    if (pending->expiry() <= at) return;  // it comes first; Due arms the rest
    pending->cancel();
  }
  auto t = std::make_shared<asio::steady_timer>(s->ex, at);
  s->timer = t;
  t->async_wait([s, t](std::error_code ec) {
    if (ec != asio::error::operation_aborted) Due(s);
  });
}

void LoopTimer::Due(const std::shared_ptr<State>& s) {
  {
    MutexLock lk(s->mu);
    if (s->closed || !s->want) return;
    if (*s->want > SteadyClock::now()) {
      lk.Unlock();
      return Rearm(s);
    }
    s->want.reset();
    s->firing = true;
  }
  s->fire();
  MutexLock lk(s->mu);
  s->firing = false;
  s->idle.notify_all();
}

void LoopTimer::Close() {
  MutexLock lk(s_->mu);
  s_->closed = true;
  lk.Wait(s_->idle, [this]() REQUIRES(s_->mu) { return !s_->firing; });
}

// --- Runtime -------------------------------------------------------------------

Runtime::Runtime(size_t pool_threads, int64_t pool_idle_ms)
    : root_stop_(std::make_unique<Stop>(io_.get_executor())),
      pool_(std::make_unique<WorkerPool>("dyad-pool", pool_threads, pool_idle_ms)) {}

Runtime::~Runtime() { Shutdown(); }

Status Runtime::Start() {
  if (running_.exchange(true)) return Status::OK();
  work_ = std::make_unique<asio::executor_work_guard<asio::io_context::executor_type>>(
      io_.get_executor());
  loop_ = std::thread([this] {
    t_on_loop = true;
    for (;;) {
      try {
        io_.run();
        break;
      } catch (const std::exception& e) {
        DYAD_LOG_ERROR("runtime: a task threw: %s", e.what());
      }
    }
  });
  pthread_setname_np(loop_.native_handle(), "dyad-loop");
  return Status::OK();
}

void Runtime::FireStop() { root_stop_->Fire(Status(DYAD_RC_CANCELLED, "the service is stopping")); }

void Runtime::Shutdown(int64_t grace_ms) {
  if (!running_.exchange(false)) {
    if (pool_) pool_->Stop();
    return;
  }
  FireStop();
  const Deadline grace = Deadline::AfterMs(grace_ms);
  while (tasks_.load() != 0 && !grace.expired())
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  if (tasks_.load() != 0)
    DYAD_LOG_WARN("runtime: %llu tasks still running after %lld ms; stopping the loop",
                  static_cast<unsigned long long>(tasks_.load()), static_cast<long long>(grace_ms));
  work_.reset();
  pool_->Stop();  // queued blocking calls run and post their results
  io_.stop();
  if (loop_.joinable()) loop_.join();
}

void Runtime::Spawn(Task<void> task) {
  tasks_.fetch_add(1);
  // Posted, never run inline: a caller on the loop may hold a lock the
  // task takes (co_spawn alone would run it at once up to its first wait).
  asio::post(io_, [this, t = std::move(task)]() mutable {
    asio::co_spawn(io_, std::move(t), [this](std::exception_ptr e) {
      tasks_.fetch_sub(1);
      if (!e) return;
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        DYAD_LOG_ERROR("runtime: a task ended with an exception: %s", ex.what());
      }
    });
  });
}

void Runtime::RunSync(Task<void> task) {
  std::promise<void> done;
  std::future<void> f = done.get_future();
  tasks_.fetch_add(1);
  asio::co_spawn(io_, std::move(task), [this, &done](std::exception_ptr e) {
    tasks_.fetch_sub(1);
    if (e) return done.set_exception(e);
    done.set_value();
  });
  f.get();
}

bool Runtime::Submit(std::function<void()> fn) { return pool_->Submit(std::move(fn)); }

Task<void> ForEachTask(Runtime& rt, size_t n, size_t width, std::function<Task<void>(size_t)> fn) {
  if (n == 0) co_return;
  // `width` runners take the next index until none is left; the last to
  // end wakes the caller. All of it runs on the loop: no lock.
  struct Shared {
    std::function<Task<void>(size_t)> fn;
    size_t n = 0;
    size_t next = 0;
    size_t running = 0;
    std::shared_ptr<Rendezvous<bool>> all_done;
  };
  auto sh = std::make_shared<Shared>();
  sh->fn = std::move(fn);
  sh->n = n;
  sh->running = std::clamp<size_t>(width, 1, n);
  sh->all_done = std::make_shared<Rendezvous<bool>>(rt.executor());
  for (size_t r = sh->running; r > 0; --r)
    rt.Spawn([](std::shared_ptr<Shared> s) -> Task<void> {
      while (s->next < s->n) co_await s->fn(s->next++);
      if (--s->running == 0) s->all_done->Deliver(true);
    }(sh));
  (void)co_await sh->all_done->Take(Deadline::Never(), nullptr);
}

}  // namespace dyad
