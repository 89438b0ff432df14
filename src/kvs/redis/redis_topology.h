// redis_topology.h: which Redis node serves what.
//
// One server (redis://): that server, always. Sentinel (redis+sentinel://):
// the primary the sentinels name (SENTINEL get-master-addr-by-name, asked
// of each sentinel in turn, the one that answered first next time),
// confirmed with ROLE on the primary itself so a sentinel that has not yet
// seen a failover cannot send writes to a replica; +switch-master messages
// (watched by the subscriber) update it at once. Cluster (redis+cluster://):
// the owner of each of the 16384 hash slots, read with CLUSTER SLOTS from
// any node known so far or else the seeds, patched by MOVED replies in
// between.
//
// Lookups are serialised and rate-limited (kMinRefreshMs): when many
// threads see the same failure they share one lookup. epoch() changes
// whenever the view changes, so holders of derived state (the
// subscriber's channel -> node routing) know to re-route.
//
// Threading: thread-safe; lookups do network I/O without holding the lock
// that guards the view, so CachedNodeFor never blocks on the network.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "common/time.h"
#include "kvs/redis/redis_link.h"
#include "kvs/redis/redis_url.h"

namespace dyad {

class RedisTopology {
 public:
  static constexpr int64_t kMinRefreshMs = 100;
  // One lookup connection's bound, so a dead seed or sentinel costs little.
  static constexpr int64_t kLookupConnectMs = 1000;

  explicit RedisTopology(const RedisConfig& config);
  RedisTopology(const RedisTopology&) = delete;
  RedisTopology& operator=(const RedisTopology&) = delete;

  RedisMode mode() const { return config_.mode; }
  const RedisLogin& login() const { return login_; }

  // The node serving `slot` (cluster; any slot value elsewhere), looking
  // the topology up first when it is unknown or marked stale.
  Result<RedisAddress> NodeFor(int slot);
  // The same from what is known now, without I/O; nullopt when unknown.
  std::optional<RedisAddress> CachedNodeFor(int slot) const;
  // Every master (cluster) or the one primary/server.
  Result<std::vector<RedisAddress>> Masters();
  // Cluster: every master known now then the URL's seeds not among them,
  // looking the topology up first when stale (a failed lookup keeps the
  // old view); nodes that may be down are included. Elsewhere: NodeFor.
  // For links that any node can serve (the namespace watcher).
  Result<std::vector<RedisAddress>> AnyNodes();

  // A MOVED reply: `slot` is served by `node` now.
  void NoteMoved(int slot, const RedisAddress& node);
  // The sentinels announced a new primary (+switch-master).
  void SetPrimary(const RedisAddress& node);
  // Something suggests the view is out of date (a node unreachable,
  // READONLY, CLUSTERDOWN): the next NodeFor looks it up again.
  void MarkStale() {
    if (config_.mode != RedisMode::kSingle) stale_.store(true);
  }
  bool stale() const { return stale_.load(); }
  // Looks the topology up now; at most one attempt per kMinRefreshMs (a
  // later call within that time gets the last attempt's outcome).
  Status Refresh();

  // For an error reaching `node`: when it is a cluster node that the URL
  // does not name (it came from the cluster's own slot map), a sentence
  // saying so and how to fix an unreachable announced address; "" else.
  std::string AddressOrigin(const RedisAddress& node) const;

  uint64_t epoch() const { return epoch_.load(); }
  // The sentinels, in the order they will be asked (for the subscriber's
  // +switch-master link).
  std::vector<RedisAddress> Sentinels() const;
  RedisLogin sentinel_login() const;

 private:
  struct ClusterView {
    std::vector<RedisAddress> nodes;
    std::vector<int16_t> owner;  // slot -> index in nodes, -1 unknown
  };

  Status RefreshCluster();
  Status RefreshSentinel();
  Result<ClusterView> AskClusterSlots(const RedisAddress& node);
  Result<RedisAddress> AskSentinel(const RedisAddress& sentinel);
  Status ConfirmPrimary(const RedisAddress& node);
  bool KnownLocked() const REQUIRES(mu_);
  void BumpLocked() { epoch_.fetch_add(1); }

  const RedisConfig config_;
  const RedisLogin login_;

  Mutex refresh_mu_;                                     // one lookup at a time
  mutable Mutex mu_;                                     // the view below
  std::optional<RedisAddress> primary_ GUARDED_BY(mu_);  // single / sentinel
  ClusterView cluster_ GUARDED_BY(mu_);
  std::vector<RedisAddress> sentinels_ GUARDED_BY(mu_);  // answering one first
  SteadyClock::time_point last_attempt_ GUARDED_BY(mu_){};
  Status last_status_ GUARDED_BY(mu_);
  std::atomic<bool> stale_{false};
  std::atomic<uint64_t> epoch_{1};
};

}  // namespace dyad
