// embedded_watch.cc: Kvs::Watch of the embedded store's clients (see
// embedded_kvs.h and change_feed.h).
//
// Every watched namespace has a Feed: its own link to the root, on which
// one long poll (kKvsWatch) is outstanding at a time, and its position in
// the root's change feed. One thread serves all of them: it dials the
// links that need it, sends each feed's next poll, and waits in one poll(2)
// for any reply, for a wake-up (a new or ended feed) or for the earliest
// timer (a back-off, a reply overdue). So a service following many
// namespaces runs one feed thread, not one per namespace; the thread starts
// with the first feed and ends when none is left.
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

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

int64_t MsUntil(SteadyClock::time_point t, SteadyClock::time_point now) {
  if (t <= now) return 0;
  return std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1;
}

}  // namespace

Result<KvsWatchTicket> EmbeddedKvs::Watch(const std::string& ns, KvsWatchCallback on_change) {
  if (!on_change) return Status(DYAD_RC_BADREQUEST, "watch without a callback");
  if (ns.size() > kMaxFieldBytes)
    return Status(DYAD_RC_BADREQUEST, "namespace exceeds the embedded store's field limit");
  if (stopping_.load()) return Status(DYAD_RC_CANCELLED, "metadata store is shutting down");
  // Added under feed_mu_ so that Unwatch's "anyone left?" sees it.
  MutexLock lk(feed_mu_);
  if (feeds_closed_) return Status(DYAD_RC_CANCELLED, "metadata store is shutting down");
  const KvsWatchTicket ticket = watchers_.Add(ns, std::move(on_change));
  std::shared_ptr<Feed>& slot = feeds_[ns];
  if (!slot) {
    slot = std::make_shared<Feed>();
    slot->ns = ns;
    slot->cursor.ns = ns;
    slot->cursor.timeout_ms = kWaitSliceMs;
    slot->due = SteadyClock::now();
  }
  // A feed whose last watcher left moments ago and that the thread has not
  // dropped yet simply goes on, from its position.
  slot->stop = false;
  const std::shared_ptr<Feed> feed = slot;
  const bool on_feed_thread = feed_running_ && feed_thread_.get_id() == std::this_thread::get_id();
  if (!feed_running_) {
    // The previous thread (if any) found no feed left and has returned, or
    // is about to: it takes feed_mu_ no more.
    if (feed_thread_.joinable()) feed_thread_.join();
    feed_running_ = true;
    feed_thread_ = std::thread([this] { FeedLoop(); });
  }
  WakeFeeds();
  // A callback that watches another namespace runs on the feed thread,
  // which would establish the feed: it does not wait for itself (the feed
  // then reports a resync, as after kEstablishMs).
  if (!on_feed_thread) {
    lk.WaitFor(feed_cv_, std::chrono::milliseconds(kEstablishMs),
               [&feed] { return feed->established || feed->stop || !feed->refused.ok(); });
  }
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
  // Once Remove returns the callback neither runs nor will run.
  const std::optional<std::string> removed = watchers_.Remove(ticket);
  if (!removed) return;
  MutexLock lk(feed_mu_);
  if (watchers_.Watched(*removed)) return;
  auto it = feeds_.find(*removed);
  if (it == feeds_.end()) return;
  // The feed thread closes its link and forgets it (and ends itself when
  // no feed is left); nothing here waits for that.
  it->second->stop = true;
  feed_cv_.notify_all();
  WakeFeeds();
}

void EmbeddedKvs::StopFeeds() {
  std::thread thread;
  {
    MutexLock lk(feed_mu_);
    feeds_closed_ = true;
    for (auto& [ns, f] : feeds_) f->stop = true;
    thread = std::move(feed_thread_);
    feed_cv_.notify_all();
    WakeFeeds();
  }
  if (thread.joinable()) {
    if (thread.get_id() == std::this_thread::get_id()) {
      thread.detach();  // a callback of the feed thread itself shuts down
    } else {
      thread.join();
    }
  }
  std::map<std::string, std::shared_ptr<Feed>> left;  // closed outside the lock
  MutexLock lk(feed_mu_);
  left.swap(feeds_);
}

void EmbeddedKvs::WakeFeeds() {
  if (!feed_wake_.valid()) return;
  const uint64_t one = 1;
  ssize_t n;
  do {
    n = ::write(feed_wake_.get(), &one, sizeof one);
  } while (n < 0 && errno == EINTR);
  // EAGAIN: the counter is saturated, so the thread is woken anyway.
}

void EmbeddedKvs::FeedLoop() {
  std::vector<std::shared_ptr<Feed>> live;
  std::vector<pollfd> fds;
  std::vector<Feed*> polled;  // feed of fds[i + 1]
  for (;;) {
    std::vector<std::shared_ptr<Feed>> ended;  // their links close outside the lock
    {
      MutexLock lk(feed_mu_);
      for (auto it = feeds_.begin(); it != feeds_.end();) {
        if (it->second->stop) {
          ended.push_back(std::move(it->second));
          it = feeds_.erase(it);
        } else {
          ++it;
        }
      }
      live.clear();
      if (feeds_.empty() || feeds_closed_) {
        // Watch starts a new thread for the next feed.
        feed_running_ = false;
        return;
      }
      for (auto& [ns, f] : feeds_) live.push_back(f);
    }
    ended.clear();

    // Dial and send what is due. A dial blocks this thread (bounded by the
    // RPC timeout); the replies of other feeds wait in their sockets.
    for (const std::shared_ptr<Feed>& f : live) {
      if (f->in_flight || SteadyClock::now() < f->due) continue;
      if (!f->ch && !FeedDial(*f)) continue;
      FeedSend(*f);
    }

    // Wait for a reply, a wake-up or the earliest timer.
    fds.clear();
    polled.clear();
    fds.push_back(pollfd{feed_wake_.get(), POLLIN, 0});
    const auto now = SteadyClock::now();
    int64_t timeout_ms = kWaitSliceMs;
    for (const std::shared_ptr<Feed>& f : live) {
      timeout_ms = std::min(timeout_ms, MsUntil(f->due, now));
      if (!f->in_flight) continue;
      fds.push_back(pollfd{f->ch->fd(), POLLIN, 0});
      polled.push_back(f.get());
    }
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(timeout_ms));
    if (n < 0 && errno != EINTR) {
      DYAD_LOG_WARN("watch feeds: poll: %s", std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (n > 0 && fds[0].revents != 0) {
      uint64_t count;
      while (::read(feed_wake_.get(), &count, sizeof count) > 0) {
      }
    }
    for (size_t i = 0; n > 0 && i < polled.size(); ++i) {
      if (fds[i + 1].revents != 0) FeedReceive(*polled[i]);
    }
    // Replies overdue: the root (or the path to it) is gone.
    const auto after = SteadyClock::now();
    for (Feed* f : polled) {
      if (f->in_flight && after >= f->due) {
        DYAD_LOG_DEBUG("watch of namespace '%s': no reply in time", f->ns.c_str());
        FeedLost(*f, after);
      }
    }
  }
}

bool EmbeddedKvs::FeedDial(Feed& f) {
  Result<std::unique_ptr<Channel>> ch = Dial(Deadline::AfterMs(rpc_timeout_ms_));
  if (!ch.ok()) {
    DYAD_LOG_DEBUG("watch of namespace '%s': %s", f.ns.c_str(), ch.status().ToString().c_str());
    f.due = SteadyClock::now() + std::chrono::milliseconds(f.dial_backoff_ms);
    f.dial_backoff_ms = std::min(f.dial_backoff_ms * 2, kBackoffMaxMs);
    return false;
  }
  f.dial_backoff_ms = kBackoffFirstMs;
  f.ch = std::move(*ch);
  return true;
}

void EmbeddedKvs::FeedSend(Feed& f) {
  Encoder e;
  f.cursor.EncodeTo(e);
  Status st = f.ch->SendFrame(static_cast<uint16_t>(MsgType::kKvsWatch), e.data(),
                              Deadline::AfterMs(rpc_timeout_ms_));
  const auto now = SteadyClock::now();
  if (!st.ok()) {
    DYAD_LOG_DEBUG("watch of namespace '%s': %s", f.ns.c_str(), st.ToString().c_str());
    FeedLost(f, now);
    return;
  }
  f.in_flight = true;
  f.frame.Reset();
  f.payload.clear();
  f.due = now + std::chrono::milliseconds(kWaitSliceMs + kReplyGraceMs);
}

void EmbeddedKvs::FeedLost(Feed& f, SteadyClock::time_point now) {
  // Dial again at once; the dial's back-off paces a root that stays away.
  f.ch.reset();
  f.in_flight = false;
  f.due = now;
  // Publications may be missed from now until the feed is back: watchers
  // hear so at once (once per loss), and get a resync when it is back
  // (FeedReceive).
  if (!f.established || f.gap_told) return;
  {
    MutexLock lk(feed_mu_);
    if (f.stop) return;
  }
  f.gap_told = true;
  watchers_.Lost(f.ns);
}

void EmbeddedKvs::FeedReceive(Feed& f) {
  uint16_t type = 0;
  Result<bool> got = f.ch->RecvFrameNow(&f.frame, &type, &f.payload);
  if (!got.ok()) {
    DYAD_LOG_DEBUG("watch of namespace '%s': %s", f.ns.c_str(), got.status().ToString().c_str());
    FeedLost(f, SteadyClock::now());
    return;
  }
  if (!*got) return;  // more to come
  f.in_flight = false;
  f.due = SteadyClock::now();  // the next poll at once
  std::string body;
  Status st = ReplyOfFrame(*f.ch, type, f.payload, &body);
  f.payload.clear();
  if (!st.ok()) {
    if (f.ch->broken() || st.code() == DYAD_RC_CANCELLED) {
      FeedLost(f, SteadyClock::now());
      return;
    }
    DYAD_LOG_WARN("watch of namespace '%s' refused by the root: %s", f.ns.c_str(),
                  st.ToString().c_str());
    // The link is fine: ask again on it after a back-off, rather than
    // dialling the root again at once.
    f.refused_backoff_ms = f.refused_backoff_ms == 0
                               ? kBackoffFirstMs
                               : std::min(f.refused_backoff_ms * 2, kBackoffMaxMs);
    f.due = SteadyClock::now() + std::chrono::milliseconds(f.refused_backoff_ms);
    MutexLock lk(feed_mu_);
    f.refused = st;
    feed_cv_.notify_all();
    return;
  }
  f.refused_backoff_ms = 0;
  KvsWatchReply reply;
  Decoder d(body);
  if (!reply.DecodeFrom(d) || !d.done()) {
    DYAD_LOG_WARN("watch of namespace '%s': malformed reply from the root", f.ns.c_str());
    FeedLost(f, SteadyClock::now());
    return;
  }
  f.cursor.epoch = reply.epoch;
  f.cursor.after = reply.last;
  {
    MutexLock lk(feed_mu_);
    if (f.stop) return;  // nobody watches it any more
  }
  for (const auto& [k, v] : reply.changes) watchers_.Notify(f.ns, k, v);
  bool resync = reply.resync || f.gap_told;  // the gap ends with a resync
  f.gap_told = false;
  {
    MutexLock lk(feed_mu_);
    f.refused = Status::OK();
    if (!f.established) {
      f.established = true;
      if (f.quiet_first) resync = false;  // Watch has not returned: its caller lists next
      feed_cv_.notify_all();
    }
  }
  if (resync) watchers_.Resync(f.ns);
}

}  // namespace dyad
