// node_cache.h: the index of the copies this service placed in consumer
// directories (fetched copies), their versions, and the node's byte budget.
//
// Every copy Placement puts into a consumer directory is recorded here
// with the identity of the record it is a copy of (CopyId) and the time it
// was last consumed. The index answers "is this copy the current version?"
// (a version is the owner's: its rank, incarnation and publication counter,
// plus size and content time; mtime alone collides under coarse clocks and
// touch), and keeps the fetched bytes under a budget:
//
//  * Budget: DYAD_CACHE_BYTES / --cache-bytes (0 = unlimited). When the
//    indexed bytes exceed it, copies are removed least recently consumed
//    first. Only copies (files another rank owns, placed by this service)
//    are indexed, wherever they live: a consumer directory that is also
//    the producer directory (one managed directory, the README's setup)
//    included. The node's own products are never indexed, hence never
//    evicted; a copy that a local producer rewrote or republished stops
//    being one (Forget on publication; and eviction removes a file only
//    while it is still the very file placed: inode, size and mtime).
//  * Pinned: a copy the cache cannot remove (permission denied, read-only
//    file system) is counted apart (pinned_bytes, node_cache.pinned_bytes)
//    and no longer against the budget.
//  * Trim() evicts down to the budget without a consume (the service calls
//    it on a timer and after placements), so the cache returns under budget
//    once the grace period of the last consumed copies is over.
//  * A copy consumed (fetched or hit) less than kGraceMs ago is not evicted:
//    the consumer that was just told "it is there" still has to open it.
//  * A copy a process holds open is not removed from under it: readers
//    hold a shared flock() on it while open (the preload library does for
//    every read-only open of a consumer file; other programs can with
//    dyad_producer_lock_shared; docs/consistency.md), and the evictor
//    removes a copy only while it holds a non-blocking exclusive flock().
//  * Recency is what the service sees: a consume answered by the client's
//    level-1 shortcut (file present, no message) does not refresh it.
//  * When everything evictable is gone the cache may stay over budget
//    (copies in use, or consumed within the grace period); the next
//    NoteFetched/NoteHit/Trim tries again.
//
// Contract for the prefetcher (src/service/prefetch.*):
//  * call Admit(size) before starting a prefetch; on false, do not start it
//    now (the budget has no room for more unconsumed copies) and try again
//    after a later NoteHit/NoteFetched frees room;
//  * after a prefetched copy is placed, call
//    NoteFetched(ns, path, record, /*consumed=*/false); such a copy counts
//    as "waiting" until a consume hits it (NoteHit) or, since most consumes
//    of a prefetched file are level-1 ones the service never sees, until
//    its access time shows it was read (checked only when the budget is
//    short; on a noatime mount only NoteHit ends the wait). Waiting copies
//    are evicted only after every consumed one;
//  * call Supersede(ns, record) for every publication notification received
//    from the store (matching a prefetch pattern or not): copies of another
//    version of that file are removed so the level-1 shortcut (a client
//    that finds the file present sends no message) cannot hand them out.
// Thread-safe; no method blocks on anything but the index's own mutex and
// the file system calls of eviction.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <list>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/net.h"
#include "proto/protocol.h"
#include "service/stats.h"

namespace dyad {

// What identifies one published version of a file.
struct CopyId {
  uint32_t owner_rank = 0;
  uint64_t owner_incarnation = 0;
  uint64_t seq = 0;  // the owner's publication counter (0: a record of an older DYAD)
  uint64_t size = 0;
  uint64_t version = 0;  // content time (mtime, ns) of the published file
  bool operator==(const CopyId& o) const {
    return owner_rank == o.owner_rank && owner_incarnation == o.owner_incarnation && seq == o.seq &&
           size == o.size && version == o.version;
  }
  bool operator!=(const CopyId& o) const { return !(*this == o); }
};
CopyId IdOf(const FileRecord& rec);

class NodeCache {
 public:
  static constexpr int64_t kGraceMs = 1000;

  // `budget_bytes` 0: unlimited. `stats` gets the node_cache.* counters.
  NodeCache(uint64_t budget_bytes, ServiceStats* stats, int64_t grace_ms = kGraceMs);

  uint64_t budget() const { return budget_; }

  // Copies at or below `root` (the producer directory, when a consumer
  // directory overlaps it) are evicted like any other copy, but never
  // unlinked when superseded (the path may hold a file this node produces
  // by then; the publication's new file replaces it): the copy, while it
  // still is the file placed, loses its version stamp instead, so no client
  // takes it as current without asking the service. Set before use.
  void ProtectTree(const std::string& root) { protected_root_ = root; }

  // At a service's start, before it serves: the copies an earlier run of
  // it placed under `root` (its producer directory) may carry revocable
  // stamps, which nobody withdraws now (this index starts empty, so a new
  // version would not reach them). Each becomes the plain stamp of its
  // version (which still names it for a client that holds the record,
  // but is not taken as current on its own). Walks the tree without
  // following symlinks; returns how many it changed.
  static size_t DemoteStamps(const std::string& root);

  // Revocable stamps (proto/protocol.h): a copy in the producer tree may be
  // taken as current from its stamp alone only while this service learns
  // every publication of its namespace (the record feed follows it, with
  // no gap), so that Supersede withdraws the stamp the moment the copy
  // goes stale.
  //  * Following(ns): from now on every publication of `ns` reaches
  //    Supersede (the feed follows it and has listed it once);
  //  * GapBegins(ns): publications may be missed from now on (the feed's
  //    link was lost, the store restarted): every copy of `ns` in the
  //    producer tree loses its stamp (the Withdrawal it returns, run at
  //    once), and so does one indexed until GapEnds(ns) (the namespace has
  //    been listed again);
  //  * StampRevocable(ns, path): whether a copy placed at `path` now gets a
  //    revocable stamp.
  class Withdrawal;
  void Following(const std::string& ns);
  // Marks the gap at once (no file system call, the lock held briefly);
  // the returned Withdrawal removes the stamps without the lock.
  [[nodiscard]] Withdrawal GapBegins(const std::string& ns);
  void GapEnds(const std::string& ns);
  bool StampRevocable(const std::string& ns, const std::string& path) const;

  // True when `bytes` more of not-yet-consumed copies fit in the budget
  // (always with no budget). Does not reserve anything.
  bool Admit(uint64_t bytes);

  // A copy of `rec` was placed at `path` (absolute). Replaces
  // what the index held for `path`, then evicts down to the budget.
  // `consumed`: a consumer asked for it (false: prefetched ahead).
  void NoteFetched(const std::string& ns, const std::string& path, const FileRecord& rec,
                   bool consumed = true);
  // The same with the placed file's fstat, taken by the placement after
  // stamping it (AtomicFile::CommitOptions::placed): no stat of the path.
  void NoteFetched(const std::string& ns, const std::string& path, const FileRecord& rec,
                   bool consumed, const struct stat& placed);

  // A consume found the copy at `path` current: it becomes the most
  // recently consumed (counted in node_cache.hits), gets a revocable stamp
  // when it may have one now (see Following), then evicts to budget.
  // True when the copy had been prefetched and this is its first consume.
  bool NoteHit(const std::string& path);

  // True when the index holds `path` as a copy of exactly `rec`'s version
  // and the file still has the size and content time it was placed with
  // (nobody rewrote it behind DYAD's back).
  bool IsCurrent(const std::string& path, const FileRecord& rec) const;

  // `rec` is a version of (ns, rec.upath) that was just published: removes
  // every indexed copy of that file with another version. Returns how many.
  size_t Supersede(const std::string& ns, const FileRecord& rec);

  // Owner ranks of the indexed copies of (ns, upath): whom to tell when
  // this node publishes a new version of it (service/versions.h).
  std::set<uint32_t> OwnersOf(const std::string& ns, const std::string& upath) const;

  // Drops `path` from the index without touching the file (it was replaced
  // or adopted: read-write ownership made it this node's own file).
  void Forget(const std::string& path);

  // Evicts down to the budget now (copies consumed within the grace period
  // and copies held open stay). For the service's timer.
  void Trim();
  // Whether the copies counted exceed the budget (never without one): what
  // Trim would act on.
  bool OverBudget() const;

  // Bytes of the copies counted against the budget (pinned ones apart).
  uint64_t bytes() const;
  // Bytes of the copies the cache found it cannot remove.
  uint64_t pinned_bytes() const;
  size_t files() const;
  // Namespaces followed without a gap now (their copies in the producer
  // tree get revocable stamps).
  size_t followed_namespaces() const;

 private:
  struct Entry {
    std::string ns_upath;  // ns '\0' upath, the key of by_file_
    CopyId id;
    uint64_t mtime_ns = 0;      // of the placed file
    uint64_t used_ns = 0;       // monotonic time of the last consume
    uint64_t atime_ns = 0;      // of the placed file, when placed
    uint64_t ino = 0, dev = 0;  // of the placed file: a rewrite is no longer the copy
    bool consumed = true;
    bool pinned = false;  // cannot be removed (counted in pinned_bytes_, not bytes_)
    std::list<std::string>::iterator lru;  // position in lru_
  };
  bool OverBudgetLocked() const;  // under mu_
  void DropLocked(std::unordered_map<std::string, Entry>::iterator it);
  void MarkConsumedLocked(Entry& e);
  void RefreshWaitingLocked();
  void EvictLocked(const std::string& keep);
  enum class Removal { kRemoved, kBusy, kNotTheCopy, kDenied };
  static bool IsThePlacedFile(const struct stat& st, const Entry& e);
  // `path` opened (read-only, not through a symlink) while it still is the
  // very file `e` placed, `*st` its fstat; an invalid descriptor otherwise.
  static UniqueFd OpenPlaced(const std::string& path, const Entry& e, struct stat* st);
  void Unstamp(const std::string& path, const Entry& e) const;
  void Restamp(const std::string& path, const Entry& e) const;
  bool RevocableLocked(const std::string& ns, const std::string& path) const;
  Removal TryRemove(const std::string& path, const Entry& e) const;
  bool Protected(const std::string& path) const;

  const uint64_t budget_;
  const int64_t grace_ms_;
  std::string protected_root_;
  ServiceStats* stats_;
  mutable std::mutex mu_;
  std::set<std::string> following_;  // namespaces whose publications all reach Supersede
  std::set<std::string> gapped_;     // ... except during a gap
  std::unordered_map<std::string, Entry> by_path_;
  std::map<std::string, std::set<std::string>> by_file_;  // ns '\0' upath -> paths
  std::list<std::string> lru_;                            // front: most recently consumed
  uint64_t bytes_ = 0;
  uint64_t pinned_bytes_ = 0;
  uint64_t waiting_bytes_ = 0;  // of copies not consumed yet (prefetched)
};

// The copies a gap takes the stamps from (NodeCache::GapBegins), each with
// what identifies the file placed there: Run() opens each and removes its
// stamp (a few system calls per copy, without the cache's lock), so a
// caller on the service's loop runs it on the pool. A copy replaced since
// is left alone; one that lost its stamp anyway is fine.
class NodeCache::Withdrawal {
 public:
  Withdrawal() = default;
  bool empty() const { return copies_.empty(); }
  size_t size() const { return copies_.size(); }
  void Run() const;

 private:
  friend class NodeCache;
  const NodeCache* cache_ = nullptr;
  std::vector<std::pair<std::string, Entry>> copies_;
};

}  // namespace dyad
