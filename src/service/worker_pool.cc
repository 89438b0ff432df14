#include "service/worker_pool.h"

#include <pthread.h>

#include <algorithm>
#include <utility>

namespace dyad {

WorkerPool::WorkerPool(std::string name, size_t threads) : name_(std::move(name)) {
  if (threads == 0) threads = 1;
  threads_.reserve(threads);
  for (size_t i = 0; i < threads; ++i) {
    threads_.emplace_back([this] { Run(); });
    pthread_setname_np(threads_.back().native_handle(), name_.substr(0, 15).c_str());
  }
}

WorkerPool::~WorkerPool() { Stop(); }

bool WorkerPool::Submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) return false;
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

size_t WorkerPool::queued() const {
  std::lock_guard<std::mutex> lk(mu_);
  return tasks_.size();
}

void WorkerPool::Stop() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
  }
  cv_.notify_all();
  for (std::thread& t : threads_)
    if (t.joinable()) t.join();
  std::lock_guard<std::mutex> lk(mu_);
  threads_.clear();
}

void WorkerPool::Run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      idle_.fetch_add(1, std::memory_order_relaxed);
      cv_.wait(lk, [this] { return stopping_ || !tasks_.empty(); });
      idle_.fetch_sub(1, std::memory_order_relaxed);
      if (tasks_.empty()) return;  // stopping and drained
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

void ForEachParallel(size_t n, size_t threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) fn(i);
  };
  std::vector<std::thread> helpers;
  for (size_t h = 1; h < std::min(threads, n); ++h) helpers.emplace_back(work);
  work();
  for (std::thread& t : helpers) t.join();
}

}  // namespace dyad
