// redis_watch.h: Kvs::Watch for the Redis store (one server, a
// sentinel-managed primary or a Redis Cluster).
//
// Every Put's script also publishes "<key length>:<key><value>" on the
// namespace's watch channel (RedisKvs::WatchChannel), atomically with the
// SET, so a watcher subscribed before a Put receives it. One link of our
// own subscribes to the channels of the watched namespaces; a broken link
// is re-dialled with back-off (following the primary after a failover),
// re-subscribed, and its namespaces get a resync (List again), since
// messages published while it was down are lost. Watch returns once
// Redis confirmed the subscription (or after kConfirmMs, with a resync
// promised once it is confirmed).
//
// A link that goes silent is PINGed after kHeartbeatMs and dropped when
// the PING is not answered within as long again.
//
// Redis Cluster: the Put script's PUBLISH on the watch channel is classic
// pub/sub, which the cluster carries over its bus to every node, so the
// link may subscribe on any node. It takes the nodes the topology knows
// (then the URL's seeds) in turn, from an arbitrary first one: when its
// node dies, the next is dialled at once (a failed dial backs off, 50 ms
// doubling to 1 s), and the re-subscription brings the resync above. Sharded pub/sub is not used
// for watches: the watch channel's shard is not the key's, so its SPUBLISH could not share the
// SET's atomic script (docs/redis.md).
//
// Threading: thread-safe; one thread (started by the first Watch) does all
// the link's I/O and runs the callbacks.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "kvs/kvs.h"
#include "kvs/redis/redis_exec.h"
#include "kvs/watch.h"

namespace dyad {

class RedisWatcher {
 public:
  static constexpr int64_t kPollMs = 250;
  static constexpr int64_t kConfirmMs = 2000;
  static constexpr int64_t kBackoffFirstMs = 50;
  static constexpr int64_t kBackoffMaxMs = 1000;
  // Silence after which the link is PINGed, and then declared dead.
  static constexpr int64_t kHeartbeatMs = 2000;

  explicit RedisWatcher(RedisExecutor* exec);
  ~RedisWatcher();
  RedisWatcher(const RedisWatcher&) = delete;
  RedisWatcher& operator=(const RedisWatcher&) = delete;

  Result<KvsWatchTicket> Watch(const std::string& ns, const std::string& channel,
                               KvsWatchCallback on_change);
  void Unwatch(KvsWatchTicket ticket);
  void Shutdown();

  // The message a Put publishes, and its inverse.
  static std::string EncodeMessage(const std::string& key, const std::string& value);
  static bool DecodeMessage(const std::string& msg, std::string* key, std::string* value);

 private:
  struct Sub {
    std::string ns;
    bool confirmed = false;
    bool resync_on_confirm = false;
  };
  void Loop();
  bool Serve(redisContext* c);  // false: the link failed
  // Sends `verb arg` (`verb` alone when arg is empty) and flushes it.
  bool SendCommand(redisContext* c, const char* verb, const std::string& arg);
  // A link to the next node to subscribe on (see the header comment).
  Result<RedisContext> DialNext();
  void HandlePush(const redisReply* r);
  void Wake();

  RedisExecutor* const exec_;
  WatchList watchers_;
  Mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Sub> subs_ GUARDED_BY(mu_);  // by channel
  // Channels not sent on this link yet.
  std::set<std::string> to_subscribe_ GUARDED_BY(mu_);
  std::set<std::string> to_unsubscribe_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  int wake_fd_ = -1;
  size_t next_node_ = 0;  // DialNext's rotation; the loop thread's own
  std::thread thread_ GUARDED_BY(mu_);
};

}  // namespace dyad
