// embedded_waits.h: Kvs::StartWait for the clients of a remote embedded
// root (EmbeddedKvs), without a thread or a connection per wait.
//
// Every wait is an entry in a table keyed by (namespace, key). The waits of
// one namespace share the store's watch of it (EmbeddedKvs::Watch: one
// change feed per namespace, one connection whatever the number of waits):
// a Put reported by the feed ends every wait on its key. A new wait is
// checked with a Get once its namespace's watch is started, so a key
// published before the wait started is found; one published after it is
// reported by the feed, or, when the feed was not established yet, found
// by the checks its establishment's resync makes (a watch started on the
// loop does not wait for its feed); nothing falls in between. When the feed may have
// missed changes (it reconnected to a restarted root, or fell behind the
// root's ring) every wait of the namespace is checked again. One task, on
// the store's runtime beside its feeds, runs those checks, the
// deadlines, and the retries of checks that could not reach the root; it
// drops a namespace's watch once no wait has used it for kIdleWatchMs.
//
// So 10,000 consumers waiting on distinct keys cost the root one feed per
// namespace per service, not 10,000 connections, and no thread: the
// feeds and this task run on the service's runtime (a store opened without
// one runs them on one loop thread of its own).
//
// Threading: thread-safe. `done` runs once: on that loop, or on the thread
// of Cancel/Shutdown; never inside Start.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/runtime.h"
#include "common/thread_annotations.h"
#include "common/time.h"
#include "kvs/kvs.h"

namespace dyad {

class EmbeddedKvs;

class EmbeddedWaits {
 public:
  // A namespace's watch is dropped after this long without waits.
  static constexpr int64_t kIdleWatchMs = 30000;
  // A check that could not reach the root is retried after this long,
  // doubling up to kRetryMaxMs.
  static constexpr int64_t kRetryFirstMs = 100;
  static constexpr int64_t kRetryMaxMs = 2000;

  // `store` answers the Gets, provides the watches and the runtime; it
  // outlives this.
  explicit EmbeddedWaits(EmbeddedKvs* store) : store_(store) {}
  ~EmbeddedWaits() { Shutdown(); }
  EmbeddedWaits(const EmbeddedWaits&) = delete;
  EmbeddedWaits& operator=(const EmbeddedWaits&) = delete;

  // As Kvs::StartWait.
  Result<KvsWaitTicket> Start(const std::string& ns, const std::string& key, Deadline deadline,
                              KvsWaitCallback done);
  // As Kvs::CancelWait.
  void Cancel(KvsWaitTicket ticket);
  // Ends every wait with DYAD_RC_CANCELLED, refuses later ones, ends the
  // task's waits and drops the watches. Idempotent. The task itself ends
  // with the store's runtime.
  void Shutdown();

  size_t pending() const;

  // The root refused a namespace's feed (on the feeds' loop): the task
  // looks at the feeds again and ends the waits of refused ones.
  void FeedRefused();

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
    KvsWatchTicket watch = 0;  // 0 until the task has started the watch
    bool established = false;  // the watch's feed knows its position
    size_t waits = 0;
    SteadyClock::time_point idle_since;
  };
  using Completions = std::vector<std::pair<KvsWaitCallback, Result<std::string>>>;

  void OnChange(const std::string& ns, const KvsChange& change);
  // The task: rounds of watches to start, checks to make, deadlines and
  // idle watches, then a sleep until the next is due or Kick.
  Task<void> Loop();
  void Kick() REQUIRES(mu_);
  void StartWatches(Completions* out) REQUIRES(mu_);
  // Ends the waits of watches the root refused; notes those established.
  void CheckEstablished(Completions* out) REQUIRES(mu_);
  Task<void> RunChecks();
  void ExpireAndDropIdle(Completions* out) REQUIRES(mu_);
  SteadyClock::time_point NextWakeLocked() const REQUIRES(mu_);
  void EndLocked(KvsWaitTicket t, Result<std::string> r, Completions* out) REQUIRES(mu_);
  void QueueNamespaceLocked(const std::string& ns) REQUIRES(mu_);
  void EndNamespaceLocked(const std::string& ns, const Status& why, Completions* out) REQUIRES(mu_);
  static void Run(Completions* c);

  EmbeddedKvs* const store_;
  mutable Mutex mu_;
  bool started_ GUARDED_BY(mu_) = false;  // the task was spawned (by the first Start)
  bool stopping_ GUARDED_BY(mu_) = false;
  std::unique_ptr<Stop> stop_ GUARDED_BY(mu_);  // ends the task's waits
  // Set while the task sleeps: Kick wakes it.
  std::shared_ptr<Rendezvous<bool>> kick_ GUARDED_BY(mu_);
  KvsWaitTicket next_ticket_ GUARDED_BY(mu_) = 1;
  std::map<KvsWaitTicket, Waiter> waiters_ GUARDED_BY(mu_);
  std::map<SlotKey, std::set<KvsWaitTicket>> by_slot_ GUARDED_BY(mu_);
  std::multimap<SteadyClock::time_point, KvsWaitTicket> deadlines_ GUARDED_BY(mu_);
  std::map<std::string, Space> spaces_ GUARDED_BY(mu_);
  // Why the latest check could not reach the root (OK once one did).
  Status unreachable_ GUARDED_BY(mu_);
  // A feed was refused since CheckEstablished last looked.
  bool feeds_changed_ GUARDED_BY(mu_) = false;
  // Need a Get (new, or after a resync).
  std::deque<KvsWaitTicket> to_check_ GUARDED_BY(mu_);
  std::multimap<SteadyClock::time_point, KvsWaitTicket> retries_
      GUARDED_BY(mu_);  // checks that failed
  int64_t retry_ms_ GUARDED_BY(mu_) = kRetryFirstMs;
};

}  // namespace dyad
