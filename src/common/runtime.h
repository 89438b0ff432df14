// runtime.h: the service's one runtime: an event loop (standalone asio)
// on which every wait is a C++20 coroutine.
//
// A request, a fetch, a transfer, a store wait: each operation that waits
// on a peer, a publication, a lock, a buffer or a timer is one
// straight-line `Task` that suspends at its waits; the loop thread runs
// whichever task can go on. A wait holds no thread, whatever it waits for
// and however long, so threads follow the CPU work, not the waits:
//  * one loop thread runs every task;
//  * one bounded pool (Offload) runs what must leave the loop: calls that
//    block in the kernel or in a library (a store's client, a disk copy,
//    MUNGE), started lazily and ended when idle.
// Every wait is bounded by a deadline and ends early when its Stop fires
// (the requester hung up, the service stops): WaitReady says which.
// A caller outside the loop (a tool, a test, a thread of its own) runs a
// task to completion with RunSync; there is no second implementation of
// any operation for blocking callers.
//
// Only the service and its parts include this; the client libraries that
// load into applications never do.
#pragma once

#include <poll.h>

// asio 1.22 enables co_await with clang only for the coroutines TS;
// clang 16 in C++20 mode has the standard ones, which asio also uses.
#if defined(__clang__) && defined(__cpp_impl_coroutine) && !defined(ASIO_HAS_CO_AWAIT)
#define ASIO_HAS_CO_AWAIT 1
#endif
#include <asio/any_io_executor.hpp>
#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/experimental/as_tuple.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/time.h"

namespace dyad {

class Channel;
class WorkerPool;

template <typename T = void>
using Task = asio::awaitable<T>;

// DYAD_RETURN_IF_ERROR inside a coroutine (`expr` may co_await).
#define DYAD_CO_RETURN_IF_ERROR(expr) \
  do {                                \
    ::dyad::Status _st = (expr);      \
    if (!_st.ok()) co_return _st;     \
  } while (0)

// A one-shot signal that ends waits: once fired, every wait that names it
// ends, now and later. A Stop may have a parent (a request's Stop has the
// service's): it counts as fired when its parent has.
class Stop {
 public:
  explicit Stop(asio::any_io_executor ex, Stop* parent = nullptr);
  ~Stop();
  Stop(const Stop&) = delete;
  Stop& operator=(const Stop&) = delete;

  // Fires (from any thread; the first reason stays): the waits that name
  // it (or a child) end on the loop.
  void Fire(const Status& why);
  bool fired() const;
  // The reason of the first Stop of the chain that fired.
  Status why() const;

  // Loop only: `fn` runs (on the loop) once this Stop or a parent fires,
  // unless Forget(ticket) came first. 0 when it fired already.
  uint64_t OnFire(std::function<void()> fn);
  void Forget(uint64_t ticket);

 private:
  void Notify();  // on the loop
  asio::any_io_executor ex_;
  std::atomic<bool> fired_{false};
  mutable std::mutex mu_;
  Status why_;  // guarded by mu_
  Stop* parent_;
  uint64_t parent_ticket_ = 0;
  // Loop only.
  uint64_t next_ = 1;
  std::map<uint64_t, std::function<void()>> waiters_;
};

enum class Ready { kReady, kTimeout, kStopped };

// The service's runtime (see above). Start() starts the loop thread;
// Stop() fires the root Stop (every wait ends), lets the tasks finish,
// then joins the loop and the pool.
class Runtime {
 public:
  // `pool_threads`: the bound of the pool for blocking calls; threads start
  // as calls need them and end after `pool_idle_ms` idle.
  Runtime(size_t pool_threads, int64_t pool_idle_ms);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  Status Start();
  // Fires stopping() (idempotent): every wait that names it ends.
  void FireStop();
  // Fires the stop, gives the tasks (RunSync's included) `grace_ms` to
  // end, then stops the loop and the pool and joins them. Idempotent.
  void Shutdown(int64_t grace_ms = 2000);

  asio::any_io_executor executor() { return io_.get_executor(); }
  // Fires when the service stops: every request's Stop descends from it.
  Stop& stopping() { return *root_stop_; }
  bool running() const { return running_.load(); }
  // Whether the calling thread runs this runtime's loop now.
  bool OnLoop() { return io_.get_executor().running_in_this_thread(); }

  // Starts `task` on the loop, detached, after the caller's turn (never
  // inline, whoever calls); it must end by itself (its waits name a Stop
  // descending from stopping()).
  void Spawn(Task<void> task);
  // Tasks started by Spawn that have not ended.
  uint64_t tasks() const { return tasks_.load(); }

  // Runs `fn` on the pool and resumes with its result on the loop. `fn`
  // may block; it must not touch loop-only state.
  template <typename F>
  Task<std::invoke_result_t<F>> Offload(F fn);

  // Runs `task` to its end from a thread that is not the loop, blocking
  // this thread meanwhile (tools, tests, a thread of the caller's own).
  template <typename T>
  T RunSync(Task<T> task);
  void RunSync(Task<void> task);

  // Waits on a peer in progress that have lasted long enough to count as
  // parked (service/peer_waits.h), for `dyad status`.
  std::atomic<uint64_t> long_waits{0};

  // Posts `fn` to the loop.
  void Post(std::function<void()> fn) { asio::post(io_, std::move(fn)); }

 private:
  bool Submit(std::function<void()> fn);

  asio::io_context io_;
  std::unique_ptr<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::unique_ptr<Stop> root_stop_;
  std::unique_ptr<WorkerPool> pool_;
  std::thread loop_;
  std::atomic<bool> running_{false};
  std::atomic<uint64_t> tasks_{0};
};

// Waits until `fd` is ready for `events` (POLLIN, POLLOUT; a hang-up or an
// error counts as ready), or `fd2` for `events2` (-1: none), or `deadline`,
// or `stop` fires (may be null). The descriptors' owner keeps them open
// during the wait. On the loop only.
Task<Ready> WaitReady(int fd, short events, Deadline deadline, Stop* stop, int fd2 = -1,
                      short events2 = POLLIN);
// The same for a Channel: its descriptor's registration is kept with the
// channel (created at its first wait), so a session's waits cost no
// registration each.
Task<Ready> WaitReady(Channel& ch, short events, Deadline deadline, Stop* stop, int fd2 = -1,
                      short events2 = POLLIN);
// Reads what the socket of `ch` holds (at least one byte, at most `max`,
// up to 16 KiB) into the channel's unread bytes (Channel::Unread), from
// which its frame calls then take whole frames: one system call usually
// brings a frame's header and payload, and those of frames behind it.
// Waits until bytes come, `deadline` or `stop`. A hang-up or a socket
// error gives kReady with `*error` set (DYAD_RC_CONNLOST); `ch` is left as
// it is (a requester that shut down its sending side still gets its
// reply). Unlike WaitReady it costs no re-registration of the descriptor
// per call (a read is tried, then queued). On the loop only; nobody else
// may read the descriptor meanwhile.
Task<Ready> ReadInto(Channel& ch, size_t max, Deadline deadline, Stop* stop, Status* error);
// The same started from a callback: `done` runs once on the loop, with
// how it ended and the hang-up or error (OK otherwise), possibly before
// this returns (a Stop that fired). The caller keeps `ch` alive until then.
void StartReadInto(asio::any_io_executor ex, Channel& ch, size_t max, Deadline deadline, Stop* stop,
                   std::function<void(Ready, Status)> done);
// Sleeps until `deadline` or until `stop` fires (false then).
Task<bool> Sleep(Deadline deadline, Stop* stop);

// Runs `fn(0)` ... `fn(n - 1)` as tasks on the loop, at most `width` at
// once, and returns when every one has ended. Each must end by itself
// (its waits name a Stop). `fn` is kept until then. On the loop.
Task<void> ForEachTask(Runtime& rt, size_t n, size_t width, std::function<Task<void>(size_t)> fn);

// A timer for state that lives outside any task (a store's wait deadlines,
// its feeds' polls): `fire` runs on a loop once the earliest time armed has
// come: `loop`'s (a service's runtime), or, without one, a loop of the
// timer's own (one thread, started here). Arm may be called from any
// thread, also from `fire` (which re-arms for what is still pending). After
// Close (any thread, never from `fire`), `fire` is not running and never
// runs again. The loop's timers are owned by their pending waits alone, so
// a LoopTimer may outlive its loop's runtime, and the runtime may be
// destroyed with a wait pending.
class LoopTimer {
 public:
  LoopTimer(std::optional<asio::any_io_executor> loop, std::function<void()> fire);
  ~LoopTimer();
  LoopTimer(const LoopTimer&) = delete;
  LoopTimer& operator=(const LoopTimer&) = delete;

  // `fire` runs at `at` (at once when it has passed) unless an earlier
  // time is armed already.
  void Arm(SteadyClock::time_point at);
  void Close();

 private:
  struct State;
  static void Rearm(const std::shared_ptr<State>& s);  // on the loop
  static void Due(const std::shared_ptr<State>& s);    // on the loop
  std::unique_ptr<Runtime> own_;                       // without `loop`
  std::shared_ptr<State> s_;
};

// Runs `task` to its end on the calling thread, on a loop of its own made
// for the call: a blocking caller of an operation written as a task (a
// store client's call from a tool or a thread outside any runtime). The
// task's waits take no Stop (that loop has none). A channel that outlives
// the call must drop its registration with that loop (attachment().reset())
// within the task: once the call returns, the loop is gone.
template <typename T>
T RunOnThisThread(Task<T> task) {
  asio::io_context io;
  std::optional<T> out;
  std::exception_ptr error;
  asio::co_spawn(
      io,
      [&]() -> Task<void> {
        try {
          out.emplace(co_await std::move(task));
        } catch (...) {
          error = std::current_exception();
        }
      },
      asio::detached);
  io.run();
  if (error) std::rethrow_exception(error);
  return std::move(*out);
}

// A result delivered by a callback from any thread (a store's wait, a
// flight that settles): the first Deliver counts; Take waits for it, until
// `deadline` or `stop` (nullopt then; a later Take may still get it).
template <typename T>
class Rendezvous : public std::enable_shared_from_this<Rendezvous<T>> {
 public:
  explicit Rendezvous(asio::any_io_executor ex) : ex_(std::move(ex)) {}
  // From any thread; the first call wins.
  void Deliver(T value) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (value_) return;
      value_.emplace(std::move(value));
    }
    asio::post(ex_, [self = this->shared_from_this()] {
      // Moved out first: the wait it ends clears kick_, which must not
      // destroy the function while it runs.
      std::function<void()> kick = std::move(self->kick_);
      self->kick_ = nullptr;
      if (kick) kick();
    });
  }
  Task<std::optional<T>> Take(Deadline deadline, Stop* stop);

 private:
  asio::any_io_executor ex_;
  std::mutex mu_;
  std::optional<T> value_;      // guarded by mu_
  std::function<void()> kick_;  // loop only: ends the Take waiting now
};

// --- templates ---------------------------------------------------------------

namespace runtime_internal {
// Waits until `*kick` is called (loop only; it is set for the wait),
// `deadline` passes or `stop` fires.
Task<Ready> WaitKicked(std::function<void()>* kick, Deadline deadline, Stop* stop);
// Resumes a suspended coroutine's handler on its executor with `value`.
template <typename Handler, typename T>
void Complete(std::shared_ptr<Handler> h, T value) {
  auto ex = asio::get_associated_executor(*h);
  asio::post(ex, [h, v = std::move(value)]() mutable { std::move (*h)(std::move(v)); });
}
}  // namespace runtime_internal

template <typename F>
Task<std::invoke_result_t<F>> Runtime::Offload(F fn) {
  using R = std::invoke_result_t<F>;
  if constexpr (std::is_void_v<R>) {
    co_await Offload([fn = std::move(fn)]() mutable {
      fn();
      return true;
    });
    co_return;
  } else {
    auto initiate = [this, fn = std::move(fn)](auto handler) mutable {
      using H = decltype(handler);
      auto h = std::make_shared<H>(std::move(handler));
      auto run = std::make_shared<F>(std::move(fn));
      if (!Submit([h, run] { runtime_internal::Complete(h, std::optional<R>((*run)())); }))
        runtime_internal::Complete(h, std::optional<R>());  // stopping: the loop runs it
    };
    std::optional<R> r =
        co_await asio::async_initiate<decltype(asio::use_awaitable), void(std::optional<R>)>(
            std::move(initiate), asio::use_awaitable);
    if (!r) co_return fn();  // the pool is stopping: run it here
    co_return std::move(*r);
  }
}

template <typename T>
T Runtime::RunSync(Task<T> task) {
  std::promise<T> done;
  std::future<T> f = done.get_future();
  tasks_.fetch_add(1);
  asio::co_spawn(
      io_,
      [](Task<T> t, std::promise<T>* p, std::atomic<uint64_t>* n) -> Task<void> {
        try {
          p->set_value(co_await std::move(t));
        } catch (...) {
          p->set_exception(std::current_exception());
        }
        n->fetch_sub(1);
      }(std::move(task), &done, &tasks_),
      asio::detached);
  return f.get();
}

template <typename T>
Task<std::optional<T>> Rendezvous<T>::Take(Deadline deadline, Stop* stop) {
  auto self = this->shared_from_this();
  for (;;) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (value_) co_return std::move(*value_);
    }
    if (deadline.expired() || (stop != nullptr && stop->fired())) break;
    // Deliver's kick runs on the loop, after this check or during the wait.
    if (co_await runtime_internal::WaitKicked(&kick_, deadline, stop) != Ready::kReady) break;
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (value_) co_return std::move(*value_);
  co_return std::nullopt;
}

}  // namespace dyad
