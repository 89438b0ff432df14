// The embedded root's change feeds (kvs/embedded/change_feed.h): positions,
// long polls that wait for the next put, and a resync for a new watcher, an
// earlier root (epoch) or one that fell behind the bounded ring.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvs/embedded/change_feed.h"
#include "kvs/memory/memory_kvs.h"
#include "util.h"

namespace dyad {
namespace {

// Resident memory of this process now, in bytes.
size_t RssBytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

KvsWatchRequest At(uint64_t epoch, uint64_t after, const std::string& ns = "n") {
  KvsWatchRequest r;
  r.ns = ns;
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
  for (size_t i = 0; i < ChangeFeedLimits{}.ring_entries + 10; ++i)
    ASSERT_TRUE(store->Put("n", "k" + std::to_string(i), "v").ok());
  Result<KvsWatchReply> behind =
      feeds.Poll(At(first->epoch, first->last), Deadline::AfterMs(10), nullptr);
  ASSERT_TRUE(behind.ok());
  EXPECT_TRUE(behind->resync);
  EXPECT_EQ(behind->last, first->last + ChangeFeedLimits{}.ring_entries + 10);
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

// Issue 25, item 5: the root kept a feed for every namespace ever watched
// (100,000 watches of distinct namespaces left +100 MiB). Now a feed nobody
// polls is freed after the idle time, their number is capped and a watch
// beyond the cap is refused with an error naming the limit; a watcher of a
// freed feed resyncs.
TEST(ChangeFeeds, IdleFeedsAreFreedAndCapped) {
  auto store = std::make_shared<MemoryKvs>();
  ChangeFeedLimits limits;
  limits.max_feeds = 8;
  limits.idle_ms = 300;
  ChangeFeeds feeds(store, limits);
  uint64_t epoch_a = 0, last_a = 0;
  for (int i = 0; i < 8; ++i) {
    Result<KvsWatchReply> r =
        feeds.Poll(At(0, 0, "ns" + std::to_string(i)), Deadline::AfterMs(0), nullptr);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (i == 0) {
      epoch_a = r->epoch;
      last_a = r->last;
    }
  }
  EXPECT_EQ(feeds.FeedCount(), 8u);
  Result<KvsWatchReply> over = feeds.Poll(At(0, 0, "one-more"), Deadline::AfterMs(0), nullptr);
  ASSERT_FALSE(over.ok());
  EXPECT_EQ(over.status().code(), DYAD_RC_BADREQUEST);
  EXPECT_NE(over.status().message().find("limit"), std::string::npos) << over.status().ToString();
  EXPECT_NE(over.status().message().find("8 namespaces"), std::string::npos);

  // A feed with a parked poll is in use: it stays while the others go.
  ChangeFeeds::PollTicket t = 0;
  std::mutex mu;
  std::condition_variable cv;
  bool answered = false;
  // Refused while the cap is full; accepted once the idle feeds are freed.
  Result<KvsWatchReply> kept = feeds.Poll(At(0, 0, "kept"), Deadline::AfterMs(0), nullptr);
  const Deadline until = Deadline::AfterMs(5000);
  while (!kept.ok() && !until.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    kept = feeds.Poll(At(0, 0, "kept"), Deadline::AfterMs(0), nullptr);
  }
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  ASSERT_FALSE(feeds
                   .StartPoll(
                       At(kept->epoch, kept->last, "kept"), Deadline::AfterMs(3000),
                       [&](Result<KvsWatchReply>) {
                         std::lock_guard<std::mutex> lk(mu);
                         answered = true;
                         cv.notify_all();
                       },
                       &t)
                   .has_value());
  (void)testutil::Eventually([&] { return feeds.FeedCount() <= 1; }, 5000, 20);
  EXPECT_EQ(feeds.FeedCount(), 1u);  // "kept" only
  // Room again for a new namespace.
  EXPECT_TRUE(feeds.Poll(At(0, 0, "one-more"), Deadline::AfterMs(0), nullptr).ok());
  // The watcher of a freed feed is told to resync, even after as many
  // changes as it had seen: the new feed is another epoch.
  ASSERT_TRUE(store->Put("ns0", "k", "v").ok());
  Result<KvsWatchReply> back =
      feeds.Poll(At(epoch_a, last_a, "ns0"), Deadline::AfterMs(0), nullptr);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->resync);
  feeds.CancelPoll(t);
  std::unique_lock<std::mutex> lk(mu);
  EXPECT_TRUE(cv.wait_for(lk, std::chrono::seconds(5), [&] { return answered; }));
}

// The figure of the issue: 100,000 watches of distinct namespaces. At most
// max_feeds feeds exist, the rest are refused, and memory stays flat.
TEST(ChangeFeeds, HundredThousandWatchedNamespacesHoldBoundedMemory) {
  auto store = std::make_shared<MemoryKvs>();
  ChangeFeeds feeds(store);  // the root's limits
  const size_t before = RssBytes();
  size_t refused = 0;
  for (int i = 0; i < 100000; ++i) {
    Result<KvsWatchReply> r =
        feeds.Poll(At(0, 0, "space-" + std::to_string(i)), Deadline::AfterMs(0), nullptr);
    if (!r.ok()) ++refused;
  }
  const size_t grown = RssBytes() - std::min(RssBytes(), before);
  EXPECT_LE(feeds.FeedCount(), feeds.limits().max_feeds);
  EXPECT_GE(refused, 100000u - feeds.limits().max_feeds);
  EXPECT_LT(grown, size_t{24} << 20) << "resident memory grew by " << (grown >> 20) << " MiB";
}

// A feed's ring holds keys, not values: 64 puts of a 1 MiB value to one key
// hold the store's one copy (they held 64 MiB before), and a poll reads the
// current value, at most kMaxReplyBytes of them per reply.
TEST(ChangeFeeds, RingHoldsKeysAndRepliesReadCurrentValues) {
  auto store = std::make_shared<MemoryKvs>();
  ChangeFeeds feeds(store);
  Result<KvsWatchReply> first = feeds.Poll(At(0, 0), Deadline::AfterMs(0), nullptr);
  ASSERT_TRUE(first.ok());
  const size_t before = RssBytes();
  for (int i = 0; i < 64; ++i)
    ASSERT_TRUE(
        store->Put("n", "big", std::string(1u << 20, static_cast<char>('a' + i % 26))).ok());
  const size_t grown = RssBytes() - std::min(RssBytes(), before);
  EXPECT_LT(grown, size_t{24} << 20) << "resident memory grew by " << (grown >> 20) << " MiB";
  Result<KvsWatchReply> r =
      feeds.Poll(At(first->epoch, first->last), Deadline::AfterMs(100), nullptr);
  ASSERT_TRUE(r.ok());
  ASSERT_FALSE(r->changes.empty());
  EXPECT_LE(r->changes.size(), ChangeFeeds::kMaxReplyBytes / (1u << 20) + 1);
  EXPECT_EQ(r->last, first->last + r->changes.size());
  for (const auto& [k, v] : r->changes) {
    EXPECT_EQ(k, "big");
    EXPECT_EQ(v, std::string(1u << 20, static_cast<char>('a' + 63 % 26)));  // the newest
  }
  // A removed key is skipped, its position still passed.
  ASSERT_TRUE(store->Put("n", "gone", "x").ok());
  ASSERT_TRUE(store->Remove("n", "gone").ok());
  ASSERT_TRUE(store->Put("n", "here", "y").ok());
  Result<KvsWatchReply> all =
      feeds.Poll(At(first->epoch, first->last + 64), Deadline::AfterMs(100), nullptr);
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->changes.size(), 1u);
  EXPECT_EQ(all->changes[0], std::make_pair(std::string("here"), std::string("y")));
  EXPECT_EQ(all->last, first->last + 66);
}

// The ring is bounded in key bytes too: a watcher behind it resyncs.
TEST(ChangeFeeds, RingIsBoundedInKeyBytes) {
  auto store = std::make_shared<MemoryKvs>();
  ChangeFeedLimits limits;
  limits.ring_key_bytes = 1000;
  ChangeFeeds feeds(store, limits);
  Result<KvsWatchReply> first = feeds.Poll(At(0, 0), Deadline::AfterMs(0), nullptr);
  ASSERT_TRUE(first.ok());
  for (int i = 0; i < 20; ++i)
    ASSERT_TRUE(store->Put("n", std::string(100, static_cast<char>('a' + i)), "v").ok());
  Result<KvsWatchReply> behind =
      feeds.Poll(At(first->epoch, first->last), Deadline::AfterMs(0), nullptr);
  ASSERT_TRUE(behind.ok());
  EXPECT_TRUE(behind->resync);
  // The last ten (1000 bytes of keys) are still there.
  Result<KvsWatchReply> recent =
      feeds.Poll(At(first->epoch, first->last + 10), Deadline::AfterMs(0), nullptr);
  ASSERT_TRUE(recent.ok());
  EXPECT_FALSE(recent->resync);
  EXPECT_EQ(recent->changes.size(), 10u);
}

// A put looks at its own namespace's parked polls and watchers only: 20,000
// polls parked on other namespaces cost 10,000 puts nothing (each put
// scanned every parked poll and every watcher: 1,000 puts took 51 s).
TEST(ChangeFeeds, PutLooksOnlyAtItsNamespacesParkedPolls) {
  auto store = std::make_shared<MemoryKvs>();
  ChangeFeedLimits limits;
  limits.max_feeds = 30000;
  ChangeFeeds feeds(store, limits);
  constexpr int kOthers = 20000;
  std::atomic<int> ended{0};
  std::vector<ChangeFeeds::PollTicket> tickets;
  for (int i = 0; i < kOthers; ++i) {
    const std::string ns = "other-" + std::to_string(i);
    Result<KvsWatchReply> first = feeds.Poll(At(0, 0, ns), Deadline::AfterMs(0), nullptr);
    ASSERT_TRUE(first.ok());
    ChangeFeeds::PollTicket t = 0;
    ASSERT_FALSE(feeds
                     .StartPoll(
                         At(first->epoch, first->last, ns), Deadline::AfterMs(60000),
                         [&ended](Result<KvsWatchReply>) { ++ended; }, &t)
                     .has_value());
    tickets.push_back(t);
  }
  Result<KvsWatchReply> first = feeds.Poll(At(0, 0), Deadline::AfterMs(0), nullptr);
  ASSERT_TRUE(first.ok());
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 10000; ++i) ASSERT_TRUE(store->Put("n", "k" + std::to_string(i), "v").ok());
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start)
                      .count();
  EXPECT_LT(ms, 5000) << "10,000 puts took " << ms << " ms";
  EXPECT_EQ(ended.load(), 0);
  for (ChangeFeeds::PollTicket t : tickets) feeds.CancelPoll(t);
  EXPECT_EQ(ended.load(), kOthers);
}

}  // namespace
}  // namespace dyad
