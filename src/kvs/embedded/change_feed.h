// change_feed.h: the root's per-namespace change feeds (Kvs::Watch for the
// services that use the embedded store remotely).
//
// The first kKvsWatch for a namespace starts its feed: a watch on the
// root's MemoryKvs that appends the key of every later Put to a bounded
// ring, each with a position. A watching service long-polls "the changes
// after position P" (server-side waits are bounded like kKvsWait's slices);
// one that asks for a position the ring no longer holds, or for a feed it
// did not get its position from (the epoch differs: an earlier root, or a
// feed freed and started again), is told to resync (List again). So a slow
// or disconnected watcher costs the root a bounded ring, never an
// unbounded queue.
//
// What the root holds (issue 25, item 5), whatever its watchers do:
//  * a ring holds keys, not values: a reply reads each key's current value
//    from the store when it is sent (as much as one reply carries), so a
//    watcher is told "this key has this value", the newest, and a removed
//    key is skipped. A ring holds at most ring_entries keys and
//    ring_key_bytes of them; older ones fall off (a watcher behind them
//    resyncs);
//  * a feed nobody polls (none parked, no poll for idle_ms) is
//    freed with its ring and its watch on the store; a later poll starts a
//    new one with a new epoch, so its watcher resyncs;
//  * at most max_feeds feeds exist: a poll that would start one more is
//    refused (DYAD_RC_BADREQUEST, naming the limit) once idle feeds are
//    freed and still none is free.
// So the feeds hold at most max_feeds x (ring_key_bytes + a few KiB).
//
// A poll (StartPoll) is answered at once when there is something to say;
// otherwise it is parked, holding no thread, and answered from the thread
// of the Put that brings a change, from the feeds' timer at its deadline,
// or from CancelPoll/Shutdown. The root service parks every peer's poll
// this way, so watchers (one per namespace per service) never occupy its
// workers. A Put looks at the parked polls of its own namespace only.
//
// Threading: thread-safe.
// Lock order: the feeds' mutex, then the store's (never the reverse).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/cancel.h"
#include "common/runtime.h"
#include "common/thread_annotations.h"
#include "common/time.h"
#include "kvs/memory/memory_kvs.h"
#include "proto/protocol.h"

namespace dyad {

struct ChangeFeedLimits {
  size_t max_feeds = 1024;           // namespaces watched at once
  int64_t idle_ms = 60000;           // a feed nobody polls this long is freed
  size_t ring_entries = 16384;       // keys one feed remembers
  size_t ring_key_bytes = 1u << 20;  // and their bytes
};

class ChangeFeeds {
 public:
  static constexpr uint32_t kMaxBatch = 1024;
  // Value bytes one reply carries (at least one change).
  static constexpr size_t kMaxReplyBytes = 4u << 20;

  // `loop`: where deadlines and sweeps run (the root service's runtime,
  // which must outlive the feeds); none: a loop of the feeds' own, started
  // with the first feed.
  explicit ChangeFeeds(std::shared_ptr<MemoryKvs> store, ChangeFeedLimits limits = {},
                       std::optional<asio::any_io_executor> loop = std::nullopt);
  ~ChangeFeeds();
  ChangeFeeds(const ChangeFeeds&) = delete;
  ChangeFeeds& operator=(const ChangeFeeds&) = delete;

  using PollCallback = std::function<void(Result<KvsWatchReply>)>;
  using PollTicket = uint64_t;
  // Answers one kKvsWatch (see KvsWatchRequest): returns the answer when there is one now (a
  // refusal included); otherwise parks the poll, sets *ticket and returns
  // nothing, and `done` runs once later (quick, must not block). Shutting
  // down: CANCELLED.
  std::optional<Result<KvsWatchReply>> StartPoll(const KvsWatchRequest& req, Deadline deadline,
                                                 PollCallback done, PollTicket* ticket);
  // StartPoll for a blocking caller (AwaitCallback): `cancel` asked every
  // kCancelAskMs.
  Result<KvsWatchReply> Poll(const KvsWatchRequest& req, Deadline deadline, const CancelFn& cancel);
  // Ends a parked poll with DYAD_RC_CANCELLED (`done` runs on this thread),
  // unless it was answered already.
  void CancelPoll(PollTicket ticket);
  // Ends every poll in progress (service shutdown).
  void Shutdown();

  const ChangeFeedLimits& limits() const { return limits_; }
  // Feeds that exist now (for statistics and tests).
  size_t FeedCount() const;

 private:
  struct Feed {
    uint64_t epoch = 0;  // distinct for every feed this root starts
    KvsWatchTicket ticket = 0;
    uint64_t head = 0;             // position of the newest change
    std::deque<std::string> ring;  // keys at positions head-size+1 .. head
    size_t ring_bytes = 0;         // of the keys in `ring`
    std::set<uint64_t> parked;     // tickets of its parked polls
    SteadyClock::time_point used;  // last poll
  };
  struct Parked {
    KvsWatchRequest req;
    std::multimap<SteadyClock::time_point, PollTicket>::iterator deadline;
    PollCallback done;
  };
  using Answers = std::vector<std::pair<PollCallback, Result<KvsWatchReply>>>;
  // The feed of `ns`, started if need be; null (and *refused set) when the
  // feeds are at their limit.
  Feed* FeedOf(const std::string& ns, Status* refused) REQUIRES(mu_);
  void Append(const std::string& ns, uint64_t epoch, const KvsChange& c);
  // The reply to `req` if there is one now (or `force`: at its deadline).
  std::optional<KvsWatchReply> AnswerLocked(const KvsWatchRequest& req, Feed& f, bool force)
      REQUIRES(mu_);
  // Frees the feeds idle for `idle_ms`; their store watches go to retired_.
  void SweepLocked(SteadyClock::time_point now) REQUIRES(mu_);
  void EndParkedLocked(std::map<PollTicket, Parked>::iterator p, Feed* f) REQUIRES(mu_);
  // On the timer's loop: parked polls at their deadline, idle feeds freed,
  // their store watches ended.
  void OnTimer();
  std::chrono::milliseconds SweepEvery() const;
  static void Run(Answers* a);

  const std::shared_ptr<MemoryKvs> store_;
  const ChangeFeedLimits limits_;
  const uint64_t epoch_;
  mutable Mutex mu_;
  std::map<std::string, std::unique_ptr<Feed>> feeds_ GUARDED_BY(mu_);
  uint64_t started_ GUARDED_BY(mu_) = 0;                 // feeds ever started
  std::vector<KvsWatchTicket> retired_ GUARDED_BY(mu_);  // store watches to end off the lock
  bool shutdown_ GUARDED_BY(mu_) = false;
  PollTicket next_poll_ GUARDED_BY(mu_) = 1;
  std::map<PollTicket, Parked> parked_ GUARDED_BY(mu_);
  std::multimap<SteadyClock::time_point, PollTicket> deadlines_ GUARDED_BY(mu_);
  const std::optional<asio::any_io_executor> loop_;
  std::unique_ptr<LoopTimer> timer_ GUARDED_BY(mu_);  // made with the first feed
  SteadyClock::time_point next_sweep_ GUARDED_BY(mu_);
};

}  // namespace dyad
