// key_table.cc: see key_table.h.
#include "kvs/memory/key_table.h"

#include <algorithm>
#include <functional>
#include <limits>

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
  if (!inserted) {
    it->second = value;  // in place: the index's pointer stays valid
    return false;
  }
  order_.emplace(std::string_view(it->first), &it->second);
  ++size_;
  return true;
}

const std::string* KeyTable::Find(const std::string& key) const {
  const Shard& shard = ShardOf(key);
  const auto it = shard.find(key);
  return it == shard.end() ? nullptr : &it->second;
}

bool KeyTable::Erase(const std::string& key) {
  Shard& shard = ShardOf(key);
  const auto it = shard.find(key);
  if (it == shard.end()) return false;
  order_.erase(std::string_view(it->first));  // before the view's key goes
  shard.erase(it);
  --size_;
  return true;
}

size_t KeyTable::Measure(const std::string& prefix, uint32_t limit, size_t max_bytes,
                         bool* all_fit) const {
  *all_fit = true;
  size_t n = 0, bytes = 0;
  for (auto it = order_.lower_bound(prefix); it != order_.end(); ++it) {
    if (it->first.compare(0, prefix.size(), prefix) != 0) break;  // past the prefix
    if (limit != 0 && n == limit) break;
    const size_t size = it->first.size() + it->second->size() + kEntryOverhead;
    if (size > max_bytes - bytes) {
      *all_fit = false;
      break;
    }
    bytes += size;
    ++n;
  }
  return n;
}

void KeyTable::Collect(const std::string& prefix, uint32_t limit,
                       std::vector<KvsEntry>* out) const {
  (void)CollectUpTo(prefix, limit, std::numeric_limits<size_t>::max(), out);
}

bool KeyTable::CollectUpTo(const std::string& prefix, uint32_t limit, size_t max_bytes,
                           std::vector<KvsEntry>* out) const {
  bool all_fit = true;
  const size_t n = Measure(prefix, limit, max_bytes, &all_fit);
  if (!all_fit) return false;
  out->reserve(out->size() + n);
  auto it = order_.lower_bound(prefix);
  for (size_t i = 0; i < n; ++i, ++it) out->emplace_back(std::string(it->first), *it->second);
  return true;
}

void SortByKey(std::vector<KvsEntry>* entries) {
  std::sort(entries->begin(), entries->end(),
            [](const KvsEntry& a, const KvsEntry& b) { return a.first < b.first; });
}

}  // namespace dyad
