// worker_pool.h: a bounded, elastic set of threads running queued tasks.
//
// The service's requests run here once its event loop (reactor.h) has
// assembled them, so the number of threads follows the work, up to the
// configured workers, never the number of connections. Threads start when a
// task finds none idle and end after `idle_ms` without work, so an idle
// service runs none of them. Tasks run in submission order (FIFO across the
// pool); a task that waits on the network or on a file is bounded by its own
// deadline. Stop() runs what is queued, then joins.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dyad {

class WorkerPool {
 public:
  static constexpr int64_t kDefaultIdleMs = 30000;
  // `name` labels the threads (pthread name, at most 15 characters); at
  // most `max_threads` (at least 1) run at once.
  WorkerPool(std::string name, size_t max_threads, int64_t idle_ms = kDefaultIdleMs);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // False once Stop() began: the task is not run (the caller cleans up).
  bool Submit(std::function<void()> task);
  // Runs the queued tasks, then joins the threads. Idempotent.
  void Stop();

  size_t max_threads() const { return max_; }
  // Threads running now (busy or idle).
  size_t live() const;
  // Tasks queued, not yet started.
  size_t queued() const;
  // Tasks a Submit now would start at once: threads waiting for a task plus
  // threads that may still be started (a snapshot).
  size_t spare() const;

 private:
  void Run();
  // Joins threads that ended after their idle time (outside mu_).
  void Reap();

  const std::string name_;
  const size_t max_;
  const int64_t idle_ms_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;         // guarded by mu_
  bool stopping_ = false;                           // guarded by mu_
  size_t idle_ = 0;                                 // threads waiting for a task; guarded by mu_
  std::map<std::thread::id, std::thread> threads_;  // live ones; guarded by mu_
  std::vector<std::thread> ended_;                  // ended, to join; guarded by mu_
};

}  // namespace dyad
