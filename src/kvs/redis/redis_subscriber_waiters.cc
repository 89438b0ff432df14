// redis_subscriber_waiters.cc: the waiters' side of RedisSubscriber: adding,
// ending and expiring waiters, and the checker thread that reads keys
// again after (re)subscriptions (see redis_subscriber.h).
#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <map>

#include "kvs/redis/redis_subscriber.h"

namespace dyad {
namespace {

// The value of a GET reply: nullopt for nil, an error for anything else.
Result<std::optional<std::string>> GetValue(const redisReply* r) {
  if (r->type == REDIS_REPLY_NIL) return std::optional<std::string>();
  if (r->type == REDIS_REPLY_STRING) return std::optional<std::string>(std::string(r->str, r->len));
  const std::string err = RedisErrorText(r);
  return Status(DYAD_RC_BADRPC, "redis GET: " + (err.empty() ? "unexpected reply" : err));
}

}  // namespace

Result<KvsWaitTicket> RedisSubscriber::Add(const std::string& channel, int slot, Deadline deadline,
                                           std::string what, KvsWaitCallback done) {
  MutexLock lk(mu_);
  if (shutdown_) return Status(DYAD_RC_CANCELLED, what + ": the metadata store is shutting down");
  StartLocked();
  const KvsWaitTicket t = next_ticket_++;
  Waiter& w = waiters_[t];
  w.channel = channel;
  w.what = std::move(what);
  w.done = std::move(done);
  if (!deadline.never()) {
    w.deadline = deadlines_.emplace(deadline.time_point(), t);
    w.has_deadline = true;
  }
  Channel& ch = channels_[channel];
  ch.slot = slot;
  ch.waiters.insert(t);
  // Joining a confirmed subscription: a message sent before we joined is
  // lost to us, so read the key once more.
  if (ch.state == State::kActive) {
    QueueCheckLocked(channel);
  } else {
    dirty_.insert(channel);
  }
  lk.Unlock();
  Wake();
  return t;
}

void RedisSubscriber::Cancel(KvsWaitTicket ticket, const Status& why) {
  Completions done;
  {
    MutexLock lk(mu_);
    CompleteLocked(ticket, why, &done);
  }
  Run(&done);
  Wake();  // the channel may have no waiter left: unsubscribe
}

void RedisSubscriber::Shutdown() {
  Completions done;
  {
    MutexLock lk(mu_);
    shutdown_ = true;
    std::vector<KvsWaitTicket> all;
    for (const auto& [t, w] : waiters_) all.push_back(t);
    for (KvsWaitTicket t : all) {
      const std::string what = waiters_[t].what;
      CompleteLocked(t, Status(DYAD_RC_CANCELLED, what + ": the metadata store is shutting down"),
                     &done);
    }
  }
  Run(&done);
  Wake();
}

void RedisSubscriber::Run(Completions* c) {
  for (auto& [done, result] : *c) done(std::move(result));
  c->clear();
}

void RedisSubscriber::CompleteLocked(KvsWaitTicket t, Result<std::string> r, Completions* out) {
  auto it = waiters_.find(t);
  if (it == waiters_.end()) return;
  Waiter& w = it->second;
  if (w.has_deadline) deadlines_.erase(w.deadline);
  auto cit = channels_.find(w.channel);
  if (cit != channels_.end()) {
    cit->second.waiters.erase(t);
    if (cit->second.waiters.empty()) dirty_.insert(w.channel);
  }
  out->emplace_back(std::move(w.done), std::move(r));
  waiters_.erase(it);
}

void RedisSubscriber::CompleteChannelLocked(const std::string& channel, const std::string& value,
                                            Completions* out) {
  auto cit = channels_.find(channel);
  if (cit == channels_.end()) return;
  const std::set<KvsWaitTicket> tickets = cit->second.waiters;
  for (KvsWaitTicket t : tickets) CompleteLocked(t, value, out);
}

void RedisSubscriber::FailChannelLocked(const std::string& channel, const Status& why,
                                        Completions* out) {
  auto cit = channels_.find(channel);
  if (cit == channels_.end()) return;
  const std::set<KvsWaitTicket> tickets = cit->second.waiters;
  for (KvsWaitTicket t : tickets) CompleteLocked(t, why.Annotate(waiters_[t].what), out);
}

std::string RedisSubscriber::DownReasonLocked(const Channel& ch) const {
  if (ch.node.empty()) return topology_error_.ok() ? "" : topology_error_.message();
  auto it = links_.find(ch.node);
  if (it == links_.end() || it->second.c || it->second.error.ok()) return "";
  return it->second.error.message();
}

void RedisSubscriber::ExpireLocked(Completions* out) {
  const auto now = SteadyClock::now();
  while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
    const KvsWaitTicket t = deadlines_.begin()->second;
    const Waiter& w = waiters_[t];
    auto cit = channels_.find(w.channel);
    const std::string reason = cit == channels_.end() ? "" : DownReasonLocked(cit->second);
    Status st = Status(DYAD_RC_TIMEOUT, w.what + ": not put before the deadline" +
                                            (reason.empty() ? "" : " (" + reason + ")"))
                    .WithCause(reason.empty() ? DYAD_RC_OK : DYAD_RC_CONNLOST);
    CompleteLocked(t, st, out);
  }
}

int64_t RedisSubscriber::NextTimerMsLocked() const {
  auto until = SteadyClock::now() + std::chrono::milliseconds(kPollMs);
  if (!deadlines_.empty()) until = std::min(until, deadlines_.begin()->first);
  for (const auto& [name, link] : links_)
    if (!link.c && link.refs > 0) until = std::min(until, link.retry_at);
  const auto left =
      std::chrono::duration_cast<std::chrono::microseconds>(until - SteadyClock::now());
  // Rounded up, so a timer is never polled for with 0 ms again and again.
  return std::max<int64_t>(0, (left.count() + 999) / 1000);
}

void RedisSubscriber::QueueCheckLocked(const std::string& channel) {
  if (check_.insert(channel).second && check_.size() == 1) check_cv_.notify_one();
}

void RedisSubscriber::CheckerLoop() {
  MutexLock lk(mu_);
  int64_t backoff = kBackoffFirstMs;
  while (!stop_) {
    if (check_.empty()) {
      lk.WaitFor(check_cv_, std::chrono::milliseconds(kPollMs));
      continue;
    }
    std::vector<std::pair<std::string, int>> batch;
    for (auto it = check_.begin(); it != check_.end() && batch.size() < kCheckBatch;) {
      auto cit = channels_.find(*it);
      if (cit != channels_.end() && !cit->second.waiters.empty())
        batch.emplace_back(*it, cit->second.slot);
      it = check_.erase(it);
    }
    if (batch.empty()) continue;
    lk.Unlock();
    std::vector<std::pair<std::string, std::string>> found;
    std::vector<std::string> retry;
    CheckBatch(batch, &found, &retry);
    lk.Lock();
    Completions done;
    for (const auto& [channel, value] : found) CompleteChannelLocked(channel, value, &done);
    for (const std::string& channel : retry) check_.insert(channel);
    lk.Unlock();
    Run(&done);
    Wake();
    lk.Lock();
    if (retry.empty()) {
      backoff = kBackoffFirstMs;
    } else {
      // The store is unreachable or failing over: try again, not in a spin.
      lk.WaitFor(check_cv_, std::chrono::milliseconds(backoff),
                 [this]() REQUIRES(mu_) { return stop_; });
      backoff = std::min(backoff * 2, kBackoffMaxMs);
    }
  }
}

void RedisSubscriber::CheckBatch(const std::vector<std::pair<std::string, int>>& batch,
                                 std::vector<std::pair<std::string, std::string>>* found,
                                 std::vector<std::string>* retry) {
  std::vector<RedisReply> replies;
  if (!sharded_) {  // one node: one MGET
    RedisArgv mget{"MGET"};
    for (const auto& item : batch) mget.push_back(item.first);
    Status st = exec_->Run(-1, {mget}, &replies);
    if (!st.ok() || replies[0]->type != REDIS_REPLY_ARRAY || replies[0]->elements != batch.size()) {
      for (const auto& item : batch) retry->push_back(item.first);
      return;
    }
    for (size_t i = 0; i < batch.size(); ++i) {
      Result<std::optional<std::string>> v = GetValue(replies[0]->element[i]);
      if (v.ok() && v->has_value()) found->emplace_back(batch[i].first, **v);
    }
    return;
  }
  // A cluster: GETs pipelined per owner; a key that moved meanwhile
  // (MOVED, ASK) is read alone, following the redirection.
  std::map<RedisAddress, std::vector<size_t>> by_node;
  for (size_t i = 0; i < batch.size(); ++i) {
    std::optional<RedisAddress> n = topology_->CachedNodeFor(batch[i].second);
    if (n) {
      by_node[*n].push_back(i);
    } else {
      retry->push_back(batch[i].first);
    }
  }
  for (const auto& [node, items] : by_node) {
    std::vector<RedisArgv> gets;
    for (size_t i : items) gets.push_back({"GET", batch[i].first});
    if (!exec_->RunOn(node, gets, &replies).ok()) {
      // The node is down: the subscriber's link to it is too, and its
      // re-subscription (maybe elsewhere) will ask for this check again.
      topology_->MarkStale();
      for (size_t i : items) retry->push_back(batch[i].first);
      continue;
    }
    for (size_t k = 0; k < items.size(); ++k) {
      const auto& [channel, slot] = batch[items[k]];
      Result<std::optional<std::string>> v = GetValue(replies[k].get());
      if (!v.ok()) {
        std::vector<RedisReply> one;
        if (exec_->Run(slot, {{"GET", channel}}, &one).ok()) v = GetValue(one[0].get());
      }
      if (!v.ok()) {
        retry->push_back(channel);
      } else if (v->has_value()) {
        found->emplace_back(channel, **v);
      }
    }
  }
}

}  // namespace dyad
