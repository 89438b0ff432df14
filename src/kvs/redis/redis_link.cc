// redis_link.cc: one hiredis connection (see redis_link.h).
#include "kvs/redis/redis_link.h"

#include <hiredis/hiredis.h>

#include <cstdlib>

namespace dyad {
namespace {

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

void RedisContextDeleter::operator()(redisContext* c) const {
  if (c != nullptr) redisFree(c);
}

void RedisReplyDeleter::operator()(redisReply* r) const {
  if (r != nullptr) freeReplyObject(r);
}

timeval RedisTimeval(int64_t ms) {
  if (ms < 1) ms = 1;
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  return tv;
}

Status RunRedis(redisContext* c, const std::vector<RedisArgv>& cmds, std::vector<RedisReply>* out) {
  out->clear();
  for (const RedisArgv& argv : cmds) {
    std::vector<const char*> args;
    std::vector<size_t> lens;
    for (const std::string& a : argv) {
      args.push_back(a.data());
      lens.push_back(a.size());
    }
    if (redisAppendCommandArgv(c, static_cast<int>(args.size()), args.data(), lens.data()) !=
        REDIS_OK) {
      return Status(DYAD_RC_CONNLOST, std::string("redis: ") + c->errstr);
    }
  }
  for (size_t i = 0; i < cmds.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(c, &raw) != REDIS_OK || raw == nullptr) {
      out->clear();
      return Status(DYAD_RC_CONNLOST, "redis " + cmds[i][0] + ": " + c->errstr);
    }
    out->emplace_back(static_cast<redisReply*>(raw));
  }
  return Status::OK();
}

Result<RedisContext> DialRedis(const RedisAddress& node, const RedisLogin& login,
                               int64_t connect_ms, int64_t command_ms) {
  const std::string where = "redis " + node.ToString();
  RedisContext c(redisConnectWithTimeout(node.host.c_str(), node.port, RedisTimeval(connect_ms)));
  if (!c) return Status(DYAD_RC_CONNLOST, where + " unreachable: out of memory");
  if (c->err != 0) return Status(DYAD_RC_CONNLOST, where + " unreachable: " + c->errstr);
  redisSetTimeout(c.get(), RedisTimeval(command_ms));
  redisEnableKeepAlive(c.get());
  std::vector<RedisArgv> cmds;
  if (!login.password.empty()) {
    cmds.push_back(login.user.empty() ? RedisArgv{"AUTH", login.password}
                                      : RedisArgv{"AUTH", login.user, login.password});
  }
  if (login.db != 0) cmds.push_back({"SELECT", std::to_string(login.db)});
  if (cmds.empty()) return c;
  std::vector<RedisReply> replies;
  Status st = RunRedis(c.get(), cmds, &replies);
  if (!st.ok()) return st.Annotate(where);
  for (size_t i = 0; i < replies.size(); ++i) {
    const std::string err = RedisErrorText(replies[i].get());
    if (!err.empty()) return RedisErrorStatus(where + " " + cmds[i][0], err);
  }
  return c;
}

std::string RedisErrorText(const redisReply* r) {
  if (r == nullptr || r->type != REDIS_REPLY_ERROR) return "";
  std::string text(r->str, r->len);
  return text.empty() ? "ERR" : text;
}

std::string RedisText(const redisReply* r) {
  return r != nullptr && (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS)
             ? std::string(r->str, r->len)
             : std::string();
}

bool ParseRedisRedirect(const std::string& error, RedisRedirect* out) {
  RedisRedirect r;
  size_t pos;
  if (StartsWith(error, "MOVED ")) {
    pos = 6;
  } else if (StartsWith(error, "ASK ")) {
    r.ask = true;
    pos = 4;
  } else {
    return false;
  }
  const size_t space = error.find(' ', pos);
  if (space == std::string::npos) return false;
  const std::string slot = error.substr(pos, space - pos);
  const std::string addr = error.substr(space + 1);
  const size_t colon = addr.rfind(':');
  if (slot.empty() || slot.size() > 5 ||
      slot.find_first_not_of("0123456789") != std::string::npos || colon == std::string::npos ||
      colon + 1 >= addr.size() || colon + 7 < addr.size()) {
    return false;
  }
  r.slot = std::atoi(slot.c_str());
  r.node.port = std::atoi(addr.c_str() + colon + 1);
  r.node.host = addr.substr(0, colon);
  if (r.node.host.size() > 2 && r.node.host.front() == '[' && r.node.host.back() == ']')
    r.node.host = r.node.host.substr(1, r.node.host.size() - 2);
  if (r.slot >= 16384 || r.node.port <= 0 || r.node.port > 65535) return false;
  // Redis announces an unknown endpoint as "?" or "": use it as is and let
  // the connection attempt report it.
  *out = r;
  return true;
}

bool RedisTopologyError(const std::string& e) {
  return StartsWith(e, "READONLY") || StartsWith(e, "CLUSTERDOWN") || StartsWith(e, "MASTERDOWN");
}

bool RedisTransientError(const std::string& e) {
  return StartsWith(e, "LOADING") || StartsWith(e, "BUSY") || StartsWith(e, "TRYAGAIN") ||
         RedisTopologyError(e);
}

namespace {

// What to do about a refusal, for the operator reading the error.
std::string CredentialHint(const std::string& msg) {
  if (StartsWith(msg, "NOAUTH"))
    return "this redis requires a password: give it in the URL "
           "(redis://[USER:]PASSWORD@HOST:PORT), with ?password_file=PATH, or in "
           "$DYAD_REDIS_PASSWORD (docs/redis.md)";
  if (StartsWith(msg, "WRONGPASS") || msg.find("invalid password") != std::string::npos)
    return "the user name or password given for redis is wrong: check the URL, the "
           "password_file or $DYAD_REDIS_PASSWORD against redis' requirepass or ACL user";
  if (StartsWith(msg, "NOPERM"))
    return "the redis ACL user lacks a permission DYAD needs: grant it ~dyad:* keys, &dyad:* "
           "channels and +@all minus dangerous commands, as in docs/redis.md";
  if (StartsWith(msg, "DENIED"))
    return "redis is in protected mode (no password set, connection from another host): set a "
           "password (requirepass or an ACL user) and give it to dyad-service, as in "
           "docs/redis.md";
  return "";
}

}  // namespace

Status RedisErrorStatus(const std::string& what, const std::string& e) {
  // Credentials do not fix themselves: these fail at once, never retried.
  if (const std::string hint = CredentialHint(e); !hint.empty())
    return Status(DYAD_RC_AUTH, what + ": redis refused: " + e + " (" + hint + ")");
  if (RedisTransientError(e)) return Status(DYAD_RC_CONNLOST, what + ": redis not ready: " + e);
  return Status(DYAD_RC_BADRPC, what + ": redis error: " + e);
}

}  // namespace dyad
