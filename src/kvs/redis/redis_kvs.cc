// redis_kvs.cc: the Redis metadata store (see redis_kvs.h for the design).
#include "kvs/redis/redis_kvs.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include "common/thread_annotations.h"
#include "kvs/redis/redis_slot.h"

namespace dyad {
namespace {

// SET and publish in one script, so the write and its notification are one
// atomic step on the server: a subscriber that gets the message is never
// ahead of a reader, and no writer can interleave between the two.
// The namespace's watch channel (ARGV[2]) gets "<key length>:<key><value>"
// (ARGV[3]) in the same step, for Kvs::Watch (redis_watch.h).
constexpr const char kPutScript[] =
    "redis.call('SET', KEYS[1], ARGV[1]) "
    "redis.call('PUBLISH', KEYS[1], ARGV[1]) "
    "redis.call('PUBLISH', ARGV[2], ARGV[3]) "
    "return 1";
// The same in a cluster. The key's own channel is sharded (SPUBLISH): the
// message stays on the key's shard, where its waiters are subscribed
// (redis_subscriber.h). The watch channel stays classic: the cluster
// propagates that PUBLISH to every node, so a namespace watcher may listen
// on any node (redis_watch.h), and it leaves in the same atomic step.
constexpr const char kPutScriptSharded[] =
    "redis.call('SET', KEYS[1], ARGV[1]) "
    "redis.call('SPUBLISH', KEYS[1], ARGV[1]) "
    "redis.call('PUBLISH', ARGV[2], ARGV[3]) "
    "return 1";

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// Percent-encodes the bytes of `special` (and '%') in a namespace.
std::string EncodeNamespace(const std::string& ns, const char* special) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(ns.size());
  for (unsigned char c : ns) {
    if (c == '%' || (c != 0 && std::strchr(special, c) != nullptr)) {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out;
}

// SCAN MATCH treats * ? [ ] and \ specially; a literal prefix escapes them.
std::string GlobEscape(const std::string& literal) {
  std::string out;
  out.reserve(literal.size());
  for (char c : literal) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

Result<std::optional<std::string>> ValueOf(const redisReply* r, const char* what) {
  if (r->type == REDIS_REPLY_NIL) return std::optional<std::string>();
  if (r->type == REDIS_REPLY_STRING) return std::optional<std::string>(std::string(r->str, r->len));
  const std::string err = RedisErrorText(r);
  if (!err.empty()) return RedisErrorStatus(std::string("redis ") + what, err);
  return Status(DYAD_RC_BADRPC, std::string("redis ") + what + ": unexpected reply type " +
                                    std::to_string(r->type));
}

}  // namespace

Result<std::unique_ptr<RedisKvs>> RedisKvs::Open(const std::string& url,
                                                 const KvsOptions& options) {
  Result<RedisConfig> cfg = ParseRedisUrl(url);
  if (!cfg.ok()) return cfg.status();
  DYAD_RETURN_IF_ERROR(LoadRedisPasswords(&*cfg));
  // Without an explicit timeout_ms in the URL the caller's RPC bound applies.
  if (!cfg->command_timeout_set && options.rpc_timeout_ms > 0) {
    cfg->command_timeout_ms = options.rpc_timeout_ms;
  }
  return std::unique_ptr<RedisKvs>(new RedisKvs(std::move(*cfg)));
}

RedisKvs::RedisKvs(RedisConfig config)
    : config_(std::move(config)),
      topology_(config_),
      exec_(config_, &topology_),
      subscriber_(config_, &exec_),
      watcher_(&exec_) {}

RedisKvs::~RedisKvs() { Shutdown(); }

void RedisKvs::Shutdown() {
  shutdown_.store(true);
  subscriber_.Shutdown();
  watcher_.Shutdown();
  exec_.Shutdown();
}

std::string RedisKvs::RedisKey(const std::string& ns, const std::string& key) const {
  if (config_.mode == RedisMode::kCluster)
    return config_.prefix + ":" + EncodeNamespace(ns, ":{}") + ":" + key;
  return config_.prefix + ":{" + EncodeNamespace(ns, "{}") + "}:" + key;
}

std::string RedisKvs::WatchChannel(const std::string& ns) const {
  // "PREFIX:{NS}#watch": never a key's name nor a key's channel, since
  // those always have ':' right after the namespace.
  std::string base = RedisKey(ns, "");
  base.pop_back();
  return base + "#watch";
}

Result<KvsWatchTicket> RedisKvs::Watch(const std::string& ns, KvsWatchCallback on_change) {
  if (!on_change) return Status(DYAD_RC_BADREQUEST, "watch without a callback");
  if (shutdown_.load()) return Status(DYAD_RC_CANCELLED, "metadata store is shutting down");
  return watcher_.Watch(ns, WatchChannel(ns), std::move(on_change));
}

void RedisKvs::Unwatch(KvsWatchTicket ticket) { watcher_.Unwatch(ticket); }

int RedisKvs::SlotOf(const std::string& rkey) const {
  return config_.mode == RedisMode::kCluster ? RedisKeySlot(rkey) : -1;
}

Status RedisKvs::CheckReplicated(const std::vector<RedisReply>& replies) const {
  if (config_.wait_replicas == 0) return Status::OK();
  const redisReply* acked = replies.back().get();
  if (acked->type == REDIS_REPLY_INTEGER && acked->integer >= config_.wait_replicas)
    return Status::OK();
  const long long got = acked->type == REDIS_REPLY_INTEGER ? acked->integer : 0;
  return Status(DYAD_RC_BADCOMMIT,
                "redis: written on the primary but acknowledged by " + std::to_string(got) +
                    " of the " + std::to_string(config_.wait_replicas) + " replicas asked for (" +
                    "wait_replicas) within " + std::to_string(config_.wait_replicas_ms) +
                    " ms: a failover now could lose it");
}

Status RedisKvs::Put(const std::string& ns, const std::string& key, const std::string& value) {
  const std::string rkey = RedisKey(ns, key);
  const bool cluster = config_.mode == RedisMode::kCluster;
  std::vector<RedisArgv> cmds{{"EVAL", cluster ? kPutScriptSharded : kPutScript, "1", rkey, value,
                               WatchChannel(ns), RedisWatcher::EncodeMessage(key, value)}};
  if (config_.wait_replicas > 0) {
    cmds.push_back(
        {"WAIT", std::to_string(config_.wait_replicas), std::to_string(config_.wait_replicas_ms)});
  }
  std::vector<RedisReply> replies;
  RedisExecutor::Route route;
  DYAD_RETURN_IF_ERROR(exec_.Run(SlotOf(rkey), cmds, &replies, &route));
  if (route.asked_by) {
    // The slot is migrating: its subscribers are still on the old owner,
    // which serves shard channels until the migration ends. Best effort:
    // if this fails the migration has ended, and the subscribers move to
    // the new owner and read the key there.
    std::vector<RedisReply> ignored;
    Status st = exec_.RunOn(*route.asked_by, {{"SPUBLISH", rkey, value}}, &ignored);
    (void)st;
  }
  return CheckReplicated(replies);
}

Result<std::optional<std::string>> RedisKvs::GetRaw(const std::string& rkey) {
  std::vector<RedisReply> replies;
  DYAD_RETURN_IF_ERROR(exec_.Run(SlotOf(rkey), {{"GET", rkey}}, &replies));
  return ValueOf(replies[0].get(), "GET");
}

Result<std::optional<std::string>> RedisKvs::Get(const std::string& ns, const std::string& key) {
  return GetRaw(RedisKey(ns, key));
}

Status RedisKvs::Remove(const std::string& ns, const std::string& key) {
  const std::string rkey = RedisKey(ns, key);
  std::vector<RedisReply> replies;
  return exec_.Run(SlotOf(rkey), {{"DEL", rkey}}, &replies);
}

// --- List ------------------------------------------------------------------------

Result<std::vector<std::string>> RedisKvs::ScanKeys(const std::string& pattern,
                                                    const std::string& base,
                                                    const std::string& prefix) {
  Result<std::vector<RedisAddress>> masters = topology_.Masters();
  if (!masters.ok()) return masters.status();
  // SCAN may return a key twice and in any order: collect into a set.
  std::set<std::string> keys;
  for (const RedisAddress& node : *masters) {
    std::string cursor = "0";
    do {
      std::vector<RedisReply> replies;
      DYAD_RETURN_IF_ERROR(exec_.RunOn(
          node, {{"SCAN", cursor, "MATCH", pattern, "COUNT", std::to_string(kScanCount)}},
          &replies));
      const redisReply* r = replies[0].get();
      const std::string err = RedisErrorText(r);
      if (!err.empty()) return RedisErrorStatus("redis " + node.ToString() + " SCAN", err);
      if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
          r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY) {
        return Status(DYAD_RC_BADRPC, "redis SCAN: unexpected reply");
      }
      cursor.assign(r->element[0]->str, r->element[0]->len);
      const redisReply* batch = r->element[1];
      for (size_t i = 0; i < batch->elements; ++i) {
        if (batch->element[i]->type != REDIS_REPLY_STRING) continue;
        std::string k(batch->element[i]->str, batch->element[i]->len);
        if (StartsWith(k, base) && StartsWith(k.substr(base.size()), prefix)) keys.insert(k);
      }
    } while (cursor != "0");
  }
  return std::vector<std::string>(keys.begin(), keys.end());
}

Result<KvsValues> RedisKvs::MultiGet(const std::string& ns, const std::vector<std::string>& keys) {
  std::vector<std::string> rkeys;
  rkeys.reserve(keys.size());
  for (const std::string& key : keys) rkeys.push_back(RedisKey(ns, key));
  return GetMany(rkeys);
}

Status RedisKvs::FetchValues(const std::vector<std::string>& keys, size_t base_len,
                             std::vector<KvsEntry>* out) {
  Result<KvsValues> values = GetMany(keys);
  if (!values.ok()) return values.status();
  for (size_t i = 0; i < keys.size(); ++i)  // a key removed since the SCAN is left out
    if ((*values)[i]) out->emplace_back(keys[i].substr(base_len), std::move(*(*values)[i]));
  return Status::OK();
}

Result<KvsValues> RedisKvs::GetMany(const std::vector<std::string>& rkeys) {
  if (config_.mode == RedisMode::kCluster) return GetManyCluster(rkeys);
  KvsValues values;
  values.reserve(rkeys.size());
  for (size_t start = 0; start < rkeys.size(); start += kMgetBatch) {
    const size_t end = std::min(rkeys.size(), start + kMgetBatch);
    RedisArgv argv{"MGET"};
    argv.insert(argv.end(), rkeys.begin() + static_cast<long>(start),
                rkeys.begin() + static_cast<long>(end));
    std::vector<RedisReply> replies;
    DYAD_RETURN_IF_ERROR(exec_.Run(-1, {argv}, &replies));
    const redisReply* r = replies[0].get();
    if (r->type != REDIS_REPLY_ARRAY || r->elements != end - start) {
      return Status(DYAD_RC_BADRPC, "redis MGET: unexpected reply");
    }
    for (size_t i = 0; i < r->elements; ++i) {
      const redisReply* v = r->element[i];
      values.push_back(v->type == REDIS_REPLY_STRING
                           ? std::optional<std::string>(std::string(v->str, v->len))
                           : std::nullopt);
    }
  }
  return values;
}

Result<KvsValues> RedisKvs::GetManyCluster(const std::vector<std::string>& rkeys) {
  // MGET needs all its keys in one slot, and file keys spread over all
  // slots; so GETs pipelined per master (one round trip each) instead. A
  // key that moved since (MOVED, ASK) is read alone, following the
  // redirection.
  std::map<RedisAddress, std::vector<size_t>> by_node;
  for (size_t i = 0; i < rkeys.size(); ++i) {
    Result<RedisAddress> node = topology_.NodeFor(RedisKeySlot(rkeys[i]));
    if (!node.ok()) return node.status();
    by_node[*node].push_back(i);
  }
  KvsValues values(rkeys.size());
  for (const auto& [node, items] : by_node) {
    for (size_t start = 0; start < items.size(); start += kMgetBatch) {
      const size_t end = std::min(items.size(), start + kMgetBatch);
      std::vector<RedisArgv> gets;
      for (size_t k = start; k < end; ++k) gets.push_back({"GET", rkeys[items[k]]});
      std::vector<RedisReply> replies;
      DYAD_RETURN_IF_ERROR(exec_.RunOn(node, gets, &replies));
      for (size_t k = start; k < end; ++k) {
        Result<std::optional<std::string>> v = ValueOf(replies[k - start].get(), "GET");
        if (!v.ok()) v = GetRaw(rkeys[items[k]]);
        if (!v.ok()) return v.status();
        values[items[k]] = std::move(*v);
      }
    }
  }
  return values;
}

Result<std::vector<KvsEntry>> RedisKvs::List(const std::string& ns, const std::string& prefix,
                                             uint32_t limit) {
  const std::string base = RedisKey(ns, "");
  const std::string pattern = GlobEscape(base) + GlobEscape(prefix) + "*";
  const Deadline retry_until = Deadline::AfterMs(config_.retry_ms);
  int64_t backoff = RedisExecutor::kBackoffFirstMs;
  while (true) {
    Result<std::vector<std::string>> keys = ScanKeys(pattern, base, prefix);
    Status st = keys.status();
    if (keys.ok()) {
      // Sorting the Redis keys sorts the user keys: they share `base`.
      if (limit != 0 && keys->size() > limit) keys->resize(limit);
      std::vector<KvsEntry> out;
      st = FetchValues(*keys, base.size(), &out);
      if (st.ok()) return out;
    }
    // A node restarting or failing over mid-listing: list again.
    if (!RedisRetryable(st) || retry_until.expired()) return st;
    topology_.MarkStale();
    std::this_thread::sleep_for(std::chrono::milliseconds(retry_until.RemainingMs(backoff)));
    backoff = std::min(backoff * 2, RedisExecutor::kBackoffMaxMs);
  }
}

// --- waits -----------------------------------------------------------------------

Result<KvsWaitTicket> RedisKvs::StartWait(const std::string& ns, const std::string& key,
                                          Deadline deadline, KvsWaitCallback done) {
  const std::string rkey = RedisKey(ns, key);
  return subscriber_.Add(rkey, SlotOf(rkey), deadline,
                         "wait for '" + key + "' in namespace '" + ns + "'", std::move(done));
}

void RedisKvs::CancelWait(KvsWaitTicket ticket) {
  subscriber_.Cancel(ticket, Status(DYAD_RC_CANCELLED, "wait cancelled"));
}

Result<std::string> RedisKvs::Wait(const std::string& ns, const std::string& key, Deadline deadline,
                                   const CancelFn& cancel) {
  const std::string what = "wait for '" + key + "' in namespace '" + ns + "'";
  // Most waits find the key: one GET, no subscription.
  Result<std::optional<std::string>> first = GetRaw(RedisKey(ns, key));
  if (first.ok() && first->has_value()) return std::move(**first);
  if (!first.ok() && !RedisRetryable(first.status())) return first.status().Annotate(what);
  if (shutdown_.load())
    return Status(DYAD_RC_CANCELLED, what + ": the metadata store is shutting down");
  if (deadline.expired()) {
    const Status& reason = first.status();
    return Status(DYAD_RC_TIMEOUT, what + ": not put before the deadline" +
                                       (reason.ok() ? "" : " (" + reason.message() + ")"))
        .WithCause(reason.ok() ? DYAD_RC_OK : DYAD_RC_CONNLOST);
  }
  return Kvs::Wait(ns, key, deadline, cancel);
}

Result<std::unique_ptr<Kvs>> OpenKvs_redis(const std::string& url, const KvsOptions& options) {
  if (url == "redis") {
    return Status(DYAD_RC_BADREQUEST,
                  std::string("metadata store 'redis' needs an address: ") + kRedisUrlForms);
  }
  Result<std::unique_ptr<RedisKvs>> kvs = RedisKvs::Open(url, options);
  if (!kvs.ok()) return kvs.status();
  return std::unique_ptr<Kvs>(std::move(*kvs));
}

}  // namespace dyad
