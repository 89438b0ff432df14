// redis_url.h: what a Redis store URL says (the "redis" backend).
//
// Three deployments, one URL form each (docs/redis.md):
//   redis://[[USER]:PASSWORD@]HOST[:PORT][/DB][?OPTIONS]          one server
//   redis+cluster://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...][?OPTIONS]
//       Redis Cluster; the addresses are seeds, the slot map is read from
//       the cluster itself
//   redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/MASTER[/DB][?OPTIONS]
//       one primary found through Redis Sentinel (default port 26379)
// USER and PASSWORD are those of the data nodes, percent-encoded.
//
// Threading: plain values and a pure function.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace dyad {

enum class RedisMode { kSingle, kCluster, kSentinel };

struct RedisAddress {
  std::string host;
  int port = 0;
  // "HOST:PORT" ("[::1]:PORT" for IPv6); also the key of per-node state.
  std::string ToString() const;
  bool operator==(const RedisAddress& o) const { return host == o.host && port == o.port; }
  bool operator!=(const RedisAddress& o) const { return !(*this == o); }
  bool operator<(const RedisAddress& o) const {
    return host != o.host ? host < o.host : port < o.port;
  }
};

struct RedisConfig {
  RedisMode mode = RedisMode::kSingle;
  // kSingle: the server; kCluster: seed nodes; kSentinel: the sentinels.
  std::vector<RedisAddress> nodes;
  std::string master_name;    // kSentinel: the monitored primary's name
  std::string user;           // ACL user; empty: the default user
  std::string password;       // empty: no AUTH
  std::string password_file;  // ?password_file=PATH: first line is the password
  // ?sentinel_password_file=PATH: AUTH for the sentinels (they often have
  // their own, or none).
  std::string sentinel_password_file;
  std::string sentinel_password;
  int db = 0;  // SELECTed on every connection when not 0 (never in a cluster)
  int64_t connect_timeout_ms = 2000;
  int64_t command_timeout_ms = 60000;
  bool command_timeout_set = false;  // timeout_ms given in the URL
  // How long a command keeps retrying while its node is unreachable,
  // loading, or failing over. Default: connect_timeout_ms for one server,
  // 10 s where a failover can end the outage (cluster, sentinel).
  int64_t retry_ms = 0;
  // kSentinel: replicas that must acknowledge a publication (Redis WAIT)
  // before it counts as done, so a failover cannot lose it; 0: do not wait.
  int wait_replicas = 0;
  int64_t wait_replicas_ms = 2000;
  std::string prefix = "dyad";  // first component of every key
};

// Parses any of the three forms. Options ("&"-separated): connect_timeout_ms,
// timeout_ms, retry_ms, password_file, prefix, and for sentinel URLs
// sentinel_password_file, wait_replicas, wait_replicas_ms. tls=1 and the
// "rediss://" scheme give DYAD_RC_NOTSUP (no TLS in hiredis 0.14); other
// mistakes give DYAD_RC_BADREQUEST naming the part at fault.
Result<RedisConfig> ParseRedisUrl(const std::string& url);

// Reads password_file / sentinel_password_file, or $DYAD_REDIS_PASSWORD,
// when the URL carries no password (keeps secrets out of `ps` and logs).
Status LoadRedisPasswords(RedisConfig* cfg);

// The URL forms and their meaning, for error messages.
extern const char kRedisUrlForms[];

}  // namespace dyad
