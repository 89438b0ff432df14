// redis_kvs.h: the metadata store kept in a Redis server (the "redis"
// backend, URL "redis://[[USER]:PASSWORD@]HOST:PORT[/DB][?OPTIONS]").
//
// Layout: the value of (ns, key) is the Redis string "dyad:{NS}:KEY", where
// NS is the namespace with '%', '{' and '}' percent-encoded. The encoding
// makes the first "}" end the namespace, so two different (ns, key) pairs
// never share a Redis key, and "{NS}" is a Redis Cluster hash tag: all keys
// of one namespace live in one slot. Values are stored byte for byte.
//
// Put runs one Lua script that SETs the key and PUBLISHes the value on the
// channel named like the key, atomically: a reader that sees the value and a
// subscriber that gets the message see the same write.
//
// Waits do not poll Redis. Each RedisKvs has one subscriber connection,
// driven by one thread (started by the first wait that has to block), which
// multiplexes every waiting call: a map channel -> waiters. A Wait GETs the
// key; if absent it registers on the key's channel, and every time the
// subscriber thread reports the channel (re)subscribed -- confirmed by Redis
// -- the waiter GETs again. A Put before the subscription is seen by that
// GET, a Put after it arrives as a message: no lost wake-up. Waiters sleep
// on their own condition variable in slices of at most kCancelPollMs to
// check the deadline and `cancel`. When the subscriber link breaks (Redis
// restart), the thread reconnects with back-off (kBackoffFirstMs doubling to
// kBackoffMaxMs) and re-subscribes every channel that still has waiters; the
// new confirmations make the waiters check again, so waits survive a restart
// until their deadline. One connection serves any number of waiters.
//
// Commands other than waits use a pool of blocking hiredis connections (at
// most kMaxIdle kept idle), created lazily so a service may start before
// Redis does. Every command is idempotent: one that fails on a reused (maybe
// stale) connection is retried at once on a fresh one, and while Redis is
// unreachable or loading, retried with back-off for connect_timeout_ms.
//
// hiredis 0.14 (Debian 12) has no TLS: "rediss://" and "?tls=1" give
// DYAD_RC_NOTSUP. Redis Cluster redirections (MOVED/ASK) are not followed.
//
// Threading: all methods are thread-safe; each concurrent command uses its
// own pooled connection. `cancel` callbacks are called from the waiting
// thread without any lock held. The subscriber thread never calls back into
// user code; it is joined by the destructor.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kvs/kvs.h"

struct redisContext;

namespace dyad {

// What a redis:// URL says. Parsed by ParseRedisUrl; exposed for tests.
struct RedisConfig {
  std::string host = "127.0.0.1";
  int port = 6379;
  std::string user;           // ACL user; empty: the default user
  std::string password;       // empty: no AUTH
  std::string password_file;  // ?password_file=PATH: first line is the password
  int db = 0;                 // SELECTed on every connection when not 0
  int64_t connect_timeout_ms = 2000;
  int64_t command_timeout_ms = 60000;
  bool command_timeout_set = false;  // timeout_ms given in the URL
  std::string prefix = "dyad";       // first component of every key
};

// Parses "redis://[[USER]:PASSWORD@]HOST:PORT[/DB][?OPTIONS]". OPTIONS are
// "&"-separated: connect_timeout_ms=N, timeout_ms=N, password_file=PATH,
// prefix=NAME; tls=1 and
// the "rediss://" scheme give DYAD_RC_NOTSUP (no TLS in hiredis 0.14). USER
// and PASSWORD may be percent-encoded.
Result<RedisConfig> ParseRedisUrl(const std::string& url);

class RedisKvs final : public Kvs {
 public:
  static constexpr size_t kMaxIdle = 8;
  static constexpr int64_t kCancelPollMs = 250;
  static constexpr int64_t kBackoffFirstMs = 50;
  static constexpr int64_t kBackoffMaxMs = 1000;
  // Keys asked for per SCAN step, and values per MGET, in List.
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
  Result<std::string> Wait(const std::string& ns, const std::string& key, Deadline deadline,
                           const CancelFn& cancel = nullptr) override;
  Status Remove(const std::string& ns, const std::string& key) override;
  Result<std::vector<KvsEntry>> List(const std::string& ns, const std::string& prefix,
                                     uint32_t limit = 0) override;

  // Makes waits in progress (within kCancelPollMs) and later waits on absent
  // keys return DYAD_RC_CANCELLED, and closes idle connections. Other calls
  // keep working. Irreversible.
  void Shutdown() override;

  // The Redis key holding (ns, key): "PREFIX:{NS}:KEY" (see the header).
  std::string RedisKey(const std::string& ns, const std::string& key) const;
  const RedisConfig& config() const { return config_; }

 private:
  struct ContextDeleter {
    void operator()(redisContext* c) const;
  };
  using Context = std::unique_ptr<redisContext, ContextDeleter>;
  class Reply;

  explicit RedisKvs(RedisConfig config);

  // A connected, authenticated context with the db selected.
  Result<Context> Dial(int64_t timeout_ms);
  Result<Context> Borrow(bool* reused);
  void Release(Context c);

  // Runs one command with the retry policy; `*out` gets the reply.
  Status Command(const std::vector<std::string>& argv, Reply* out);
  // One GET, used by Get and Wait.
  Result<std::optional<std::string>> GetRaw(const std::string& rkey);
  // --- the shared subscriber (see the header comment) ---
  struct Waiter {
    std::condition_variable cv;
    std::shared_ptr<const std::string> value;  // set by a message
    uint64_t confirmed = 0;                    // channel generation seen last
  };
  enum class ChannelState { kNew, kSubscribing, kActive, kUnsubscribing };
  struct ChannelEntry {
    std::set<Waiter*> waiters;
    ChannelState state = ChannelState::kNew;
    // Bumped at each confirmed (re)subscription: waiters GET again.
    uint64_t generation = 0;
  };

  void StartSubscriberLocked();  // needs smu_
  void WakeSubscriber();
  void SubscriberLoop();
  // Sends SUBSCRIBE/UNSUBSCRIBE for channels whose waiters changed; false
  // when the link broke. Needs smu_.
  bool SyncChannelsLocked(redisContext* c);
  // Handles one pushed reply. Needs smu_.
  void HandlePushLocked(redisContext* c, const void* reply);
  bool Stopping(const CancelFn& cancel, Status* why) const;

  const RedisConfig config_;
  std::atomic<bool> shutdown_{false};
  std::mutex mu_;
  std::vector<Context> idle_;  // guarded by mu_

  std::mutex smu_;                                // the subscriber state below
  std::map<std::string, ChannelEntry> channels_;  // guarded by smu_
  Status link_error_;                             // guarded by smu_: why it is down
  bool link_up_ = false;                          // guarded by smu_
  std::atomic<bool> stop_subscriber_{false};
  std::thread subscriber_;  // started under smu_
  int wake_fd_ = -1;        // eventfd: channels changed
};

}  // namespace dyad
