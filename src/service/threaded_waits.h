// threaded_waits.h: parked waits for stores without Kvs::StartWait.
//
// A store whose waits need a thread (the client of a remote embedded root,
// the stores whose row lacks async_wait) still lets the service park a
// request: the wait runs here, on a thread of its own that lives only as
// long as the wait, so the workers stay free for other requests (a local
// producer's publish must never queue behind consumers waiting for it).
// Threads follow the waits in progress, not the connections.
#pragma once

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "kvs/kvs.h"

namespace dyad {

class ThreadedWaits {
 public:
  explicit ThreadedWaits(Kvs* kvs) : kvs_(kvs) {}
  ~ThreadedWaits() { Stop(); }
  ThreadedWaits(const ThreadedWaits&) = delete;
  ThreadedWaits& operator=(const ThreadedWaits&) = delete;

  // As Kvs::StartWait: `done` runs once, on the wait's thread. The returned
  // flag cancels the wait when set (polled by Kvs::Wait). Refused (and
  // `done` not called) once stopping.
  Result<std::shared_ptr<std::atomic<bool>>> Start(const std::string& ns, const std::string& key,
                                                   Deadline deadline, KvsWaitCallback done);
  // Cancels every wait and joins its thread. Idempotent.
  void Stop();
  size_t running() const;

 private:
  struct Waiter {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> cancel = std::make_shared<std::atomic<bool>>(false);
    std::atomic<bool> finished{false};
  };
  void ReapFinished();  // under mu_

  Kvs* const kvs_;
  mutable std::mutex mu_;
  std::list<std::unique_ptr<Waiter>> waiters_;
  bool stopping_ = false;
};

}  // namespace dyad
