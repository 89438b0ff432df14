// redis_kvs.h: the metadata store kept in Redis (the "redis" backend): one
// server (redis://), a Redis Cluster (redis+cluster://) or a primary
// managed by Redis Sentinel (redis+sentinel://); URLs in redis_url.h,
// operations guide in docs/redis.md.
//
// Layout. One server and sentinel: the value of (ns, key) is the string
// "PREFIX:{NS}:KEY", NS with '%', '{', '}' percent-encoded, so the first
// "}" ends it (unambiguous), and "{NS}" keeps a namespace in one slot
// should the data later move to a cluster by hand. Cluster:
// "PREFIX:NS:KEY" with '%', ':', '{', '}' in NS encoded: no hash tag before
// KEY, so every file key hashes on its own and the keys of one namespace
// spread over all slots and masters. Values are stored byte for byte.
//
// Put runs one Lua script on the key's node that SETs the key and
// publishes the value on the channel named like the key (PUBLISH; SPUBLISH
// in a cluster, sharded pub/sub), and "<key length>:<key><value>" on the
// namespace's watch channel (classic PUBLISH everywhere: a cluster carries
// it to every node; redis_watch.h), atomically: a subscriber that gets the
// message never sees a value a reader could not. With sentinel, the script
// is followed on the same connection by WAIT (wait_replicas, default 1), so
// a publication counts as done only once a replica has it and a failover
// cannot lose it. In a cluster, a Put redirected by ASK (its slot is being
// migrated) also publishes on the slot's old owner, where subscribers stay
// until the migration ends.
//
// Get, Remove: one command on the key's node. MultiGet: MGET per 256 keys
// on one server; in a cluster GETs pipelined per master. List: SCAN with a literal
// MATCH pattern on every master (a cluster has no cross-node index; List
// serves `dyad list` and tools, never the publish/consume path), then the
// values (MGET on one node, pipelined GETs per cluster node), sorted.
//
// Waits: StartWait parks on the shared subscriber (redis_subscriber.h)
// without a thread; Wait reads the key once and, when absent, is Kvs::Wait
// over StartWait. Commands run through RedisExecutor
// (redis_exec.h): per-node pools, MOVED/ASK, retries across restarts and
// failovers.
//
// hiredis 0.14 (Debian 12) has no TLS: "rediss://" and "?tls=1" give
// DYAD_RC_NOTSUP.
//
// Threading: all methods are thread-safe. `cancel` callbacks are called
// from the waiting thread without any lock held.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvs/kvs.h"
#include "kvs/redis/redis_exec.h"
#include "kvs/redis/redis_subscriber.h"
#include "kvs/redis/redis_topology.h"
#include "kvs/redis/redis_url.h"
#include "kvs/redis/redis_watch.h"

namespace dyad {

class RedisKvs final : public Kvs {
 public:
  // Keys asked for per SCAN step in List, and values per MGET or pipeline
  // (List, MultiGet).
  static constexpr int kScanCount = 1000;
  static constexpr size_t kMgetBatch = 256;

  // Does not connect: the first call does. `options.rpc_timeout_ms` bounds
  // one command unless the URL sets timeout_ms. Without a password in the
  // URL, the password comes from password_file, else $DYAD_REDIS_PASSWORD.
  static Result<std::unique_ptr<RedisKvs>> Open(const std::string& url, const KvsOptions& options);
  ~RedisKvs() override;
  RedisKvs(const RedisKvs&) = delete;
  RedisKvs& operator=(const RedisKvs&) = delete;

  std::string name() const override { return "redis"; }

  Status Put(const std::string& ns, const std::string& key, const std::string& value) override;
  Result<std::optional<std::string>> Get(const std::string& ns, const std::string& key) override;
  // MGET on one server or sentinel's primary; in a cluster, GETs pipelined
  // per master.
  Result<KvsValues> MultiGet(const std::string& ns, const std::vector<std::string>& keys) override;
  Result<std::string> Wait(const std::string& ns, const std::string& key, Deadline deadline,
                           const CancelFn& cancel = nullptr) override;
  Status Remove(const std::string& ns, const std::string& key) override;
  Result<std::vector<KvsEntry>> List(const std::string& ns, const std::string& prefix,
                                     uint32_t limit = 0) override;
  Result<KvsWaitTicket> StartWait(const std::string& ns, const std::string& key, Deadline deadline,
                                  KvsWaitCallback done) override;
  void CancelWait(KvsWaitTicket ticket) override;
  // Every deployment: one server, sentinel and cluster (redis_watch.h).
  Result<KvsWatchTicket> Watch(const std::string& ns, KvsWatchCallback on_change) override;
  void Unwatch(KvsWatchTicket ticket) override;

  // Makes waits in progress and later waits on absent keys return
  // DYAD_RC_CANCELLED, and closes idle connections. Other calls keep
  // working. Irreversible.
  void Shutdown() override;

  // The Redis key holding (ns, key) (see the header comment).
  std::string RedisKey(const std::string& ns, const std::string& key) const;
  // The channel a Put also publishes on for Kvs::Watch (classic pub/sub,
  // also in a cluster).
  std::string WatchChannel(const std::string& ns) const;
  const RedisConfig& config() const { return config_; }
  // Pub/sub links connected now, for tests.
  size_t subscriber_links() const { return subscriber_.links_up(); }

 private:
  explicit RedisKvs(RedisConfig config);

  int SlotOf(const std::string& rkey) const;
  Result<std::optional<std::string>> GetRaw(const std::string& rkey);
  Status CheckReplicated(const std::vector<RedisReply>& replies) const;
  // List's two halves.
  Result<std::vector<std::string>> ScanKeys(const std::string& pattern, const std::string& base,
                                            const std::string& prefix);
  Status FetchValues(const std::vector<std::string>& keys, size_t base_len,
                     std::vector<KvsEntry>* out);
  // The values of Redis keys `rkeys`, in order.
  Result<KvsValues> GetMany(const std::vector<std::string>& rkeys);
  Result<KvsValues> GetManyCluster(const std::vector<std::string>& rkeys);

  const RedisConfig config_;
  RedisTopology topology_;
  RedisExecutor exec_;
  RedisSubscriber subscriber_;
  RedisWatcher watcher_;
  std::atomic<bool> shutdown_{false};
};

}  // namespace dyad
