// MetadataCache (service/metadata_cache.h): its eviction order holds each
// cached key exactly once, so it stays as small as the cache under
// put/erase churn, and a key erased and put again takes its new place.
#include <gtest/gtest.h>

#include <string>

#include "service/metadata_cache.h"

namespace dyad {
namespace {

FileRecord Rec(const std::string& path) {
  FileRecord r;
  r.upath = path;
  return r;
}

// Item 2 of the feed brief: erased keys used to stay in the order and every
// re-put pushed its key again, so the order grew without bound while the
// cache stayed small.
TEST(MetadataCacheOrder, StaysBoundedUnderPutEraseChurn) {
  MetadataCache cache(64);
  for (int round = 0; round < 20000; ++round) {
    const std::string key = "k" + std::to_string(round % 10);
    cache.Put("ns", key, Rec(key));
    cache.Put("ns", key, Rec(key + "-again"));  // a replacement keeps one place
    if (round % 3 == 0) cache.Erase("ns", key);
    ASSERT_EQ(cache.order_size(), cache.size()) << "round " << round;
  }
  EXPECT_LE(cache.size(), 10u);
  cache.EraseNamespace("ns");
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_EQ(cache.order_size(), 0u);
}

TEST(MetadataCacheOrder, ChurnOfManyKeysNeverExceedsTheCapacity) {
  MetadataCache cache(100);
  for (int i = 0; i < 50000; ++i) {
    const std::string key = "f" + std::to_string(i);
    ASSERT_TRUE(cache.PutIfAbsent(i % 2 ? "a" : "b", key, Rec(key)));
    if (i % 2) cache.Erase("a", key);
    ASSERT_LE(cache.order_size(), 100u);
    ASSERT_EQ(cache.order_size(), cache.size());
  }
}

// A key erased and put again is as young as its new put: eviction drops the
// records put before it, not it (the stale first place used to evict it).
TEST(MetadataCacheOrder, AKeyPutAgainAfterEraseIsEvictedInItsNewTurn) {
  MetadataCache cache(6);
  cache.Put("ns", "a", Rec("a1"));
  cache.Erase("ns", "a");
  for (const char* k : {"b", "c", "d", "e"}) cache.Put("ns", k, Rec(k));
  cache.Put("ns", "a", Rec("a2"));
  cache.Put("ns", "f", Rec("f"));
  cache.Put("ns", "g", Rec("g"));  // 7 > 6: the oldest go, down to 3
  EXPECT_EQ(cache.size(), 3u);
  EXPECT_EQ(cache.order_size(), 3u);
  for (const char* k : {"a", "f", "g"}) EXPECT_TRUE(cache.Contains("ns", k)) << k;
  for (const char* k : {"b", "c", "d", "e"}) EXPECT_FALSE(cache.Contains("ns", k)) << k;
  ASSERT_TRUE(cache.Get("ns", "a").has_value());
  EXPECT_EQ(cache.Get("ns", "a")->upath, "a2");
}

}  // namespace
}  // namespace dyad
