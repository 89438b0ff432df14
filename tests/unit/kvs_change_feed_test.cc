// The embedded root's change feeds (kvs/embedded/change_feed.h): positions,
// long polls that wait for the next put, and a resync for a new watcher, an
// earlier root (epoch) or one that fell behind the bounded ring.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "kvs/embedded/change_feed.h"
#include "kvs/memory/memory_kvs.h"

namespace dyad {
namespace {

KvsWatchRequest At(uint64_t epoch, uint64_t after) {
  KvsWatchRequest r;
  r.ns = "n";
  r.epoch = epoch;
  r.after = after;
  return r;
}

TEST(ChangeFeeds, NewWatcherResyncsThenFollowsPutsInOrder) {
  auto store = std::make_shared<MemoryKvs>();
  ChangeFeeds feeds(store);
  ASSERT_TRUE(store->Put("n", "old", "x").ok());
  Result<KvsWatchReply> first = feeds.Poll(At(0, 0), Deadline::AfterMs(100), nullptr);
  ASSERT_TRUE(first.ok());
  EXPECT_TRUE(first->resync);  // list what exists; changes from here on
  EXPECT_TRUE(first->changes.empty());
  const uint64_t epoch = first->epoch;
  ASSERT_TRUE(store->Put("n", "a", "1").ok());
  ASSERT_TRUE(store->Put("other", "z", "0").ok());
  ASSERT_TRUE(store->Put("n", "b", "2").ok());
  Result<KvsWatchReply> next = feeds.Poll(At(epoch, first->last), Deadline::AfterMs(100), nullptr);
  ASSERT_TRUE(next.ok());
  EXPECT_FALSE(next->resync);
  ASSERT_EQ(next->changes.size(), 2u);
  EXPECT_EQ(next->changes[0], std::make_pair(std::string("a"), std::string("1")));
  EXPECT_EQ(next->changes[1], std::make_pair(std::string("b"), std::string("2")));
  // Nothing new: the poll waits for the next put (or its bound).
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    (void)store->Put("n", "c", "3");
  });
  Result<KvsWatchReply> waited =
      feeds.Poll(At(epoch, next->last), Deadline::AfterMs(5000), nullptr);
  later.join();
  ASSERT_TRUE(waited.ok());
  ASSERT_EQ(waited->changes.size(), 1u);
  EXPECT_EQ(waited->changes[0].first, "c");
  // Another root's epoch: resync.
  EXPECT_TRUE(feeds.Poll(At(epoch + 1, waited->last), Deadline::AfterMs(10), nullptr)->resync);
}

TEST(ChangeFeeds, WatcherBehindTheRingResyncs) {
  auto store = std::make_shared<MemoryKvs>();
  ChangeFeeds feeds(store);
  Result<KvsWatchReply> first = feeds.Poll(At(0, 0), Deadline::AfterMs(10), nullptr);
  ASSERT_TRUE(first.ok());
  for (size_t i = 0; i < ChangeFeeds::kRingEntries + 10; ++i)
    ASSERT_TRUE(store->Put("n", "k" + std::to_string(i), "v").ok());
  Result<KvsWatchReply> behind =
      feeds.Poll(At(first->epoch, first->last), Deadline::AfterMs(10), nullptr);
  ASSERT_TRUE(behind.ok());
  EXPECT_TRUE(behind->resync);
  EXPECT_EQ(behind->last, first->last + ChangeFeeds::kRingEntries + 10);
  // From the new position it follows again, in bounded batches.
  ASSERT_TRUE(store->Put("n", "after", "v").ok());
  Result<KvsWatchReply> again =
      feeds.Poll(At(behind->epoch, behind->last), Deadline::AfterMs(10), nullptr);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->resync);
  ASSERT_EQ(again->changes.size(), 1u);
  EXPECT_EQ(again->changes[0].first, "after");
}

TEST(ChangeFeeds, CancelAndShutdownEndAPoll) {
  auto store = std::make_shared<MemoryKvs>();
  ChangeFeeds feeds(store);
  Result<KvsWatchReply> first = feeds.Poll(At(0, 0), Deadline::AfterMs(10), nullptr);
  Result<KvsWatchReply> c =
      feeds.Poll(At(first->epoch, first->last), Deadline::AfterMs(5000), [] { return true; });
  EXPECT_EQ(c.status().code(), DYAD_RC_CANCELLED);
  feeds.Shutdown();
  Result<KvsWatchReply> s =
      feeds.Poll(At(first->epoch, first->last), Deadline::AfterMs(5000), nullptr);
  EXPECT_EQ(s.status().code(), DYAD_RC_CANCELLED);
}

// Parked polls (StartPoll): how the root serves its peers' watch polls
// without a thread each. Answered now when there is something to say, else
// by the Put that brings a change, at the deadline with nothing, or with
// CANCELLED by CancelPoll and Shutdown. Each callback runs exactly once.
TEST(ChangeFeeds, ParkedPollsAreAnsweredByPutDeadlineCancelAndShutdown) {
  auto store = std::make_shared<MemoryKvs>();
  ChangeFeeds feeds(store);
  struct Out {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<Result<KvsWatchReply>> got;
    ChangeFeeds::PollCallback Callback() {
      return [this](Result<KvsWatchReply> r) {
        std::lock_guard<std::mutex> lk(mu);
        got.push_back(std::move(r));
        cv.notify_all();
      };
    }
    bool AwaitCount(size_t n) {
      std::unique_lock<std::mutex> lk(mu);
      return cv.wait_for(lk, std::chrono::seconds(10), [&] { return got.size() >= n; });
    }
  };
  ChangeFeeds::PollTicket t = 0;
  Out first;
  auto now = feeds.StartPoll(At(0, 0), Deadline::AfterMs(5000), first.Callback(), &t);
  ASSERT_TRUE(now.has_value());  // a new watcher: resync at once
  ASSERT_TRUE(now->ok());
  EXPECT_TRUE((*now)->resync);
  const uint64_t epoch = (*now)->epoch, pos = (*now)->last;

  Out by_put, by_deadline, by_cancel, by_shutdown;
  ASSERT_FALSE(feeds.StartPoll(At(epoch, pos), Deadline::AfterMs(10000), by_put.Callback(), &t));
  ASSERT_FALSE(feeds.StartPoll(At(epoch, pos), Deadline::AfterMs(200), by_deadline.Callback(), &t));
  ASSERT_TRUE(store->Put("n", "k", "v").ok());
  ASSERT_TRUE(by_put.AwaitCount(1));
  ASSERT_TRUE(by_put.got[0].ok());
  ASSERT_EQ(by_put.got[0]->changes.size(), 1u);
  EXPECT_EQ(by_put.got[0]->changes[0].first, "k");
  EXPECT_EQ(by_put.got[0]->last, pos + 1);
  // Parked before the Put, so the Put answered it too.
  ASSERT_TRUE(by_deadline.AwaitCount(1));
  ASSERT_TRUE(by_deadline.got[0].ok());
  EXPECT_EQ(by_deadline.got[0]->changes.size(), 1u);

  Out quiet;
  ASSERT_FALSE(feeds.StartPoll(At(epoch, pos + 1), Deadline::AfterMs(200), quiet.Callback(), &t));
  ASSERT_TRUE(quiet.AwaitCount(1));  // the deadline: nothing new, same position
  ASSERT_TRUE(quiet.got[0].ok());
  EXPECT_TRUE(quiet.got[0]->changes.empty());
  EXPECT_FALSE(quiet.got[0]->resync);
  EXPECT_EQ(quiet.got[0]->last, pos + 1);

  ASSERT_FALSE(
      feeds.StartPoll(At(epoch, pos + 1), Deadline::AfterMs(10000), by_cancel.Callback(), &t));
  feeds.CancelPoll(t);
  ASSERT_EQ(by_cancel.got.size(), 1u);  // on this thread, before CancelPoll returned
  EXPECT_EQ(by_cancel.got[0].status().code(), DYAD_RC_CANCELLED);
  feeds.CancelPoll(t);  // answered already: nothing happens

  ASSERT_FALSE(
      feeds.StartPoll(At(epoch, pos + 1), Deadline::AfterMs(10000), by_shutdown.Callback(), &t));
  feeds.Shutdown();
  ASSERT_EQ(by_shutdown.got.size(), 1u);
  EXPECT_EQ(by_shutdown.got[0].status().code(), DYAD_RC_CANCELLED);
  Out after;
  auto refused = feeds.StartPoll(At(epoch, pos + 1), Deadline::AfterMs(100), after.Callback(), &t);
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status().code(), DYAD_RC_CANCELLED);
  for (Out* o : {&by_put, &by_deadline, &quiet}) EXPECT_EQ(o->got.size(), 1u);
}

}  // namespace
}  // namespace dyad
