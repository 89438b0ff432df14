// key_table.h: the entries of one namespace of the memory store (MemoryKvs,
// and so the embedded root's store).
//
// Puts and gets are the store's hot path (every publish and locate of the
// cluster lands on the root), so keys live in hash tables: one lookup
// whatever the namespace holds, where an ordered tree walks ~20 levels of
// cache misses at a million entries. The table is split into kShards by
// the key's hash so that growing it never rehashes more than a shard at a
// time (a rehash runs under the store's lock and would stall every request
// meanwhile).
//
// Key order, which listings need, is kept beside the shards in an ordered
// index of the keys (views of the shards' own keys, so a key is stored
// once). Only a put of a new key and an erase touch it; a get or an
// overwrite does not. It makes a listing cost what it returns: a walk from
// the prefix's first key that stops at the listing's limit or byte budget,
// where a scan of the shards costs the whole namespace whatever the prefix
// (issue 25: a listing of a large namespace held the root's event loop).
//
// Threading: none; MemoryKvs guards it with its mutex.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kvs/kvs.h"

namespace dyad {

class KeyTable {
 public:
  static constexpr size_t kShards = 64;
  // Bytes an entry adds to an encoded listing besides its key and value
  // (two length prefixes).
  static constexpr size_t kEntryOverhead = 8;

  KeyTable() = default;
  // The index holds views of the shards' keys: a copy would point into
  // the original. Moving keeps every node, so the views stay valid.
  KeyTable(const KeyTable&) = delete;
  KeyTable& operator=(const KeyTable&) = delete;
  KeyTable(KeyTable&&) = default;
  KeyTable& operator=(KeyTable&&) = default;

  // Stores `value` under `key`; true when the key is new.
  bool Put(const std::string& key, const std::string& value);
  // The value of `key`, or null. Valid until the key is put or erased.
  const std::string* Find(const std::string& key) const;
  // True when the key was there.
  bool Erase(const std::string& key);
  bool empty() const { return size_ == 0; }

  // Appends to `out` copies of the entries whose key starts with `prefix`,
  // in key order: all of them when `limit` is 0, else the `limit` smallest.
  void Collect(const std::string& prefix, uint32_t limit, std::vector<KvsEntry>* out) const;

  // As Collect, measured before anything is copied: when the entries'
  // encoded size (key + value + kEntryOverhead each) would exceed
  // `max_bytes`, copies nothing and returns false. Walks at most the
  // entries that fit, plus one.
  bool CollectUpTo(const std::string& prefix, uint32_t limit, size_t max_bytes,
                   std::vector<KvsEntry>* out) const;

 private:
  using Shard = std::unordered_map<std::string, std::string>;
  // Key -> its value, both owned by a shard's node (stable addresses).
  using Order = std::map<std::string_view, const std::string*>;
  Shard& ShardOf(const std::string& key) { return shards_[Index(key)]; }
  const Shard& ShardOf(const std::string& key) const { return shards_[Index(key)]; }
  static size_t Index(const std::string& key);
  // Walks the entries of `prefix` in order, at most `limit` (0: all) and
  // while their encoded size stays within `max_bytes`; returns how many
  // fit, and sets *all_fit to false when one more matched but did not fit.
  size_t Measure(const std::string& prefix, uint32_t limit, size_t max_bytes, bool* all_fit) const;

  std::array<Shard, kShards> shards_;
  Order order_;
  size_t size_ = 0;
};

// Sorts listed entries by key (List's order).
void SortByKey(std::vector<KvsEntry>* entries);

}  // namespace dyad
