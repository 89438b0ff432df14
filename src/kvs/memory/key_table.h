// key_table.h: the entries of one namespace of the memory store (MemoryKvs,
// and so the embedded root's store).
//
// Puts and gets are the store's hot path (every publish and locate of the
// cluster lands on the root), so keys live in hash tables: one lookup
// whatever the namespace holds, where an ordered tree walks ~20 levels of
// cache misses at a million entries. The table is split into kShards by
// the key's hash so that growing it never rehashes more than a shard at a
// time (a rehash runs under the store's lock and would stall every request
// meanwhile). Key order, which only List needs, is made by List itself.
//
// Threading: none; MemoryKvs guards it with its mutex.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvs/kvs.h"

namespace dyad {

class KeyTable {
 public:
  static constexpr size_t kShards = 64;

  // Stores `value` under `key`; true when the key is new.
  bool Put(const std::string& key, const std::string& value);
  // The value of `key`, or null. Valid until the key is put or erased.
  const std::string* Find(const std::string& key) const;
  // True when the key was there.
  bool Erase(const std::string& key);
  bool empty() const { return size_ == 0; }

  // Appends to `out` copies of the entries whose key starts with `prefix`:
  // all of them in no particular order when `limit` is 0 (the caller sorts,
  // after leaving the store's lock), else the `limit` smallest keys, in order.
  void Collect(const std::string& prefix, uint32_t limit, std::vector<KvsEntry>* out) const;

 private:
  using Shard = std::unordered_map<std::string, std::string>;
  Shard& ShardOf(const std::string& key) { return shards_[Index(key)]; }
  const Shard& ShardOf(const std::string& key) const { return shards_[Index(key)]; }
  static size_t Index(const std::string& key);

  std::array<Shard, kShards> shards_;
  size_t size_ = 0;
};

// Sorts listed entries by key (List's order).
void SortByKey(std::vector<KvsEntry>* entries);

}  // namespace dyad
