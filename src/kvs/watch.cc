// watch.cc: see watch.h.
#include "kvs/watch.h"

#include <set>

namespace dyad {

KvsWatchTicket WatchList::Add(const std::string& ns, KvsWatchCallback cb) {
  auto w = std::make_shared<Watcher>();
  w->ns = ns;
  w->cb = std::move(cb);
  MutexLock lk(mu_);
  const KvsWatchTicket t = next_++;
  by_ns_[ns].emplace(t, w);
  all_.emplace(t, std::move(w));
  count_.store(all_.size(), std::memory_order_release);
  return t;
}

std::optional<std::string> WatchList::Remove(KvsWatchTicket ticket) {
  std::shared_ptr<Watcher> w;
  {
    MutexLock lk(mu_);
    auto it = all_.find(ticket);
    if (it == all_.end()) return std::nullopt;
    w = std::move(it->second);
    all_.erase(it);
    auto space = by_ns_.find(w->ns);
    if (space != by_ns_.end()) {
      space->second.erase(ticket);
      if (space->second.empty()) by_ns_.erase(space);
    }
    count_.store(all_.size(), std::memory_order_release);
  }
  MutexLock run(w->run_mu);  // waits for a callback in progress
  w->active = false;
  return w->ns;
}

bool WatchList::Watched(const std::string& ns) const {
  if (empty()) return false;
  MutexLock lk(mu_);
  return by_ns_.count(ns) != 0;
}

std::vector<std::string> WatchList::Namespaces() const {
  std::set<std::string> names;
  MutexLock lk(mu_);
  for (const auto& [ns, watchers] : by_ns_) names.insert(ns);
  return std::vector<std::string>(names.begin(), names.end());
}

std::vector<std::shared_ptr<WatchList::Watcher>> WatchList::Of(const std::string& ns) const {
  std::vector<std::shared_ptr<Watcher>> out;
  MutexLock lk(mu_);
  const auto space = by_ns_.find(ns);
  if (space != by_ns_.end())
    for (const auto& [t, w] : space->second) out.push_back(w);
  return out;
}

void WatchList::Deliver(const std::vector<std::shared_ptr<Watcher>>& to, const KvsChange& change) {
  for (const auto& w : to) {
    MutexLock run(w->run_mu);
    if (w->active) w->cb(change);
  }
}

void WatchList::Notify(const std::string& ns, const std::string& key, const std::string& value) {
  if (empty()) return;
  const auto to = Of(ns);
  if (to.empty()) return;
  KvsChange c;
  c.key = key;
  c.value = value;
  Deliver(to, c);
}

void WatchList::Resync(const std::string& ns) {
  KvsChange c;
  c.resync = true;
  Deliver(Of(ns), c);
}

void WatchList::Lost(const std::string& ns) {
  KvsChange c;
  c.lost = true;
  Deliver(Of(ns), c);
}

}  // namespace dyad
