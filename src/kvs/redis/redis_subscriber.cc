// redis_subscriber.cc: the pub/sub links of RedisSubscriber (see
// redis_subscriber.h): routing channels to nodes, (un)subscribing, reading
// pushes, following +switch-master.
#include "kvs/redis/redis_subscriber.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

namespace dyad {
RedisSubscriber::RedisSubscriber(const RedisConfig& config, RedisExecutor* exec)
    : config_(config),
      exec_(exec),
      topology_(exec->topology()),
      sharded_(config.mode == RedisMode::kCluster),
      wake_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

RedisSubscriber::~RedisSubscriber() {
  Shutdown();
  {
    MutexLock lk(mu_);
    stop_ = true;
  }
  check_cv_.notify_all();
  Wake();
  if (subscriber_.joinable()) subscriber_.join();
  if (checker_.joinable()) checker_.join();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

size_t RedisSubscriber::links_up() const {
  MutexLock lk(mu_);
  size_t n = 0;
  for (const auto& [name, link] : links_) n += link.c ? 1 : 0;
  return n;
}

void RedisSubscriber::StartLocked() {
  if (subscriber_.joinable()) return;
  subscriber_ = std::thread(&RedisSubscriber::SubscriberLoop, this);
  checker_ = std::thread(&RedisSubscriber::CheckerLoop, this);
}

void RedisSubscriber::Wake() {
  const uint64_t one = 1;
  // A full counter already means "wake up"; nothing to do on failure.
  if (wake_fd_ >= 0 && ::write(wake_fd_, &one, sizeof one) < 0) return;
}

const char* RedisSubscriber::Verb(bool subscribe) const {
  if (sharded_) return subscribe ? "SSUBSCRIBE" : "SUNSUBSCRIBE";
  return subscribe ? "SUBSCRIBE" : "UNSUBSCRIBE";
}

void RedisSubscriber::SetNodeLocked(Channel* ch, const RedisAddress* node) {
  if (!ch->node.empty()) {
    auto it = links_.find(ch->node);
    if (it != links_.end() && it->second.refs > 0) --it->second.refs;
  }
  ch->node = node == nullptr ? "" : node->ToString();
  if (node != nullptr) {
    Link& link = links_[ch->node];
    link.node = *node;
    ++link.refs;
  }
}

bool RedisSubscriber::RouteLocked(bool after_lookup) {
  bool lookup = false;
  for (const std::string& name : dirty_) {
    auto it = channels_.find(name);
    if (it == channels_.end() || it->second.state != State::kNew || !it->second.node.empty() ||
        it->second.waiters.empty()) {
      continue;
    }
    std::optional<RedisAddress> node;
    if (after_lookup || !topology_->stale()) node = topology_->CachedNodeFor(it->second.slot);
    if (node) {
      SetNodeLocked(&it->second, &*node);
    } else {
      lookup = true;
    }
  }
  return lookup && !after_lookup;
}

void RedisSubscriber::RerouteLocked() {
  routed_epoch_ = topology_->epoch();
  std::set<std::string> broken;
  for (auto& [name, ch] : channels_) {
    if (ch.node.empty() || ch.state == State::kUnsubscribing) continue;
    std::optional<RedisAddress> target = topology_->CachedNodeFor(ch.slot);
    if (ch.state != State::kNew && (!target || target->ToString() == ch.node)) continue;
    if (ch.state != State::kNew) {
      Link& old = links_[ch.node];
      // Its confirmation is ignored: the channel's node changes below.
      if (old.c && !SendLocked(&old, Verb(false), {name})) broken.insert(ch.node);
    }
    ch.state = State::kNew;
    SetNodeLocked(&ch, nullptr);
    dirty_.insert(name);
  }
  for (const std::string& node : broken)
    DropLinkLocked(node, Status(DYAD_RC_CONNLOST, "redis " + node + " subscriber: write failed"));
}

void RedisSubscriber::DialDue() {
  const auto now = SteadyClock::now();
  std::vector<RedisAddress> due;
  for (const auto& [name, link] : links_)
    if (link.refs > 0 && !link.c && link.retry_at <= now) due.push_back(link.node);
  if (due.empty()) return;
  std::vector<Result<RedisContext>> dialled;
  {
    MutexUnlock unlocked(mu_);
    for (const RedisAddress& node : due) dialled.push_back(exec_->Dial(node));
  }
  for (size_t i = 0; i < due.size(); ++i) {
    Link& link = links_[due[i].ToString()];
    link.node = due[i];
    if (dialled[i].ok()) {
      link.c = std::move(*dialled[i]);
      // (UN)SUBSCRIBE writes are tiny; a link that cannot take them within
      // 2 s is broken, and the lock must not be held longer than that.
      redisSetTimeout(link.c.get(),
                      RedisTimeval(std::min<int64_t>(config_.command_timeout_ms, 2000)));
      link.error = Status::OK();
      link.backoff = kBackoffFirstMs;
    } else {
      link.error = dialled[i].status();
      link.retry_at = SteadyClock::now() + std::chrono::milliseconds(link.backoff);
      link.backoff = std::min(link.backoff * 2, kBackoffMaxMs);
      topology_->MarkStale();
    }
  }
}

bool RedisSubscriber::SendLocked(Link* link, const char* verb,
                                 const std::vector<std::string>& channels) {
  // Sharded (un)subscriptions must stay within one slot: one per command.
  const size_t per = sharded_ ? 1 : kChannelsPerCommand;
  for (size_t start = 0; start < channels.size(); start += per) {
    std::vector<const char*> argv{verb};
    std::vector<size_t> lens{std::strlen(verb)};
    for (size_t i = start; i < std::min(channels.size(), start + per); ++i) {
      argv.push_back(channels[i].data());
      lens.push_back(channels[i].size());
    }
    if (redisAppendCommandArgv(link->c.get(), static_cast<int>(argv.size()), argv.data(),
                               lens.data()) != REDIS_OK) {
      return false;
    }
  }
  int done = channels.empty();
  while (!done) {
    if (redisBufferWrite(link->c.get(), &done) != REDIS_OK) return false;
  }
  return true;
}

void RedisSubscriber::SyncLocked() {
  std::map<std::string, std::pair<std::vector<std::string>, std::vector<std::string>>> work;
  for (auto it = dirty_.begin(); it != dirty_.end();) {
    auto cit = channels_.find(*it);
    if (cit == channels_.end()) {
      it = dirty_.erase(it);
      continue;
    }
    Channel& ch = cit->second;
    if (ch.state == State::kNew && ch.waiters.empty()) {
      SetNodeLocked(&ch, nullptr);
      channels_.erase(cit);
      it = dirty_.erase(it);
      continue;
    }
    auto link = ch.node.empty() ? links_.end() : links_.find(ch.node);
    const bool up = link != links_.end() && link->second.c;
    if (ch.state == State::kNew) {
      if (!up) {  // not routed yet, or its link is down: stays dirty
        ++it;
        continue;
      }
      work[ch.node].first.push_back(*it);
      ch.state = State::kSubscribing;
    } else if (ch.state == State::kActive && ch.waiters.empty() && up) {
      work[ch.node].second.push_back(*it);
      ch.state = State::kUnsubscribing;
    }
    it = dirty_.erase(it);
  }
  for (auto& [node, lists] : work) {
    Link& link = links_[node];
    if (!SendLocked(&link, Verb(true), lists.first) ||
        !SendLocked(&link, Verb(false), lists.second)) {
      DropLinkLocked(node,
                     Status(DYAD_RC_CONNLOST, "redis " + node + " subscriber: " + link.c->errstr));
    }
  }
  for (auto it = links_.begin(); it != links_.end();) {
    it = it->second.refs == 0 ? links_.erase(it) : std::next(it);
  }
}

void RedisSubscriber::DropLinkLocked(const std::string& node, const Status& why) {
  Link& link = links_[node];
  link.c.reset();
  link.error = why;
  link.retry_at = SteadyClock::now() + std::chrono::milliseconds(link.backoff);
  link.backoff = std::min(link.backoff * 2, kBackoffMaxMs);
  topology_->MarkStale();  // the node may have failed over
  for (auto& [name, ch] : channels_) {
    if (ch.node != node) continue;
    ch.state = State::kNew;
    SetNodeLocked(&ch, nullptr);
    dirty_.insert(name);  // re-routed and re-subscribed, or dropped if unwanted
  }
}

void RedisSubscriber::ReadLinkLocked(const std::string& node, Completions* out) {
  auto it = links_.find(node);
  if (it == links_.end() || !it->second.c) return;
  redisContext* c = it->second.c.get();
  if (redisBufferRead(c) != REDIS_OK) {
    DropLinkLocked(node, Status(DYAD_RC_CONNLOST, "redis " + node + " subscriber: " + c->errstr));
    return;
  }
  while (it->second.c) {
    void* raw = nullptr;
    if (redisGetReplyFromReader(c, &raw) != REDIS_OK) {
      DropLinkLocked(node, Status(DYAD_RC_CONNLOST, "redis " + node + " subscriber: " + c->errstr));
      return;
    }
    if (raw == nullptr) return;
    RedisReply reply(static_cast<redisReply*>(raw));
    HandlePushLocked(node, reply.get(), out);
  }
}

void RedisSubscriber::HandlePushLocked(const std::string& node, const redisReply* r,
                                       Completions* out) {
  if (r->type == REDIS_REPLY_ERROR) return HandleLinkErrorLocked(node, RedisErrorText(r), out);
  if (r->type != REDIS_REPLY_ARRAY || r->elements < 3) return;
  const std::string kind = RedisText(r->element[0]);
  const std::string name = RedisText(r->element[1]);
  auto it = channels_.find(name);
  if (it == channels_.end()) return;
  Channel& ch = it->second;
  if (kind == "message" || kind == "smessage") {
    // The value itself: whichever link it came on, it was put.
    if (r->element[2]->type == REDIS_REPLY_STRING)
      CompleteChannelLocked(name, RedisText(r->element[2]), out);
  } else if ((kind == "subscribe" || kind == "ssubscribe") && ch.node == node &&
             ch.state == State::kSubscribing) {
    ch.state = State::kActive;
    if (ch.waiters.empty()) {
      dirty_.insert(name);
    } else {
      QueueCheckLocked(name);
    }
  } else if ((kind == "unsubscribe" || kind == "sunsubscribe") && ch.node == node) {
    // Ours, or the node's own when it lost the slot (migration): either
    // way the channel is routed again if someone still waits.
    if (ch.state != State::kUnsubscribing) topology_->MarkStale();
    ch.state = State::kNew;
    SetNodeLocked(&ch, nullptr);
    dirty_.insert(name);
  }
}

void RedisSubscriber::HandleLinkErrorLocked(const std::string& node, const std::string& error,
                                            Completions* out) {
  RedisRedirect moved;
  const bool redirect = ParseRedisRedirect(error, &moved);
  if (redirect) topology_->NoteMoved(moved.slot, moved.node);
  if (!redirect && RedisTransientError(error)) {
    DropLinkLocked(node, RedisErrorStatus("redis " + node + " subscribe", error));
    return;
  }
  const Status st = RedisErrorStatus("redis " + node + " " + Verb(true), error);
  std::vector<std::string> affected;
  for (const auto& [name, ch] : channels_) {
    if (ch.node == node && ch.state == State::kSubscribing && (!redirect || ch.slot == moved.slot))
      affected.push_back(name);
  }
  for (const std::string& name : affected) {
    Channel& ch = channels_[name];
    ch.state = State::kNew;
    SetNodeLocked(&ch, nullptr);
    dirty_.insert(name);
    // A refusal (rights, unknown command) will not change by retrying.
    if (!redirect) FailChannelLocked(name, st, out);
  }
}

void RedisSubscriber::SentinelStep(bool readable) {
  if (config_.mode != RedisMode::kSentinel) return;
  if (readable && sentinel_) {
    if (redisBufferRead(sentinel_.get()) != REDIS_OK) {
      sentinel_.reset();
      return;
    }
    void* raw = nullptr;
    while (sentinel_ && redisGetReplyFromReader(sentinel_.get(), &raw) == REDIS_OK && raw) {
      RedisReply reply(static_cast<redisReply*>(raw));
      const redisReply* r = reply.get();
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 || RedisText(r->element[0]) != "message")
        continue;
      // "+switch-master": "<name> <old-ip> <old-port> <new-ip> <new-port>"
      std::istringstream words(RedisText(r->element[2]));
      std::string name, old_ip, old_port;
      RedisAddress now;
      if ((words >> name >> old_ip >> old_port >> now.host >> now.port) &&
          name == config_.master_name && now.port > 0 && now.port <= 65535) {
        topology_->SetPrimary(now);
      }
    }
    return;
  }
  if (sentinel_ || channels_.empty() || SteadyClock::now() < sentinel_retry_at_) return;
  const std::vector<RedisAddress> sentinels = topology_->Sentinels();
  const RedisAddress target = sentinels[sentinel_next_++ % sentinels.size()];
  Result<RedisContext> c = WithoutLock(mu_, [&] {
    Result<RedisContext> c =
        DialRedis(target, topology_->sentinel_login(), RedisTopology::kLookupConnectMs, 2000);
    if (c.ok()) {
      const char* argv[] = {"SUBSCRIBE", "+switch-master"};
      const size_t lens[] = {9, 14};
      int done = 0;
      if (redisAppendCommandArgv(c->get(), 2, argv, lens) != REDIS_OK)
        c = Status(DYAD_RC_CONNLOST, "");
      while (c.ok() && !done)
        if (redisBufferWrite(c->get(), &done) != REDIS_OK) c = Status(DYAD_RC_CONNLOST, "");
    }
    return c;
  });
  if (c.ok()) {
    sentinel_ = std::move(*c);
  } else {
    sentinel_retry_at_ = SteadyClock::now() + std::chrono::milliseconds(kBackoffMaxMs);
  }
}

void RedisSubscriber::SubscriberLoop() {
  MutexLock lk(mu_);
  while (!stop_) {
    Completions done;
    ExpireLocked(&done);
    if (routed_epoch_ != topology_->epoch()) RerouteLocked();
    if (RouteLocked(false)) {
      lk.Unlock();
      Run(&done);
      Status st = topology_->Refresh();
      lk.Lock();
      topology_error_ = st;
      if (routed_epoch_ != topology_->epoch()) RerouteLocked();
      RouteLocked(true);
    }
    DialDue();
    SentinelStep(false);
    SyncLocked();
    std::vector<pollfd> fds{{wake_fd_, POLLIN, 0}};
    std::vector<std::string> names;
    for (const auto& [name, link] : links_) {
      if (!link.c) continue;
      fds.push_back({link.c->fd, POLLIN, 0});
      names.push_back(name);
    }
    if (sentinel_) fds.push_back({sentinel_->fd, POLLIN, 0});
    const int timeout = static_cast<int>(NextTimerMsLocked());
    lk.Unlock();
    Run(&done);
    const int n = ::poll(fds.data(), fds.size(), timeout);
    uint64_t count;
    if (n > 0 && (fds[0].revents & POLLIN) && ::read(wake_fd_, &count, sizeof count) < 0) count = 0;
    lk.Lock();
    if (n <= 0) continue;
    for (size_t i = 0; i < names.size(); ++i)
      if (fds[i + 1].revents & (POLLIN | POLLERR | POLLHUP)) ReadLinkLocked(names[i], &done);
    if (sentinel_ && (fds.back().revents & (POLLIN | POLLERR | POLLHUP))) SentinelStep(true);
    lk.Unlock();
    Run(&done);
    lk.Lock();
  }
}

}  // namespace dyad
