// metadata_cache.h: the node-local level of the hierarchical file locator.
//
// Records this service published or located, by (namespace, key). Bounded:
// when it grows past its capacity the oldest half (by first insertion; a
// replaced record keeps its place) is dropped (a miss only costs a lookup
// in the global store). The eviction order holds exactly the keys of the
// map: each record knows its place in it, so Erase and EraseNamespace take
// the key out of the order at once, and a key erased and put again is in it
// once. Thread-safe.
#pragma once

#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "proto/protocol.h"

namespace dyad {

class MetadataCache {
 public:
  explicit MetadataCache(size_t capacity = 1u << 20) : capacity_(capacity) {}

  std::optional<FileRecord> Get(const std::string& ns, const std::string& key) const {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = map_.find(Join(ns, key));
    if (it == map_.end()) return std::nullopt;
    return it->second.rec;
  }

  bool Contains(const std::string& ns, const std::string& key) const {
    std::lock_guard<std::mutex> lk(mu_);
    return map_.count(Join(ns, key)) != 0;
  }

  void Put(const std::string& ns, const std::string& key, const FileRecord& rec) {
    std::lock_guard<std::mutex> lk(mu_);
    PutLocked(ns, key, rec, true);
  }

  // Put unless a record of (ns, key) is there already (which is newer than
  // a listing read before it arrived). True if it was put.
  bool PutIfAbsent(const std::string& ns, const std::string& key, const FileRecord& rec) {
    std::lock_guard<std::mutex> lk(mu_);
    return PutLocked(ns, key, rec, false);
  }

  // Drops every record of `ns` (its feed may have missed changes).
  void EraseNamespace(const std::string& ns) {
    std::lock_guard<std::mutex> lk(mu_);
    const std::string prefix = ns + '\0';
    for (auto it = map_.begin(); it != map_.end();) {
      if (it->first.compare(0, prefix.size(), prefix) == 0) {
        order_.erase(it->second.pos);
        it = map_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void Erase(const std::string& ns, const std::string& key) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = map_.find(Join(ns, key));
    if (it == map_.end()) return;
    order_.erase(it->second.pos);
    map_.erase(it);
  }

  size_t size() const {
    std::lock_guard<std::mutex> lk(mu_);
    return map_.size();
  }

  // Keys in the eviction order: always size() (for tests).
  size_t order_size() const {
    std::lock_guard<std::mutex> lk(mu_);
    return order_.size();
  }

 private:
  // A record and its place in order_.
  struct Entry {
    FileRecord rec;
    std::list<const std::string*>::iterator pos;
  };

  bool PutLocked(const std::string& ns, const std::string& key, const FileRecord& rec,
                 bool replace) {
    auto [it, inserted] = map_.try_emplace(Join(ns, key));
    if (!inserted) {
      if (!replace) return false;
      it->second.rec = rec;  // keeps its place in the order
      return true;
    }
    it->second.rec = rec;
    // The map's nodes do not move, so the order can point at their keys.
    it->second.pos = order_.insert(order_.end(), &it->first);
    if (map_.size() > capacity_) {
      while (map_.size() > capacity_ / 2 && !order_.empty()) {
        auto oldest = map_.find(*order_.front());
        order_.pop_front();
        map_.erase(oldest);
      }
    }
    return true;
  }
  static std::string Join(const std::string& ns, const std::string& key) {
    std::string k;
    k.reserve(ns.size() + 1 + key.size());
    k += ns;
    k += '\0';
    k += key;
    return k;
  }
  size_t capacity_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> map_;
  // The keys of map_, oldest first (pointers to the map's own keys).
  std::list<const std::string*> order_;
};

}  // namespace dyad
