// redis_link.h: one hiredis connection and what its replies mean.
//
// The pieces every part of the Redis store shares: owning wrappers for a
// hiredis context and reply, dialling a node (connect, AUTH, SELECT),
// running commands on one connection (pipelined when there are several),
// and the classification of error replies: which are final (refused
// credentials or rights), which are worth retrying (loading, failing over),
// and which redirect (MOVED, ASK) to another cluster node.
//
// Threading: a RedisContext is used by one thread at a time; the functions
// are thread-safe.
#pragma once

#include <sys/time.h>

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "kvs/redis/redis_url.h"

struct redisContext;
struct redisReply;

namespace dyad {

struct RedisContextDeleter {
  void operator()(redisContext* c) const;
};
using RedisContext = std::unique_ptr<redisContext, RedisContextDeleter>;

struct RedisReplyDeleter {
  void operator()(redisReply* r) const;
};
using RedisReply = std::unique_ptr<redisReply, RedisReplyDeleter>;

using RedisArgv = std::vector<std::string>;

timeval RedisTimeval(int64_t ms);

// What a node should be told on connecting: credentials and database.
struct RedisLogin {
  std::string user;
  std::string password;
  int db = 0;
};

// Connects within `connect_ms`, sets `command_ms` as the I/O timeout, logs
// in and selects the database. Errors: DYAD_RC_CONNLOST ("... unreachable"),
// DYAD_RC_AUTH (credentials refused).
Result<RedisContext> DialRedis(const RedisAddress& node, const RedisLogin& login,
                               int64_t connect_ms, int64_t command_ms);

// Sends `cmds` in one write and reads one reply each, in order. A null
// entry in `*out` never happens on success; an I/O failure (the link is
// then unusable) gives DYAD_RC_CONNLOST. Error replies are returned as
// replies: the caller decides (see ClassifyRedisError).
Status RunRedis(redisContext* c, const std::vector<RedisArgv>& cmds, std::vector<RedisReply>* out);

// The text of an error reply, or "" when `r` is not an error.
std::string RedisErrorText(const redisReply* r);
// The text of a string or status reply, or "" when `r` is neither.
std::string RedisText(const redisReply* r);

// A MOVED or ASK error reply: the slot and the node that serves it.
struct RedisRedirect {
  bool ask = false;
  int slot = -1;
  RedisAddress node;
};
// Parses "MOVED 3999 127.0.0.1:6381" / "ASK ..."; false for other text.
bool ParseRedisRedirect(const std::string& error, RedisRedirect* out);

// Errors Redis gives while it is (re)starting, failing over or migrating:
// LOADING, BUSY, TRYAGAIN, MASTERDOWN, CLUSTERDOWN, READONLY.
bool RedisTransientError(const std::string& error);
// READONLY, CLUSTERDOWN, MASTERDOWN: the node is not (or no longer) the
// one to write to; the topology should be looked up again.
bool RedisTopologyError(const std::string& error);
// The Status for an error reply: DYAD_RC_AUTH for refused credentials or
// rights, DYAD_RC_CONNLOST for transient ones, DYAD_RC_BADRPC otherwise.
Status RedisErrorStatus(const std::string& what, const std::string& error);

// Retrying can cure these (the store may come back, or fail over).
inline bool RedisRetryable(const Status& st) {
  return st.code() == DYAD_RC_CONNLOST || st.code() == DYAD_RC_NOSERVICE;
}

}  // namespace dyad
