// watch_log.h: what a Kvs::Watch reported, collected from the watcher's
// thread, with bounded waits for the tests that check it.
#pragma once

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "kvs/kvs.h"

namespace dyad {
namespace testing_kvs {

struct WatchLog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<KvsChange> changes;

  KvsWatchCallback Callback() {
    return [this](const KvsChange& c) {
      std::lock_guard<std::mutex> lk(mu);
      changes.push_back(c);
      cv.notify_all();
    };
  }
  // Waits (bounded) until `n` changes arrived.
  bool WaitFor(size_t n, int64_t ms) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::milliseconds(ms), [&] { return changes.size() >= n; });
  }
  // Waits (bounded) for a change `want` accepts.
  bool WaitFor(const std::function<bool(const KvsChange&)>& want, int64_t ms) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, std::chrono::milliseconds(ms),
                       [&] { return std::any_of(changes.begin(), changes.end(), want); });
  }
  size_t size() {
    std::lock_guard<std::mutex> lk(mu);
    return changes.size();
  }
};

}  // namespace testing_kvs
}  // namespace dyad
