// watch.h: the watchers of one store's namespaces (Kvs::Watch).
//
// Every store that supports Watch keeps one WatchList: Add/Remove manage
// the watchers, Notify delivers a Put to those of its namespace, Resync
// tells every watcher (or those of one namespace) that changes may have
// been missed. Delivery runs on the caller's thread with no lock of the
// list held across the callback except the watcher's own, which is what
// lets Remove promise that the callback is not running and will not run
// once it returns.
//
// Threading: all methods are thread-safe. A callback must not call Remove
// on its own ticket (it would wait for itself).
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/thread_annotations.h"
#include "kvs/kvs.h"

namespace dyad {

class WatchList {
 public:
  KvsWatchTicket Add(const std::string& ns, KvsWatchCallback cb);
  // Returns the namespace of the removed watcher (none for an unknown
  // ticket), after which its callback no longer runs.
  std::optional<std::string> Remove(KvsWatchTicket ticket);
  // True when someone watches `ns` (cheap; lets a Put skip Notify).
  bool Watched(const std::string& ns) const;
  bool empty() const { return count_.load(std::memory_order_acquire) == 0; }
  // Namespaces watched now (for a reconnecting feed).
  std::vector<std::string> Namespaces() const;

  void Notify(const std::string& ns, const std::string& key, const std::string& value);
  void Resync(const std::string& ns);
  void Lost(const std::string& ns);

 private:
  struct Watcher {
    std::string ns;
    KvsWatchCallback cb;
    Mutex run_mu;  // held while `cb` runs; Remove takes it to retire
    bool active GUARDED_BY(run_mu) = true;
  };
  void Deliver(const std::vector<std::shared_ptr<Watcher>>& to, const KvsChange& change);
  std::vector<std::shared_ptr<Watcher>> Of(const std::string& ns) const;

  using Watchers = std::map<KvsWatchTicket, std::shared_ptr<Watcher>>;
  mutable Mutex mu_;
  KvsWatchTicket next_ GUARDED_BY(mu_) = 1;
  Watchers all_ GUARDED_BY(mu_);
  // The same, by namespace: a Put finds its namespace's watchers without
  // looking at every other namespace's (a root may follow thousands).
  std::unordered_map<std::string, Watchers> by_ns_ GUARDED_BY(mu_);
  std::atomic<size_t> count_{0};
};

}  // namespace dyad
