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
// Threading: thread-safe; Poll is called from many connection threads.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>

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
  Result<KvsWatchReply> Poll(const KvsWatchRequest& req, Deadline deadline,
                             const CancelFn& cancel);
  // Ends every poll in progress (service shutdown).
  void Shutdown();

 private:
  struct Feed {
    KvsWatchTicket ticket = 0;
    uint64_t head = 0;  // position of the newest change
    std::deque<std::pair<std::string, std::string>> ring;  // positions head-size+1 .. head
  };
  Feed& FeedOf(const std::string& ns);  // under mu_
  void Append(const std::string& ns, const KvsChange& c);

  const std::shared_ptr<MemoryKvs> store_;
  const uint64_t epoch_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::unique_ptr<Feed>> feeds_;  // guarded by mu_
  bool shutdown_ = false;                               // guarded by mu_
};

}  // namespace dyad
