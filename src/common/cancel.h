// cancel.h: how long waits learn that nobody needs their answer any more,
// and the one way a thread blocks on a wait that was started with a
// callback.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>

#include "common/thread_annotations.h"

namespace dyad {

// Polled by long waits every so often (at most every 250 ms); returning true
// abandons the wait. Used to stop waiting for a client that went away or
// when the service is stopping.
using CancelFn = std::function<bool()>;

// How often a blocked thread asks its CancelFn (AwaitCallback's callers).
constexpr int64_t kCancelAskMs = 100;

// The blocking side of a wait that runs without a thread (a store's
// StartWait, a feed's StartPoll): `start(done)` starts it and returns its
// outcome when it ended at once, or nothing when `done` runs later, from
// any thread, exactly once. This thread then sleeps until `done` has run
// and returns what it got. With `cancel`, it asks every `poll_ms` and, once
// it says so, calls `end`, which must make `done` run soon. For blocking
// callers only (tools, tests, the blocking half of a request handler);
// nothing on an event loop calls it.
template <typename R>
R AwaitCallback(const std::function<std::optional<R>(std::function<void(R)>)>& start,
                const CancelFn& cancel, int64_t poll_ms, const std::function<void()>& end) {
  struct Outcome {
    Mutex mu;
    std::condition_variable cv;
    std::optional<R> result GUARDED_BY(mu);
  };
  auto out = std::make_shared<Outcome>();
  std::optional<R> now = start([out](R r) {
    MutexLock lk(out->mu);
    out->result.emplace(std::move(r));
    out->cv.notify_one();
  });
  if (now) return std::move(*now);
  MutexLock lk(out->mu);
  bool ended = false;
  while (!out->result) {
    // The deadline and a shutdown arrive through the callback; only
    // `cancel` needs polling, so a wait without one sleeps until it runs.
    if (!cancel || ended) {
      lk.Wait(out->cv, [&]() REQUIRES(out->mu) { return out->result.has_value(); });
      break;
    }
    lk.WaitFor(out->cv, std::chrono::milliseconds(poll_ms));
    if (out->result) break;
    lk.Unlock();
    if (cancel()) {
      end();  // calls back (CANCELLED) unless the wait just ended
      ended = true;
    }
    lk.Lock();
  }
  return std::move(*out->result);
}

}  // namespace dyad
