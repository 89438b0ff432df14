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
// A listing answered to another process (CollectUpTo, issue 25) costs at
// most what it returns or a bounded scan: a whole namespace is measured
// over the shards, stopping as soon as the reply's budget is exceeded
// (so it looks at no more entries than fit, plus one) and is sorted by
// the caller off the store's lock; a listing that needs key order (a
// prefix or a limit) scans the namespace, so it is served for namespaces
// of at most kMaxOrderedScan keys and refused beyond. (An ordered index
// kept beside the shards would make it cheap at any size, but cost every
// new key's put about four times its hash insertion.)
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

  // Keys a listing that needs key order may scan.
  static constexpr size_t kMaxOrderedScan = 65536;
  // Bytes an entry adds to an encoded listing besides its key and value
  // (two length prefixes).
  static constexpr size_t kEntryOverhead = 8;
  enum class Listed { kOk, kOverBudget, kTooManyToOrder };
  // As Collect, measured before anything is copied: when the entries'
  // encoded size (key + value + kEntryOverhead each) would exceed
  // `max_bytes`, copies nothing (kOverBudget). A listing with a prefix or
  // a limit of a namespace of more than kMaxOrderedScan keys is refused
  // (kTooManyToOrder) without a scan.
  Listed CollectUpTo(const std::string& prefix, uint32_t limit, size_t max_bytes,
                     std::vector<KvsEntry>* out) const;
  size_t size() const { return size_; }

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
