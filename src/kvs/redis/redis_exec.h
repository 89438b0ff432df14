// redis_exec.h: running commands on the right Redis node.
//
// Keeps a pool of connections per node (at most kMaxOpenPerNode open:
// callers beyond that wait for a free one instead of opening thousands of
// connections when thousands of waits start together; of those, at most
// kMaxIdlePerNode stay open once nobody waits, so a burst does not turn
// into a storm of connects and closes) and runs command batches with the
// store's retry policy:
//  * the batch goes to the node the topology names for its slot and is
//    pipelined on one connection (so WAIT follows its write);
//  * MOVED updates the slot map and goes to the named node at once; ASK
//    goes there once, preceded by ASKING (a slot being migrated), and tells
//    the caller which node redirected it;
//  * a link that fails after sitting idle in the pool is retried at once on
//    a fresh one (it is no evidence that the node is gone);
//  * unreachable nodes, LOADING, BUSY, READONLY, CLUSTERDOWN, MASTERDOWN
//    and TRYAGAIN are retried with back-off for retry_ms, the topology
//    looked up again meanwhile (a failover moves the primary).
// Every command DYAD sends is idempotent, so a retry is always safe.
//
// Threading: thread-safe; each batch uses a connection of its own.
#pragma once

#include <atomic>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "kvs/redis/redis_link.h"
#include "kvs/redis/redis_topology.h"
#include "kvs/redis/redis_url.h"

namespace dyad {

class RedisExecutor {
 public:
  static constexpr size_t kMaxIdlePerNode = 8;
  static constexpr size_t kMaxOpenPerNode = 64;
  static constexpr int64_t kBackoffFirstMs = 50;
  static constexpr int64_t kBackoffMaxMs = 1000;
  static constexpr int kMaxRedirects = 8;

  // Where a batch ran: the node that answered, and the node that sent it
  // there with ASK (a slot in migration), if one did.
  struct Route {
    RedisAddress node;
    std::optional<RedisAddress> asked_by;
  };

  RedisExecutor(const RedisConfig& config, RedisTopology* topology);
  ~RedisExecutor();
  RedisExecutor(const RedisExecutor&) = delete;
  RedisExecutor& operator=(const RedisExecutor&) = delete;

  // Runs `cmds` on the node serving `slot` (cluster) or the primary, with
  // the policy above. On success every reply is in `*out` and none is an
  // error reply; an error reply gives its Status (RedisErrorStatus).
  Status Run(int slot, const std::vector<RedisArgv>& cmds, std::vector<RedisReply>* out,
             Route* route = nullptr);
  // Runs `cmds` on `node` only: no redirection, one retry on a stale link.
  // Error replies come back in `*out` (the caller knows what it asked).
  Status RunOn(const RedisAddress& node, const std::vector<RedisArgv>& cmds,
               std::vector<RedisReply>* out);

  // `st` (a failure to reach `node`) with where the address came from when
  // the cluster named it (RedisTopology::AddressOrigin).
  Status WithOrigin(const Status& st, const RedisAddress& node) const;
  // A new connection to `node` outside the pools (the subscriber's links).
  Result<RedisContext> Dial(const RedisAddress& node);

  // Closes idle connections and stops pooling. Commands still work.
  void Shutdown();
  RedisTopology* topology() const { return topology_; }

 private:
  struct Pool {
    std::vector<RedisContext> idle;
    size_t open = 0;     // idle + borrowed
    size_t waiting = 0;  // callers in Borrow waiting for a connection
  };
  // An attempt's outcome, for Run's loop.
  enum class Next { kDone, kRetryNow, kBackOff };

  Result<RedisContext> Borrow(const RedisAddress& node, bool* reused);
  void Release(const RedisAddress& node, RedisContext c, bool healthy);
  void DropIdle(const RedisAddress& node);
  // One attempt of Run on `node`; fills `*out` and `*last`.
  Next Attempt(const RedisAddress& node, bool asking, const std::vector<RedisArgv>& cmds,
               std::vector<RedisReply>* out, Status* last, std::optional<RedisRedirect>* redirect);

  const RedisConfig config_;
  RedisTopology* const topology_;
  std::atomic<bool> shutdown_{false};
  Mutex mu_;
  std::condition_variable freed_;
  std::map<std::string, Pool> pools_ GUARDED_BY(mu_);  // by RedisAddress::ToString()
};

}  // namespace dyad
