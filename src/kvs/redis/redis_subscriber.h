// redis_subscriber.h: every wait of one RedisKvs, on few pub/sub links.
//
// A waiter is (channel, deadline, callback); the channel is the Redis key
// itself, on which every Put publishes the value it wrote. Waiters of one
// key share one subscription, and subscriptions share links: one link for
// one server or a sentinel-managed primary (SUBSCRIBE), one link per
// master that owns a waited-for slot in a cluster (SSUBSCRIBE, sharded
// pub/sub: a publication reaches only its shard, so the cost of a Put does
// not grow with the number of masters, as classic PUBLISH's cluster-wide
// broadcast would).
//
// No lost wake-up: when Redis confirms a subscription (first time, after a
// reconnect, after moving to another node), and whenever a waiter joins an
// already-confirmed one, the key is read again (the checker thread, in
// batches): a Put before the subscription is seen by that read, one after
// it arrives as a message. A node that loses a slot (migration) ends its
// shard subscriptions with "sunsubscribe"; the channel is then routed
// again (slot map looked up) and subscribed on the new owner, which
// triggers the read. While a slot is migrating, publishers also publish on
// the old owner (RedisKvs::Put), where subscribers still are.
//
// Failures: a broken link is re-dialled with back-off (kBackoffFirstMs
// doubling to kBackoffMaxMs) and its channels re-subscribed; in sentinel
// mode a link to a sentinel follows +switch-master so a failover moves the
// subscriptions at once. A waiter whose deadline passes gets
// DYAD_RC_TIMEOUT naming the link's last error, if any.
//
// Threading: thread-safe. Two threads, started by the first waiter: the
// subscriber (all pub/sub I/O, deadlines) and the checker (the reads).
// Callbacks run on one of them, or in Cancel/Shutdown's caller, never
// under the lock.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/thread_annotations.h"
#include "kvs/kvs.h"
#include "kvs/redis/redis_exec.h"

namespace dyad {

class RedisSubscriber {
 public:
  static constexpr int64_t kPollMs = 250;
  static constexpr int64_t kBackoffFirstMs = 50;
  static constexpr int64_t kBackoffMaxMs = 1000;
  static constexpr size_t kCheckBatch = 256;
  static constexpr size_t kChannelsPerCommand = 256;

  RedisSubscriber(const RedisConfig& config, RedisExecutor* exec);
  ~RedisSubscriber();
  RedisSubscriber(const RedisSubscriber&) = delete;
  RedisSubscriber& operator=(const RedisSubscriber&) = delete;

  // Registers a waiter on `channel` (a Redis key, in `slot`). `what` names
  // the wait in messages. DYAD_RC_CANCELLED after Shutdown.
  Result<KvsWaitTicket> Add(const std::string& channel, int slot, Deadline deadline,
                            std::string what, KvsWaitCallback done);
  // Ends a pending waiter with `why` (its callback runs here).
  void Cancel(KvsWaitTicket ticket, const Status& why);
  // Ends every waiter with DYAD_RC_CANCELLED and refuses new ones.
  void Shutdown();

  // Pub/sub links connected now (data links, not the sentinel's).
  size_t links_up() const;

 private:
  enum class State { kNew, kSubscribing, kActive, kUnsubscribing };
  struct Channel {
    std::set<KvsWaitTicket> waiters;
    State state = State::kNew;
    std::string node;  // link it is (being) subscribed on; "" = not routed
    int slot = -1;
  };
  struct Waiter {
    std::string channel;
    std::string what;
    KvsWaitCallback done;
    std::multimap<SteadyClock::time_point, KvsWaitTicket>::iterator deadline;
    bool has_deadline = false;
  };
  struct Link {
    RedisAddress node;
    RedisContext c;
    Status error;  // why it is down
    SteadyClock::time_point retry_at{};
    int64_t backoff = kBackoffFirstMs;
    size_t refs = 0;  // channels whose node is this link
  };
  using Completions = std::vector<std::pair<KvsWaitCallback, Result<std::string>>>;

  // --- waiters (redis_subscriber_waiters.cc) ---
  void CompleteLocked(KvsWaitTicket t, Result<std::string> r, Completions* out) REQUIRES(mu_);
  void CompleteChannelLocked(const std::string& channel, const std::string& value, Completions* out)
      REQUIRES(mu_);
  void FailChannelLocked(const std::string& channel, const Status& why, Completions* out)
      REQUIRES(mu_);
  void ExpireLocked(Completions* out) REQUIRES(mu_);
  int64_t NextTimerMsLocked() const REQUIRES(mu_);
  std::string DownReasonLocked(const Channel& ch) const REQUIRES(mu_);
  void QueueCheckLocked(const std::string& channel) REQUIRES(mu_);
  void CheckerLoop();
  void CheckBatch(const std::vector<std::pair<std::string, int>>& batch,
                  std::vector<std::pair<std::string, std::string>>* found,
                  std::vector<std::string>* retry);
  static void Run(Completions* c);

  // --- links (redis_subscriber.cc) ---
  void StartLocked() REQUIRES(mu_);
  void Wake();
  void SubscriberLoop();
  // Assigns kNew channels a node from the known topology; true when it
  // must be looked up first (unknown or stale), unless `after_lookup`.
  bool RouteLocked(bool after_lookup) REQUIRES(mu_);
  void SetNodeLocked(Channel* ch, const RedisAddress* node) REQUIRES(mu_);
  void RerouteLocked() REQUIRES(mu_);
  // Dials links that are wanted, down, and due (without the lock held).
  void DialDue() REQUIRES(mu_);
  void SyncLocked() REQUIRES(mu_);
  bool SendLocked(Link* link, const char* verb, const std::vector<std::string>& channels)
      REQUIRES(mu_);
  void DropLinkLocked(const std::string& node, const Status& why) REQUIRES(mu_);
  void ReadLinkLocked(const std::string& node, Completions* out) REQUIRES(mu_);
  void HandlePushLocked(const std::string& node, const struct redisReply* r, Completions* out)
      REQUIRES(mu_);
  void HandleLinkErrorLocked(const std::string& node, const std::string& error, Completions* out)
      REQUIRES(mu_);
  void SentinelStep(bool readable) REQUIRES(mu_);
  const char* Verb(bool subscribe) const;

  const RedisConfig config_;
  RedisExecutor* const exec_;
  RedisTopology* const topology_;
  const bool sharded_;  // cluster: SSUBSCRIBE

  mutable Mutex mu_;
  std::condition_variable check_cv_;
  bool shutdown_ GUARDED_BY(mu_) = false;
  bool stop_ GUARDED_BY(mu_) = false;
  KvsWaitTicket next_ticket_ GUARDED_BY(mu_) = 1;
  std::unordered_map<KvsWaitTicket, Waiter> waiters_ GUARDED_BY(mu_);
  std::multimap<SteadyClock::time_point, KvsWaitTicket> deadlines_ GUARDED_BY(mu_);
  std::unordered_map<std::string, Channel> channels_ GUARDED_BY(mu_);
  std::set<std::string> dirty_ GUARDED_BY(mu_);        // channels that may need (un)subscribing
  std::set<std::string> check_ GUARDED_BY(mu_);        // channels to read again
  std::map<std::string, Link> links_ GUARDED_BY(mu_);  // by node
  uint64_t routed_epoch_ GUARDED_BY(mu_) = 0;
  Status topology_error_ GUARDED_BY(mu_);
  bool need_lookup_ GUARDED_BY(mu_) = false;

  // Sentinel mode: the +switch-master link (subscriber thread only).
  RedisContext sentinel_;
  size_t sentinel_next_ = 0;
  SteadyClock::time_point sentinel_retry_at_{};

  int wake_fd_ = -1;  // eventfd: something for the subscriber thread to do
  std::thread subscriber_ GUARDED_BY(mu_);
  std::thread checker_ GUARDED_BY(mu_);
};

}  // namespace dyad
