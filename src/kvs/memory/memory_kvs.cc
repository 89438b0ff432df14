#include "kvs/memory/memory_kvs.h"
#include "common/thread_annotations.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace dyad {
namespace {

std::string Describe(const std::string& ns, const std::string& key) {
  return "key '" + key + "' in namespace '" + ns + "'";
}

}  // namespace

const std::string* MemoryKvs::FindLocked(const std::string& ns, const std::string& key) const {
  const auto nit = data_.find(ns);
  if (nit == data_.end()) return nullptr;
  return nit->second.Find(key);
}

Status MemoryKvs::Put(const std::string& ns, const std::string& key, const std::string& value) {
  Completions woken;
  {
    MutexLock lk(mu_);
    if (data_[ns].Put(key, value)) ++entries_;
    // A wait registers under this mutex after checking the key: none is
    // missed. Their callbacks run after it is released.
    if (!slots_.empty()) {  // spares building a SlotKey when nobody waits
      const auto slot = slots_.find(SlotKey(ns, key));
      if (slot != slots_.end()) {
        const std::set<KvsWaitTicket> parked = slot->second.async;
        for (KvsWaitTicket t : parked) EndAsyncLocked(t, value, &woken);
      }
    }
  }
  Run(&woken);
  watchers_.Notify(ns, key, value);
  return Status::OK();
}

Result<KvsWatchTicket> MemoryKvs::Watch(const std::string& ns, KvsWatchCallback on_change) {
  if (!on_change) return Status(DYAD_RC_BADREQUEST, "watch without a callback");
  return watchers_.Add(ns, std::move(on_change));
}

void MemoryKvs::Run(Completions* c) {
  for (auto& [done, result] : *c) done(std::move(result));
  c->clear();
}

void MemoryKvs::EndAsyncLocked(KvsWaitTicket t, Result<std::string> r, Completions* out) {
  auto it = async_.find(t);
  if (it == async_.end()) return;
  if (it->second.has_deadline) async_deadlines_.erase(it->second.deadline);
  auto slot = slots_.find(it->second.slot);
  if (slot != slots_.end()) {
    slot->second.async.erase(t);
    if (slot->second.async.empty()) slots_.erase(slot);
  }
  out->emplace_back(std::move(it->second.done), std::move(r));
  async_.erase(it);
}

Result<KvsWaitTicket> MemoryKvs::StartWait(const std::string& ns, const std::string& key,
                                           Deadline deadline, KvsWaitCallback done) {
  MutexLock lk(mu_);
  // A key already there is returned even while the store shuts down (a
  // stopping service may still read); only waiting is refused then.
  const std::string* v = FindLocked(ns, key);
  if (v == nullptr && shutdown_) {
    return Status(DYAD_RC_CANCELLED,
                  "wait for " + Describe(ns, key) + " cancelled: the store is shutting down");
  }
  LoopTimer& timer = TimerLocked();
  const KvsWaitTicket t = next_ticket_++;
  if (v != nullptr) {
    ready_.emplace_back(std::move(done), *v);  // never from inside StartWait
    timer.Arm(SteadyClock::now());
    return t;
  }
  AsyncWaiter& w = async_[t];
  w.slot = SlotKey(ns, key);
  w.done = std::move(done);
  if (!deadline.never()) {
    w.deadline = async_deadlines_.emplace(deadline.time_point(), t);
    w.has_deadline = true;
    timer.Arm(deadline.time_point());  // maybe the earliest deadline now
  }
  slots_[w.slot].async.insert(t);
  return t;
}

void MemoryKvs::CancelWait(KvsWaitTicket ticket) {
  Completions done;
  {
    MutexLock lk(mu_);
    EndAsyncLocked(ticket, Status(DYAD_RC_CANCELLED, "wait cancelled"), &done);
  }
  Run(&done);
}

LoopTimer& MemoryKvs::TimerLocked() {
  if (timer_ == nullptr) timer_ = std::make_unique<LoopTimer>(loop_, [this] { OnTimer(); });
  return *timer_;
}

void MemoryKvs::OnTimer() {
  Completions due;
  {
    MutexLock lk(mu_);
    due.swap(ready_);
    const auto now = SteadyClock::now();
    while (!async_deadlines_.empty() && async_deadlines_.begin()->first <= now) {
      const KvsWaitTicket t = async_deadlines_.begin()->second;
      const SlotKey slot = async_[t].slot;
      EndAsyncLocked(t,
                     Status(DYAD_RC_TIMEOUT, Describe(slot.first, slot.second) +
                                                 " not published before the deadline"),
                     &due);
    }
    if (timer_ != nullptr && !async_deadlines_.empty())
      timer_->Arm(async_deadlines_.begin()->first);
  }
  Run(&due);
}

MemoryKvs::~MemoryKvs() {
  Shutdown();
  std::unique_ptr<LoopTimer> timer;
  {
    MutexLock lk(mu_);
    timer = std::move(timer_);
  }
  timer.reset();     // OnTimer is not running, and never runs again
  Completions left;  // ready but not yet run when the timer ended
  {
    MutexLock lk(mu_);
    left.swap(ready_);
  }
  Run(&left);
}

Result<std::optional<std::string>> MemoryKvs::Get(const std::string& ns, const std::string& key) {
  MutexLock lk(mu_);
  const std::string* v = FindLocked(ns, key);
  if (v == nullptr) return std::optional<std::string>();
  return std::optional<std::string>(*v);
}

Result<KvsValues> MemoryKvs::MultiGet(const std::string& ns, const std::vector<std::string>& keys) {
  KvsValues out;
  out.reserve(keys.size());
  MutexLock lk(mu_);
  for (const std::string& key : keys) {
    const std::string* v = FindLocked(ns, key);
    out.push_back(v == nullptr ? std::nullopt : std::optional<std::string>(*v));
  }
  return out;
}

Status MemoryKvs::Remove(const std::string& ns, const std::string& key) {
  MutexLock lk(mu_);
  const auto nit = data_.find(ns);
  if (nit == data_.end()) return Status::OK();
  if (nit->second.Erase(key)) --entries_;
  if (nit->second.empty()) data_.erase(nit);
  return Status::OK();
}

Result<std::vector<KvsEntry>> MemoryKvs::List(const std::string& ns, const std::string& prefix,
                                              uint32_t limit) {
  std::vector<KvsEntry> out;
  {
    MutexLock lk(mu_);
    const auto nit = data_.find(ns);
    if (nit == data_.end()) return out;
    nit->second.Collect(prefix, limit, &out);
  }
  // Ordering a whole namespace's listing is the costly part: done here,
  // where puts and gets are not waiting for it.
  SortByKey(&out);
  return out;
}

Result<std::vector<KvsEntry>> MemoryKvs::ListUpTo(const std::string& ns, const std::string& prefix,
                                                  uint32_t limit, size_t max_bytes) {
  std::vector<KvsEntry> out;
  {
    MutexLock lk(mu_);
    const auto nit = data_.find(ns);
    if (nit == data_.end()) return out;
    switch (nit->second.CollectUpTo(prefix, limit, max_bytes, &out)) {
      case KeyTable::Listed::kOk:
        break;
      case KeyTable::Listed::kOverBudget:
        return Status(DYAD_RC_BADPACK,
                      "listing of '" + prefix + "*' in namespace '" + ns +
                          "' exceeds the reply limit of " + std::to_string(max_bytes) +
                          " bytes (one message); ask for fewer entries (limit) or a longer prefix");
      case KeyTable::Listed::kTooManyToOrder:
        return Status(DYAD_RC_BADREQUEST,
                      "namespace '" + ns + "' holds " + std::to_string(nit->second.size()) +
                          " keys, more than the " + std::to_string(KeyTable::kMaxOrderedScan) +
                          " a listing with a prefix or a limit may scan; list it whole");
    }
  }
  // Sorted off the lock (a listing with a prefix or limit came in order).
  if (prefix.empty() && limit == 0) SortByKey(&out);
  return out;
}

Result<KvsValues> MemoryKvs::MultiGetUpTo(const std::string& ns,
                                          const std::vector<std::string>& keys, size_t max_bytes) {
  KvsValues out;
  MutexLock lk(mu_);
  const auto nit = data_.find(ns);
  // Measured key by key before its value is copied: a request naming one
  // large value thousands of times copies what one reply carries.
  size_t bytes = 0;
  for (const std::string& key : keys) {
    const std::string* v = nit == data_.end() ? nullptr : nit->second.Find(key);
    const size_t size = v == nullptr ? 0 : v->size();
    if (!out.empty() && size > max_bytes - std::min(bytes, max_bytes)) break;
    bytes += size;
    out.push_back(v == nullptr ? std::nullopt : std::optional<std::string>(*v));
    if (bytes >= max_bytes) break;
  }
  return out;
}

void MemoryKvs::Shutdown() {
  Completions cancelled;
  {
    MutexLock lk(mu_);
    shutdown_ = true;
    std::vector<KvsWaitTicket> parked;
    for (const auto& [t, w] : async_) parked.push_back(t);
    for (KvsWaitTicket t : parked) {
      const SlotKey slot = async_[t].slot;
      EndAsyncLocked(t,
                     Status(DYAD_RC_CANCELLED, "wait for " + Describe(slot.first, slot.second) +
                                                   " cancelled: the store is shutting down"),
                     &cancelled);
    }
  }
  Run(&cancelled);
}

bool MemoryKvs::shut_down() const {
  MutexLock lk(mu_);
  return shutdown_;
}

uint64_t MemoryKvs::EntryCount() const {
  MutexLock lk(mu_);
  return entries_;
}

// "memory": a store private to this process.
Result<std::unique_ptr<Kvs>> OpenKvs_memory(const std::string& url, const KvsOptions& options) {
  (void)url;
  (void)options;
  return std::unique_ptr<Kvs>(std::make_unique<MemoryKvs>());
}

}  // namespace dyad
