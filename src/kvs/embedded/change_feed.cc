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

ChangeFeeds::ChangeFeeds(std::shared_ptr<MemoryKvs> store)
    : store_(std::move(store)), epoch_(NewEpoch()) {}

ChangeFeeds::~ChangeFeeds() {
  Shutdown();
  if (timer_.joinable()) timer_.join();
  std::vector<KvsWatchTicket> tickets;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [ns, f] : feeds_) tickets.push_back(f->ticket);
  }
  for (KvsWatchTicket t : tickets) store_->Unwatch(t);
}

void ChangeFeeds::Shutdown() {
  Answers cancelled;
  {
    std::lock_guard<std::mutex> lk(mu_);
    shutdown_ = true;
    for (auto& [t, p] : parked_)
      cancelled.emplace_back(std::move(p.done),
                             Status(DYAD_RC_CANCELLED, "metadata store is stopping"));
    parked_.clear();
    cv_.notify_all();
    timer_cv_.notify_all();
  }
  Run(&cancelled);
}

void ChangeFeeds::Run(Answers* a) {
  for (auto& [done, r] : *a) done(std::move(r));
  a->clear();
}

ChangeFeeds::Feed& ChangeFeeds::FeedOf(const std::string& ns) {
  auto it = feeds_.find(ns);
  if (it != feeds_.end()) return *it->second;
  auto feed = std::make_unique<Feed>();
  Feed& ref = *feed;
  feeds_.emplace(ns, std::move(feed));
  // The watch calls back on Put threads, which take mu_: registering under
  // mu_ is safe because Watch itself does not call back.
  Result<KvsWatchTicket> t = store_->Watch(ns, [this, ns](const KvsChange& c) { Append(ns, c); });
  if (t.ok()) ref.ticket = *t;
  return ref;
}

void ChangeFeeds::Append(const std::string& ns, const KvsChange& c) {
  if (c.resync) return;  // the memory store never loses changes
  Answers answers;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = feeds_.find(ns);
    if (it == feeds_.end()) return;
    Feed& f = *it->second;
    f.ring.emplace_back(c.key, c.value);
    ++f.head;
    if (f.ring.size() > kRingEntries) f.ring.pop_front();
    cv_.notify_all();
    // Parked polls are few (one per watching service and namespace).
    for (auto p = parked_.begin(); p != parked_.end();) {
      if (p->second.req.ns != ns) {
        ++p;
        continue;
      }
      std::optional<KvsWatchReply> r = AnswerLocked(p->second.req, f, false);
      if (!r) {
        ++p;
        continue;
      }
      answers.emplace_back(std::move(p->second.done), std::move(*r));
      p = parked_.erase(p);
    }
  }
  Run(&answers);
}

std::optional<KvsWatchReply> ChangeFeeds::AnswerLocked(const KvsWatchRequest& req, Feed& f,
                                                       bool force) {
  KvsWatchReply reply;
  reply.epoch = epoch_;
  if (req.epoch != epoch_ || req.after > f.head || req.after + f.ring.size() < f.head) {
    reply.resync = true;  // a new watcher, an earlier root, or fell behind the ring
    reply.last = f.head;
    return reply;
  }
  if (f.head == req.after && !force) return std::nullopt;
  const uint32_t cap = req.max_entries == 0 ? kMaxBatch : std::min(req.max_entries, kMaxBatch);
  const size_t first = f.ring.size() - (f.head - req.after);
  const size_t avail = std::min<size_t>(cap, f.ring.size() - first);
  size_t n = 0, bytes = 0;
  // Bounded in bytes as well, so a reply always fits in one frame.
  while (n < avail && (n == 0 || bytes < kMaxReplyBytes)) {
    const auto& change = f.ring[first + n];
    bytes += change.first.size() + change.second.size() + 16;
    reply.changes.push_back(change);
    ++n;
  }
  reply.last = req.after + n;
  return reply;
}

std::optional<Result<KvsWatchReply>> ChangeFeeds::StartPoll(const KvsWatchRequest& req,
                                                            Deadline deadline, PollCallback done,
                                                            PollTicket* ticket) {
  std::lock_guard<std::mutex> lk(mu_);
  if (shutdown_)
    return Result<KvsWatchReply>(Status(DYAD_RC_CANCELLED, "metadata store is stopping"));
  Feed& f = FeedOf(req.ns);
  std::optional<KvsWatchReply> now = AnswerLocked(req, f, deadline.expired());
  if (now) return Result<KvsWatchReply>(std::move(*now));
  if (!timer_.joinable()) timer_ = std::thread(&ChangeFeeds::TimerLoop, this);
  *ticket = next_poll_++;
  parked_.emplace(*ticket, Parked{req, deadline.time_point(), std::move(done)});
  timer_cv_.notify_all();
  return std::nullopt;
}

void ChangeFeeds::CancelPoll(PollTicket ticket) {
  PollCallback done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = parked_.find(ticket);
    if (it == parked_.end()) return;
    done = std::move(it->second.done);
    parked_.erase(it);
  }
  done(Status(DYAD_RC_CANCELLED, "watch cancelled"));
}

// Answers the parked polls whose deadline passed (with no change: the
// watcher polls again). Polls are few, so a scan per round is cheap.
void ChangeFeeds::TimerLoop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!shutdown_) {
    const auto now = SteadyClock::now();
    auto next = now + std::chrono::milliseconds(kCancelPollMs * 4);
    Answers due;
    for (auto p = parked_.begin(); p != parked_.end();) {
      if (p->second.deadline > now) {
        next = std::min(next, p->second.deadline);
        ++p;
        continue;
      }
      std::optional<KvsWatchReply> r = AnswerLocked(p->second.req, FeedOf(p->second.req.ns), true);
      due.emplace_back(std::move(p->second.done), std::move(*r));
      p = parked_.erase(p);
    }
    if (!due.empty()) {
      lk.unlock();
      Run(&due);
      lk.lock();
      continue;
    }
    timer_cv_.wait_until(lk, next);
  }
}

Result<KvsWatchReply> ChangeFeeds::Poll(const KvsWatchRequest& req, Deadline deadline,
                                        const CancelFn& cancel) {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    // FeedOf again each round: the reference must not outlive an unlock.
    std::optional<KvsWatchReply> r = AnswerLocked(req, FeedOf(req.ns), deadline.expired());
    if (r) return std::move(*r);
    if (shutdown_) return Status(DYAD_RC_CANCELLED, "metadata store is stopping");
    cv_.wait_until(lk, deadline.Min(kCancelPollMs).time_point());
    if (cancel) {
      lk.unlock();
      const bool stop = cancel();
      lk.lock();
      if (stop) return Status(DYAD_RC_CANCELLED, "watch cancelled");
    }
  }
}

}  // namespace dyad
