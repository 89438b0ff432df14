// embedded_watch.cc: Kvs::Watch of the embedded store's clients (see
// embedded_kvs.h and change_feed.h).
#include <sys/socket.h>

#include <chrono>

#include "common/log.h"
#include "common/thread_annotations.h"
#include "common/wire.h"
#include "kvs/embedded/embedded_kvs.h"

namespace dyad {
namespace {

// How long Watch waits for the feed's first position before returning (the
// feed then delivers a resync once it has one, so nothing is lost).
constexpr int64_t kEstablishMs = 2000;
constexpr int64_t kReplyGraceMs = 2000;

}  // namespace

Result<KvsWatchTicket> EmbeddedKvs::Watch(const std::string& ns, KvsWatchCallback on_change) {
  if (!on_change) return Status(DYAD_RC_BADREQUEST, "watch without a callback");
  if (ns.size() > kMaxFieldBytes)
    return Status(DYAD_RC_BADREQUEST, "namespace exceeds the embedded store's field limit");
  if (stopping_.load()) return Status(DYAD_RC_CANCELLED, "metadata store is shutting down");
  // Added under feed_mu_ so that Unwatch's "anyone left?" sees it.
  MutexLock lk(feed_mu_);
  const KvsWatchTicket ticket = watchers_.Add(ns, std::move(on_change));
  auto it = feeds_.find(ns);
  if (it == feeds_.end()) {
    auto fresh = std::make_unique<Feed>();
    fresh->ns = ns;
    Feed* raw = fresh.get();
    it = feeds_.emplace(ns, std::move(fresh)).first;
    raw->thread = std::thread([this, raw] { FeedLoop(raw); });
  }
  Feed* feed = it->second.get();
  lk.WaitFor(feed_cv_, std::chrono::milliseconds(kEstablishMs),
             [feed] { return feed->established || feed->stop || !feed->refused.ok(); });
  if (!feed->established && !feed->refused.ok()) {
    // The root refused the feed (its limit of watched namespaces): say so
    // rather than watch nothing. The feed stops when nobody else uses it.
    const Status refused = feed->refused;
    lk.Unlock();
    Unwatch(ticket);
    return refused;
  }
  feed->quiet_first = false;
  return ticket;
}

void EmbeddedKvs::Unwatch(KvsWatchTicket ticket) {
  const std::optional<std::string> removed = watchers_.Remove(ticket);
  if (!removed) return;
  const std::string& ns = *removed;
  std::unique_ptr<Feed> feed;
  {
    MutexLock lk(feed_mu_);
    if (watchers_.Watched(ns)) return;
    auto it = feeds_.find(ns);
    if (it == feeds_.end()) return;
    feed = std::move(it->second);
    feeds_.erase(it);
  }
  StopFeed(std::move(feed));
}

void EmbeddedKvs::StopFeed(std::unique_ptr<Feed> feed) {
  {
    MutexLock lk(feed_mu_);
    feed->stop = true;
    if (feed->fd >= 0) ::shutdown(feed->fd, SHUT_RDWR);
  }
  feed_cv_.notify_all();
  if (feed->thread.joinable()) feed->thread.join();
}

void EmbeddedKvs::StopFeeds() {
  std::map<std::string, std::unique_ptr<Feed>> feeds;
  {
    MutexLock lk(feed_mu_);
    feeds.swap(feeds_);
  }
  for (auto& [ns, f] : feeds) StopFeed(std::move(f));
}

void EmbeddedKvs::FeedLoop(Feed* feed) {
  KvsWatchRequest cursor;
  cursor.ns = feed->ns;
  cursor.timeout_ms = kWaitSliceMs;
  int64_t backoff = kBackoffFirstMs;
  for (;;) {
    Result<std::unique_ptr<Channel>> ch = Dial(Deadline::AfterMs(rpc_timeout_ms_));
    {
      MutexLock lk(feed_mu_);
      if (feed->stop) return;
      if (!ch.ok()) {
        DYAD_LOG_DEBUG("watch of namespace '%s': %s", feed->ns.c_str(),
                       ch.status().ToString().c_str());
        lk.WaitFor(feed_cv_, std::chrono::milliseconds(backoff), [feed] { return feed->stop; });
        backoff = std::min(backoff * 2, kBackoffMaxMs);
        continue;
      }
      feed->fd = (*ch)->fd();
    }
    backoff = kBackoffFirstMs;
    while (FeedPoll(feed, **ch, &cursor)) {
    }
    MutexLock lk(feed_mu_);
    feed->fd = -1;
    if (feed->stop) return;
  }
}

// One long poll; false when the link is unusable (or the feed stops).
bool EmbeddedKvs::FeedPoll(Feed* feed, Channel& ch, KvsWatchRequest* cursor) {
  Encoder e;
  cursor->EncodeTo(e);
  std::string body;
  Status st = CallRpc(ch, MsgType::kKvsWatch, e.data(), &body,
                      Deadline::AfterMs(kWaitSliceMs + kReplyGraceMs));
  if (!st.ok()) {
    if (ch.broken() || st.code() == DYAD_RC_CANCELLED) return false;
    DYAD_LOG_WARN("watch of namespace '%s' refused by the root: %s", feed->ns.c_str(),
                  st.ToString().c_str());
    // The link is fine: ask again on it after a back-off, rather than
    // dialling the root again at once.
    feed->refused_backoff_ms = feed->refused_backoff_ms == 0
                                   ? kBackoffFirstMs
                                   : std::min(feed->refused_backoff_ms * 2, kBackoffMaxMs);
    MutexLock lk(feed_mu_);
    feed->refused = st;
    feed_cv_.notify_all();
    lk.WaitFor(feed_cv_, std::chrono::milliseconds(feed->refused_backoff_ms),
               [feed] { return feed->stop; });
    return !feed->stop;
  }
  feed->refused_backoff_ms = 0;
  KvsWatchReply reply;
  Decoder d(body);
  if (!reply.DecodeFrom(d) || !d.done()) {
    DYAD_LOG_WARN("watch of namespace '%s': malformed reply from the root", feed->ns.c_str());
    return false;
  }
  cursor->epoch = reply.epoch;
  cursor->after = reply.last;
  for (const auto& [k, v] : reply.changes) watchers_.Notify(feed->ns, k, v);
  bool resync = reply.resync;
  {
    MutexLock lk(feed_mu_);
    feed->refused = Status::OK();
    if (!feed->established) {
      feed->established = true;
      if (feed->quiet_first) resync = false;  // Watch has not returned: its caller lists next
      feed_cv_.notify_all();
    }
    if (feed->stop) return false;
  }
  if (resync) watchers_.Resync(feed->ns);
  return true;
}

}  // namespace dyad
