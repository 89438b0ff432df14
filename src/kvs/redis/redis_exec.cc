// redis_exec.cc: commands on the right node (see redis_exec.h).
#include "kvs/redis/redis_exec.h"
#include "common/thread_annotations.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

namespace dyad {

RedisExecutor::RedisExecutor(const RedisConfig& config, RedisTopology* topology)
    : config_(config), topology_(topology) {}

RedisExecutor::~RedisExecutor() { Shutdown(); }

void RedisExecutor::Shutdown() {
  shutdown_.store(true);
  std::map<std::string, Pool> closing;
  MutexLock lk(mu_);
  for (auto& [name, pool] : pools_) {
    pool.open -= pool.idle.size();
    closing[name].idle.swap(pool.idle);
  }
}

Status RedisExecutor::WithOrigin(const Status& st, const RedisAddress& node) const {
  const std::string origin = topology_->AddressOrigin(node);
  if (st.ok() || origin.empty()) return st;
  return Status(st.code(), st.message() + origin).WithCause(st.cause());
}

Result<RedisContext> RedisExecutor::Dial(const RedisAddress& node) {
  return DialRedis(node, topology_->login(), config_.connect_timeout_ms,
                   config_.command_timeout_ms);
}

Result<RedisContext> RedisExecutor::Borrow(const RedisAddress& node, bool* reused) {
  const std::string name = node.ToString();
  MutexLock lk(mu_);
  Pool& pool = pools_[name];
  // Bounded: a borrowed connection is returned within one command timeout.
  const auto until = SteadyClock::now() + std::chrono::milliseconds(config_.command_timeout_ms);
  while (pool.idle.empty() && pool.open >= kMaxOpenPerNode) {
    ++pool.waiting;
    const bool timed_out = lk.WaitUntil(freed_, until) == std::cv_status::timeout;
    --pool.waiting;
    if (timed_out && pool.idle.empty() && pool.open >= kMaxOpenPerNode) {
      return Status(DYAD_RC_CONNLOST, "redis " + name + ": all " + std::to_string(kMaxOpenPerNode) +
                                          " connections stayed busy");
    }
  }
  if (!pool.idle.empty()) {
    RedisContext c = std::move(pool.idle.back());
    pool.idle.pop_back();
    *reused = true;
    return c;
  }
  ++pool.open;
  lk.Unlock();
  *reused = false;
  Result<RedisContext> c = Dial(node);
  if (!c.ok()) {
    lk.Lock();
    --pools_[name].open;
    freed_.notify_one();
  }
  return c;
}

void RedisExecutor::Release(const RedisAddress& node, RedisContext c, bool healthy) {
  MutexLock lk(mu_);
  Pool& pool = pools_[node.ToString()];
  // A waiting caller takes it over; otherwise a few stay for the next burst.
  if (healthy && c && c->err == 0 && !shutdown_.load() &&
      (pool.waiting > 0 || pool.idle.size() < kMaxIdlePerNode)) {
    pool.idle.push_back(std::move(c));
  } else {
    --pool.open;
  }
  freed_.notify_one();
}

void RedisExecutor::DropIdle(const RedisAddress& node) {
  std::vector<RedisContext> dropped;
  MutexLock lk(mu_);
  Pool& pool = pools_[node.ToString()];
  pool.open -= pool.idle.size();
  dropped.swap(pool.idle);
  freed_.notify_all();
}

Status RedisExecutor::RunOn(const RedisAddress& node, const std::vector<RedisArgv>& cmds,
                            std::vector<RedisReply>* out) {
  for (int attempt = 0;; ++attempt) {
    bool reused = false;
    Result<RedisContext> c = Borrow(node, &reused);
    if (!c.ok()) return WithOrigin(c.status(), node);
    Status st = RunRedis(c->get(), cmds, out);
    Release(node, std::move(*c), st.ok());
    if (st.ok()) return st;
    DropIdle(node);
    if (!reused || attempt > 0) return st.Annotate("redis " + node.ToString());
  }
}

RedisExecutor::Next RedisExecutor::Attempt(const RedisAddress& node, bool asking,
                                           const std::vector<RedisArgv>& cmds,
                                           std::vector<RedisReply>* out, Status* last,
                                           std::optional<RedisRedirect>* redirect) {
  redirect->reset();
  bool reused = false;
  Result<RedisContext> c = Borrow(node, &reused);
  if (!c.ok()) {
    *last = WithOrigin(c.status(), node);
    if (!RedisRetryable(*last)) return Next::kDone;
    topology_->MarkStale();  // the node may be gone for good (failover)
    return Next::kBackOff;
  }
  std::vector<RedisArgv> batch;
  if (asking) batch.push_back({"ASKING"});
  batch.insert(batch.end(), cmds.begin(), cmds.end());
  Status st = RunRedis(c->get(), batch, out);
  Release(node, std::move(*c), st.ok());
  if (!st.ok()) {
    *last = st.Annotate("redis " + node.ToString());
    DropIdle(node);  // the node went away: its other pooled links are stale too
    if (reused) return Next::kRetryNow;
    topology_->MarkStale();
    return Next::kBackOff;
  }
  if (asking) out->erase(out->begin());
  const std::string err = RedisErrorText(out->front().get());
  RedisRedirect r;
  if (!err.empty() && ParseRedisRedirect(err, &r)) {
    *redirect = r;
    if (!r.ask) topology_->NoteMoved(r.slot, r.node);
    return Next::kRetryNow;
  }
  if (!err.empty() && RedisTransientError(err)) {
    *last = RedisErrorStatus("redis " + node.ToString() + " " + cmds.front()[0], err);
    if (RedisTopologyError(err)) topology_->MarkStale();
    return Next::kBackOff;
  }
  for (size_t i = 0; i < out->size(); ++i) {
    const std::string e = RedisErrorText((*out)[i].get());
    if (!e.empty()) {
      *last = RedisErrorStatus("redis " + cmds[i][0], e);
      return Next::kDone;
    }
  }
  *last = Status::OK();
  return Next::kDone;
}

Status RedisExecutor::Run(int slot, const std::vector<RedisArgv>& cmds,
                          std::vector<RedisReply>* out, Route* route) {
  const Deadline retry_until = Deadline::AfterMs(config_.retry_ms);
  int64_t backoff = kBackoffFirstMs;
  int redirects = 0;
  int stale_retries = 0;
  std::optional<RedisAddress> target;  // from MOVED or ASK
  std::optional<RedisAddress> asked_by;
  bool asking = false;
  Status last;
  while (true) {
    RedisAddress node;
    if (target) {
      node = *target;
    } else {
      Result<RedisAddress> n = topology_->NodeFor(slot);
      if (!n.ok() && !RedisRetryable(n.status())) return n.status();
      if (n.ok()) node = *n;
      last = n.status();
    }
    Next next = Next::kBackOff;
    std::optional<RedisRedirect> redirect;
    if (!node.host.empty()) next = Attempt(node, asking, cmds, out, &last, &redirect);
    if (next == Next::kDone) {
      if (last.ok() && route != nullptr) *route = Route{node, asked_by};
      return last;
    }
    if (next == Next::kRetryNow && redirect) {
      if (++redirects > kMaxRedirects)
        return Status(DYAD_RC_BADRPC, "redis " + cmds.front()[0] + ": too many redirections");
      asked_by = redirect->ask ? std::optional<RedisAddress>(node) : std::nullopt;
      asking = redirect->ask;
      target = redirect->node;
      continue;
    }
    if (next == Next::kRetryNow && ++stale_retries <= static_cast<int>(kMaxIdlePerNode)) continue;
    target.reset();
    asking = false;
    asked_by.reset();
    if (retry_until.expired()) return last;
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::max<int64_t>(1, retry_until.RemainingMs(backoff))));
    backoff = std::min(backoff * 2, kBackoffMaxMs);
  }
}

}  // namespace dyad
