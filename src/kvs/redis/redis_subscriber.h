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
  void CompleteLocked(KvsWaitTicket t, Result<std::string> r, Completions* out);
  void CompleteChannelLocked(const std::string& channel, const std::string& value,
                             Completions* out);
  void FailChannelLocked(const std::string& channel, const Status& why, Completions* out);
  void ExpireLocked(Completions* out);
  int64_t NextTimerMsLocked() const;
  std::string DownReasonLocked(const Channel& ch) const;
  void QueueCheckLocked(const std::string& channel);
  void CheckerLoop();
  void CheckBatch(const std::vector<std::pair<std::string, int>>& batch,
                  std::vector<std::pair<std::string, std::string>>* found,
                  std::vector<std::string>* retry);
  static void Run(Completions* c);

  // --- links (redis_subscriber.cc) ---
  void StartLocked();
  void Wake();
  void SubscriberLoop();
  // Assigns kNew channels a node from the known topology; true when it
  // must be looked up first (unknown or stale), unless `after_lookup`.
  bool RouteLocked(bool after_lookup);
  void SetNodeLocked(Channel* ch, const RedisAddress* node);
  void RerouteLocked();
  // Dials links that are wanted, down, and due (without the lock held).
  void DialDue(std::unique_lock<std::mutex>& lk);
  void SyncLocked();
  bool SendLocked(Link* link, const char* verb, const std::vector<std::string>& channels);
  void DropLinkLocked(const std::string& node, const Status& why);
  void ReadLinkLocked(const std::string& node, Completions* out);
  void HandlePushLocked(const std::string& node, const struct redisReply* r, Completions* out);
  void HandleLinkErrorLocked(const std::string& node, const std::string& error, Completions* out);
  void SentinelStep(std::unique_lock<std::mutex>& lk, bool readable);
  const char* Verb(bool subscribe) const;

  const RedisConfig config_;
  RedisExecutor* const exec_;
  RedisTopology* const topology_;
  const bool sharded_;  // cluster: SSUBSCRIBE

  mutable std::mutex mu_;
  std::condition_variable check_cv_;
  bool shutdown_ = false;                                            // guarded by mu_
  bool stop_ = false;                                                // guarded by mu_
  KvsWaitTicket next_ticket_ = 1;                                    // guarded by mu_
  std::unordered_map<KvsWaitTicket, Waiter> waiters_;                // guarded by mu_
  std::multimap<SteadyClock::time_point, KvsWaitTicket> deadlines_;  // guarded by mu_
  std::unordered_map<std::string, Channel> channels_;                // guarded by mu_
  std::set<std::string> dirty_;        // channels that may need (un)subscribing; guarded by mu_
  std::set<std::string> check_;        // channels to read again; guarded by mu_
  std::map<std::string, Link> links_;  // by node; guarded by mu_
  uint64_t routed_epoch_ = 0;          // guarded by mu_
  Status topology_error_;              // guarded by mu_
  bool need_lookup_ = false;           // guarded by mu_

  // Sentinel mode: the +switch-master link (subscriber thread only).
  RedisContext sentinel_;
  size_t sentinel_next_ = 0;
  SteadyClock::time_point sentinel_retry_at_{};

  int wake_fd_ = -1;  // eventfd: something for the subscriber thread to do
  std::thread subscriber_;
  std::thread checker_;
};

}  // namespace dyad
