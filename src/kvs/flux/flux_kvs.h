// flux_kvs.h: the flux:// metadata store, the KVS of a Flux instance.
//
// URL: `flux://` (or `flux`) is the instance of $FLUX_URI (what `flux
// start`, `flux alloc` and the Flux module set); `flux://?uri=URI` names
// another; `&dir=NAME` (or `?dir=NAME`) moves the store's keys under another
// top directory of each namespace (default "dyad"; keeps two stores in one
// namespace apart, and lets tests start clean).
//
// Layout of keys and values: flux_keys.h. A namespace is created on demand
// by the first Put (or Watch) that finds it missing, owned by the instance
// owner (Flux's default: only that user may read it).
//
// Threads and handles: a flux_t is not thread-safe, so no handle is ever
// used by two threads at once:
//  * Put, Get, Remove, List and MultiGet borrow a handle from a pool (one
//    thread at a time each; the pool opens another connection to the
//    broker when every handle is lent, up to kMaxPooledHandles, and keeps
//    them for reuse); each request is bounded by KvsOptions::rpc_timeout_ms.
//  * StartWait runs on one reactor thread that owns its own handle: a
//    flux_kvs_lookup(FLUX_KVS_WAITCREATE) per wait (after creating its
//    namespace when it is not known to exist: NamespaceSeen says why),
//    with a reactor timer for its deadline; at the deadline, on CancelWait and on Shutdown the
//    lookup is ended with flux_kvs_lookup_cancel (the broker answers
//    ENODATA, and only then is the future destroyed). Other threads reach
//    that thread only through a command queue and an eventfd.
//  * Wait is Kvs's: StartWait plus a sleep of the caller's thread, which
//    polls `cancel` every 100 ms and calls CancelWait when it says so.
//  * Each Watch has its own thread and handle: a kvs-watch of the
//    namespace's root (FLUX_KVS_WATCH | FLUX_KVS_WATCH_FULL, one answer per
//    commit, in commit order) whose successive root snapshots it compares
//    directory by directory (flux_kvs_lookupat), reporting each key whose
//    entry changed with the value of that snapshot. A Put that rewrites
//    the value already there changes nothing and is not reported.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kvs/kvs.h"

struct flux_handle;
struct flux_future;
struct flux_reactor;
struct flux_watcher;

namespace dyad {

struct FluxUrl {
  std::string uri;  // "" = $FLUX_URI
  std::string top;  // top directory of the store's keys
};
// Parses flux://, flux, flux://?uri=URI[&dir=NAME]; DYAD_RC_BADREQUEST
// names what is wrong.
Result<FluxUrl> ParseFluxUrl(const std::string& url);

class FluxKvs : public Kvs {
 public:
  static Result<std::unique_ptr<FluxKvs>> Open(const std::string& url, const KvsOptions& options);
  ~FluxKvs() override;

  std::string name() const override { return "flux"; }
  Status Put(const std::string& ns, const std::string& key, const std::string& value) override;
  Result<std::optional<std::string>> Get(const std::string& ns, const std::string& key) override;
  Status Remove(const std::string& ns, const std::string& key) override;
  Result<std::vector<KvsEntry>> List(const std::string& ns, const std::string& prefix,
                                     uint32_t limit = 0) override;
  Result<KvsValues> MultiGet(const std::string& ns, const std::vector<std::string>& keys) override;
  void Shutdown() override;

  Result<KvsWaitTicket> StartWait(const std::string& ns, const std::string& key, Deadline deadline,
                                  KvsWaitCallback done) override;
  void CancelWait(KvsWaitTicket ticket) override;

  Result<KvsWatchTicket> Watch(const std::string& ns, KvsWatchCallback on_change) override;
  void Unwatch(KvsWatchTicket ticket) override;

  // The Flux key a key of ours is stored under (for tests and messages).
  std::string FluxKey(const std::string& key) const;

  // Bounds: connections of the pool (a caller finding all of them lent
  // waits for one, at most rpc_timeout_ms), and watches at once (each has
  // a thread and a connection; one beyond is refused, DYAD_RC_BADREQUEST).
  static constexpr size_t kMaxPooledHandles = 64;
  static constexpr size_t kMaxWatches = 128;
  // Connections the pool has open now (lent or idle).
  size_t PooledHandles();

 private:
  class Lease;
  struct AsyncWait;
  struct WatchFeed;

  FluxKvs(FluxUrl url, const KvsOptions& options);
  Status Start();

  // --- the handle pool ---
  Result<flux_handle*> OpenHandle();
  Result<flux_handle*> Borrow();
  void GiveBack(flux_handle* h, bool broken);

  // Commits a put or an unlink of `fkey` in `fns`, creating the namespace
  // when it is missing and `create` says so.
  Status Commit(flux_handle* h, const std::string& fns, const std::string& fkey,
                const std::string* json, bool create, const std::string& what);

  // Namespaces known to exist (created or found in the last second). A
  // wait creates its namespace first unless it is known: flux-core's
  // kvs-watch (0.73.0 and 0.88) aborts the broker (assert nsm->commit !=
  // NULL in watcher_respond) when two FLUX_KVS_WAITCREATE lookups reach a
  // namespace that does not exist yet before its first getroot has answered.
  bool NamespaceSeen(const std::string& fns);
  void MarkNamespace(const std::string& fns, bool seen);

  // --- the reactor thread of StartWait ---
  void ReactorMain(std::promise<Status>* ready);
  void Post(std::function<void()> fn);
  void RunPosted();
  void BeginWait(const std::shared_ptr<AsyncWait>& w);
  void OnCreated(AsyncWait* w);
  void SendLookup(AsyncWait* w);
  void AbortWait(KvsWaitTicket ticket);
  void OnLookup(AsyncWait* w);
  void OnTimer(AsyncWait* w);
  void FinishWait(AsyncWait* w);
  bool Claim(AsyncWait* w);

  // --- watches ---
  void FeedMain(WatchFeed* feed);

  const FluxUrl url_;
  const KvsOptions options_;

  std::mutex pool_mu_;
  std::condition_variable pool_cv_;
  std::vector<flux_handle*> idle_;  // guarded by pool_mu_
  size_t open_ = 0;                 // guarded by pool_mu_: lent + idle

  std::mutex ns_mu_;
  std::map<std::string, std::chrono::steady_clock::time_point> ns_seen_;  // guarded by ns_mu_

  // StartWait state shared with other threads.
  std::mutex waits_mu_;
  bool shutdown_ = false;                                                // guarded by waits_mu_
  KvsWaitTicket next_wait_ = 1;                                          // guarded by waits_mu_
  std::unordered_map<KvsWaitTicket, std::shared_ptr<AsyncWait>> waits_;  // guarded by waits_mu_

  std::mutex cmd_mu_;
  std::deque<std::function<void()>> cmds_;  // guarded by cmd_mu_
  int wake_fd_ = -1;                        // eventfd: commands are queued
  std::thread reactor_thread_;
  // Owned by the reactor thread.
  flux_handle* rh_ = nullptr;
  flux_reactor* reactor_ = nullptr;
  flux_watcher* wake_watcher_ = nullptr;
  std::unordered_map<KvsWaitTicket, std::shared_ptr<AsyncWait>> live_;

  std::mutex watch_mu_;
  KvsWatchTicket next_watch_ = 1;                                 // guarded by watch_mu_
  std::map<KvsWatchTicket, std::unique_ptr<WatchFeed>> watches_;  // guarded by watch_mu_
};

}  // namespace dyad
