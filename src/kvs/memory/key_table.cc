// key_table.cc: see key_table.h.
#include "kvs/memory/key_table.h"

#include <algorithm>
#include <functional>

namespace dyad {

size_t KeyTable::Index(const std::string& key) {
  // The high bits: the shard's own table buckets by the same hash modulo
  // its (prime) bucket count, so these stay spread within a shard.
  constexpr int kShift = 64 - 6;
  static_assert(kShards == size_t{1} << (64 - kShift), "kShards must match kShift");
  return static_cast<size_t>(static_cast<uint64_t>(std::hash<std::string>{}(key)) >> kShift);
}

bool KeyTable::Put(const std::string& key, const std::string& value) {
  auto [it, inserted] = ShardOf(key).try_emplace(key, value);
  if (inserted) {
    ++size_;
  } else {
    it->second = value;
  }
  return inserted;
}

const std::string* KeyTable::Find(const std::string& key) const {
  const Shard& shard = ShardOf(key);
  const auto it = shard.find(key);
  return it == shard.end() ? nullptr : &it->second;
}

bool KeyTable::Erase(const std::string& key) {
  if (ShardOf(key).erase(key) == 0) return false;
  --size_;
  return true;
}

void KeyTable::Collect(const std::string& prefix, uint32_t limit,
                       std::vector<KvsEntry>* out) const {
  auto matches = [&prefix](const std::string& key) {
    return key.compare(0, prefix.size(), prefix) == 0;
  };
  if (limit == 0) {
    for (const Shard& shard : shards_)
      for (const auto& kv : shard)
        if (matches(kv.first)) out->push_back(kv);
    return;
  }
  // Only the first `limit` keys in order are copied: select them by
  // pointer, so a small listing of a large namespace copies little.
  std::vector<const Shard::value_type*> found;
  for (const Shard& shard : shards_)
    for (const auto& kv : shard)
      if (matches(kv.first)) found.push_back(&kv);
  auto by_key = [](const Shard::value_type* a, const Shard::value_type* b) {
    return a->first < b->first;
  };
  if (found.size() > limit) {
    std::nth_element(found.begin(), found.begin() + limit, found.end(), by_key);
    found.resize(limit);
  }
  std::sort(found.begin(), found.end(), by_key);
  for (const Shard::value_type* kv : found) out->push_back(*kv);
}

KeyTable::Listed KeyTable::CollectUpTo(const std::string& prefix, uint32_t limit, size_t max_bytes,
                                       std::vector<KvsEntry>* out) const {
  auto fits = [&max_bytes](size_t* bytes, const Shard::value_type& kv) {
    const size_t size = kv.first.size() + kv.second.size() + kEntryOverhead;
    if (size > max_bytes - *bytes) return false;
    *bytes += size;
    return true;
  };
  size_t bytes = 0;
  if (prefix.empty() && limit == 0) {
    // Everything, in no order: measured first, stopping once over budget.
    size_t n = 0;
    for (const Shard& shard : shards_) {
      for (const auto& kv : shard) {
        if (!fits(&bytes, kv)) return Listed::kOverBudget;
        ++n;
      }
    }
    out->reserve(out->size() + n);
    for (const Shard& shard : shards_)
      for (const auto& kv : shard) out->push_back(kv);
    return Listed::kOk;
  }
  if (size_ > kMaxOrderedScan) return Listed::kTooManyToOrder;
  // Selected by pointer (at most kMaxOrderedScan of them), measured in
  // order, then copied.
  std::vector<const Shard::value_type*> found;
  for (const Shard& shard : shards_)
    for (const auto& kv : shard)
      if (kv.first.compare(0, prefix.size(), prefix) == 0) found.push_back(&kv);
  auto by_key = [](const Shard::value_type* a, const Shard::value_type* b) {
    return a->first < b->first;
  };
  if (limit != 0 && found.size() > limit) {
    std::nth_element(found.begin(), found.begin() + limit, found.end(), by_key);
    found.resize(limit);
  }
  std::sort(found.begin(), found.end(), by_key);
  for (const Shard::value_type* kv : found)
    if (!fits(&bytes, *kv)) return Listed::kOverBudget;
  out->reserve(out->size() + found.size());
  for (const Shard::value_type* kv : found) out->push_back(*kv);
  return Listed::kOk;
}

void SortByKey(std::vector<KvsEntry>* entries) {
  std::sort(entries->begin(), entries->end(),
            [](const KvsEntry& a, const KvsEntry& b) { return a.first < b.first; });
}

}  // namespace dyad
