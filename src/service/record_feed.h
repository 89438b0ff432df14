// record_feed.h: a service's local replica of the records of the
// namespaces its consumers read.
//
// The first consume or locate in a namespace starts following it: the
// store's watch feed (KvsCaps::watch) puts every later publication into
// the node's locate cache, and one listing (at most kSeedLimit records)
// seeds the records already there. A consume of a file published before
// then finds its record locally and costs two round trips (client to
// service, service to owner) instead of three. Correctness does not rest
// on the feed: a record the owner refuses as stale is dropped and the
// store read again (Service::RecordAfterStale), and a resync (a lost link,
// a restarted root, a Redis failover) drops the namespace's replica and
// lists it again. Bounded: at most kMaxNamespaces namespaces are followed,
// and the cache holding the records has a fixed capacity.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/runtime.h"
#include "common/thread_annotations.h"
#include "kvs/kvs.h"
#include "service/metadata_cache.h"
#include "service/node_cache.h"
#include "service/stats.h"

namespace dyad {

class RecordFeed {
 public:
  static constexpr size_t kMaxNamespaces = 8;
  static constexpr uint32_t kSeedLimit = 65536;

  // `copies` (may be null) hears every record learned (Supersede) and
  // whether the feed is complete (NodeCache::Following, GapBegins, GapEnds).
  RecordFeed(Kvs* kvs, MetadataCache* cache, NodeCache* copies, Runtime* rt, ServiceStats* stats)
      : kvs_(kvs), cache_(cache), copies_(copies), rt_(rt), stats_(stats) {}
  ~RecordFeed() { Stop(); }
  RecordFeed(const RecordFeed&) = delete;
  RecordFeed& operator=(const RecordFeed&) = delete;

  // Starts following `ns` unless it is followed already, the store has no
  // watch, or kMaxNamespaces are followed. Returns at once: the watch and
  // the seeding listing run on the runtime's pool.
  void Follow(const std::string& ns);
  // Ends every watch; no callback runs after it returns.
  void Stop();

 private:
  // Runs `step` for `ns` on the runtime's pool: it asks the store, which
  // may block, so never on the loop.
  void OnPool(void (RecordFeed::*step)(const std::string&), const std::string& ns);
  void Start(const std::string& ns);
  // Lists the namespace into the cache; false when the listing failed.
  bool Seed(const std::string& ns);
  // After a resync: lists again, then ends the copies' gap.
  void Reseed(const std::string& ns);
  void OnChange(const std::string& ns, const KvsChange& c);
  // The copies' gap (NodeCache::GapBegins), their stamps taken off on the pool.
  void GapBegins(const std::string& ns);

  Kvs* kvs_;
  MetadataCache* cache_;
  NodeCache* copies_;
  Runtime* rt_;
  ServiceStats* stats_;
  mutable Mutex mu_;
  bool stopping_ GUARDED_BY(mu_) = false;
  // Followed namespaces and their watch (0 while it is being set up).
  std::map<std::string, KvsWatchTicket> followed_ GUARDED_BY(mu_);
};

}  // namespace dyad
