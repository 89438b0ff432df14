// redis_kvs.cc: the Redis metadata store (see redis_kvs.h for the design).
#include "kvs/redis/redis_kvs.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <thread>
#include <utility>

#include "common/config.h"

namespace dyad {
namespace {

constexpr const char kScheme[] = "redis://";
constexpr const char kTlsScheme[] = "rediss://";
constexpr const char kNoTls[] =
    "TLS needs hiredis >= 1.0 with hiredis_ssl; this build has hiredis "
    "0.14 without TLS (use a TLS tunnel such as stunnel, or plain redis:// on a "
    "trusted network)";

// SET and PUBLISH in one script, so the write and its notification are one
// atomic step on the server: a subscriber that gets the message is never
// ahead of a reader, and no writer can interleave between the two.
constexpr const char kPutScript[] =
    "redis.call('SET', KEYS[1], ARGV[1]) "
    "redis.call('PUBLISH', KEYS[1], ARGV[1]) "
    "return 1";

timeval ToTimeval(int64_t ms) {
  if (ms < 1) ms = 1;
  timeval tv;
  tv.tv_sec = static_cast<time_t>(ms / 1000);
  tv.tv_usec = static_cast<suseconds_t>((ms % 1000) * 1000);
  return tv;
}

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

// Sleeps up to `ms`, in slices of at most 250 ms, stopping early when `stop`
// says so or the deadline passes.
template <typename StopFn>
void SleepSliced(int64_t ms, Deadline deadline, StopFn stop) {
  const Deadline until = deadline.Min(ms);
  while (!until.expired() && !stop()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(
        std::max<int64_t>(1, until.RemainingMs(RedisKvs::kCancelPollMs))));
  }
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<std::string> PercentDecode(const std::string& in) {
  std::string out;
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) {
      return Status(DYAD_RC_BADREQUEST, "bad percent escape in redis URL");
    }
    const int hi = HexValue(in[i + 1]);
    const int lo = HexValue(in[i + 2]);
    if (hi < 0 || lo < 0) return Status(DYAD_RC_BADREQUEST, "bad percent escape in redis URL");
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

Result<int64_t> ParseInt(const std::string& text, int64_t lo, int64_t hi, const std::string& what) {
  if (text.empty() || text.size() > 18 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    return Status(DYAD_RC_BADREQUEST, "redis URL: " + what + " '" + text + "' is not a number");
  }
  const int64_t v = std::strtoll(text.c_str(), nullptr, 10);
  if (v < lo || v > hi) {
    return Status(DYAD_RC_BADREQUEST, "redis URL: " + what + " " + text + " is out of range");
  }
  return v;
}

// Namespaces are percent-encoded in keys so that '}' (the end of the hash
// tag) and '{' never appear in them: "{NS}" is then unambiguous.
std::string EncodeNamespace(const std::string& ns) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(ns.size());
  for (unsigned char c : ns) {
    if (c == '%' || c == '{' || c == '}') {
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

// Errors Redis gives while it is (re)starting or busy: worth retrying.
bool TransientError(const std::string& msg) {
  return StartsWith(msg, "LOADING") || StartsWith(msg, "BUSY") || StartsWith(msg, "TRYAGAIN") ||
         StartsWith(msg, "MASTERDOWN");
}

Status ErrorReplyStatus(const std::string& what, const std::string& msg) {
  if (StartsWith(msg, "NOAUTH") || StartsWith(msg, "WRONGPASS") ||
      msg.find("invalid password") != std::string::npos || StartsWith(msg, "NOPERM")) {
    return Status(DYAD_RC_AUTH, what + ": redis refused: " + msg);
  }
  if (TransientError(msg)) return Status(DYAD_RC_CONNLOST, what + ": redis not ready: " + msg);
  return Status(DYAD_RC_BADRPC, what + ": redis error: " + msg);
}

bool Retryable(const Status& st) {
  return st.code() == DYAD_RC_CONNLOST || st.code() == DYAD_RC_NOSERVICE;
}

}  // namespace

// Owns one hiredis reply.
class RedisKvs::Reply {
 public:
  Reply() = default;
  ~Reply() { Reset(nullptr); }
  Reply(const Reply&) = delete;
  Reply& operator=(const Reply&) = delete;
  void Reset(redisReply* r) {
    if (r_ != nullptr) freeReplyObject(r_);
    r_ = r;
  }
  redisReply* get() const { return r_; }
  redisReply* operator->() const { return r_; }

 private:
  redisReply* r_ = nullptr;
};

void RedisKvs::ContextDeleter::operator()(redisContext* c) const {
  if (c != nullptr) redisFree(c);
}

Result<RedisConfig> ParseRedisUrl(const std::string& url) {
  if (StartsWith(url, kTlsScheme)) return Status(DYAD_RC_NOTSUP, "'" + url + "': " + kNoTls);
  if (!StartsWith(url, kScheme)) {
    return Status(DYAD_RC_BADREQUEST, "'" + url + "' is not a redis:// URL");
  }
  RedisConfig cfg;
  std::string rest = url.substr(sizeof(kScheme) - 1);
  std::string query;
  const size_t q = rest.find('?');
  if (q != std::string::npos) {
    query = rest.substr(q + 1);
    rest.resize(q);
  }
  const size_t at = rest.rfind('@');
  if (at != std::string::npos) {
    const std::string userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    // "USER:PASSWORD", ":PASSWORD", or "USER" (password from elsewhere).
    const size_t colon = userinfo.find(':');
    Result<std::string> user = PercentDecode(userinfo.substr(0, colon));
    Result<std::string> pass =
        PercentDecode(colon == std::string::npos ? std::string() : userinfo.substr(colon + 1));
    if (!user.ok()) return user.status();
    if (!pass.ok()) return pass.status();
    cfg.user = *user;
    cfg.password = *pass;
  }
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    const std::string db = rest.substr(slash + 1);
    rest.resize(slash);
    if (!db.empty()) {
      Result<int64_t> n = ParseInt(db, 0, 1 << 20, "database");
      if (!n.ok()) return n.status();
      cfg.db = static_cast<int>(*n);
    }
  }
  std::string host = rest;
  std::string port;
  if (!rest.empty() && rest[0] == '[') {  // [IPv6]:port
    const size_t close = rest.find(']');
    if (close == std::string::npos) return Status(DYAD_RC_BADREQUEST, "redis URL: bad IPv6 host");
    host = rest.substr(1, close - 1);
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':') return Status(DYAD_RC_BADREQUEST, "redis URL: bad host");
      port = rest.substr(close + 2);
    }
  } else {
    const size_t colon = rest.rfind(':');
    if (colon != std::string::npos) {
      host = rest.substr(0, colon);
      port = rest.substr(colon + 1);
    }
  }
  if (host.empty()) return Status(DYAD_RC_BADREQUEST, "redis URL '" + url + "' has no host");
  cfg.host = host;
  if (!port.empty()) {
    Result<int64_t> p = ParseInt(port, 1, 65535, "port");
    if (!p.ok()) return p.status();
    cfg.port = static_cast<int>(*p);
  }
  size_t pos = 0;
  while (pos < query.size()) {
    size_t amp = query.find('&', pos);
    if (amp == std::string::npos) amp = query.size();
    const std::string item = query.substr(pos, amp - pos);
    pos = amp + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string k = item.substr(0, eq);
    const std::string v = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (k == "tls" || k == "ssl") {
      if (v == "0" || v == "false") continue;
      return Status(DYAD_RC_NOTSUP, "'" + url + "': " + kNoTls);
    } else if (k == "connect_timeout_ms" || k == "timeout_ms") {
      Result<int64_t> n = ParseInt(v, 1, 3600 * 1000, k);
      if (!n.ok()) return n.status();
      if (k == "timeout_ms") {
        cfg.command_timeout_ms = *n;
        cfg.command_timeout_set = true;
      } else {
        cfg.connect_timeout_ms = *n;
      }
    } else if (k == "password_file") {
      Result<std::string> path = PercentDecode(v);
      if (!path.ok()) return path.status();
      if (path->empty()) return Status(DYAD_RC_BADREQUEST, "redis URL: empty password_file");
      cfg.password_file = *path;
    } else if (k == "prefix") {
      if (v.empty() || v.find_first_of(":{}*?[]\\") != std::string::npos) {
        return Status(DYAD_RC_BADREQUEST,
                      "redis URL: prefix must be non-empty without : { } * ? [ ] \\");
      }
      cfg.prefix = v;
    } else {
      return Status(DYAD_RC_BADREQUEST,
                    "redis URL: unknown option '" + k +
                        "' (known: connect_timeout_ms, timeout_ms, password_file, prefix, tls)");
    }
  }
  return cfg;
}

Result<std::unique_ptr<RedisKvs>> RedisKvs::Open(const std::string& url,
                                                 const KvsOptions& options) {
  Result<RedisConfig> cfg = ParseRedisUrl(url);
  if (!cfg.ok()) return cfg.status();
  // A password kept out of the URL stays out of logs, `ps` and status
  // replies: from password_file, else from $DYAD_REDIS_PASSWORD.
  if (cfg->password.empty() && !cfg->password_file.empty()) {
    std::ifstream in(cfg->password_file, std::ios::binary);
    if (!in) {
      return Status(DYAD_RC_AUTH, "redis password file '" + cfg->password_file +
                                      "' cannot be read: " + std::strerror(errno));
    }
    std::getline(in, cfg->password);
    while (!cfg->password.empty() &&
           (cfg->password.back() == '\r' || cfg->password.back() == ' ')) {
      cfg->password.pop_back();
    }
    if (cfg->password.empty()) {
      return Status(DYAD_RC_AUTH, "redis password file '" + cfg->password_file + "' is empty");
    }
  } else if (cfg->password.empty()) {
    if (std::optional<std::string> env = GetEnv("DYAD_REDIS_PASSWORD")) cfg->password = *env;
  }
  if (!cfg->user.empty() && cfg->password.empty()) {
    return Status(DYAD_RC_BADREQUEST,
                  "redis user '" + cfg->user +
                      "' without a password (give USER:PASSWORD@, ?password_file=PATH or "
                      "$DYAD_REDIS_PASSWORD)");
  }
  // Without an explicit timeout_ms in the URL the caller's RPC bound applies.
  if (!cfg->command_timeout_set && options.rpc_timeout_ms > 0) {
    cfg->command_timeout_ms = options.rpc_timeout_ms;
  }
  return std::unique_ptr<RedisKvs>(new RedisKvs(std::move(*cfg)));
}

RedisKvs::RedisKvs(RedisConfig config)
    : config_(std::move(config)), wake_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

RedisKvs::~RedisKvs() {
  Shutdown();
  stop_subscriber_.store(true);
  WakeSubscriber();
  if (subscriber_.joinable()) subscriber_.join();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void RedisKvs::Shutdown() {
  shutdown_.store(true);
  std::vector<Context> idle;
  std::lock_guard<std::mutex> lk(mu_);
  idle.swap(idle_);
}

std::string RedisKvs::RedisKey(const std::string& ns, const std::string& key) const {
  return config_.prefix + ":{" + EncodeNamespace(ns) + "}:" + key;
}

Result<RedisKvs::Context> RedisKvs::Dial(int64_t timeout_ms) {
  const std::string where = "redis " + config_.host + ":" + std::to_string(config_.port);
  Context c(redisConnectWithTimeout(config_.host.c_str(), config_.port, ToTimeval(timeout_ms)));
  if (!c) return Status(DYAD_RC_CONNLOST, where + " unreachable: out of memory");
  if (c->err != 0) return Status(DYAD_RC_CONNLOST, where + " unreachable: " + c->errstr);
  redisSetTimeout(c.get(), ToTimeval(config_.command_timeout_ms));
  redisEnableKeepAlive(c.get());
  auto run = [&](std::vector<const char*> argv, std::vector<size_t> lens,
                 const std::string& what) -> Status {
    Reply r;
    r.Reset(static_cast<redisReply*>(
        redisCommandArgv(c.get(), static_cast<int>(argv.size()), argv.data(), lens.data())));
    if (r.get() == nullptr) return Status(DYAD_RC_CONNLOST, where + " " + what + ": " + c->errstr);
    if (r->type == REDIS_REPLY_ERROR) {
      return ErrorReplyStatus(where + " " + what, std::string(r->str, r->len));
    }
    return Status::OK();
  };
  if (!config_.password.empty()) {
    Status st = config_.user.empty()
                    ? run({"AUTH", config_.password.c_str()}, {4, config_.password.size()}, "AUTH")
                    : run({"AUTH", config_.user.c_str(), config_.password.c_str()},
                          {4, config_.user.size(), config_.password.size()}, "AUTH");
    if (!st.ok()) return st;
  }
  if (config_.db != 0) {
    const std::string db = std::to_string(config_.db);
    DYAD_RETURN_IF_ERROR(run({"SELECT", db.c_str()}, {6, db.size()}, "SELECT " + db));
  }
  return c;
}

Result<RedisKvs::Context> RedisKvs::Borrow(bool* reused) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!idle_.empty()) {
      Context c = std::move(idle_.back());
      idle_.pop_back();
      *reused = true;
      return c;
    }
  }
  *reused = false;
  return Dial(config_.connect_timeout_ms);
}

void RedisKvs::Release(Context c) {
  if (!c || c->err != 0) return;
  std::lock_guard<std::mutex> lk(mu_);
  if (idle_.size() < kMaxIdle && !shutdown_.load()) idle_.push_back(std::move(c));
}

Status RedisKvs::Command(const std::vector<std::string>& argv, Reply* out) {
  std::vector<const char*> args;
  std::vector<size_t> lens;
  for (const std::string& a : argv) {
    args.push_back(a.data());
    lens.push_back(a.size());
  }
  // A restart of Redis is bridged for up to connect_timeout_ms: long enough
  // for a restart, short enough that a dead store is reported promptly.
  const Deadline retry_until = Deadline::AfterMs(config_.connect_timeout_ms);
  int64_t backoff = kBackoffFirstMs;
  Status last;
  while (true) {
    bool reused = false;
    Result<Context> c = Borrow(&reused);
    if (c.ok()) {
      out->Reset(static_cast<redisReply*>(
          redisCommandArgv(c->get(), static_cast<int>(args.size()), args.data(), lens.data())));
      if (out->get() == nullptr) {
        last = Status(DYAD_RC_CONNLOST, "redis " + argv[0] + ": " + (*c)->errstr);
        // The server went away: the other pooled links are stale too.
        {
          std::vector<Context> idle;
          std::lock_guard<std::mutex> lk(mu_);
          idle.swap(idle_);
        }
        if (reused) continue;  // a stale link is no evidence; retry at once
      } else if ((*out)->type == REDIS_REPLY_ERROR &&
                 TransientError(std::string((*out)->str, (*out)->len))) {
        last = ErrorReplyStatus("redis " + argv[0], std::string((*out)->str, (*out)->len));
        Release(std::move(*c));
      } else {
        Release(std::move(*c));
        if ((*out)->type == REDIS_REPLY_ERROR) {
          return ErrorReplyStatus("redis " + argv[0], std::string((*out)->str, (*out)->len));
        }
        return Status::OK();
      }
    } else {
      last = c.status();
      if (!Retryable(last)) return last;
    }
    if (retry_until.expired()) return last;
    SleepSliced(backoff, retry_until, [] { return false; });
    backoff = std::min(backoff * 2, kBackoffMaxMs);
  }
}

Status RedisKvs::Put(const std::string& ns, const std::string& key, const std::string& value) {
  Reply r;
  return Command({"EVAL", kPutScript, "1", RedisKey(ns, key), value}, &r);
}

Result<std::optional<std::string>> RedisKvs::GetRaw(const std::string& rkey) {
  Reply r;
  DYAD_RETURN_IF_ERROR(Command({"GET", rkey}, &r));
  if (r->type == REDIS_REPLY_NIL) return std::optional<std::string>();
  if (r->type != REDIS_REPLY_STRING) {
    return Status(DYAD_RC_BADRPC, "redis GET: unexpected reply type " + std::to_string(r->type));
  }
  return std::optional<std::string>(std::string(r->str, r->len));
}

Result<std::optional<std::string>> RedisKvs::Get(const std::string& ns, const std::string& key) {
  return GetRaw(RedisKey(ns, key));
}

Status RedisKvs::Remove(const std::string& ns, const std::string& key) {
  Reply r;
  return Command({"DEL", RedisKey(ns, key)}, &r);
}

Result<std::vector<KvsEntry>> RedisKvs::List(const std::string& ns, const std::string& prefix,
                                             uint32_t limit) {
  const std::string base = RedisKey(ns, "");
  const std::string pattern = GlobEscape(base) + GlobEscape(prefix) + "*";
  // SCAN may return a key twice and in any order: collect into a set.
  std::set<std::string> keys;
  std::string cursor = "0";
  do {
    Reply r;
    DYAD_RETURN_IF_ERROR(
        Command({"SCAN", cursor, "MATCH", pattern, "COUNT", std::to_string(kScanCount)}, &r));
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_ARRAY) {
      return Status(DYAD_RC_BADRPC, "redis SCAN: unexpected reply");
    }
    cursor.assign(r->element[0]->str, r->element[0]->len);
    const redisReply* batch = r->element[1];
    for (size_t i = 0; i < batch->elements; ++i) {
      std::string k(batch->element[i]->str, batch->element[i]->len);
      if (StartsWith(k, base) && StartsWith(k.substr(base.size()), prefix)) keys.insert(k);
    }
  } while (cursor != "0");

  std::vector<std::string> wanted(keys.begin(), keys.end());
  // Sorting the Redis keys sorts the user keys: they share `base`.
  if (limit != 0 && wanted.size() > limit) wanted.resize(limit);
  std::vector<KvsEntry> out;
  out.reserve(wanted.size());
  for (size_t start = 0; start < wanted.size(); start += kMgetBatch) {
    const size_t end = std::min(wanted.size(), start + kMgetBatch);
    std::vector<std::string> argv{"MGET"};
    argv.insert(argv.end(), wanted.begin() + start, wanted.begin() + end);
    Reply r;
    DYAD_RETURN_IF_ERROR(Command(argv, &r));
    if (r->type != REDIS_REPLY_ARRAY || r->elements != end - start) {
      return Status(DYAD_RC_BADRPC, "redis MGET: unexpected reply");
    }
    for (size_t i = 0; i < r->elements; ++i) {
      const redisReply* v = r->element[i];
      if (v->type != REDIS_REPLY_STRING) continue;  // removed since the SCAN
      out.emplace_back(wanted[start + i].substr(base.size()), std::string(v->str, v->len));
    }
  }
  return out;
}

bool RedisKvs::Stopping(const CancelFn& cancel, Status* why) const {
  if (shutdown_.load()) {
    *why = Status(DYAD_RC_CANCELLED, "metadata store is shutting down");
    return true;
  }
  if (cancel && cancel()) {
    *why = Status(DYAD_RC_CANCELLED, "wait cancelled");
    return true;
  }
  return false;
}

// --- waits: the shared subscriber ------------------------------------------

void RedisKvs::StartSubscriberLocked() {
  if (!subscriber_.joinable()) subscriber_ = std::thread(&RedisKvs::SubscriberLoop, this);
}

void RedisKvs::WakeSubscriber() {
  const uint64_t one = 1;
  if (wake_fd_ >= 0) {
    // A full counter already means "wake up"; nothing to do on failure.
    ssize_t n = ::write(wake_fd_, &one, sizeof one);
    (void)n;
  }
}

bool RedisKvs::SyncChannelsLocked(redisContext* c) {
  bool sent = false;
  for (auto it = channels_.begin(); it != channels_.end();) {
    ChannelEntry& e = it->second;
    const char* verb = nullptr;
    if (e.state == ChannelState::kNew && e.waiters.empty()) {
      it = channels_.erase(it);  // never subscribed on this link
      continue;
    }
    if (e.state == ChannelState::kNew) {
      verb = "SUBSCRIBE";
      e.state = ChannelState::kSubscribing;
    } else if (e.state == ChannelState::kActive && e.waiters.empty()) {
      verb = "UNSUBSCRIBE";
      e.state = ChannelState::kUnsubscribing;
    }
    if (verb != nullptr) {
      const char* argv[] = {verb, it->first.data()};
      const size_t lens[] = {std::strlen(verb), it->first.size()};
      if (redisAppendCommandArgv(c, 2, argv, lens) != REDIS_OK) return false;
      sent = true;
    }
    ++it;
  }
  int done = !sent;
  while (!done) {
    if (redisBufferWrite(c, &done) != REDIS_OK) return false;
  }
  return true;
}

void RedisKvs::HandlePushLocked(redisContext* c, const void* raw) {
  const redisReply* r = static_cast<const redisReply*>(raw);
  if (r->type != REDIS_REPLY_ARRAY || r->elements < 2 ||
      r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING) {
    return;
  }
  const std::string kind(r->element[0]->str, r->element[0]->len);
  auto it = channels_.find(std::string(r->element[1]->str, r->element[1]->len));
  if (it == channels_.end()) return;
  ChannelEntry& e = it->second;
  if (kind == "message" && r->elements == 3 && r->element[2]->type == REDIS_REPLY_STRING) {
    auto value = std::make_shared<const std::string>(r->element[2]->str, r->element[2]->len);
    for (Waiter* w : e.waiters) {
      w->value = value;
      w->cv.notify_one();
    }
  } else if (kind == "subscribe" && e.state == ChannelState::kSubscribing) {
    // From now on every Put of this key reaches us; waiters check once more
    // for a Put that came before.
    e.state = ChannelState::kActive;
    ++e.generation;
    for (Waiter* w : e.waiters) w->cv.notify_one();
  } else if (kind == "unsubscribe" && e.state == ChannelState::kUnsubscribing) {
    if (e.waiters.empty()) {
      channels_.erase(it);
    } else {
      e.state = ChannelState::kNew;  // a waiter came meanwhile: subscribe again
    }
  }
}

void RedisKvs::SubscriberLoop() {
  Context c;
  int64_t backoff = kBackoffFirstMs;
  auto drop_link = [&](Status why) {  // needs smu_
    c.reset();
    link_up_ = false;
    link_error_ = std::move(why);
    for (auto it = channels_.begin(); it != channels_.end();) {
      if (it->second.waiters.empty()) {
        it = channels_.erase(it);
      } else {
        it->second.state = ChannelState::kNew;
        ++it;
      }
    }
  };
  auto sleep_or_wake = [&](int fd, int64_t ms) -> bool {  // without smu_; true: fd readable
    pollfd p[2] = {{wake_fd_, POLLIN, 0}, {fd, POLLIN, 0}};
    const int n = ::poll(p, fd >= 0 ? 2 : 1, static_cast<int>(ms));
    if (n > 0 && (p[0].revents & POLLIN)) {
      uint64_t count;
      ssize_t got = ::read(wake_fd_, &count, sizeof count);
      (void)got;
    }
    return n > 0 && fd >= 0 && (p[1].revents & (POLLIN | POLLERR | POLLHUP));
  };
  std::unique_lock<std::mutex> lk(smu_);
  while (!stop_subscriber_.load()) {
    if (!c) {
      if (channels_.empty()) {  // connect only while someone waits
        lk.unlock();
        sleep_or_wake(-1, kCancelPollMs);
        lk.lock();
        continue;
      }
      lk.unlock();
      Result<Context> d = Dial(config_.connect_timeout_ms);
      lk.lock();
      if (!d.ok()) {
        drop_link(d.status());
        lk.unlock();
        const Deadline until = Deadline::AfterMs(backoff);
        while (!until.expired() && !stop_subscriber_.load()) {
          std::this_thread::sleep_for(
              std::chrono::milliseconds(std::max<int64_t>(1, until.RemainingMs(kCancelPollMs))));
        }
        backoff = std::min(backoff * 2, kBackoffMaxMs);
        lk.lock();
        continue;
      }
      c = std::move(*d);
      // (UN)SUBSCRIBE writes are tiny; a link that cannot take them within
      // 2 s is broken, and smu_ must not be held longer than that.
      redisSetTimeout(c.get(), ToTimeval(std::min<int64_t>(config_.command_timeout_ms, 2000)));
      backoff = kBackoffFirstMs;
      link_up_ = true;
      link_error_ = Status::OK();
    }
    if (!SyncChannelsLocked(c.get())) {
      drop_link(Status(DYAD_RC_CONNLOST, std::string("redis subscriber: ") + c->errstr));
      continue;
    }
    const int fd = c->fd;
    lk.unlock();
    const bool readable = sleep_or_wake(fd, kCancelPollMs);
    lk.lock();
    if (!readable) continue;
    if (redisBufferRead(c.get()) != REDIS_OK) {
      drop_link(Status(DYAD_RC_CONNLOST, std::string("redis subscriber: ") + c->errstr));
      continue;
    }
    while (true) {
      void* raw = nullptr;
      if (redisGetReplyFromReader(c.get(), &raw) != REDIS_OK) {
        drop_link(Status(DYAD_RC_CONNLOST, std::string("redis subscriber: ") + c->errstr));
        break;
      }
      if (raw == nullptr) break;
      Reply r;
      r.Reset(static_cast<redisReply*>(raw));
      HandlePushLocked(c.get(), raw);
    }
  }
}

Result<std::string> RedisKvs::Wait(const std::string& ns, const std::string& key, Deadline deadline,
                                   const CancelFn& cancel) {
  const std::string rkey = RedisKey(ns, key);
  const std::string what = "wait for '" + key + "' in namespace '" + ns + "'";
  Status last;
  Result<std::optional<std::string>> first = GetRaw(rkey);
  if (first.ok() && first->has_value()) return std::move(**first);
  if (!first.ok()) {
    if (!Retryable(first.status())) return first.status().Annotate(what);
    last = first.status();
  }

  Waiter w;
  std::unique_lock<std::mutex> lk(smu_);
  StartSubscriberLocked();
  channels_[rkey].waiters.insert(&w);
  lk.unlock();
  WakeSubscriber();
  lk.lock();

  Result<std::string> result = Status(DYAD_RC_TIMEOUT, what);
  Status why;
  while (true) {
    if (w.value) {
      result = *w.value;
      break;
    }
    ChannelEntry& e = channels_[rkey];  // present: we are one of its waiters
    if (e.state == ChannelState::kActive && e.generation > w.confirmed) {
      // (Re)subscribed: a Put that came before the subscription is visible
      // now, one after it will be a message.
      const uint64_t generation = e.generation;
      lk.unlock();
      Result<std::optional<std::string>> now = GetRaw(rkey);
      lk.lock();
      w.confirmed = generation;
      if (now.ok() && now->has_value()) {
        result = std::move(**now);
        break;
      }
      if (!now.ok()) {
        if (!Retryable(now.status())) {
          result = now.status().Annotate(what);
          break;
        }
        last = now.status();
      }
      continue;
    }
    lk.unlock();
    const bool stopping = Stopping(cancel, &why);
    lk.lock();
    if (stopping) {
      result = why.Annotate(what);
      break;
    }
    if (deadline.expired()) {
      const Status& reason = !link_up_ && !link_error_.ok() ? link_error_ : last;
      result = Status(DYAD_RC_TIMEOUT,
                      what + ": not put before the deadline" +
                          (reason.ok() ? std::string() : " (" + reason.message() + ")"))
                   .WithCause(reason.ok() ? DYAD_RC_OK : DYAD_RC_CONNLOST);
      break;
    }
    w.cv.wait_for(
        lk, std::chrono::milliseconds(std::max<int64_t>(1, deadline.RemainingMs(kCancelPollMs))));
  }

  auto it = channels_.find(rkey);
  if (it != channels_.end()) {
    it->second.waiters.erase(&w);
    if (it->second.waiters.empty()) {
      lk.unlock();
      WakeSubscriber();  // to unsubscribe
    }
  }
  return result;
}

Result<std::unique_ptr<Kvs>> OpenKvs_redis(const std::string& url, const KvsOptions& options) {
  if (url == "redis")
    return Status(DYAD_RC_BADREQUEST,
                  "metadata store 'redis' needs an address: redis://[[USER]:PASSWORD@]HOST:PORT[/DB]");
  Result<std::unique_ptr<RedisKvs>> kvs = RedisKvs::Open(url, options);
  if (!kvs.ok()) return kvs.status();
  return std::unique_ptr<Kvs>(std::move(*kvs));
}

}  // namespace dyad
