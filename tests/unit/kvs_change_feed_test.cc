// The embedded root's change feeds (kvs/embedded/change_feed.h): positions,
// long polls that wait for the next put, and a resync for a new watcher, an
// earlier root (epoch) or one that fell behind the bounded ring.
#include <gtest/gtest.h>

#include <memory>
#include <thread>

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
  Result<KvsWatchReply> waited = feeds.Poll(At(epoch, next->last), Deadline::AfterMs(5000), nullptr);
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
  Result<KvsWatchReply> again = feeds.Poll(At(behind->epoch, behind->last), Deadline::AfterMs(10), nullptr);
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
  Result<KvsWatchReply> s = feeds.Poll(At(first->epoch, first->last), Deadline::AfterMs(5000), nullptr);
  EXPECT_EQ(s.status().code(), DYAD_RC_CANCELLED);
}

}  // namespace
}  // namespace dyad
