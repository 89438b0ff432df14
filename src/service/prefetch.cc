// prefetch.cc: see prefetch.h.
#include "service/prefetch.h"

#include <fnmatch.h>

#include <algorithm>
#include <chrono>

#include "common/log.h"

namespace dyad {
namespace {
// Queue entries a worker looks at for one it may start.
constexpr size_t kMaxLook = 1024;
// Pause before listing a namespace again after a listing failed (a store
// node down): the resync stays owed, so nothing published is missed.
constexpr int64_t kRelistPauseMs = 1000;
}  // namespace

bool PrefetchPatternMatches(const std::string& pattern, const std::string& upath) {
  if (pattern.find_first_of("*?[") != std::string::npos)
    return ::fnmatch(pattern.c_str(), upath.c_str(), 0) == 0;
  return upath.compare(0, pattern.size(), pattern) == 0;
}

Prefetcher::Prefetcher(PrefetchConfig config, Runtime* rt, Kvs* kvs, Placement* placement,
                       MetadataCache* cache)
    : cfg_(config), rt_(rt), kvs_(kvs), placement_(placement), cache_(cache) {}

void Prefetcher::PumpLocked() {
  // Up to max_inflight requests at once, each a task on the runtime; none
  // after Stop.
  const uint32_t cap = std::max<uint32_t>(1, cfg_.max_inflight);
  while (!stopping_ && running_ < cap) {
    std::vector<Item> items;
    std::optional<std::string> resync_ns;
    if (!NextLocked(&items, &resync_ns)) return;
    ++running_;
    rt_->Spawn(Work(std::move(items), std::move(resync_ns)));
  }
}

Prefetcher::~Prefetcher() { Stop(); }

void Prefetcher::Stop() {
  if (stopped_.exchange(true)) return;
  std::map<std::string, KvsWatchTicket> watches;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    watches.swap(watches_);
  }
  // Unwatch outside mu_: it waits for a callback in progress, which takes mu_.
  for (const auto& [ns, t] : watches) kvs_->Unwatch(t);
  // The requests in flight end (their waits name the service's stop, fired
  // before this); none starts now.
  std::unique_lock<std::mutex> lk(mu_);
  idle_cv_.wait(lk, [this] { return running_ == 0; });
}

void Prefetcher::SetAdmit(std::function<bool(uint64_t bytes)> admit) {
  std::lock_guard<std::mutex> lk(mu_);
  admit_ = std::move(admit);
}

void Prefetcher::SetOnPublication(
    std::function<void(const std::string& ns, const FileRecord& rec)> on_publication) {
  std::lock_guard<std::mutex> lk(mu_);
  on_publication_ = std::move(on_publication);
}

void Prefetcher::Kick() {
  std::lock_guard<std::mutex> lk(mu_);
  if (deferred_.empty()) return;
  std::map<std::string, Item> deferred;
  deferred.swap(deferred_);
  for (auto& [dest, item] : deferred) EnqueueLocked(std::move(item));
  PumpLocked();
}

Result<uint32_t> Prefetcher::Declare(const PrefetchRequest& req) {
  Declaration d{req.ns, req.pattern, req.cons_path, req.dtl_mode};
  auto same = [&d](const Declaration& o) {
    return o.ns == d.ns && o.pattern == d.pattern && o.cons_root == d.cons_root;
  };
  if (req.cancel) {
    std::lock_guard<std::mutex> lk(mu_);
    const size_t before = decls_.size();
    decls_.erase(std::remove_if(decls_.begin(), decls_.end(), same), decls_.end());
    if (decls_.size() == before)
      return Status(DYAD_RC_NOTFOUND, "no prefetch of '" + req.pattern + "' was declared");
    return 0u;
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stopping_) return Status(DYAD_RC_CANCELLED, "dyad-service is stopping");
    auto it = std::find_if(decls_.begin(), decls_.end(), same);
    if (it != decls_.end()) {
      it->dtl_mode = d.dtl_mode;
    } else if (decls_.size() >= cfg_.max_declarations) {
      return Status(DYAD_RC_BADREQUEST, "too many prefetch declarations on this service (" +
                                            std::to_string(cfg_.max_declarations) +
                                            "); cancel some with 'dyad prefetch --cancel'");
    } else {
      decls_.push_back(d);
    }
  }
  // Watch first, then list: a publication between the two is seen by both
  // (the queue keeps one entry per file), never by neither.
  DYAD_RETURN_IF_ERROR(EnsureWatched(req.ns));
  Result<uint32_t> listed = QueueListed(req.ns, &d);
  if (listed.ok()) return *listed;
  // The declaration stands; the files already there come with a resync
  // (a full listing, retried until it works).
  std::lock_guard<std::mutex> lk(mu_);
  resync_.insert(req.ns);
  PumpLocked();
  return 0u;
}

Status Prefetcher::EnsureWatched(const std::string& ns) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (watches_.count(ns) != 0) return Status::OK();
  }
  Result<KvsWatchTicket> t = kvs_->Watch(ns, [this, ns](const KvsChange& c) { OnChange(ns, c); });
  if (!t.ok()) return t.status().Annotate("prefetch: watch namespace '" + ns + "'");
  std::unique_lock<std::mutex> lk(mu_);
  if (stopping_ || watches_.count(ns) != 0) {
    lk.unlock();
    kvs_->Unwatch(*t);  // lost a race with another declaration (or Stop)
    return Status::OK();
  }
  watches_[ns] = *t;
  return Status::OK();
}

Result<uint32_t> Prefetcher::QueueListed(const std::string& ns, const Declaration* only) {
  Result<std::vector<KvsEntry>> all = kvs_->List(ns, "", 0);
  if (!all.ok()) {
    DYAD_LOG_WARN("prefetch: cannot list namespace '%s' (trying again in %lld ms): %s", ns.c_str(),
                  static_cast<long long>(kRelistPauseMs), all.status().ToString().c_str());
    return all.status();
  }
  uint32_t matched = 0;
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& [key, value] : *all) {
    FileRecord rec;
    if (!FileRecord::Decode(value, &rec)) continue;
    if (only != nullptr) {
      if (!PrefetchPatternMatches(only->pattern, rec.upath)) continue;
      ++matched;
      EnqueueLocked(Item{ns, key, only->cons_root, only->dtl_mode, rec, false});
    } else {
      MatchLocked(ns, key, rec);
    }
  }
  PumpLocked();
  return matched;
}

void Prefetcher::OnChange(const std::string& ns, const KvsChange& change) {
  FileRecord rec;
  if (!change.resync && !FileRecord::Decode(change.value, &rec)) return;  // not a file record
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_) return;
  if (change.resync) {
    resync_.insert(ns);
  } else {
    if (on_publication_) on_publication_(ns, rec);
    // The node's locate cache learns the record now, so a consume that
    // overtakes its prefetch does not ask the store again.
    cache_->Put(ns, change.key, rec);
    MatchLocked(ns, change.key, rec);
  }
  PumpLocked();
}

void Prefetcher::MatchLocked(const std::string& ns, const std::string& key, const FileRecord& rec) {
  for (const Declaration& d : decls_)
    if (d.ns == ns && PrefetchPatternMatches(d.pattern, rec.upath))
      EnqueueLocked(Item{ns, key, d.cons_root, d.dtl_mode, rec, false});
}

void Prefetcher::EnqueueLocked(Item item) {
  if (!ValidateUpath(item.record.upath).ok()) return;  // never place outside the directory
  const std::string dest = item.cons_root + "/" + item.record.upath;
  auto newer = [](const Item& a, const Item& b) {
    return a.record.published_ns >= b.record.published_ns;
  };
  deferred_.erase(dest);  // superseded by this newer entry
  if (active_.count(dest) != 0) {
    auto it = again_.find(dest);
    if (it == again_.end() || newer(item, it->second)) again_[dest] = std::move(item);
    return;
  }
  auto it = pending_.find(dest);
  if (it != pending_.end()) {
    if (newer(item, it->second)) it->second = std::move(item);
    return;
  }
  if (pending_.size() >= cfg_.max_queued) {
    n_dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  pending_.emplace(dest, std::move(item));
  order_.push_back(dest);
  n_queued_.fetch_add(1, std::memory_order_relaxed);
}

bool Prefetcher::NextLocked(std::vector<Item>* out, std::optional<std::string>* resync_ns) {
  if (!resync_.empty()) {
    *resync_ns = *resync_.begin();
    resync_.erase(resync_.begin());
    return true;
  }
  // Entries taken by a batch stay in order_ until they reach its front.
  while (!order_.empty() && pending_.count(order_.front()) == 0) order_.pop_front();
  // A bounded look: with every owner at its limit, a worker woken by a
  // publication must not walk a queue of a million files to learn so.
  size_t looked = 0;
  for (auto it = order_.begin(); it != order_.end() && looked < kMaxLook; ++it, ++looked) {
    auto p = pending_.find(*it);
    if (p == pending_.end()) continue;
    uint32_t& busy = per_peer_[p->second.record.owner_rank];
    uint32_t cap = std::max<uint32_t>(1, cfg_.max_per_peer);
    if (p->second.record.size <= Placement::kBatchInline)
      cap = std::min(cap, std::max<uint32_t>(1, cfg_.max_batches_per_peer));
    if (busy >= cap) continue;
    ++busy;
    out->push_back(std::move(p->second));
    active_.insert(*it);
    pending_.erase(p);
    order_.erase(it);
    GatherLocked(out);
    return true;
  }
  return false;
}

void Prefetcher::GatherLocked(std::vector<Item>* out) {
  auto small = [](const Item& i) { return i.record.size <= Placement::kBatchInline; };
  if (!small(out->front())) return;
  const Item first = out->front();  // a copy: `out` grows below
  // A bounded look along the queue: batches form from runs of one owner's
  // publications, which is what a producer's stream of files looks like.
  const size_t want = std::max<uint32_t>(1, cfg_.max_batch);
  size_t looked = 0;
  for (auto it = order_.begin(); it != order_.end() && out->size() < want && looked < 4 * want;
       ++it, ++looked) {
    auto p = pending_.find(*it);
    if (p == pending_.end()) continue;
    const Item& c = p->second;
    if (c.record.owner_rank != first.record.owner_rank || c.ns != first.ns ||
        c.cons_root != first.cons_root || c.dtl_mode != first.dtl_mode || !small(c))
      continue;
    out->push_back(std::move(p->second));
    active_.insert(*it);
    pending_.erase(p);
  }
}

Task<void> Prefetcher::Work(std::vector<Item> items, std::optional<std::string> resync_ns) {
  std::vector<Item> retries;
  bool relisted = true;
  if (resync_ns) {
    relisted =
        co_await rt_->Offload([this, &resync_ns] { return QueueListed(*resync_ns, nullptr).ok(); });
    // Still owed: this request pauses (bounded), then puts it back.
    if (!relisted) co_await Sleep(Deadline::AfterMs(kRelistPauseMs), &rt_->stopping());
  } else {
    retries = co_await PlaceAll(items);
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (!relisted && watches_.count(*resync_ns) != 0) resync_.insert(*resync_ns);  // still declared
  for (Item& item : items) {
    const std::string dest = item.cons_root + "/" + item.record.upath;
    Item* retry = nullptr;
    for (Item& r : retries)
      if (r.cons_root == item.cons_root && r.record.upath == item.record.upath) retry = &r;
    FinishLocked(dest, retry);
  }
  if (!items.empty()) {
    auto p = per_peer_.find(items.front().record.owner_rank);
    if (p != per_peer_.end() && --p->second == 0) per_peer_.erase(p);
  }
  --running_;
  PumpLocked();
  if (running_ == 0) idle_cv_.notify_all();
}

Task<std::vector<Prefetcher::Item>> Prefetcher::PlaceAll(std::vector<Item>& items) {
  std::function<bool(uint64_t)> admit;
  {
    std::lock_guard<std::mutex> lk(mu_);
    admit = admit_;
  }
  std::vector<PlacementRequest> preqs;
  std::vector<Item*> placed;
  uint64_t admitted = 0;  // a batch is admitted as a whole, never past the budget
  for (Item& item : items) {
    const std::string dest = item.cons_root + "/" + item.record.upath;
    if (placement_->IsCurrentCopy(dest, item.record)) {
      n_present_.fetch_add(1, std::memory_order_relaxed);
    } else if (admit && !admit(admitted + item.record.size)) {
      n_refused_.fetch_add(1, std::memory_order_relaxed);
      std::lock_guard<std::mutex> lk(mu_);
      deferred_.emplace(dest, item);
    } else {
      admitted += item.record.size;
      PlacementRequest preq;
      preq.record = item.record;
      preq.cons_root = item.cons_root;
      preq.dtl_mode = item.dtl_mode;
      preq.ns = item.ns;
      preq.prefetched = true;
      preqs.push_back(std::move(preq));
      placed.push_back(&item);
    }
  }
  std::vector<Item> retries;
  if (preqs.empty()) co_return retries;
  std::vector<Result<ConsumeReply>> results = co_await placement_->PlaceBatch(
      std::move(preqs), Deadline::AfterMs(cfg_.transfer_timeout_ms), &rt_->stopping(), 1);
  for (size_t k = 0; k < placed.size(); ++k) {
    Item& item = *placed[k];
    const Result<ConsumeReply>& r = results[k];
    if (!r.ok()) {
      n_failed_.fetch_add(1, std::memory_order_relaxed);
      DYAD_LOG_DEBUG("prefetch of '%s' failed: %s", item.record.upath.c_str(),
                     r.status().ToString().c_str());
      continue;
    }
    n_done_.fetch_add(1, std::memory_order_relaxed);
    cache_->Put(item.ns, item.key, item.record);
    // Joined an explicit consume's transfer of an older version: fetch
    // the one this entry was queued for (once; a newer publication
    // queues its own entry).
    if (r->joined && !item.retried &&
        !placement_->IsCurrentCopy(item.cons_root + "/" + item.record.upath, item.record)) {
      retries.push_back(item);
      retries.back().retried = true;
    }
  }
  co_return retries;
}

void Prefetcher::FinishLocked(const std::string& dest, Item* retry) {
  active_.erase(dest);
  auto again = again_.find(dest);
  if (again != again_.end()) {
    Item next = std::move(again->second);
    again_.erase(again);
    EnqueueLocked(std::move(next));
  } else if (retry != nullptr) {
    EnqueueLocked(std::move(*retry));
  }
}

void Prefetcher::AddCounters(std::map<std::string, uint64_t>* out) const {
  (*out)["prefetch.queued"] = n_queued_.load(std::memory_order_relaxed);
  (*out)["prefetch.fetched"] = n_done_.load(std::memory_order_relaxed);
  (*out)["prefetch.present"] = n_present_.load(std::memory_order_relaxed);
  (*out)["prefetch.failed"] = n_failed_.load(std::memory_order_relaxed);
  (*out)["prefetch.refused_budget"] = n_refused_.load(std::memory_order_relaxed);
  (*out)["prefetch.dropped"] = n_dropped_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lk(mu_);
  (*out)["prefetch.pending"] = pending_.size();
  (*out)["prefetch.deferred"] = deferred_.size();
  (*out)["prefetch.declarations"] = decls_.size();
}

}  // namespace dyad
