// embedded_waits.h: Kvs::StartWait for the clients of a remote embedded
// root (EmbeddedKvs), without a thread or a connection per wait.
//
// Every wait is an entry in a table keyed by (namespace, key). The waits of
// one namespace share the store's watch of it (EmbeddedKvs::Watch: one
// change feed per namespace, one connection whatever the number of waits,
// and one thread for the feeds of all namespaces): a Put reported by the feed ends every wait on
// its key, on the feed's thread. A new wait is first checked with a Get, made after the feed is
// established, so a key published before the wait started is found and one published after it is
// reported by the feed; nothing falls in between. When the feed may have missed changes (it
// reconnected to a restarted root, or fell behind the root's ring) every wait of the namespace is
// checked again. One helper thread runs those checks, the deadlines, and the retries of checks that
// could not reach the root; it drops a namespace's watch once no wait has used it for kIdleWatchMs.
//
// So 10,000 consumers waiting on distinct keys cost the root one feed per
// namespace per service, not 10,000 connections, and they cost the service
// two threads (the feeds' and the helper) however many namespaces it waits in.
//
// Threading: thread-safe. `done` runs once: on the feed's thread, the
// helper thread, or the thread of Cancel/Shutdown; never inside Start.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/thread_annotations.h"
#include "common/time.h"
#include "kvs/kvs.h"

namespace dyad {

class EmbeddedWaits {
 public:
  // A namespace's watch is dropped after this long without waits.
  static constexpr int64_t kIdleWatchMs = 30000;
  // A check that could not reach the root is retried after this long,
  // doubling up to kRetryMaxMs.
  static constexpr int64_t kRetryFirstMs = 100;
  static constexpr int64_t kRetryMaxMs = 2000;

  // `store` answers the Gets and provides the watches; it outlives this.
  explicit EmbeddedWaits(Kvs* store) : store_(store) {}
  ~EmbeddedWaits() { Shutdown(); }
  EmbeddedWaits(const EmbeddedWaits&) = delete;
  EmbeddedWaits& operator=(const EmbeddedWaits&) = delete;

  // As Kvs::StartWait.
  Result<KvsWaitTicket> Start(const std::string& ns, const std::string& key, Deadline deadline,
                              KvsWaitCallback done);
  // As Kvs::CancelWait.
  void Cancel(KvsWaitTicket ticket);
  // Ends every wait with DYAD_RC_CANCELLED, refuses later ones, drops the
  // watches and joins the helper thread. Idempotent.
  void Shutdown();

  size_t pending() const;

 private:
  using SlotKey = std::pair<std::string, std::string>;  // namespace, key
  struct Waiter {
    SlotKey slot;
    KvsWaitCallback done;
    Deadline deadline = Deadline::Never();
    std::multimap<SteadyClock::time_point, KvsWaitTicket>::iterator due;
    bool has_deadline = false;
  };
  struct Space {               // one watched namespace
    KvsWatchTicket watch = 0;  // 0 until the helper has started the watch
    size_t waits = 0;
    SteadyClock::time_point idle_since;
  };
  using Completions = std::vector<std::pair<KvsWaitCallback, Result<std::string>>>;

  void OnChange(const std::string& ns, const KvsChange& change);
  void Loop();
  // One round of the helper: watches to start, checks to make, deadlines,
  // idle watches. Releases mu_ around calls to the store.
  void Round(Completions* out) REQUIRES(mu_);
  void StartWatches(Completions* out) REQUIRES(mu_);
  void RunChecks(Completions* out) REQUIRES(mu_);
  void ExpireAndDropIdle(Completions* out) REQUIRES(mu_);
  SteadyClock::time_point NextWakeLocked() const REQUIRES(mu_);
  void EndLocked(KvsWaitTicket t, Result<std::string> r, Completions* out) REQUIRES(mu_);
  void QueueNamespaceLocked(const std::string& ns) REQUIRES(mu_);
  static void Run(Completions* c);

  Kvs* const store_;
  mutable Mutex mu_;
  std::condition_variable cv_;
  std::thread helper_ GUARDED_BY(mu_);  // started by the first Start
  bool stopping_ GUARDED_BY(mu_) = false;
  KvsWaitTicket next_ticket_ GUARDED_BY(mu_) = 1;
  std::map<KvsWaitTicket, Waiter> waiters_ GUARDED_BY(mu_);
  std::map<SlotKey, std::set<KvsWaitTicket>> by_slot_ GUARDED_BY(mu_);
  std::multimap<SteadyClock::time_point, KvsWaitTicket> deadlines_ GUARDED_BY(mu_);
  std::map<std::string, Space> spaces_ GUARDED_BY(mu_);
  // Need a Get (new, or after a resync).
  std::deque<KvsWaitTicket> to_check_ GUARDED_BY(mu_);
  std::multimap<SteadyClock::time_point, KvsWaitTicket> retries_
      GUARDED_BY(mu_);  // checks that failed
  int64_t retry_ms_ GUARDED_BY(mu_) = kRetryFirstMs;
};

}  // namespace dyad
