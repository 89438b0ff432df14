#include "kvs/embedded/embedded_waits.h"

#include "kvs/embedded/embedded_kvs.h"

#include <algorithm>
#include <chrono>

namespace dyad {
namespace {

// Failures that asking again may cure: those of the connection, or a root
// shutting down (another may take its place).
bool Transient(const Status& st) {
  return EmbeddedKvs::IsConnectionFailure(st) || st.code() == DYAD_RC_CANCELLED ||
         st.code() == DYAD_RC_NOSERVICE;
}

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
  if (!started_) {
    // (The store's feed lock is taken under mu_, never around it.)
    Result<Runtime*> rt = store_->LoopRuntime();
    if (!rt.ok()) return rt.status();
    started_ = true;
    stop_ = std::make_unique<Stop>((*rt)->executor(), &(*rt)->stopping());
    store_->SpawnCounted(*rt, Loop());
  }
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
  Kick();
  return t;
}

void EmbeddedWaits::Kick() {
  if (kick_) kick_->Deliver(true);
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
    if (stop_) stop_->Fire(Status(DYAD_RC_CANCELLED, "the store is shutting down"));
    Kick();
  }
  Run(&out);
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
      Kick();
      return;
    }
    auto slot = by_slot_.find(SlotKey(ns, change.key));
    if (slot == by_slot_.end()) return;
    const std::set<KvsWaitTicket> woken = slot->second;
    for (KvsWaitTicket t : woken) EndLocked(t, change.value, &out);
  }
  Run(&out);
}

Task<void> EmbeddedWaits::Loop() {
  const asio::any_io_executor ex = co_await asio::this_coro::executor;
  for (;;) {
    Completions out;
    {
      MutexLock lk(mu_);
      if (stopping_) break;
      StartWatches(&out);
      CheckEstablished(&out);
    }
    Run(&out);
    co_await RunChecks();
    std::shared_ptr<Rendezvous<bool>> kick;
    Stop* stop = nullptr;
    int64_t sleep_ms = 0;
    {
      MutexLock lk(mu_);
      if (stopping_) break;
      ExpireAndDropIdle(&out);
      if (out.empty() && waiters_.empty() && spaces_.empty() && retries_.empty()) {
        // Nothing left to do: the task ends; the next Start spawns it again.
        started_ = false;
        stop_.reset();
        co_return;
      }
      const auto wake = NextWakeLocked();
      const auto now = SteadyClock::now();
      if (out.empty() && wake > now) {
        kick_ = std::make_shared<Rendezvous<bool>>(ex);
        kick = kick_;
        stop = stop_.get();
        sleep_ms = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count() + 1;
      }
    }
    Run(&out);
    if (!kick) continue;
    // Until the next deadline, retry or idle watch is due, or Kick.
    co_await kick->Take(Deadline::AfterMs(sleep_ms), stop);
    MutexLock lk(mu_);
    kick_.reset();
  }
}

void EmbeddedWaits::StartWatches(Completions* out) {
  std::vector<std::string> unwatched;
  for (const auto& [ns, space] : spaces_)
    if (space.watch == 0 && space.waits > 0) unwatched.push_back(ns);
  for (const std::string& ns : unwatched) {
    // On the feeds' loop Watch returns at once. A feed the root refuses
    // says so (FeedRefused), and CheckEstablished ends its waits then.
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
      Space& space = spaces_[ns];
      space.watch = *w;
      space.established = false;
      continue;
    }
    // Without a feed nothing would wake these waits: end them now.
    EndNamespaceLocked(ns, w.status(), out);
  }
}

void EmbeddedWaits::FeedRefused() {
  MutexLock lk(mu_);
  feeds_changed_ = true;
  Kick();
}

void EmbeddedWaits::CheckEstablished(Completions* out) {
  feeds_changed_ = false;
  std::vector<std::pair<std::string, KvsWatchTicket>> refused;
  for (auto& [ns, space] : spaces_) {
    if (space.watch == 0 || space.established) continue;
    Status why = store_->FeedState(ns, &space.established);
    if (!why.ok()) {
      EndNamespaceLocked(ns, why, out);
      refused.emplace_back(ns, space.watch);
    }
  }
  for (const auto& [ns, watch] : refused) {
    spaces_[ns].watch = 0;
    MutexUnlock unlocked(mu_);
    store_->Unwatch(watch);
  }
}

void EmbeddedWaits::EndNamespaceLocked(const std::string& ns, const Status& why, Completions* out) {
  for (auto it = by_slot_.lower_bound(SlotKey(ns, std::string()));
       it != by_slot_.end() && it->first.first == ns;) {
    const std::set<KvsWaitTicket> ended = (it++)->second;
    for (KvsWaitTicket t : ended) EndLocked(t, why, out);
  }
}

Task<void> EmbeddedWaits::RunChecks() {
  std::deque<KvsWaitTicket> later;  // their namespace's watch is not started yet
  for (;;) {
    KvsWaitTicket t = 0;
    SlotKey slot;
    Stop* stop = nullptr;
    {
      MutexLock lk(mu_);
      const auto now = SteadyClock::now();
      while (!retries_.empty() && retries_.begin()->first <= now) {
        to_check_.push_back(retries_.begin()->second);
        retries_.erase(retries_.begin());
      }
      while (t == 0 && !to_check_.empty() && !stopping_) {
        const KvsWaitTicket next = to_check_.front();
        to_check_.pop_front();
        auto it = waiters_.find(next);
        if (it == waiters_.end()) continue;
        auto space = spaces_.find(it->second.slot.first);
        if (space == spaces_.end() || space->second.watch == 0) {
          later.push_back(next);
          continue;
        }
        t = next;
        slot = it->second.slot;
      }
      if (t == 0) {
        for (KvsWaitTicket l : later) to_check_.push_back(l);
        co_return;
      }
      stop = stop_.get();
    }
    Result<std::optional<std::string>> got = co_await store_->GetOn(stop, slot.first, slot.second);
    Completions out;
    {
      MutexLock lk(mu_);
      if (stopping_) co_return;
      if (!got.ok() && !Transient(got.status())) {
        // Final (a refused credential, a malformed answer): said at once.
        EndLocked(t, got.status(), &out);
      } else if (!got.ok()) {
        // The root is unreachable: the feed will report a resync once it
        // is back if it restarted; meanwhile ask again, backing off. A
        // deadline that passes meanwhile says why it may have.
        unreachable_ = got.status();
        retries_.emplace(SteadyClock::now() + std::chrono::milliseconds(retry_ms_), t);
        retry_ms_ = std::min(retry_ms_ * 2, kRetryMaxMs);
      } else {
        unreachable_ = Status::OK();
        retry_ms_ = kRetryFirstMs;
        if (got->has_value()) EndLocked(t, std::move(**got), &out);
      }
    }
    Run(&out);
  }
}

void EmbeddedWaits::ExpireAndDropIdle(Completions* out) {
  const auto now = SteadyClock::now();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const KvsWaitTicket t = deadlines_.begin()->second;
    const SlotKey slot = waiters_.at(t).slot;
    Status late(DYAD_RC_TIMEOUT,
                Describe(slot.first, slot.second) + " not published before the deadline");
    if (!unreachable_.ok())
      late = Status(DYAD_RC_TIMEOUT, late.message() + " (embedded store at " + store_->address() +
                                         " unreachable: " + unreachable_.message() + ")")
                 .WithCause(DYAD_RC_CONNLOST);
    EndLocked(t, std::move(late), out);
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
  if (!to_check_.empty() || feeds_changed_) return now;
  auto next = now + std::chrono::milliseconds(kIdleWatchMs);
  for (const auto& [ns, space] : spaces_) {
    if (space.waits > 0 && space.watch == 0) return now;  // a watch to start
    if (space.waits == 0 && space.watch != 0)             // an idle watch to drop
      next = std::min(next, space.idle_since + std::chrono::milliseconds(kIdleWatchMs));
  }
  if (!deadlines_.empty()) next = std::min(next, deadlines_.begin()->first);
  if (!retries_.empty()) next = std::min(next, retries_.begin()->first);
  return next;
}

}  // namespace dyad
