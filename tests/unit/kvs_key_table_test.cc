// KeyTable (the memory store's namespace, kvs/memory/key_table.h): keys
// spread over hashed shards must still list in key order, with a limit
// selecting the smallest keys, and erase must forget a key everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kvs/memory/key_table.h"

namespace dyad {
namespace {

std::string Key(int i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%s/%05d", i % 2 == 0 ? "even" : "odd", i);
  return buf;
}

// Keys 0..n-1 put in a shuffled order, each valued "v<i>".
KeyTable Shuffled(int n) {
  std::vector<int> order(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) order[static_cast<size_t>(i)] = i;
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  KeyTable t;
  for (int i : order) EXPECT_TRUE(t.Put(Key(i), "v" + std::to_string(i)));
  return t;
}

std::vector<KvsEntry> List(const KeyTable& t, const std::string& prefix, uint32_t limit) {
  std::vector<KvsEntry> out;
  t.Collect(prefix, limit, &out);
  SortByKey(&out);
  return out;
}

TEST(KeyTable, PutFindOverwriteErase) {
  KeyTable t;
  EXPECT_TRUE(t.empty());
  EXPECT_TRUE(t.Put("a", "1"));
  EXPECT_FALSE(t.Put("a", "2"));  // an overwrite is not a new key
  ASSERT_NE(t.Find("a"), nullptr);
  EXPECT_EQ(*t.Find("a"), "2");
  EXPECT_EQ(t.Find("b"), nullptr);
  EXPECT_FALSE(t.Erase("b"));
  EXPECT_TRUE(t.Erase("a"));
  EXPECT_EQ(t.Find("a"), nullptr);
  EXPECT_TRUE(t.empty());
}

TEST(KeyTable, ListsInKeyOrderAcrossShards) {
  const int n = 2000;  // far more keys than shards
  KeyTable t = Shuffled(n);
  std::vector<KvsEntry> all = List(t, "", 0);
  ASSERT_EQ(all.size(), static_cast<size_t>(n));
  EXPECT_TRUE(std::is_sorted(all.begin(), all.end()));
  std::vector<KvsEntry> odd = List(t, "odd/", 0);
  ASSERT_EQ(odd.size(), static_cast<size_t>(n / 2));
  EXPECT_EQ(odd.front(), KvsEntry(Key(1), "v1"));
  EXPECT_EQ(odd.back(), KvsEntry(Key(n - 1), "v" + std::to_string(n - 1)));
}

TEST(KeyTable, LimitSelectsTheSmallestKeys) {
  KeyTable t = Shuffled(1000);
  std::vector<KvsEntry> first = List(t, "even/", 3);
  ASSERT_EQ(first.size(), 3u);
  EXPECT_EQ(first[0].first, Key(0));
  EXPECT_EQ(first[1].first, Key(2));
  EXPECT_EQ(first[2].first, Key(4));
  // A limit above the matches lists them all.
  EXPECT_EQ(List(t, "odd/0000", 100).size(), 5u);  // odd/00001 .. odd/00009
  EXPECT_TRUE(List(t, "none", 5).empty());
}

TEST(KeyTable, ErasedKeysAreNotListed) {
  KeyTable t = Shuffled(100);
  for (int i = 0; i < 100; i += 3) EXPECT_TRUE(t.Erase(Key(i)));
  std::vector<KvsEntry> all = List(t, "", 0);
  EXPECT_EQ(all.size(), 100u - 34u);
  for (const KvsEntry& e : all) EXPECT_NE(std::stoi(e.first.substr(e.first.find('/') + 1)) % 3, 0);
  std::vector<KvsEntry> limited = List(t, "", 2);
  ASSERT_EQ(limited.size(), 2u);
  EXPECT_EQ(limited[0].first, Key(2));  // even/00000 was erased
  EXPECT_EQ(limited[1].first, Key(4));
}

// Issue 25, item 1: a listing answered to another process is measured
// before anything is copied. The whole namespace stops being measured at
// the first entry over the budget; a listing with a prefix or a limit is
// measured in key order; one that needs key order in a namespace too large
// to scan is refused at once.
TEST(KeyTable, CollectUpToMeasuresBeforeItCopies) {
  KeyTable t = Shuffled(1000);  // keys of 10 bytes, values of 2-4
  const size_t entry = 10 + 4 + KeyTable::kEntryOverhead;
  std::vector<KvsEntry> out;
  EXPECT_EQ(t.CollectUpTo("", 0, 100 * entry, &out), KeyTable::Listed::kOverBudget);
  EXPECT_TRUE(out.empty());  // nothing copied
  EXPECT_EQ(t.CollectUpTo("", 0, 1000 * entry, &out), KeyTable::Listed::kOk);
  EXPECT_EQ(out.size(), 1000u);
  out.clear();
  // The three smallest odd keys fit in three entries' budget, four do not.
  EXPECT_EQ(t.CollectUpTo("odd/", 3, 3 * entry, &out), KeyTable::Listed::kOk);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_EQ(out[0].first, Key(1));
  EXPECT_EQ(out[2].first, Key(5));
  out.clear();
  EXPECT_EQ(t.CollectUpTo("odd/", 4, 3 * entry, &out), KeyTable::Listed::kOverBudget);
  EXPECT_TRUE(out.empty());

  KeyTable big;
  for (size_t i = 0; i <= KeyTable::kMaxOrderedScan; ++i) big.Put("k" + std::to_string(i), "v");
  EXPECT_EQ(big.CollectUpTo("k1", 0, ~size_t{0}, &out), KeyTable::Listed::kTooManyToOrder);
  EXPECT_EQ(big.CollectUpTo("", 1, ~size_t{0}, &out), KeyTable::Listed::kTooManyToOrder);
  EXPECT_TRUE(out.empty());
  // Listed whole it is served: measured, copied, unordered.
  EXPECT_EQ(big.CollectUpTo("", 0, ~size_t{0}, &out), KeyTable::Listed::kOk);
  EXPECT_EQ(out.size(), KeyTable::kMaxOrderedScan + 1);
}

}  // namespace
}  // namespace dyad
