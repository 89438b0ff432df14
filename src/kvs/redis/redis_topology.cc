// redis_topology.cc: who serves what (see redis_topology.h).
#include "kvs/redis/redis_topology.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <set>

#include "kvs/redis/redis_slot.h"

namespace dyad {
namespace {

// One command on a fresh connection (lookups are rare; no pool needed).
Result<RedisReply> AskOnce(const RedisAddress& node, const RedisLogin& login, int64_t connect_ms,
                           int64_t command_ms, const RedisArgv& argv) {
  Result<RedisContext> c = DialRedis(node, login, connect_ms, command_ms);
  if (!c.ok()) return c.status();
  std::vector<RedisReply> replies;
  DYAD_RETURN_IF_ERROR(RunRedis(c->get(), {argv}, &replies));
  const std::string err = RedisErrorText(replies[0].get());
  if (!err.empty()) return RedisErrorStatus("redis " + node.ToString() + " " + argv[0], err);
  return std::move(replies[0]);
}

}  // namespace

RedisTopology::RedisTopology(const RedisConfig& config)
    : config_(config), login_{config.user, config.password, config.db} {
  if (config_.mode == RedisMode::kSingle) primary_ = config_.nodes.front();
  if (config_.mode == RedisMode::kSentinel) sentinels_ = config_.nodes;
  cluster_.owner.assign(kRedisSlots, -1);
}

RedisLogin RedisTopology::sentinel_login() const {
  return RedisLogin{"", config_.sentinel_password, 0};
}

std::vector<RedisAddress> RedisTopology::Sentinels() const {
  MutexLock lk(mu_);
  return sentinels_;
}

bool RedisTopology::KnownLocked() const {
  if (config_.mode != RedisMode::kCluster) return primary_.has_value();
  return !cluster_.nodes.empty();
}

std::optional<RedisAddress> RedisTopology::CachedNodeFor(int slot) const {
  MutexLock lk(mu_);
  if (config_.mode != RedisMode::kCluster) return primary_;
  if (cluster_.nodes.empty()) return std::nullopt;
  const int idx = slot >= 0 && slot < kRedisSlots ? cluster_.owner[static_cast<size_t>(slot)] : 0;
  if (idx < 0) return std::nullopt;
  return cluster_.nodes[static_cast<size_t>(idx)];
}

Result<RedisAddress> RedisTopology::NodeFor(int slot) {
  if (stale_.load()) {
    Status st = Refresh();
    (void)st;  // a failed lookup leaves the old view, still worth a try
  }
  if (std::optional<RedisAddress> n = CachedNodeFor(slot)) return *n;
  DYAD_RETURN_IF_ERROR(Refresh());
  if (std::optional<RedisAddress> n = CachedNodeFor(slot)) return *n;
  return Status(DYAD_RC_CONNLOST, "redis cluster: no node serves slot " + std::to_string(slot));
}

Result<std::vector<RedisAddress>> RedisTopology::Masters() {
  MutexLock lk(mu_);
  if (!KnownLocked() || stale_.load()) {
    lk.Unlock();
    DYAD_RETURN_IF_ERROR(Refresh());
    lk.Lock();
  }
  if (config_.mode != RedisMode::kCluster) return std::vector<RedisAddress>{*primary_};
  std::set<int16_t> used(cluster_.owner.begin(), cluster_.owner.end());
  used.erase(-1);
  if (used.size() != cluster_.nodes.size() || cluster_.owner[0] < 0 ||
      std::count(cluster_.owner.begin(), cluster_.owner.end(), -1) > 0) {
    // Some slots are not covered: listing would silently miss keys.
    return Status(DYAD_RC_CONNLOST, "redis cluster: not every slot has a master right now");
  }
  std::vector<RedisAddress> out;
  for (int16_t i : used) out.push_back(cluster_.nodes[static_cast<size_t>(i)]);
  return out;
}

Result<std::vector<RedisAddress>> RedisTopology::AnyNodes() {
  if (config_.mode != RedisMode::kCluster) {
    Result<RedisAddress> node = NodeFor(0);
    if (!node.ok()) return node.status();
    return std::vector<RedisAddress>{*node};
  }
  if (stale_.load()) {
    Status st = Refresh();
    (void)st;  // the seeds and the old view are still worth a try
  }
  std::vector<RedisAddress> out;
  {
    MutexLock lk(mu_);
    out = cluster_.nodes;
  }
  for (const RedisAddress& seed : config_.nodes)
    if (std::find(out.begin(), out.end(), seed) == out.end()) out.push_back(seed);
  return out;
}

void RedisTopology::NoteMoved(int slot, const RedisAddress& node) {
  if (slot < 0 || slot >= kRedisSlots) return;
  MutexLock lk(mu_);
  auto it = std::find(cluster_.nodes.begin(), cluster_.nodes.end(), node);
  if (it == cluster_.nodes.end()) {
    if (cluster_.nodes.size() >= 1000) return;  // untrusted input cannot grow this without end
    cluster_.nodes.push_back(node);
    it = cluster_.nodes.end() - 1;
  }
  const auto idx = static_cast<int16_t>(it - cluster_.nodes.begin());
  if (cluster_.owner[static_cast<size_t>(slot)] != idx) {
    cluster_.owner[static_cast<size_t>(slot)] = idx;
    BumpLocked();
  }
  // One slot moved: usually part of a larger change; look the rest up soon.
  stale_.store(true);
}

void RedisTopology::SetPrimary(const RedisAddress& node) {
  MutexLock lk(mu_);
  if (primary_ != node) {
    primary_ = node;
    BumpLocked();
  }
}

Status RedisTopology::Refresh() {
  if (config_.mode == RedisMode::kSingle) return Status::OK();
  MutexLock serial(refresh_mu_);
  {
    MutexLock lk(mu_);
    const auto since = SteadyClock::now() - last_attempt_;
    if (since < std::chrono::milliseconds(kMinRefreshMs)) return last_status_;
  }
  stale_.store(false);
  Status st = config_.mode == RedisMode::kCluster ? RefreshCluster() : RefreshSentinel();
  MutexLock lk(mu_);
  last_attempt_ = SteadyClock::now();
  last_status_ = st;
  if (!st.ok()) stale_.store(true);
  return st;
}

// --- cluster -------------------------------------------------------------------

std::string RedisTopology::AddressOrigin(const RedisAddress& node) const {
  if (config_.mode != RedisMode::kCluster) return "";
  if (std::find(config_.nodes.begin(), config_.nodes.end(), node) != config_.nodes.end()) return "";
  return " (" + node.ToString() +
         " is not in the store URL: it comes from the cluster's own topology, CLUSTER SLOTS, "
         "i.e. the address the cluster was created with or announces. A cluster created on "
         "127.0.0.1 works on one host only: create it with addresses every host can reach "
         "(redis-cli --cluster create HOST:PORT ...) or set cluster-announce-ip on each Redis "
         "node; see docs/redis.md)";
}

Result<RedisTopology::ClusterView> RedisTopology::AskClusterSlots(const RedisAddress& node) {
  Result<RedisReply> r =
      AskOnce(node, login_, std::min(config_.connect_timeout_ms, kLookupConnectMs),
              config_.command_timeout_ms, {"CLUSTER", "SLOTS"});
  if (!r.ok()) return r.status();
  const redisReply* top = r->get();
  if (top->type != REDIS_REPLY_ARRAY)
    return Status(DYAD_RC_BADRPC, "redis " + node.ToString() + ": CLUSTER SLOTS: unexpected reply");
  ClusterView view;
  view.owner.assign(kRedisSlots, -1);
  for (size_t i = 0; i < top->elements; ++i) {
    const redisReply* range = top->element[i];
    if (range->type != REDIS_REPLY_ARRAY || range->elements < 3 ||
        range->element[0]->type != REDIS_REPLY_INTEGER ||
        range->element[1]->type != REDIS_REPLY_INTEGER ||
        range->element[2]->type != REDIS_REPLY_ARRAY || range->element[2]->elements < 2 ||
        range->element[2]->element[1]->type != REDIS_REPLY_INTEGER) {
      return Status(DYAD_RC_BADRPC, "redis " + node.ToString() + ": malformed CLUSTER SLOTS");
    }
    const long long lo = range->element[0]->integer;
    const long long hi = range->element[1]->integer;
    RedisAddress master;
    master.host = RedisText(range->element[2]->element[0]);
    master.port = static_cast<int>(range->element[2]->element[1]->integer);
    // An empty or "?" endpoint means "the address you reached me at".
    if (master.host.empty() || master.host == "?") master.host = node.host;
    if (lo < 0 || hi >= kRedisSlots || lo > hi || master.port <= 0 || master.port > 65535)
      return Status(DYAD_RC_BADRPC, "redis " + node.ToString() + ": bad range in CLUSTER SLOTS");
    auto it = std::find(view.nodes.begin(), view.nodes.end(), master);
    if (it == view.nodes.end()) {
      view.nodes.push_back(master);
      it = view.nodes.end() - 1;
    }
    const auto idx = static_cast<int16_t>(it - view.nodes.begin());
    for (long long s = lo; s <= hi; ++s) view.owner[static_cast<size_t>(s)] = idx;
  }
  if (view.nodes.empty())
    return Status(DYAD_RC_CONNLOST, "redis " + node.ToString() + ": the cluster has no slots yet");
  return view;
}

Status RedisTopology::RefreshCluster() {
  std::vector<RedisAddress> candidates;
  {
    MutexLock lk(mu_);
    candidates = cluster_.nodes;
  }
  for (const RedisAddress& seed : config_.nodes)
    if (std::find(candidates.begin(), candidates.end(), seed) == candidates.end())
      candidates.push_back(seed);
  Status last(DYAD_RC_CONNLOST, "redis cluster: no node known");
  for (const RedisAddress& node : candidates) {
    Result<ClusterView> view = AskClusterSlots(node);
    if (!view.ok()) {
      if (view.status().code() == DYAD_RC_AUTH) return view.status();
      last = view.status();
      continue;
    }
    MutexLock lk(mu_);
    bool changed = view->nodes.size() != cluster_.nodes.size();
    for (int s = 0; s < kRedisSlots && !changed; ++s) {
      const int16_t a = view->owner[static_cast<size_t>(s)];
      const int16_t b = cluster_.owner[static_cast<size_t>(s)];
      changed = (a < 0) != (b < 0) || (a >= 0 && view->nodes[static_cast<size_t>(a)] !=
                                                     cluster_.nodes[static_cast<size_t>(b)]);
    }
    cluster_ = std::move(*view);
    if (changed) BumpLocked();
    return Status::OK();
  }
  return last.Annotate("redis cluster: reading the slot map");
}

// --- sentinel ------------------------------------------------------------------

Result<RedisAddress> RedisTopology::AskSentinel(const RedisAddress& sentinel) {
  Result<RedisReply> r =
      AskOnce(sentinel, sentinel_login(), std::min(config_.connect_timeout_ms, kLookupConnectMs),
              std::min<int64_t>(config_.command_timeout_ms, 5000),
              {"SENTINEL", "get-master-addr-by-name", config_.master_name});
  if (!r.ok()) return r.status();
  const redisReply* a = r->get();
  if (a->type == REDIS_REPLY_NIL) {
    return Status(DYAD_RC_BADREQUEST, "sentinel " + sentinel.ToString() + " monitors no primary '" +
                                          config_.master_name + "'");
  }
  if (a->type != REDIS_REPLY_ARRAY || a->elements != 2) {
    return Status(DYAD_RC_BADRPC, "sentinel " + sentinel.ToString() + ": unexpected reply");
  }
  RedisAddress primary;
  primary.host = RedisText(a->element[0]);
  primary.port = std::atoi(RedisText(a->element[1]).c_str());
  if (primary.host.empty() || primary.port <= 0 || primary.port > 65535)
    return Status(DYAD_RC_BADRPC, "sentinel " + sentinel.ToString() + ": bad primary address");
  return primary;
}

Status RedisTopology::ConfirmPrimary(const RedisAddress& node) {
  Result<RedisReply> r =
      AskOnce(node, login_, std::min(config_.connect_timeout_ms, kLookupConnectMs),
              std::min<int64_t>(config_.command_timeout_ms, 5000), {"ROLE"});
  // An ACL user without +role: trust the sentinel; a write that lands on a
  // replica gets READONLY and makes the next lookup.
  if (!r.ok() && r.status().message().find("NOPERM") != std::string::npos) return Status::OK();
  if (!r.ok()) return r.status();
  const redisReply* role = r->get();
  if (role->type != REDIS_REPLY_ARRAY || role->elements < 1 ||
      RedisText(role->element[0]) != "master")
    return Status(DYAD_RC_CONNLOST, "redis " + node.ToString() + " is not a primary (yet)");
  return Status::OK();
}

Status RedisTopology::RefreshSentinel() {
  const std::vector<RedisAddress> sentinels = Sentinels();
  Status last(DYAD_RC_CONNLOST, "no sentinel reachable");
  for (size_t i = 0; i < sentinels.size(); ++i) {
    Result<RedisAddress> primary = AskSentinel(sentinels[i]);
    if (!primary.ok()) {
      if (primary.status().code() == DYAD_RC_AUTH) return primary.status();
      last = primary.status();
      continue;
    }
    Status st = ConfirmPrimary(*primary);
    if (!st.ok()) {
      if (st.code() == DYAD_RC_AUTH) return st;
      last = st.Annotate("sentinel " + sentinels[i].ToString() + " names " + primary->ToString());
      continue;
    }
    MutexLock lk(mu_);
    // The sentinel that answered is asked first next time.
    auto it = std::find(sentinels_.begin(), sentinels_.end(), sentinels[i]);
    if (it != sentinels_.end()) std::rotate(sentinels_.begin(), it, it + 1);
    if (primary_ != *primary) {
      primary_ = *primary;
      BumpLocked();
    }
    return Status::OK();
  }
  return last.Annotate("redis sentinel: finding primary '" + config_.master_name + "'");
}

}  // namespace dyad
