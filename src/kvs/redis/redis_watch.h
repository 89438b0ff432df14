// redis_watch.h: Kvs::Watch for the Redis store (one server or a
// sentinel-managed primary).
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
// A Redis Cluster has no cheap cluster-wide publication from inside a
// script (classic PUBLISH is broadcast to every master; sharded channels
// must share the key's slot), so Watch there gives DYAD_RC_NOTSUP.
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
  bool SendSubscribe(redisContext* c, const char* verb, const std::string& channel);
  void HandlePush(const redisReply* r);
  void Wake();

  RedisExecutor* const exec_;
  WatchList watchers_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Sub> subs_;     // by channel; guarded by mu_
  std::set<std::string> to_subscribe_;  // channels not sent on this link yet
  std::set<std::string> to_unsubscribe_;
  bool stop_ = false;
  int wake_fd_ = -1;
  std::thread thread_;
};

}  // namespace dyad
