// metadata_cache.h: the node-local level of the hierarchical file locator.
//
// Records this service published or located, by (namespace, key). Bounded:
// when it grows past its capacity the oldest half is dropped (a miss only
// costs a lookup in the global store). Thread-safe.
#pragma once

#include <deque>
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
    return it->second;
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
      if (it->first.compare(0, prefix.size(), prefix) == 0)
        it = map_.erase(it);
      else
        ++it;
    }
  }

  void Erase(const std::string& ns, const std::string& key) {
    std::lock_guard<std::mutex> lk(mu_);
    map_.erase(Join(ns, key));  // its slot in order_ is skipped lazily
  }

  size_t size() const {
    std::lock_guard<std::mutex> lk(mu_);
    return map_.size();
  }

 private:
  bool PutLocked(const std::string& ns, const std::string& key, const FileRecord& rec,
                 bool replace) {
    std::string k = Join(ns, key);
    if (!replace && map_.count(k) != 0) return false;
    auto [it, inserted] = map_.insert_or_assign(k, rec);
    if (inserted) order_.push_back(std::move(k));
    if (map_.size() > capacity_) {
      while (map_.size() > capacity_ / 2 && !order_.empty()) {
        map_.erase(order_.front());
        order_.pop_front();
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
  std::unordered_map<std::string, FileRecord> map_;
  std::deque<std::string> order_;
};

}  // namespace dyad
