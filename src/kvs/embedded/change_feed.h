// change_feed.h: the root's per-namespace change feeds (Kvs::Watch for the
// services that use the embedded store remotely).
//
// The first kKvsWatch for a namespace starts its feed: a watch on the
// root's MemoryKvs that appends every later Put to a bounded ring, each
// with a position. A watching service long-polls "the changes after
// position P" (server-side waits are bounded like kKvsWait's slices); one
// that asks for a position the ring no longer holds, or for a feed of an
// earlier root (the epoch differs), is told to resync (List again). So a
// slow or disconnected watcher costs the root a bounded ring, never an
// unbounded queue.
//
// A poll can also be parked (StartPoll): it then holds no thread, and is
// answered from the thread of the Put that brings a change, from the
// feeds' timer at its deadline, or from CancelPoll/Shutdown. The root
// service parks every peer's poll this way, so watchers (one per namespace
// per service) never occupy its workers.
//
// Threading: thread-safe; Poll is called from many connection threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/cancel.h"
#include "common/time.h"
#include "kvs/memory/memory_kvs.h"
#include "proto/protocol.h"

namespace dyad {

class ChangeFeeds {
 public:
  static constexpr size_t kRingEntries = 16384;
  static constexpr uint32_t kMaxBatch = 1024;
  static constexpr int64_t kCancelPollMs = 250;
  static constexpr size_t kMaxReplyBytes = 4u << 20;

  explicit ChangeFeeds(std::shared_ptr<MemoryKvs> store);
  ~ChangeFeeds();
  ChangeFeeds(const ChangeFeeds&) = delete;
  ChangeFeeds& operator=(const ChangeFeeds&) = delete;

  // Answers one kKvsWatch (see KvsWatchRequest).
  Result<KvsWatchReply> Poll(const KvsWatchRequest& req, Deadline deadline, const CancelFn& cancel);
  using PollCallback = std::function<void(Result<KvsWatchReply>)>;
  using PollTicket = uint64_t;
  // Poll without a thread: returns the answer when there is one now;
  // otherwise parks the poll, sets *ticket and returns nothing, and `done`
  // runs once later (quick, must not block). Shutting down: CANCELLED.
  std::optional<Result<KvsWatchReply>> StartPoll(const KvsWatchRequest& req, Deadline deadline,
                                                 PollCallback done, PollTicket* ticket);
  // Ends a parked poll with DYAD_RC_CANCELLED (`done` runs on this thread),
  // unless it was answered already.
  void CancelPoll(PollTicket ticket);
  // Ends every poll in progress (service shutdown).
  void Shutdown();

 private:
  struct Feed {
    KvsWatchTicket ticket = 0;
    uint64_t head = 0;                                     // position of the newest change
    std::deque<std::pair<std::string, std::string>> ring;  // positions head-size+1 .. head
  };
  struct Parked {
    KvsWatchRequest req;
    SteadyClock::time_point deadline;
    PollCallback done;
  };
  using Answers = std::vector<std::pair<PollCallback, Result<KvsWatchReply>>>;
  Feed& FeedOf(const std::string& ns);  // under mu_
  void Append(const std::string& ns, const KvsChange& c);
  // The reply to `req` if there is one now (or `force`: at its deadline).
  std::optional<KvsWatchReply> AnswerLocked(const KvsWatchRequest& req, Feed& f, bool force);
  void TimerLoop();
  static void Run(Answers* a);

  const std::shared_ptr<MemoryKvs> store_;
  const uint64_t epoch_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::unique_ptr<Feed>> feeds_;  // guarded by mu_
  bool shutdown_ = false;                               // guarded by mu_
  PollTicket next_poll_ = 1;                            // guarded by mu_
  std::map<PollTicket, Parked> parked_;                 // guarded by mu_
  std::condition_variable timer_cv_;
  std::thread timer_;  // started by the first parked poll, under mu_
};

}  // namespace dyad
