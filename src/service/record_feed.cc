#include "service/record_feed.h"

#include <utility>
#include <vector>

#include "common/log.h"
#include "proto/protocol.h"

namespace dyad {

void RecordFeed::Follow(const std::string& ns) {
  if (!kvs_->caps().watch) return;
  {
    MutexLock lk(mu_);
    if (stopping_ || followed_.count(ns) != 0 || followed_.size() >= kMaxNamespaces) return;
    followed_.emplace(ns, 0);
  }
  OnPool(&RecordFeed::Start, ns);
}

void RecordFeed::OnPool(void (RecordFeed::*step)(const std::string&), const std::string& ns) {
  rt_->Spawn([](RecordFeed* self, decltype(step) step, std::string ns) -> Task<void> {
    co_await self->rt_->Offload([self, step, &ns] { (self->*step)(ns); });
  }(this, step, ns));
}

void RecordFeed::Start(const std::string& ns) {
  // Watch first, then list: a publication between the two is seen by both,
  // never by neither (a listed record never replaces a fed one: Seed).
  Result<KvsWatchTicket> t = kvs_->Watch(ns, [this, ns](const KvsChange& c) { OnChange(ns, c); });
  if (!t.ok()) {
    DYAD_LOG_WARN("records of namespace '%s' are read from the store per consume: %s", ns.c_str(),
                  t.status().ToString().c_str());
    return;  // stays in followed_: not tried again on every consume
  }
  bool kept = false;
  {
    MutexLock lk(mu_);
    if (!stopping_) {
      followed_[ns] = *t;
      kept = true;
    }
  }
  if (!kept) {
    kvs_->Unwatch(*t);  // stopped meanwhile
    return;
  }
  // Watched, then listed: every publication reaches the copies from now on.
  if (Seed(ns) && copies_ != nullptr) copies_->Following(ns);
}

bool RecordFeed::Seed(const std::string& ns) {
  Result<std::vector<KvsEntry>> all = kvs_->List(ns, "", kSeedLimit);
  if (!all.ok()) {
    DYAD_LOG_WARN("records of namespace '%s': listing failed (%s); the feed still follows it",
                  ns.c_str(), all.status().ToString().c_str());
    return false;
  }
  uint64_t seeded = 0;
  for (const auto& [key, value] : *all) {
    FileRecord rec;
    if (!FileRecord::Decode(value, &rec)) continue;
    // A record fed meanwhile is as new or newer: it stays, and has
    // superseded the copies of older versions already.
    if (!cache_->PutIfAbsent(ns, key, rec)) continue;
    ++seeded;
    if (copies_ != nullptr) copies_->Supersede(ns, rec);
  }
  if (seeded != 0) stats_->AddNamed("records.seeded", seeded);
  return true;
}

void RecordFeed::Reseed(const std::string& ns) {
  if (!Seed(ns) || copies_ == nullptr) return;
  copies_->GapEnds(ns);
  copies_->Following(ns);
}

void RecordFeed::GapBegins(const std::string& ns) {
  if (copies_ == nullptr) return;
  // The gap counts from now; taking the stamps off the copies costs
  // system calls per copy (tens of thousands of copies: a fraction of a
  // second), which the loop does not wait for.
  NodeCache::Withdrawal w = copies_->GapBegins(ns);
  if (w.empty()) return;
  rt_->Spawn([](Runtime* rt, NodeCache::Withdrawal w) -> Task<void> {
    co_await rt->Offload([&w] { w.Run(); });
  }(rt_, std::move(w)));
}

void RecordFeed::OnChange(const std::string& ns, const KvsChange& c) {
  if (c.lost) {
    // Until the resync: no copy of the namespace is taken as current from
    // its stamp alone.
    GapBegins(ns);
    return;
  }
  if (c.resync) {
    // Changes may have been missed: what this service knows of the
    // namespace is no longer trusted (its records, the stamps of its
    // copies); the store is listed again.
    GapBegins(ns);
    cache_->EraseNamespace(ns);
    {
      MutexLock lk(mu_);
      if (stopping_) return;
    }
    OnPool(&RecordFeed::Reseed, ns);
    return;
  }
  FileRecord rec;
  if (!FileRecord::Decode(c.value, &rec)) return;  // not a file record
  cache_->Put(ns, c.key, rec);
  if (copies_ != nullptr) copies_->Supersede(ns, rec);
  stats_->AddNamed("records.fed");
}

void RecordFeed::Stop() {
  std::vector<KvsWatchTicket> tickets;
  {
    MutexLock lk(mu_);
    stopping_ = true;
    for (const auto& [ns, t] : followed_)
      if (t != 0) tickets.push_back(t);
    followed_.clear();
  }
  for (KvsWatchTicket t : tickets) kvs_->Unwatch(t);
}

}  // namespace dyad
