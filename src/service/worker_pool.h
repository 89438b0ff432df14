// worker_pool.h: a fixed set of threads running queued tasks.
//
// The service's requests run here once its event loop (reactor.h) has
// assembled them, so the number of threads follows the configured workers,
// never the number of connections. Tasks run in submission order (FIFO
// across the pool); a task that waits on the network or on a file is bounded
// by its own deadline. Stop() runs what is queued, then joins.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace dyad {

class WorkerPool {
 public:
  // `name` labels the threads (pthread name, at most 15 characters).
  WorkerPool(std::string name, size_t threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // False once Stop() began: the task is not run (the caller cleans up).
  bool Submit(std::function<void()> task);
  // Runs the queued tasks, then joins the threads. Idempotent.
  void Stop();

  size_t size() const { return threads_.size(); }
  // Tasks queued, not yet started.
  size_t queued() const;
  // Threads waiting for a task (a snapshot: one may be taking a task now).
  size_t idle() const { return idle_.load(std::memory_order_relaxed); }

 private:
  void Run();

  const std::string name_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::atomic<size_t> idle_{0};
  std::vector<std::thread> threads_;
};

// Calls fn(0) .. fn(n - 1) on up to `threads` threads, this one included,
// each taking the next index as it finishes one; returns once all are done.
// For work one request fans out (a batch's store reads or placements), on
// threads that live only as long as that request.
void ForEachParallel(size_t n, size_t threads, const std::function<void(size_t)>& fn);

}  // namespace dyad
