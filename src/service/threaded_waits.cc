#include "service/threaded_waits.h"

#include <utility>

namespace dyad {

Result<std::shared_ptr<std::atomic<bool>>> ThreadedWaits::Start(const std::string& ns,
                                                                const std::string& key,
                                                                Deadline deadline,
                                                                KvsWaitCallback done) {
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_) return Status(DYAD_RC_CANCELLED, "the service is stopping");
  ReapFinished();
  auto w = std::make_unique<Waiter>();
  Waiter* raw = w.get();
  std::shared_ptr<std::atomic<bool>> cancel = raw->cancel;
  raw->thread = std::thread([this, raw, ns, key, deadline, done = std::move(done)] {
    std::shared_ptr<std::atomic<bool>> flag = raw->cancel;
    done(kvs_->Wait(ns, key, deadline, [flag] { return flag->load(); }));
    raw->finished = true;
  });
  waiters_.push_back(std::move(w));
  return cancel;
}

void ThreadedWaits::ReapFinished() {
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if ((*it)->finished) {
      (*it)->thread.join();
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

size_t ThreadedWaits::running() const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  for (const auto& w : waiters_) n += w->finished ? 0 : 1;
  return n;
}

void ThreadedWaits::Stop() {
  std::list<std::unique_ptr<Waiter>> all;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    all.swap(waiters_);
  }
  for (auto& w : all) *w->cancel = true;
  for (auto& w : all)
    if (w->thread.joinable()) w->thread.join();
}

}  // namespace dyad
