#include "common/runtime.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <asio/experimental/awaitable_operators.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <variant>

#include "common/log.h"
#include "common/net.h"
#include "common/worker_pool.h"

namespace dyad {

using asio::experimental::awaitable_operators::operator||;

namespace {

constexpr auto kAsTuple = asio::experimental::as_tuple(asio::use_awaitable);

asio::steady_timer::time_point Expiry(Deadline d) {
  return d.never() ? asio::steady_timer::time_point::max() : d.time_point();
}

// Each operand of a wait, as the index of what ended it.
Task<int> Tagged(Task<std::tuple<std::error_code>> wait, int tag) {
  (void)co_await std::move(wait);
  co_return tag;
}
Task<int> Tagged(Task<void> wait, int tag) {
  co_await std::move(wait);
  co_return tag;
}
// A wait that never ends by itself (an absent operand).
Task<int> Never(asio::any_io_executor ex) {
  asio::steady_timer t(ex, asio::steady_timer::time_point::max());
  (void)co_await t.async_wait(kAsTuple);
  co_return -1;
}

template <typename Variant>
int IndexOf(const Variant& v) {
  return std::visit([](int tag) { return tag; }, v);
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

// A channel's registration with the loop, kept with the channel.
struct ChannelWait {
  asio::posix::stream_descriptor sd;
  ChannelWait(asio::any_io_executor ex, int fd) : sd(ex) {
    std::error_code ec;
    sd.assign(fd, ec);
  }
  ~ChannelWait() {
    std::error_code ec;
    if (sd.is_open()) (void)sd.release();  // the channel closes its descriptor
    (void)ec;
  }
};

Task<Ready> WaitOn(asio::posix::stream_descriptor* a, short events_a,
                   asio::posix::stream_descriptor* b, short events_b, Deadline deadline,
                   Stop* stop) {
  auto ex = co_await asio::this_coro::executor;
  if (stop != nullptr && stop->fired()) co_return Ready::kStopped;
  if (deadline.expired()) co_return Ready::kTimeout;
  asio::steady_timer timer(ex, Expiry(deadline));
  auto first = a != nullptr && a->is_open() ? Tagged(a->async_wait(WaitType(events_a), kAsTuple), 0)
                                            : Never(ex);
  auto second = b != nullptr && b->is_open()
                    ? Tagged(b->async_wait(WaitType(events_b), kAsTuple), 1)
                    : Never(ex);
  auto stopped = stop != nullptr ? Tagged(stop->Wait(), 3) : Never(ex);
  auto v = co_await (std::move(first) || std::move(second) ||
                     Tagged(timer.async_wait(kAsTuple), 2) || std::move(stopped));
  switch (IndexOf(v)) {
    case 0:
    case 1:
      co_return Ready::kReady;
    case 2:
      co_return deadline.expired() ? Ready::kTimeout : Ready::kReady;
    default:
      co_return Ready::kStopped;
  }
}

}  // namespace

// --- Stop --------------------------------------------------------------------

Stop::Stop(asio::any_io_executor ex, const Stop* parent)
    : timer_(ex, asio::steady_timer::time_point::max()), parent_(parent) {}

void Stop::Fire(const Status& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (fired_.load()) return;
    why_ = why;
    fired_.store(true, std::memory_order_release);
  }
  asio::post(timer_.get_executor(), [this] { timer_.cancel(); });
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

Task<void> Stop::Wait() const {
  if (fired()) co_return;
  if (parent_ == nullptr) {
    (void)co_await timer_.async_wait(kAsTuple);
    co_return;
  }
  (void)co_await (timer_.async_wait(kAsTuple) || parent_->Wait());
}

// --- waits -------------------------------------------------------------------

namespace runtime_internal {

Task<void> WaitTimerOrStop(asio::steady_timer& timer, Deadline deadline, Stop* stop) {
  auto ex = co_await asio::this_coro::executor;
  asio::steady_timer limit(ex, Expiry(deadline));
  auto stopped = stop != nullptr ? Tagged(stop->Wait(), 2) : Never(ex);
  (void)co_await (Tagged(timer.async_wait(kAsTuple), 0) || Tagged(limit.async_wait(kAsTuple), 1) ||
                  std::move(stopped));
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
  auto ex = co_await asio::this_coro::executor;
  std::shared_ptr<void>& slot = ch.attachment();
  if (!slot) slot = std::make_shared<ChannelWait>(ex, ch.fd());
  auto* mine = static_cast<ChannelWait*>(slot.get());
  std::optional<OwnedWait> b;
  if (fd2 >= 0) b.emplace(ex, fd2);
  co_return co_await WaitOn(&mine->sd, events, b ? &b->sd : nullptr, events2, deadline, stop);
}

Task<bool> Sleep(Deadline deadline, Stop* stop) {
  auto ex = co_await asio::this_coro::executor;
  asio::steady_timer never(ex, asio::steady_timer::time_point::max());
  co_await runtime_internal::WaitTimerOrStop(never, deadline, stop);
  co_return stop == nullptr || !stop->fired();
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
    loop_id_ = std::this_thread::get_id();
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
  asio::co_spawn(io_, std::move(task), [this](std::exception_ptr e) {
    tasks_.fetch_sub(1);
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      DYAD_LOG_ERROR("runtime: a task ended with an exception: %s", ex.what());
    }
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

}  // namespace dyad
