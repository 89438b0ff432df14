#include "kvs/embedded/embedded_waits.h"

#include <algorithm>
#include <chrono>

namespace dyad {
namespace {

std::string Describe(const std::string& ns, const std::string& key) {
  return "key '" + key + "' in namespace '" + ns + "'";
}

}  // namespace

Result<KvsWaitTicket> EmbeddedWaits::Start(const std::string& ns, const std::string& key,
                                           Deadline deadline, KvsWaitCallback done) {
  if (!done) return Status(DYAD_RC_BADREQUEST, "wait without a callback");
  MutexLock lk(mu_);
  if (stopping_) {
    return Status(DYAD_RC_CANCELLED,
                  "wait for " + Describe(ns, key) + " cancelled: the store is shutting down");
  }
  if (!helper_.joinable()) helper_ = std::thread(&EmbeddedWaits::Loop, this);
  const KvsWaitTicket t = next_ticket_++;
  Waiter& w = waiters_[t];
  w.slot = SlotKey(ns, key);
  w.done = std::move(done);
  w.deadline = deadline;
  if (!deadline.never()) {
    w.due = deadlines_.emplace(deadline.time_point(), t);
    w.has_deadline = true;
  }
  by_slot_[w.slot].insert(t);
  ++spaces_[ns].waits;
  to_check_.push_back(t);
  cv_.notify_one();
  return t;
}

void EmbeddedWaits::Cancel(KvsWaitTicket ticket) {
  Completions out;
  {
    MutexLock lk(mu_);
    EndLocked(ticket, Status(DYAD_RC_CANCELLED, "wait cancelled"), &out);
  }
  Run(&out);
}

void EmbeddedWaits::Shutdown() {
  Completions out;
  std::vector<KvsWatchTicket> watches;
  std::thread helper;
  {
    MutexLock lk(mu_);
    stopping_ = true;
    while (!waiters_.empty()) {
      const SlotKey slot = waiters_.begin()->second.slot;
      EndLocked(waiters_.begin()->first,
                Status(DYAD_RC_CANCELLED, "wait for " + Describe(slot.first, slot.second) +
                                              " cancelled: the store is shutting down"),
                &out);
    }
    for (const auto& [ns, space] : spaces_)
      if (space.watch != 0) watches.push_back(space.watch);
    spaces_.clear();
    helper = std::move(helper_);  // (a second Shutdown finds none to join)
  }
  cv_.notify_all();
  Run(&out);
  if (helper.joinable()) helper.join();
  for (KvsWatchTicket w : watches) store_->Unwatch(w);
}

size_t EmbeddedWaits::pending() const {
  MutexLock lk(mu_);
  return waiters_.size();
}

void EmbeddedWaits::Run(Completions* c) {
  for (auto& [done, result] : *c) done(std::move(result));
  c->clear();
}

void EmbeddedWaits::EndLocked(KvsWaitTicket t, Result<std::string> r, Completions* out) {
  auto it = waiters_.find(t);
  if (it == waiters_.end()) return;  // ended already (tickets in queues go stale)
  Waiter& w = it->second;
  if (w.has_deadline) deadlines_.erase(w.due);
  auto slot = by_slot_.find(w.slot);
  if (slot != by_slot_.end()) {
    slot->second.erase(t);
    if (slot->second.empty()) by_slot_.erase(slot);
  }
  auto space = spaces_.find(w.slot.first);
  if (space != spaces_.end() && --space->second.waits == 0)
    space->second.idle_since = SteadyClock::now();
  out->emplace_back(std::move(w.done), std::move(r));
  waiters_.erase(it);
}

void EmbeddedWaits::QueueNamespaceLocked(const std::string& ns) {
  for (auto it = by_slot_.lower_bound(SlotKey(ns, std::string()));
       it != by_slot_.end() && it->first.first == ns; ++it) {
    for (KvsWaitTicket t : it->second) to_check_.push_back(t);
  }
}

void EmbeddedWaits::OnChange(const std::string& ns, const KvsChange& change) {
  if (change.lost) return;  // the resync that follows asks again
  Completions out;
  {
    MutexLock lk(mu_);
    if (change.resync) {
      // Changes may have been missed: every wait of the namespace asks again.
      QueueNamespaceLocked(ns);
      cv_.notify_one();
      return;
    }
    auto slot = by_slot_.find(SlotKey(ns, change.key));
    if (slot == by_slot_.end()) return;
    const std::set<KvsWaitTicket> woken = slot->second;
    for (KvsWaitTicket t : woken) EndLocked(t, change.value, &out);
  }
  Run(&out);
}

void EmbeddedWaits::Loop() {
  MutexLock lk(mu_);
  while (!stopping_) {
    Completions out;
    Round(&out);
    if (!out.empty()) {
      lk.Unlock();
      Run(&out);
      lk.Lock();
      continue;
    }
    if (stopping_) break;
    lk.WaitUntil(cv_, NextWakeLocked());
  }
}

void EmbeddedWaits::Round(Completions* out) {
  StartWatches(out);
  if (!stopping_) RunChecks(out);
  if (!stopping_) ExpireAndDropIdle(out);
}

void EmbeddedWaits::StartWatches(Completions* out) {
  std::vector<std::string> unwatched;
  for (const auto& [ns, space] : spaces_)
    if (space.watch == 0 && space.waits > 0) unwatched.push_back(ns);
  for (const std::string& ns : unwatched) {
    // Returns once the feed knows its position (or after its bound; the feed
    // then reports a resync when it does, which re-checks every wait).
    Result<KvsWatchTicket> w = WithoutLock(mu_, [&] {
      return store_->Watch(ns, [this, ns](const KvsChange& change) { OnChange(ns, change); });
    });
    if (stopping_) {
      if (w.ok()) {
        MutexUnlock unlocked(mu_);
        store_->Unwatch(*w);
      }
      return;
    }
    if (w.ok()) {
      spaces_[ns].watch = *w;
      continue;
    }
    // Without a feed nothing would wake these waits: end them now.
    for (auto it = by_slot_.lower_bound(SlotKey(ns, std::string()));
         it != by_slot_.end() && it->first.first == ns;) {
      const std::set<KvsWaitTicket> ended = (it++)->second;
      for (KvsWaitTicket t : ended) EndLocked(t, w.status(), out);
    }
  }
}

void EmbeddedWaits::RunChecks(Completions* out) {
  const auto now = SteadyClock::now();
  while (!retries_.empty() && retries_.begin()->first <= now) {
    to_check_.push_back(retries_.begin()->second);
    retries_.erase(retries_.begin());
  }
  std::deque<KvsWaitTicket> later;  // their namespace's watch is not started yet
  while (!to_check_.empty() && !stopping_) {
    const KvsWaitTicket t = to_check_.front();
    to_check_.pop_front();
    auto it = waiters_.find(t);
    if (it == waiters_.end()) continue;
    const SlotKey slot = it->second.slot;
    auto space = spaces_.find(slot.first);
    if (space == spaces_.end() || space->second.watch == 0) {
      later.push_back(t);
      continue;
    }
    Result<std::optional<std::string>> got =
        WithoutLock(mu_, [&] { return store_->Get(slot.first, slot.second); });
    if (!got.ok()) {
      // The root is unreachable: the feed will report a resync once it is
      // back if it restarted; meanwhile ask again, backing off.
      retries_.emplace(SteadyClock::now() + std::chrono::milliseconds(retry_ms_), t);
      retry_ms_ = std::min(retry_ms_ * 2, kRetryMaxMs);
      continue;
    }
    retry_ms_ = kRetryFirstMs;
    if (got->has_value()) EndLocked(t, std::move(**got), out);
  }
  for (KvsWaitTicket t : later) to_check_.push_back(t);
}

void EmbeddedWaits::ExpireAndDropIdle(Completions* out) {
  const auto now = SteadyClock::now();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const KvsWaitTicket t = deadlines_.begin()->second;
    const SlotKey slot = waiters_.at(t).slot;
    EndLocked(t,
              Status(DYAD_RC_TIMEOUT,
                     Describe(slot.first, slot.second) + " not published before the deadline"),
              out);
  }
  std::vector<std::pair<std::string, KvsWatchTicket>> idle;
  for (auto it = spaces_.begin(); it != spaces_.end();) {
    const Space& s = it->second;
    if (s.waits == 0 && s.watch == 0) {
      it = spaces_.erase(it);
      continue;
    }
    if (s.waits == 0 && now - s.idle_since >= std::chrono::milliseconds(kIdleWatchMs))
      idle.emplace_back(it->first, s.watch);
    ++it;
  }
  for (const auto& [ns, watch] : idle) {
    auto it = spaces_.find(ns);
    if (it == spaces_.end() || it->second.watch != watch) continue;
    it->second.watch = 0;  // a wait arriving meanwhile starts a new watch
    {
      MutexUnlock unlocked(mu_);
      store_->Unwatch(watch);
    }
    it = spaces_.find(ns);
    if (it != spaces_.end() && it->second.waits == 0 && it->second.watch == 0) spaces_.erase(it);
  }
}

SteadyClock::time_point EmbeddedWaits::NextWakeLocked() const {
  const auto now = SteadyClock::now();
  if (!to_check_.empty()) return now;
  for (const auto& [ns, space] : spaces_)
    if (space.waits > 0 && space.watch == 0) return now;
  auto next = now + std::chrono::milliseconds(kIdleWatchMs);
  if (!deadlines_.empty()) next = std::min(next, deadlines_.begin()->first);
  if (!retries_.empty()) next = std::min(next, retries_.begin()->first);
  for (const auto& [ns, space] : spaces_)
    if (space.waits == 0 && space.watch != 0)
      next = std::min(next, space.idle_since + std::chrono::milliseconds(kIdleWatchMs));
  return next;
}

}  // namespace dyad
