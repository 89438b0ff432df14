// redis_cluster.h: a real Redis Cluster and a real Sentinel-managed
// primary for tests, on 127.0.0.1 (needs hiredis: include only under
// DYAD_HAVE_REDIS).
//
// RedisCluster starts N `redis-server --cluster-enabled yes` nodes
// (each a RedisServer: its own free port, temporary directory holding
// nodes.conf, PR_SET_PDEATHSIG) and joins them with
// `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`, then
// waits (bounded) until every node reports cluster_state:ok and the same
// slot map. RedisSentinel starts a primary (append-only file, fsync
// always), replicas and one Redis Sentinel (quorum 1, failure detection
// after 1 s), and waits until the replica is in sync and the sentinel
// knows both. Destructors kill every process and remove every directory,
// also when a test fails half-way. BusDrained waits until the cluster bus
// has delivered earlier classic publications (PUBLISH reaches other nodes
// asynchronously).
//
// Threading: use from one thread (the test body).
#pragma once

#include <fcntl.h>
#include <hiredis/hiredis.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "emu/redis_server.h"

namespace dyad {
namespace emu {

inline std::string FindRedisCli() {
  for (const char* p : {"/usr/bin/redis-cli", "/usr/local/bin/redis-cli"})
    if (::access(p, X_OK) == 0) return p;
  return "";
}

// Runs `argv` with its output in `log`; the exit code, or -1 when it had to
// be killed after `timeout_ms`.
inline int RunBounded(const std::vector<std::string>& argv, const std::string& log,
                      int timeout_ms) {
  const pid_t pid = ::fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  for (int waited = 0; waited < timeout_ms; waited += 10) {
    int status = 0;
    if (::waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return -1;
}

// One command on a fresh connection; the reply rendered as text: strings
// as is, nil "(nil)", integers in decimal, errors "ERR:<text>", arrays
// joined by ",".
inline std::string RedisCommand(int port, const std::vector<std::string>& argv) {
  timeval tv{2, 0};
  redisContext* c = redisConnectWithTimeout("127.0.0.1", port, tv);
  if (c == nullptr || c->err != 0) {
    if (c != nullptr) redisFree(c);
    return "(no connection)";
  }
  redisSetTimeout(c, tv);
  std::vector<const char*> a;
  std::vector<size_t> l;
  for (const std::string& s : argv) {
    a.push_back(s.data());
    l.push_back(s.size());
  }
  redisReply* r =
      static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(a.size()), a.data(), l.data()));
  std::function<std::string(const redisReply*)> render = [&](const redisReply* x) {
    std::string out;
    if (x->type == REDIS_REPLY_STRING || x->type == REDIS_REPLY_STATUS) out.assign(x->str, x->len);
    if (x->type == REDIS_REPLY_ERROR) out = "ERR:" + std::string(x->str, x->len);
    if (x->type == REDIS_REPLY_NIL) out = "(nil)";
    if (x->type == REDIS_REPLY_INTEGER) out = std::to_string(x->integer);
    if (x->type == REDIS_REPLY_ARRAY)
      for (size_t i = 0; i < x->elements; ++i) out += (i ? "," : "") + render(x->element[i]);
    return out;
  };
  std::string out = r == nullptr ? "(io error)" : render(r);
  if (r != nullptr) freeReplyObject(r);
  redisFree(c);
  return out;
}

// Returns once each node at `ports` has passed on every message that the
// masters at `from` published on `channel` before the call: each of those
// masters publishes a marker, and the cluster bus carries one master's
// messages to a node in order. False on an error or after `ms` per read.
inline bool BusDrained(const std::vector<int>& ports, const std::vector<int>& from,
                       const std::string& channel, int ms) {
  const timeval tv{ms / 1000, (ms % 1000) * 1000};
  std::vector<redisContext*> subs;
  bool ok = true;
  for (int port : ports) {
    redisContext* c = redisConnectWithTimeout("127.0.0.1", port, tv);
    if (c == nullptr || c->err != 0) {
      if (c != nullptr) redisFree(c);
      ok = false;
      break;
    }
    redisSetTimeout(c, tv);
    subs.push_back(c);
    void* r = redisCommand(c, "SUBSCRIBE %b", channel.data(), channel.size());
    ok = ok && r != nullptr;
    if (r != nullptr) freeReplyObject(r);
  }
  if (ok)
    for (int port : from) RedisCommand(port, {"PUBLISH", channel, "marker"});
  for (redisContext* c : subs) {
    for (size_t got = 0; ok && got < from.size();) {
      void* raw = nullptr;
      if (redisGetReply(c, &raw) != REDIS_OK || raw == nullptr) {
        ok = false;
        break;
      }
      const redisReply* r = static_cast<redisReply*>(raw);
      if (r->type == REDIS_REPLY_ARRAY && r->elements == 3 &&
          r->element[2]->type == REDIS_REPLY_STRING &&
          std::string(r->element[2]->str, r->element[2]->len) == "marker")
        ++got;
      freeReplyObject(raw);
    }
    redisFree(c);
  }
  return ok;
}

class RedisCluster {
 public:
  explicit RedisCluster(int masters = 3) {
    for (int i = 0; i < masters; ++i) {
      nodes_.push_back(std::make_unique<RedisServer>(
          "cluster-enabled yes\ncluster-config-file nodes.conf\ncluster-node-timeout 2000\n"
          "appendonly no\n"));
    }
  }

  bool available() const { return nodes_[0]->available() && !FindRedisCli().empty(); }
  int port(size_t i) const { return nodes_[i]->port(); }
  size_t size() const { return nodes_.size(); }
  RedisServer& node(size_t i) { return *nodes_[i]; }
  std::string url(const std::string& options = "") const {
    std::string u = "redis+cluster://";
    for (size_t i = 0; i < nodes_.size(); ++i)
      u += (i ? ",127.0.0.1:" : "127.0.0.1:") + std::to_string(nodes_[i]->port());
    return u + options;
  }

  // Starts the nodes, creates the cluster with redis-cli and waits for it
  // (at most ~30 s in all). Returns an error text, empty on success.
  std::string Start() {
    std::vector<std::string> create{FindRedisCli(), "--cluster", "create"};
    for (auto& n : nodes_) {
      if (n->port() <= 0) n->UsePort(FreeClusterPort());
      const std::string error = n->Start();
      if (!error.empty()) return error;
      create.push_back("127.0.0.1:" + std::to_string(n->port()));
    }
    for (const char* a : {"--cluster-replicas", "0", "--cluster-yes"}) create.push_back(a);
    const std::string log = nodes_[0]->dir() + "/cluster-create.log";
    if (RunBounded(create, log, 20000) != 0) return "redis-cli --cluster create failed; see " + log;
    return WaitHealthy(10000) ? "" : "cluster did not reach cluster_state:ok within 10 s";
  }

  // Every running node says the cluster is ok, knows every node and sees
  // every slot served.
  bool WaitHealthy(int ms) {
    const std::string known = "cluster_known_nodes:" + std::to_string(nodes_.size());
    return WaitUntil(ms, [&] {
      for (auto& n : nodes_) {
        if (!n->running()) continue;
        const std::string info = RedisCommand(n->port(), {"CLUSTER", "INFO"});
        if (info.find("cluster_state:ok") == std::string::npos ||
            info.find("cluster_slots_ok:16384") == std::string::npos ||
            info.find(known) == std::string::npos)
          return false;
      }
      return true;
    });
  }

  // The port of the master serving `key` now, as node 0 sees it (during a
  // migration: the old owner, which still serves the slot).
  int OwnerOf(const std::string& key) {
    const std::string r = RedisCommand(nodes_[0]->port(), {"TYPE", key});
    if (r.rfind("ERR:MOVED ", 0) != 0) return nodes_[0]->port();
    return std::atoi(r.c_str() + r.rfind(':') + 1);
  }

  std::string NodeId(int port) { return RedisCommand(port, {"CLUSTER", "MYID"}); }

  // Empties every master between tests sharing one cluster.
  void FlushAll() {
    for (auto& n : nodes_) RedisCommand(n->port(), {"FLUSHALL"});
  }

 private:
  std::vector<std::unique_ptr<RedisServer>> nodes_;
};

class RedisSentinel {
 public:
  static constexpr const char* kMaster = "dyadprimary";
  // Every data node: durable writes, and full resyncs that start at once
  // (Redis 7 otherwise delays diskless ones by 5 s).
  static constexpr const char* kServerConfig =
      "appendonly yes\nappendfsync always\nrepl-diskless-sync yes\n"
      "repl-diskless-sync-delay 0\n";

  explicit RedisSentinel(int replicas = 1)
      : replicas_wanted_(replicas),
        primary_(std::make_unique<RedisServer>(std::string(kServerConfig))) {}

  bool available() const { return primary_->available(); }
  RedisServer& primary() { return *primary_; }
  RedisServer& replica(size_t i) { return *replicas_[i]; }
  RedisServer& sentinel() { return *sentinel_; }
  std::string url(const std::string& options = "") const {
    return "redis+sentinel://127.0.0.1:" + std::to_string(sentinel_->port()) + "/" + kMaster +
           options;
  }

  std::string Start() {
    std::string error = primary_->Start();
    if (!error.empty()) return error;
    const std::string primary_addr = "127.0.0.1 " + std::to_string(primary_->port());
    for (int i = 0; i < replicas_wanted_; ++i) {
      replicas_.push_back(std::make_unique<RedisServer>(std::string(kServerConfig) + "replicaof " +
                                                        primary_addr + "\n"));
      error = replicas_.back()->Start();
      if (!error.empty()) return error;
    }
    sentinel_ = std::make_unique<RedisServer>(
        std::string("sentinel monitor ") + kMaster + " " + primary_addr + " 1\n" +
            // Short enough for a quick test, long enough that a loaded
            // machine's slow first PING does not fail over a live primary.
            "sentinel down-after-milliseconds " + kMaster + " 1000\n" +
            "sentinel failover-timeout " + kMaster + " 5000\n",
        RedisServer::Kind::kSentinel);
    error = sentinel_->Start();
    if (!error.empty()) return error;
    // In sync, and known to the sentinel from the replicas' own INFO (it
    // promotes none it has not heard from).
    const bool synced = WaitUntil(10000, [&] {
      const std::string known = RedisCommand(sentinel_->port(), {"SENTINEL", "REPLICAS", kMaster});
      size_t ok = 0;
      for (size_t at = known.find("master-link-status,ok"); at != std::string::npos;
           at = known.find("master-link-status,ok", at + 1))
        ++ok;
      const std::string master = RedisCommand(sentinel_->port(), {"SENTINEL", "MASTER", kMaster});
      return ok == replicas_.size() && known.find("disconnected") == std::string::npos &&
             master.find("flags,master,") != std::string::npos &&
             HasReplicasOnline(primary_->port(), static_cast<int>(replicas_.size()));
    });
    return synced ? "" : "replicas or sentinel not ready within 10 s";
  }

  // The node at `port` is a primary with `n` replicas in sync.
  static bool HasReplicasOnline(int port, int n) {
    const std::string info = RedisCommand(port, {"INFO", "replication"});
    int online = 0;
    for (size_t at = info.find("state=online"); at != std::string::npos;
         at = info.find("state=online", at + 1))
      ++online;
    return info.find("role:master") != std::string::npos && online >= n;
  }

  // The primary's port as the sentinel names it now.
  int PrimaryPort() {
    const std::string a =
        RedisCommand(sentinel_->port(), {"SENTINEL", "get-master-addr-by-name", kMaster});
    const size_t comma = a.find(',');
    return comma == std::string::npos ? -1 : std::atoi(a.c_str() + comma + 1);
  }

 private:
  const int replicas_wanted_;
  std::unique_ptr<RedisServer> primary_;
  std::vector<std::unique_ptr<RedisServer>> replicas_;
  std::unique_ptr<RedisServer> sentinel_;
};

}  // namespace emu
}  // namespace dyad
