// change_feed.cc: see change_feed.h.
#include "kvs/embedded/change_feed.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "common/seal.h"

namespace dyad {
namespace {

uint64_t NewEpoch() {
  uint64_t v = 0;
  while (v == 0)
    if (!RandomBytes(&v, sizeof v).ok()) v = WallNs();
  return v;
}

}  // namespace

ChangeFeeds::ChangeFeeds(std::shared_ptr<MemoryKvs> store, ChangeFeedLimits limits,
                         std::optional<asio::any_io_executor> loop)
    : store_(std::move(store)), limits_(limits), epoch_(NewEpoch()), loop_(std::move(loop)) {}

ChangeFeeds::~ChangeFeeds() {
  Shutdown();
  std::unique_ptr<LoopTimer> timer;
  {
    MutexLock lk(mu_);
    timer = std::move(timer_);
  }
  timer.reset();  // OnTimer is not running, and never runs again
  std::vector<KvsWatchTicket> tickets;
  {
    MutexLock lk(mu_);
    for (auto& [ns, f] : feeds_) tickets.push_back(f->ticket);
    tickets.insert(tickets.end(), retired_.begin(), retired_.end());
    retired_.clear();
  }
  for (KvsWatchTicket t : tickets) store_->Unwatch(t);
}

void ChangeFeeds::Shutdown() {
  Answers cancelled;
  {
    MutexLock lk(mu_);
    shutdown_ = true;
    for (auto& [t, p] : parked_)
      cancelled.emplace_back(std::move(p.done),
                             Status(DYAD_RC_CANCELLED, "metadata store is stopping"));
    parked_.clear();
    deadlines_.clear();
    for (auto& [ns, f] : feeds_) f->parked.clear();
  }
  Run(&cancelled);
}

size_t ChangeFeeds::FeedCount() const {
  MutexLock lk(mu_);
  return feeds_.size();
}

void ChangeFeeds::Run(Answers* a) {
  for (auto& [done, r] : *a) done(std::move(r));
  a->clear();
}

ChangeFeeds::Feed* ChangeFeeds::FeedOf(const std::string& ns, Status* refused) {
  auto it = feeds_.find(ns);
  if (it != feeds_.end()) return it->second.get();
  if (feeds_.size() >= limits_.max_feeds) SweepLocked(SteadyClock::now());
  if (feeds_.size() >= limits_.max_feeds) {
    *refused = Status(DYAD_RC_BADREQUEST,
                      "the metadata root already follows changes of " +
                          std::to_string(feeds_.size()) + " namespaces, its limit; watch of '" +
                          ns + "' refused (feeds nobody polls for " +
                          std::to_string(limits_.idle_ms / 1000) + " s are freed: retry later)");
    return nullptr;
  }
  auto feed = std::make_unique<Feed>();
  Feed* f = feed.get();
  // Distinct for every feed of this root, and unlike another root's: a
  // watcher of a feed that was freed and started again resyncs.
  f->epoch = epoch_ + ++started_;
  if (f->epoch == 0) f->epoch = epoch_ + ++started_;
  f->used = SteadyClock::now();
  feeds_.emplace(ns, std::move(feed));
  // The watch calls back on Put threads, which take mu_: registering under
  // mu_ is safe because Watch itself does not call back. The epoch tells
  // this feed's changes from those of an earlier feed of the namespace
  // whose watch is still being retired.
  Result<KvsWatchTicket> t =
      store_->Watch(ns, [this, ns, epoch = f->epoch](const KvsChange& c) { Append(ns, epoch, c); });
  if (t.ok()) f->ticket = *t;
  if (timer_ == nullptr) {
    timer_ = std::make_unique<LoopTimer>(loop_, [this] { OnTimer(); });
    next_sweep_ = SteadyClock::now() + SweepEvery();
  }
  timer_->Arm(next_sweep_);  // a feed is freed once idle
  return f;
}

void ChangeFeeds::SweepLocked(SteadyClock::time_point now) {
  const auto idle = std::chrono::milliseconds(limits_.idle_ms);
  for (auto it = feeds_.begin(); it != feeds_.end();) {
    Feed& f = *it->second;
    if (f.parked.empty() && now - f.used >= idle) {
      // Unwatched by the timer, off the lock: Unwatch waits for a callback
      // in progress, which may be waiting for mu_ (Append).
      if (f.ticket != 0) retired_.push_back(f.ticket);
      it = feeds_.erase(it);
    } else {
      ++it;
    }
  }
  // Unwatched by the timer, off the lock.
  if (!retired_.empty() && timer_ != nullptr) timer_->Arm(SteadyClock::now());
}

void ChangeFeeds::Append(const std::string& ns, uint64_t epoch, const KvsChange& c) {
  if (c.resync || c.lost) return;  // the memory store never loses changes
  Answers answers;
  {
    MutexLock lk(mu_);
    auto it = feeds_.find(ns);
    if (it == feeds_.end() || it->second->epoch != epoch) return;
    Feed& f = *it->second;
    f.ring.push_back(c.key);
    f.ring_bytes += c.key.size();
    ++f.head;
    while (f.ring.size() > limits_.ring_entries ||
           (f.ring_bytes > limits_.ring_key_bytes && f.ring.size() > 1)) {
      f.ring_bytes -= f.ring.front().size();
      f.ring.pop_front();
    }
    // Only this namespace's parked polls (one per watching service).
    for (auto t = f.parked.begin(); t != f.parked.end();) {
      auto p = parked_.find(*t);
      std::optional<KvsWatchReply> r = AnswerLocked(p->second.req, f, false);
      ++t;  // before EndParkedLocked erases it from f.parked
      if (!r) continue;
      answers.emplace_back(std::move(p->second.done), std::move(*r));
      EndParkedLocked(p, &f);
    }
  }
  Run(&answers);
}

void ChangeFeeds::EndParkedLocked(std::map<PollTicket, Parked>::iterator p, Feed* f) {
  deadlines_.erase(p->second.deadline);
  if (f != nullptr) {
    f->parked.erase(p->first);
    f->used = SteadyClock::now();
  }
  parked_.erase(p);
}

std::optional<KvsWatchReply> ChangeFeeds::AnswerLocked(const KvsWatchRequest& req, Feed& f,
                                                       bool force) {
  KvsWatchReply reply;
  reply.epoch = f.epoch;
  if (req.epoch != f.epoch || req.after > f.head || req.after + f.ring.size() < f.head) {
    reply.resync = true;  // a new watcher, another feed, or fell behind the ring
    reply.last = f.head;
    return reply;
  }
  if (f.head == req.after && !force) return std::nullopt;
  const uint32_t cap = req.max_entries == 0 ? kMaxBatch : std::min(req.max_entries, kMaxBatch);
  const size_t first = f.ring.size() - (f.head - req.after);
  const size_t avail = std::min<size_t>(cap, f.ring.size() - first);
  reply.last = req.after;
  if (avail == 0) return reply;
  const std::vector<std::string> keys(f.ring.begin() + static_cast<std::ptrdiff_t>(first),
                                      f.ring.begin() + static_cast<std::ptrdiff_t>(first + avail));
  // The values now, as many as one reply carries (at least one change).
  Result<KvsValues> values = store_->MultiGetUpTo(req.ns, keys, kMaxReplyBytes);
  if (!values.ok() || values->empty()) return reply;  // MemoryKvs never fails this
  for (size_t i = 0; i < values->size(); ++i) {
    std::optional<std::string>& v = (*values)[i];
    if (v) reply.changes.emplace_back(keys[i], std::move(*v));  // removed since: skipped
  }
  reply.last = req.after + values->size();
  return reply;
}

std::optional<Result<KvsWatchReply>> ChangeFeeds::StartPoll(const KvsWatchRequest& req,
                                                            Deadline deadline, PollCallback done,
                                                            PollTicket* ticket) {
  MutexLock lk(mu_);
  if (shutdown_)
    return Result<KvsWatchReply>(Status(DYAD_RC_CANCELLED, "metadata store is stopping"));
  Status refused;
  Feed* f = FeedOf(req.ns, &refused);
  if (f == nullptr) return Result<KvsWatchReply>(refused);
  f->used = SteadyClock::now();
  std::optional<KvsWatchReply> now = AnswerLocked(req, *f, deadline.expired());
  if (now) return Result<KvsWatchReply>(std::move(*now));
  *ticket = next_poll_++;
  Parked& p = parked_[*ticket];
  p.req = req;
  p.done = std::move(done);
  p.deadline = deadlines_.emplace(deadline.time_point(), *ticket);
  f->parked.insert(*ticket);
  if (timer_ != nullptr) timer_->Arm(deadline.time_point());
  return std::nullopt;
}

void ChangeFeeds::CancelPoll(PollTicket ticket) {
  PollCallback done;
  {
    MutexLock lk(mu_);
    auto it = parked_.find(ticket);
    if (it == parked_.end()) return;
    done = std::move(it->second.done);
    auto f = feeds_.find(it->second.req.ns);
    EndParkedLocked(it, f == feeds_.end() ? nullptr : f->second.get());
  }
  done(Status(DYAD_RC_CANCELLED, "watch cancelled"));
}

std::chrono::milliseconds ChangeFeeds::SweepEvery() const {
  return std::chrono::milliseconds(std::clamp<int64_t>(limits_.idle_ms / 4, 10, 1000));
}

// Answers the parked polls whose deadline passed (with no change: the
// watcher polls again), frees idle feeds and ends their store watches.
void ChangeFeeds::OnTimer() {
  Answers due;
  std::vector<KvsWatchTicket> unwatch;
  {
    MutexLock lk(mu_);
    const auto now = SteadyClock::now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      auto p = parked_.find(deadlines_.begin()->second);
      auto f = feeds_.find(p->second.req.ns);  // a feed with parked polls stays
      std::optional<KvsWatchReply> r = AnswerLocked(p->second.req, *f->second, true);
      due.emplace_back(std::move(p->second.done), std::move(*r));
      EndParkedLocked(p, f->second.get());
    }
    if (now >= next_sweep_) {
      SweepLocked(now);
      next_sweep_ = now + SweepEvery();
    }
    unwatch.swap(retired_);
    // Next: the earliest deadline, and the next sweep while a feed exists.
    if (timer_ != nullptr && !shutdown_) {
      if (!feeds_.empty()) timer_->Arm(next_sweep_);
      if (!deadlines_.empty()) timer_->Arm(deadlines_.begin()->first);
    }
  }
  Run(&due);
  for (KvsWatchTicket t : unwatch) store_->Unwatch(t);
}

Result<KvsWatchReply> ChangeFeeds::Poll(const KvsWatchRequest& req, Deadline deadline,
                                        const CancelFn& cancel) {
  PollTicket ticket = 0;
  return AwaitCallback<Result<KvsWatchReply>>(
      [&](PollCallback done) { return StartPoll(req, deadline, std::move(done), &ticket); }, cancel,
      kCancelAskMs, [&] { CancelPoll(ticket); });
}

}  // namespace dyad
