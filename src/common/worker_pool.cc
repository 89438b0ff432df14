#include "common/worker_pool.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <utility>

namespace dyad {

WorkerPool::WorkerPool(std::string name, size_t max_threads, int64_t idle_ms)
    : name_(std::move(name)), max_(std::max<size_t>(1, max_threads)), idle_ms_(idle_ms) {}

WorkerPool::~WorkerPool() { Stop(); }

bool WorkerPool::Submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) return false;
    tasks_.push_back(std::move(task));
    // Every queued task has an idle thread to take it, or one more starts.
    if (tasks_.size() > idle_ && threads_.size() < max_) {
      std::thread t([this] { Run(); });
      pthread_setname_np(t.native_handle(), name_.substr(0, 15).c_str());
      const std::thread::id id = t.get_id();
      threads_.emplace(id, std::move(t));
    }
  }
  cv_.notify_one();
  Reap();
  return true;
}

size_t WorkerPool::live() const {
  std::lock_guard<std::mutex> lk(mu_);
  return threads_.size();
}

size_t WorkerPool::queued() const {
  std::lock_guard<std::mutex> lk(mu_);
  return tasks_.size();
}

size_t WorkerPool::spare() const {
  std::lock_guard<std::mutex> lk(mu_);
  const size_t free_threads = idle_ > tasks_.size() ? idle_ - tasks_.size() : 0;
  return free_threads + (max_ - threads_.size());
}

void WorkerPool::Reap() {
  std::vector<std::thread> ended;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ended.swap(ended_);
  }
  for (std::thread& t : ended) t.join();
}

void WorkerPool::Stop() {
  std::map<std::thread::id, std::thread> live;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    live.swap(threads_);  // no thread starts after stopping_
  }
  cv_.notify_all();
  for (auto& [id, t] : live) t.join();
  Reap();
}

void WorkerPool::Run() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    ++idle_;
    const bool woken = cv_.wait_for(lk, std::chrono::milliseconds(idle_ms_),
                                    [this] { return stopping_ || !tasks_.empty(); });
    --idle_;
    if (tasks_.empty()) {
      if (stopping_ || !woken) break;  // stopping and drained, or idle too long
      continue;
    }
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lk.unlock();
    task();
    task = nullptr;  // its captures go before the lock is taken again
    lk.lock();
  }
  // Hand this thread's handle to whoever joins next (Submit or Stop); Stop
  // may already hold it.
  auto it = threads_.find(std::this_thread::get_id());
  if (it != threads_.end()) {
    ended_.push_back(std::move(it->second));
    threads_.erase(it);
  }
}

}  // namespace dyad
