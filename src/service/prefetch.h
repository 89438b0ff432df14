// prefetch.h: prefetch on publication, the service's way of making a later
// consume a local (level-1) hit.
//
// A consumer declares what it will read (PrefetchRequest: a namespace, a
// path prefix or glob, its consumer directory). The Prefetcher then
// watches that namespace through the store's own notifications
// (Kvs::Watch: pushed by the embedded root or Redis, never polled), lists
// what is already published, and places every matching file into the
// consumer directory through Placement, the one placement policy, so a
// prefetch and an explicit consume of the same file share one transfer.
//
// Queue. One entry per destination file, newest record wins: a file
// re-published while queued is fetched once, at its newer version; one
// re-published while its prefetch is in flight is fetched again after it.
// Requests take entries in publication order, each a task on the
// service's runtime (none holds a thread while it waits), at most
// `max_inflight` requests at once and at most `max_per_peer` to one owner; a request
// carries up to `max_batch` small files of one owner together
// (Placement::PlaceBatch: one kFetchBatch instead of a fetch per file), at
// most `max_batches_per_peer` such requests to one owner at once. Explicit consumes never enter
// this queue: they go straight to Placement (joining a prefetch in flight
// for the same file), so prefetch never makes them wait behind it.
//
// Budget. Before a prefetch, `admit(bytes)` (when set: the node cache's
// byte budget, NodeCache::Admit) may refuse it; the entry then waits,
// out of the queue, until Kick() (room was freed: a consume, an eviction)
// puts the deferred entries back. Every publication the watch reports,
// matching or not, is also handed to `on_publication` (when set: the node
// cache's Supersede, so a stale copy is never a level-1 hit).
//
// Threading: thread-safe. Watch callbacks only queue work.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/runtime.h"
#include "common/status.h"
#include "kvs/kvs.h"
#include "proto/protocol.h"
#include "service/metadata_cache.h"
#include "service/placement.h"

namespace dyad {

struct PrefetchConfig {
  // Bounds on what local clients can make the service hold: distinct
  // declarations, and files queued (beyond it new entries are dropped and
  // counted: their consumes simply fetch them).
  size_t max_declarations = 1024;
  size_t max_queued = 1u << 20;
  uint32_t max_inflight = 8;  // DYAD_PREFETCH_CONCURRENCY
  uint32_t max_per_peer = 8;  // DYAD_PREFETCH_PER_PEER
  uint32_t max_batch = 64;    // files of one owner fetched in one request
  // Requests for small files in flight to one owner (at most max_per_peer):
  // while they run, the owner's next publications gather into the next
  // batch instead of leaving one file per request.
  uint32_t max_batches_per_peer = 2;
  int64_t transfer_timeout_ms = 60000;
};

// True when `upath` is covered by `pattern`: a glob (fnmatch, '*' also
// crossing '/') when it holds '*', '?' or '[', else a path prefix ("" = all).
bool PrefetchPatternMatches(const std::string& pattern, const std::string& upath);

class Prefetcher {
 public:
  // Its requests are tasks on `rt`.
  Prefetcher(PrefetchConfig config, Runtime* rt, Kvs* kvs, Placement* placement,
             MetadataCache* cache);
  ~Prefetcher();
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  // Adds (or with req.cancel withdraws) a declaration; returns how many
  // files already published it matched (queued now).
  Result<uint32_t> Declare(const PrefetchRequest& req);
  // The node cache's hooks (see the header comment). Set before Declare.
  void SetAdmit(std::function<bool(uint64_t bytes)> admit);
  void SetOnPublication(
      std::function<void(const std::string& ns, const FileRecord& rec)> on_publication);
  // Requeues the entries the budget refused (room may have been freed).
  void Kick();
  // Ends the watches and waits for the requests in flight to end (they do
  // once the service's stop has fired). Idempotent.
  void Stop();

  // Counters for `dyad status` ("prefetch.*").
  void AddCounters(std::map<std::string, uint64_t>* out) const;

 private:
  struct Declaration {
    std::string ns, pattern, cons_root, dtl_mode;
  };
  struct Item {
    std::string ns, key, cons_root, dtl_mode;
    FileRecord record;
    bool retried = false;
  };

  Status EnsureWatched(const std::string& ns);
  // Lists `ns` and queues its matching files (of `only`, or of every
  // declaration); the number `only` matched.
  Result<uint32_t> QueueListed(const std::string& ns, const Declaration* only);
  void OnChange(const std::string& ns, const KvsChange& change);
  void MatchLocked(const std::string& ns, const std::string& key, const FileRecord& rec);
  void EnqueueLocked(Item item);
  // The next request: a resync of a namespace (`*resync_ns` set; the
  // default namespace is "", so no string marks its absence), or entries
  // of one owner (a batch).
  bool NextLocked(std::vector<Item>* out, std::optional<std::string>* resync_ns);
  // Adds to `out` the pending entries that can share a request with
  // out->front() (same owner, namespace, directory and transport; small).
  void GatherLocked(std::vector<Item>* out);
  // Starts requests (tasks) while there are entries or resyncs and fewer
  // than max_inflight run.
  void PumpLocked();
  // One request: a resync's listing, or one owner's entries placed.
  Task<void> Work(std::vector<Item> items, std::optional<std::string> resync_ns);
  // Admits and places `items`; returns the entries to fetch again.
  Task<std::vector<Item>> PlaceAll(std::vector<Item>& items);
  void FinishLocked(const std::string& dest, Item* retry);

  const PrefetchConfig cfg_;
  Runtime* const rt_;
  Kvs* const kvs_;
  Placement* const placement_;
  MetadataCache* const cache_;

  mutable std::mutex mu_;
  std::condition_variable idle_cv_;                                            // running_ became 0
  bool stopping_ = false;                                                      // guarded by mu_
  std::function<bool(uint64_t)> admit_;                                        // guarded by mu_
  std::function<void(const std::string&, const FileRecord&)> on_publication_;  // set once
  std::map<std::string, Item> deferred_;           // refused by the budget
  std::vector<Declaration> decls_;                 // guarded by mu_
  std::map<std::string, KvsWatchTicket> watches_;  // by namespace; guarded by mu_
  std::set<std::string> resync_;                   // namespaces to list again
  std::map<std::string, Item> pending_;            // by destination path
  std::deque<std::string> order_;                  // destinations, oldest first
  std::set<std::string> active_;                   // destinations in flight
  std::map<std::string, Item> again_;              // newer records of active ones
  std::map<uint32_t, uint32_t> per_peer_;          // requests in flight by owner
  uint32_t running_ = 0;                           // requests in flight; guarded by mu_
  std::atomic<bool> stopped_{false};

  std::atomic<uint64_t> n_queued_{0}, n_done_{0}, n_present_{0}, n_failed_{0}, n_refused_{0},
      n_dropped_{0};
};

}  // namespace dyad
