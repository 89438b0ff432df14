// redis_watch.cc: see redis_watch.h.
#include "kvs/redis/redis_watch.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "common/log.h"
#include "common/thread_annotations.h"
#include "common/time.h"

namespace dyad {
// The first node tried differs from service to service (the clock and
// this object's address): the watch links of many services spread over a
// cluster's nodes instead of all landing on the first.
RedisWatcher::RedisWatcher(RedisExecutor* exec)
    : exec_(exec),
      next_node_(static_cast<size_t>(SteadyClock::now().time_since_epoch().count()) ^
                 reinterpret_cast<uintptr_t>(this)) {}

RedisWatcher::~RedisWatcher() {
  Shutdown();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

std::string RedisWatcher::EncodeMessage(const std::string& key, const std::string& value) {
  return std::to_string(key.size()) + ":" + key + value;
}

bool RedisWatcher::DecodeMessage(const std::string& msg, std::string* key, std::string* value) {
  const size_t colon = msg.find(':');
  if (colon == std::string::npos || colon == 0 || colon > 10) return false;
  size_t len = 0;
  for (size_t i = 0; i < colon; ++i) {
    if (msg[i] < '0' || msg[i] > '9') return false;
    len = len * 10 + static_cast<size_t>(msg[i] - '0');
  }
  if (len > msg.size() - colon - 1) return false;
  *key = msg.substr(colon + 1, len);
  *value = msg.substr(colon + 1 + len);
  return true;
}

void RedisWatcher::Wake() {
  if (wake_fd_ < 0) return;
  const uint64_t one = 1;
  ssize_t n = ::write(wake_fd_, &one, sizeof one);
  (void)n;
}

Result<KvsWatchTicket> RedisWatcher::Watch(const std::string& ns, const std::string& channel,
                                           KvsWatchCallback on_change) {
  MutexLock lk(mu_);
  if (stop_) return Status(DYAD_RC_CANCELLED, "metadata store is shutting down");
  if (wake_fd_ < 0) {
    wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) return StatusFromErrno(errno, "redis watch: eventfd");
  }
  const KvsWatchTicket t = watchers_.Add(ns, std::move(on_change));
  auto [it, fresh] = subs_.try_emplace(channel);
  if (fresh) {
    it->second.ns = ns;
    to_subscribe_.insert(channel);
    to_unsubscribe_.erase(channel);
  }
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  Wake();
  Sub& sub = it->second;
  lk.WaitFor(cv_, std::chrono::milliseconds(kConfirmMs),
             [&]() REQUIRES(mu_) { return sub.confirmed || stop_; });
  if (!sub.confirmed) sub.resync_on_confirm = true;
  return t;
}

void RedisWatcher::Unwatch(KvsWatchTicket ticket) {
  std::optional<std::string> ns = watchers_.Remove(ticket);
  if (!ns) return;
  MutexLock lk(mu_);
  if (watchers_.Watched(*ns)) return;
  for (auto it = subs_.begin(); it != subs_.end(); ++it) {
    if (it->second.ns != *ns) continue;
    to_unsubscribe_.insert(it->first);
    to_subscribe_.erase(it->first);
    subs_.erase(it);
    break;
  }
  Wake();
}

void RedisWatcher::Shutdown() {
  std::thread loop;
  {
    MutexLock lk(mu_);
    stop_ = true;
    cv_.notify_all();
    loop = std::move(thread_);  // (a second Shutdown finds none to join)
  }
  Wake();
  if (loop.joinable()) loop.join();
}

bool RedisWatcher::SendCommand(redisContext* c, const char* verb, const std::string& arg) {
  const char* argv[] = {verb, arg.data()};
  const size_t lens[] = {std::strlen(verb), arg.size()};
  // PING goes without its argument (a subscribed link answers it too).
  if (redisAppendCommandArgv(c, arg.empty() ? 1 : 2, argv, lens) != REDIS_OK) return false;
  int done = 0;
  while (!done)
    if (redisBufferWrite(c, &done) != REDIS_OK) return false;
  return true;
}

Result<RedisContext> RedisWatcher::DialNext() {
  // Any node serves the watch channels (a cluster propagates PUBLISH to
  // every node), so each attempt takes the next one known: a dead node
  // costs one bounded connect, then the link moves on.
  Result<std::vector<RedisAddress>> nodes = exec_->topology()->AnyNodes();
  if (!nodes.ok()) return nodes.status();
  if (nodes->empty()) return Status(DYAD_RC_CONNLOST, "redis watch: no node known");
  const RedisAddress& node = (*nodes)[next_node_++ % nodes->size()];
  Result<RedisContext> c = exec_->Dial(node);
  if (!c.ok()) return c.status().Annotate("redis watch: " + node.ToString());
  DYAD_LOG_DEBUG("redis watch: subscribing on %s", node.ToString().c_str());
  return c;
}

void RedisWatcher::Loop() {
  int64_t backoff = kBackoffFirstMs;
  for (;;) {
    {
      MutexLock lk(mu_);
      if (stop_) return;
    }
    Result<RedisContext> c = DialNext();
    bool retry_now = false;
    if (c.ok()) {
      const auto up_at = SteadyClock::now();
      {
        // Everything wanted is (re)subscribed on this new link.
        MutexLock lk(mu_);
        to_unsubscribe_.clear();
        for (const auto& [channel, sub] : subs_) to_subscribe_.insert(channel);
      }
      if (Serve(c->get())) return;  // stopped
      exec_->topology()->MarkStale();
      // A link that served a while and went away: the next node is tried
      // at once. One that drops as soon as it is up backs off like a
      // failed dial, so a flapping node or a cluster that is down is not
      // hammered.
      retry_now = SteadyClock::now() - up_at >= std::chrono::milliseconds(kBackoffMaxMs);
      if (retry_now) backoff = kBackoffFirstMs;
    } else {
      DYAD_LOG_DEBUG("redis watch: %s", c.status().ToString().c_str());
    }
    // Messages published while the link is down are lost: watchers hear so
    // now, and resync once the subscriptions are confirmed again.
    std::vector<std::string> lost;
    {
      MutexLock lk(mu_);
      for (auto& [channel, sub] : subs_) {
        if (sub.confirmed) {
          sub.resync_on_confirm = true;
          lost.push_back(sub.ns);
        }
        sub.confirmed = false;
      }
    }
    for (const std::string& ns : lost) watchers_.Lost(ns);
    MutexLock lk(mu_);
    if (retry_now) continue;
    lk.WaitFor(cv_, std::chrono::milliseconds(backoff), [this]() REQUIRES(mu_) { return stop_; });
    backoff = std::min(backoff * 2, kBackoffMaxMs);
  }
}

bool RedisWatcher::Serve(redisContext* c) {
  // A node that stops answering without closing the link (hung, or the
  // network dropped it) is found by a PING after kHeartbeatMs of silence,
  // unanswered for as long again.
  auto heard = SteadyClock::now();
  bool pinged = false;
  for (;;) {
    std::vector<std::pair<const char*, std::string>> sends;
    {
      MutexLock lk(mu_);
      if (stop_) return true;
      for (const auto& ch : to_subscribe_) sends.emplace_back("SUBSCRIBE", ch);
      for (const auto& ch : to_unsubscribe_) sends.emplace_back("UNSUBSCRIBE", ch);
      to_subscribe_.clear();
      to_unsubscribe_.clear();
    }
    const int64_t silent_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(SteadyClock::now() - heard).count();
    if (silent_ms >= (pinged ? 2 : 1) * kHeartbeatMs) {
      if (pinged) {
        DYAD_LOG_WARN("redis watch: no answer to PING within %lld ms; reconnecting",
                      static_cast<long long>(kHeartbeatMs));
        return false;
      }
      sends.emplace_back("PING", "");
      pinged = true;
    }
    for (const auto& [verb, ch] : sends)
      if (!SendCommand(c, verb, ch)) return false;
    pollfd fds[2] = {{c->fd, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    const int n = ::poll(fds, 2, static_cast<int>(kPollMs));
    if (n < 0 && errno != EINTR) return false;
    if (fds[1].revents & POLLIN) {
      uint64_t v;
      ssize_t r = ::read(wake_fd_, &v, sizeof v);
      (void)r;
    }
    if (!(fds[0].revents & (POLLIN | POLLHUP | POLLERR))) continue;
    if (redisBufferRead(c) != REDIS_OK) {
      DYAD_LOG_WARN("redis watch link lost: %s; reconnecting", c->errstr);
      return false;
    }
    heard = SteadyClock::now();
    pinged = false;
    for (;;) {
      void* raw = nullptr;
      if (redisGetReplyFromReader(c, &raw) != REDIS_OK) return false;
      if (raw == nullptr) break;
      RedisReply reply(static_cast<redisReply*>(raw));
      HandlePush(reply.get());
    }
  }
}

void RedisWatcher::HandlePush(const redisReply* r) {
  if (r->type == REDIS_REPLY_ERROR) {
    DYAD_LOG_WARN("redis watch: %s", RedisErrorText(r).c_str());
    return;
  }
  if (r->type != REDIS_REPLY_ARRAY || r->elements < 3) return;
  const std::string kind = RedisText(r->element[0]);
  const std::string channel = RedisText(r->element[1]);
  std::string ns;
  bool resync = false;
  {
    MutexLock lk(mu_);
    auto it = subs_.find(channel);
    if (it == subs_.end()) return;
    ns = it->second.ns;
    if (kind == "subscribe") {
      it->second.confirmed = true;
      resync = it->second.resync_on_confirm;
      it->second.resync_on_confirm = false;
      cv_.notify_all();
    }
  }
  if (resync) watchers_.Resync(ns);
  if (kind != "message") return;
  std::string key, value;
  if (r->element[2]->type != REDIS_REPLY_STRING ||
      !DecodeMessage(RedisText(r->element[2]), &key, &value))
    return;
  watchers_.Notify(ns, key, value);
}

}  // namespace dyad
