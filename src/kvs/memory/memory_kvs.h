// memory_kvs.h: the in-process metadata store (the "memory" backend).
//
// Holds every namespace as a KeyTable (key_table.h: hashed, so a put or get
// costs the same whatever the store holds) in this process. It serves tests
// and single-service runs directly, and it is the storage engine of the
// embedded root store (EmbeddedKvsServer), which the root dyad-service
// exposes to the other services of the cluster.
//
// Threading: all methods are thread-safe. One mutex guards the data and
// the waits: a wait (StartWait; the blocking Wait is Kvs::Wait over it)
// checks its key and parks its callback in the key's slot under that same
// mutex, so a Put cannot slip between the check and the parking. Put runs
// the callbacks of its key on its own thread after releasing the mutex, and
// a LoopTimer on a loop runs those of keys that already existed and of
// deadlines that passed: the root service's loop for the store it hosts,
// else a loop of this store's own, started by the first wait. This is what
// lets a host serve thousands of waits (e.g. the embedded root's) without a
// thread each.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kvs/kvs.h"
#include "kvs/memory/key_table.h"
#include "kvs/watch.h"

namespace dyad {

class MemoryKvs final : public Kvs {
 public:
  // `loop`: where the waits' deadlines and answers run (a service's
  // runtime, which must outlive this store); none: a loop of its own.
  explicit MemoryKvs(std::optional<asio::any_io_executor> loop = std::nullopt)
      : loop_(std::move(loop)) {}
  // Ends pending StartWaits with DYAD_RC_CANCELLED and ends the timer.
  ~MemoryKvs() override;
  MemoryKvs(const MemoryKvs&) = delete;
  MemoryKvs& operator=(const MemoryKvs&) = delete;

  std::string name() const override { return "memory"; }
  bool in_process() const override { return true; }

  Status Put(const std::string& ns, const std::string& key, const std::string& value) override;
  Result<std::optional<std::string>> Get(const std::string& ns, const std::string& key) override;
  // Under one hold of the lock: a snapshot of those keys.
  Result<KvsValues> MultiGet(const std::string& ns, const std::vector<std::string>& keys) override;
  Status Remove(const std::string& ns, const std::string& key) override;
  Result<std::vector<KvsEntry>> List(const std::string& ns, const std::string& prefix,
                                     uint32_t limit = 0) override;

  // The bounded forms a server answering other processes uses (issue 25):
  // each measures under the lock before it copies, and copies no more than
  // its reply may carry, so a request costs what its reply does.
  //
  // As List, but a listing whose encoded size (KeyTable::kEntryOverhead
  // per entry besides key and value) would exceed `max_bytes` copies
  // nothing and fails with DYAD_RC_BADPACK, naming the limit; one with a
  // prefix or a limit of a namespace of more than KeyTable::kMaxOrderedScan
  // keys fails with DYAD_RC_BADREQUEST, naming that limit, without a scan.
  Result<std::vector<KvsEntry>> ListUpTo(const std::string& ns, const std::string& prefix,
                                         uint32_t limit, size_t max_bytes);
  // The values of the first keys of `keys`, in order, as many as fit in
  // `max_bytes` of values (at least one key, whatever its value's size):
  // the result may be shorter than `keys`, and the caller asks again for
  // the rest.
  Result<KvsValues> MultiGetUpTo(const std::string& ns, const std::vector<std::string>& keys,
                                 size_t max_bytes);
  // `done` runs on the timer's loop, or on the thread of the Put, CancelWait
  // or Shutdown that ends the wait.
  Result<KvsWaitTicket> StartWait(const std::string& ns, const std::string& key, Deadline deadline,
                                  KvsWaitCallback done) override;
  void CancelWait(KvsWaitTicket ticket) override;
  // `on_change` runs on the thread of the Put, after the value is stored.
  Result<KvsWatchTicket> Watch(const std::string& ns, KvsWatchCallback on_change) override;
  void Unwatch(KvsWatchTicket ticket) override { watchers_.Remove(ticket); }

  // Wakes every current waiter with DYAD_RC_CANCELLED and makes later waits
  // on absent keys fail the same way at once (a key that exists is still
  // returned). Put/Get/Remove/List keep working. Used when the service
  // stops, so no thread stays parked in a wait. Irreversible.
  void Shutdown() override;
  bool shut_down() const;

  // Number of stored entries over all namespaces (for statistics).
  uint64_t EntryCount() const;

 private:
  using SlotKey = std::pair<std::string, std::string>;  // namespace, key
  struct WaitSlot {
    std::set<KvsWaitTicket> async;  // parked by StartWait
  };
  struct AsyncWaiter {
    SlotKey slot;
    KvsWaitCallback done;
    std::multimap<SteadyClock::time_point, KvsWaitTicket>::iterator deadline;
    bool has_deadline = false;
  };
  using Completions = std::vector<std::pair<KvsWaitCallback, Result<std::string>>>;

  const std::string* FindLocked(const std::string& ns, const std::string& key) const REQUIRES(mu_);
  // Removes a parked StartWait; its callback and `r` go to `out`.
  void EndAsyncLocked(KvsWaitTicket t, Result<std::string> r, Completions* out) REQUIRES(mu_);
  // The waits' timer, made at the first wait.
  LoopTimer& TimerLocked() REQUIRES(mu_);
  // Runs the ready answers and the deadlines that passed (on the timer's loop).
  void OnTimer();
  static void Run(Completions* c);

  mutable Mutex mu_;
  std::unordered_map<std::string, KeyTable> data_ GUARDED_BY(mu_);
  // Present only while some thread waits for that key.
  // std::map keeps slot addresses stable while other slots come and go.
  std::map<SlotKey, WaitSlot> slots_ GUARDED_BY(mu_);
  uint64_t entries_ GUARDED_BY(mu_) = 0;
  bool shutdown_ GUARDED_BY(mu_) = false;

  KvsWaitTicket next_ticket_ GUARDED_BY(mu_) = 1;
  std::map<KvsWaitTicket, AsyncWaiter> async_ GUARDED_BY(mu_);
  std::multimap<SteadyClock::time_point, KvsWaitTicket> async_deadlines_ GUARDED_BY(mu_);
  Completions ready_ GUARDED_BY(mu_);  // for the timer to run
  const std::optional<asio::any_io_executor> loop_;
  std::unique_ptr<LoopTimer> timer_ GUARDED_BY(mu_);
  WatchList watchers_;
};

}  // namespace dyad
