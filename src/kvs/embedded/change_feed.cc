// change_feed.cc: see change_feed.h.
#include "kvs/embedded/change_feed.h"

#include <algorithm>
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
  std::vector<KvsWatchTicket> tickets;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto& [ns, f] : feeds_) tickets.push_back(f->ticket);
  }
  for (KvsWatchTicket t : tickets) store_->Unwatch(t);
}

void ChangeFeeds::Shutdown() {
  std::lock_guard<std::mutex> lk(mu_);
  shutdown_ = true;
  cv_.notify_all();
}

ChangeFeeds::Feed& ChangeFeeds::FeedOf(const std::string& ns) {
  auto it = feeds_.find(ns);
  if (it != feeds_.end()) return *it->second;
  auto feed = std::make_unique<Feed>();
  Feed& ref = *feed;
  feeds_.emplace(ns, std::move(feed));
  // The watch calls back on Put threads, which take mu_: registering under
  // mu_ is safe because Watch itself does not call back.
  Result<KvsWatchTicket> t =
      store_->Watch(ns, [this, ns](const KvsChange& c) { Append(ns, c); });
  if (t.ok()) ref.ticket = *t;
  return ref;
}

void ChangeFeeds::Append(const std::string& ns, const KvsChange& c) {
  if (c.resync) return;  // the memory store never loses changes
  std::lock_guard<std::mutex> lk(mu_);
  auto it = feeds_.find(ns);
  if (it == feeds_.end()) return;
  Feed& f = *it->second;
  f.ring.emplace_back(c.key, c.value);
  ++f.head;
  if (f.ring.size() > kRingEntries) f.ring.pop_front();
  cv_.notify_all();
}

Result<KvsWatchReply> ChangeFeeds::Poll(const KvsWatchRequest& req, Deadline deadline,
                                        const CancelFn& cancel) {
  std::unique_lock<std::mutex> lk(mu_);
  Feed& f = FeedOf(req.ns);
  KvsWatchReply reply;
  reply.epoch = epoch_;
  if (req.epoch != epoch_ || req.after > f.head || req.after + f.ring.size() < f.head) {
    reply.resync = true;  // a new watcher, an earlier root, or fell behind the ring
    reply.last = f.head;
    return reply;
  }
  while (f.head == req.after) {
    if (shutdown_) return Status(DYAD_RC_CANCELLED, "metadata store is stopping");
    if (deadline.expired()) break;
    cv_.wait_until(lk, deadline.Min(kCancelPollMs).time_point());
    if (cancel && f.head == req.after) {
      lk.unlock();
      const bool stop = cancel();
      lk.lock();
      if (stop) return Status(DYAD_RC_CANCELLED, "watch cancelled");
    }
  }
  if (req.after + f.ring.size() < f.head) {  // overtaken while waiting
    reply.resync = true;
    reply.last = f.head;
    return reply;
  }
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

}  // namespace dyad
