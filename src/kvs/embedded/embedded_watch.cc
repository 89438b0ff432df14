// embedded_watch.cc: Kvs::Watch of the embedded store's clients (see
// embedded_kvs.h and change_feed.h).
//
// Every watched namespace has a Feed: a task that dials its own link to
// the root and long-polls the root's change feed (kKvsWatch) from its
// position there, one poll at a time, with the store's one request path
// (DialTask, EmbeddedExchange). The feeds of every namespace run on one
// runtime, the waits' task of embedded_waits.h too: in a service, the
// service's own (so following namespaces and waiting in them add no
// thread); without one, a runtime of the store's, whose loop thread starts
// with the first feed or wait and ends with the store.
#include <algorithm>
#include <chrono>
#include <thread>

#include "common/log.h"
#include "common/thread_annotations.h"
#include "common/wire.h"
#include "kvs/embedded/embedded_kvs.h"
#include "kvs/embedded/exchange.h"

namespace dyad {
namespace {

// How long Watch waits for the feed's first position before returning (the
// feed then delivers a resync once it has one, so nothing is lost).
constexpr int64_t kEstablishMs = 2000;
constexpr int64_t kReplyGraceMs = 2000;

// How long AwaitTasksEnded waits for the tasks on the service's runtime to
// end once their stops fired (their waits end at once then).
constexpr int64_t kTasksEndMs = 10000;

}  // namespace

void EmbeddedKvs::SpawnCounted(Runtime* rt, Task<void> task) {
  {
    MutexLock lk(live_->mu);
    ++live_->count;
  }
  // The guard ends the count when the task ends, and also when its frame is
  // destroyed unfinished (a runtime shut down with it pending); it holds
  // the count, not the store.
  struct Ended {
    std::shared_ptr<LiveTasks> live;
    ~Ended() {
      MutexLock lk(live->mu);
      --live->count;
      live->cv.notify_all();
    }
  };
  rt->Spawn([](std::shared_ptr<LiveTasks> live, Task<void> t) -> Task<void> {
    const Ended ended{std::move(live)};
    co_await std::move(t);
  }(live_, std::move(task)));
}

Result<KvsWatchTicket> EmbeddedKvs::Watch(const std::string& ns, KvsWatchCallback on_change) {
  if (!on_change) return Status(DYAD_RC_BADREQUEST, "watch without a callback");
  if (ns.size() > kMaxFieldBytes)
    return Status(DYAD_RC_BADREQUEST, "namespace exceeds the embedded store's field limit");
  if (stopping_.load()) return Status(DYAD_RC_CANCELLED, "metadata store is shutting down");
  // Added under feed_mu_ so that Unwatch's "anyone left?" sees it.
  MutexLock lk(feed_mu_);
  if (feeds_closed_) return Status(DYAD_RC_CANCELLED, "metadata store is shutting down");
  Result<Runtime*> rt = LoopRuntimeLocked();
  if (!rt.ok()) return rt.status();
  const KvsWatchTicket ticket = watchers_.Add(ns, std::move(on_change));
  std::shared_ptr<Feed>& slot = feeds_[ns];
  if (!slot) {
    slot = std::make_shared<Feed>();
    slot->ns = ns;
    slot->stop = std::make_unique<Stop>((*rt)->executor(), &(*rt)->stopping());
    slot->cursor.ns = ns;
    slot->cursor.timeout_ms = kWaitSliceMs;
    SpawnCounted(*rt, RunFeed(slot));
  }
  const std::shared_ptr<Feed> feed = slot;
  // On the feeds' loop (a callback that watches another namespace, a
  // service's task), which would establish the feed, Watch does not wait
  // for it (the feed then reports a resync, as after kEstablishMs).
  if (!(*rt)->OnLoop()) {
    lk.WaitFor(feed_cv_, std::chrono::milliseconds(kEstablishMs),
               [&feed] { return feed->established || feed->stop->fired() || !feed->refused.ok(); });
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
  Result<Runtime*> rt = LoopRuntimeLocked();
  if (rt.ok()) EndFeed(**rt, std::move(it->second), "nobody watches the namespace");
  feeds_.erase(it);
  feed_cv_.notify_all();
}

void EmbeddedKvs::EndFeed(Runtime& rt, std::shared_ptr<Feed> f, const char* why) {
  // Fired on the loop, which the task's waits belong to (the task then
  // closes its link and ends); the feed lives until then.
  rt.Post([f = std::move(f), why] { f->stop->Fire(Status(DYAD_RC_CANCELLED, why)); });
}

Result<Runtime*> EmbeddedKvs::LoopRuntimeLocked() {
  if (feeds_closed_) return Status(DYAD_RC_CANCELLED, "metadata store is shutting down");
  if (service_rt_ != nullptr) return service_rt_;
  if (!own_rt_) {
    auto rt = std::make_unique<Runtime>(1, 1000);
    DYAD_RETURN_IF_ERROR(rt->Start());
    own_rt_ = std::move(rt);
  }
  return own_rt_.get();
}

Result<Runtime*> EmbeddedKvs::LoopRuntime() {
  MutexLock lk(feed_mu_);
  return LoopRuntimeLocked();
}

Status EmbeddedKvs::FeedState(const std::string& ns, bool* established) {
  MutexLock lk(feed_mu_);
  auto it = feeds_.find(ns);
  *established = it == feeds_.end() || it->second->established;
  if (*established || it->second->refused.ok()) return Status::OK();
  return it->second->refused;
}

void EmbeddedKvs::StopFeeds() {
  std::unique_ptr<Runtime> own;
  std::map<std::string, std::shared_ptr<Feed>> left;  // dropped once their tasks ended
  {
    MutexLock lk(feed_mu_);
    feeds_closed_ = true;
    own = std::move(own_rt_);
    left.swap(feeds_);
    feed_cv_.notify_all();
  }
  if (service_rt_ != nullptr) {
    // The service's loop goes on: each feed's task ends on its stop.
    for (auto& [ns, feed] : left)
      EndFeed(*service_rt_, std::move(feed), "the store is shutting down");
    return;
  }
  if (!own) return;
  if (own->OnLoop()) {
    // A callback on the loop shuts the store down: another thread ends
    // the loop, the feeds with it.
    std::thread([rt = std::move(own), left = std::move(left)]() mutable {
      rt->Shutdown();
      left.clear();
    }).detach();
    return;
  }
  own->Shutdown();  // every task's waits end on its stop
}

void EmbeddedKvs::AwaitTasksEnded() {
  // On the service's runtime, this store's tasks use `this` until they
  // end, which they do soon once their stops fired (StopFeeds, the waits'
  // Shutdown), as long as its loop runs. A runtime already shut down
  // holds them as frames that are destroyed, never resumed. Once this has
  // waited (Shutdown, off the loop), the store no longer touches the
  // runtime: its last owner may release it after the service has gone.
  if (service_rt_ == nullptr || rt_released_.load() || service_rt_->OnLoop()) return;
  const Deadline deadline = Deadline::AfterMs(kTasksEndMs);
  MutexLock lk(live_->mu);
  while (live_->count > 0 && service_rt_->running() && !deadline.expired())
    lk.WaitFor(live_->cv, std::chrono::milliseconds(20));
  if (live_->count > 0 && service_rt_->running())
    DYAD_LOG_ERROR("embedded store client: %zu task(s) still running at its end", live_->count);
  rt_released_.store(true);
}

Task<void> EmbeddedKvs::RunFeed(std::shared_ptr<Feed> f) {
  Stop* const stop = f->stop.get();
  int64_t dial_backoff_ms = kBackoffFirstMs;
  int64_t refused_backoff_ms = 0;
  while (!stop->fired()) {
    if (!f->ch) {
      Result<std::unique_ptr<Channel>> ch =
          co_await DialTask(Deadline::AfterMs(rpc_timeout_ms_), stop);
      if (!ch.ok()) {
        DYAD_LOG_DEBUG("watch of namespace '%s': %s", f->ns.c_str(),
                       ch.status().ToString().c_str());
        if (!co_await Sleep(Deadline::AfterMs(dial_backoff_ms), stop)) break;
        dial_backoff_ms = std::min(dial_backoff_ms * 2, kBackoffMaxMs);
        continue;
      }
      dial_backoff_ms = kBackoffFirstMs;
      f->ch = std::move(*ch);
    }
    Encoder e;
    f->cursor.EncodeTo(e);
    std::string body;
    const Status st =
        co_await EmbeddedExchange(*f->ch, MsgType::kKvsWatch, e.data(), &body,
                                  Deadline::AfterMs(kWaitSliceMs + kReplyGraceMs), stop);
    if (stop->fired()) break;
    if (st.ok()) {
      refused_backoff_ms = 0;
      if (!FeedReply(*f, body)) {
        DYAD_LOG_WARN("watch of namespace '%s': malformed reply from the root", f->ns.c_str());
        FeedLost(*f);
      }
      continue;
    }
    if (f->ch->broken() || st.code() == DYAD_RC_CANCELLED) {
      // No reply in time, a lost link, a root shutting down.
      DYAD_LOG_DEBUG("watch of namespace '%s': %s", f->ns.c_str(), st.ToString().c_str());
      FeedLost(*f);
      continue;
    }
    DYAD_LOG_WARN("watch of namespace '%s' refused by the root: %s", f->ns.c_str(),
                  st.ToString().c_str());
    {
      MutexLock lk(feed_mu_);
      f->refused = st;
      feed_cv_.notify_all();
    }
    waits_->FeedRefused();  // its waits end with the refusal
    // The link is fine: ask again on it after a back-off, rather than
    // dialling the root again at once.
    refused_backoff_ms =
        refused_backoff_ms == 0 ? kBackoffFirstMs : std::min(refused_backoff_ms * 2, kBackoffMaxMs);
    if (!co_await Sleep(Deadline::AfterMs(refused_backoff_ms), stop)) break;
  }
  f->ch.reset();  // here: its registration belongs to this loop
}

void EmbeddedKvs::FeedLost(Feed& f) {
  // Dial again at once; the dial's back-off paces a root that stays away.
  f.ch.reset();
  // Publications may be missed from now until the feed is back: watchers
  // hear so at once (once per loss), and get a resync when it is back
  // (FeedReply).
  if (!f.established || f.gap_told || f.stop->fired()) return;
  f.gap_told = true;
  watchers_.Lost(f.ns);
}

bool EmbeddedKvs::FeedReply(Feed& f, const std::string& body) {
  KvsWatchReply reply;
  Decoder d(body);
  if (!reply.DecodeFrom(d) || !d.done()) return false;
  f.cursor.epoch = reply.epoch;
  f.cursor.after = reply.last;
  if (f.stop->fired()) return true;  // nobody watches it any more
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
  return true;
}

}  // namespace dyad
