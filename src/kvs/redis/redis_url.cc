// redis_url.cc: parsing the three Redis URL forms (see redis_url.h).
#include "kvs/redis/redis_url.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "common/config.h"

namespace dyad {

const char kRedisUrlForms[] =
    "redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], "
    "redis+cluster://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...], "
    "redis+sentinel://[[USER]:PASSWORD@]HOST[:PORT][,HOST[:PORT]...]/MASTER[/DB]";

namespace {

constexpr const char kNoTls[] =
    "TLS needs hiredis >= 1.0 with hiredis_ssl; this build has hiredis "
    "0.14 without TLS (use a TLS tunnel such as stunnel, or plain redis:// on a "
    "trusted network)";

struct Scheme {
  const char* text;
  RedisMode mode;
  int default_port;
};
constexpr Scheme kSchemes[] = {
    {"redis://", RedisMode::kSingle, 6379},
    {"redis+cluster://", RedisMode::kCluster, 6379},
    {"redis+sentinel://", RedisMode::kSentinel, 26379},
};

bool StartsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

Status Bad(const std::string& what) { return Status(DYAD_RC_BADREQUEST, "redis URL: " + what); }

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
    const int hi = i + 2 < in.size() ? HexValue(in[i + 1]) : -1;
    const int lo = i + 2 < in.size() ? HexValue(in[i + 2]) : -1;
    if (hi < 0 || lo < 0) return Bad("bad percent escape");
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

Result<int64_t> ParseInt(const std::string& text, int64_t lo, int64_t hi, const std::string& what) {
  if (text.empty() || text.size() > 18 ||
      text.find_first_not_of("0123456789") != std::string::npos) {
    return Bad(what + " '" + text + "' is not a number");
  }
  const int64_t v = std::strtoll(text.c_str(), nullptr, 10);
  if (v < lo || v > hi) return Bad(what + " " + text + " is out of range");
  return v;
}

Result<RedisAddress> ParseHostPort(const std::string& text, int default_port) {
  RedisAddress a;
  a.port = default_port;
  std::string port;
  if (!text.empty() && text[0] == '[') {  // [IPv6]:port
    const size_t close = text.find(']');
    if (close == std::string::npos) return Bad("bad IPv6 host in '" + text + "'");
    a.host = text.substr(1, close - 1);
    if (close + 1 < text.size()) {
      if (text[close + 1] != ':') return Bad("bad address '" + text + "'");
      port = text.substr(close + 2);
    }
  } else {
    const size_t colon = text.rfind(':');
    a.host = text.substr(0, colon);
    if (colon != std::string::npos) port = text.substr(colon + 1);
  }
  if (a.host.empty()) return Bad("missing host in '" + text + "'");
  if (!port.empty() || text.back() == ':') {
    Result<int64_t> p = ParseInt(port, 1, 65535, "port");
    if (!p.ok()) return p.status();
    a.port = static_cast<int>(*p);
  }
  return a;
}

Status ParseUserinfo(const std::string& userinfo, RedisConfig* cfg) {
  // "USER:PASSWORD", ":PASSWORD", or "USER" (password from elsewhere).
  const size_t colon = userinfo.find(':');
  Result<std::string> user = PercentDecode(userinfo.substr(0, colon));
  Result<std::string> pass =
      PercentDecode(colon == std::string::npos ? std::string() : userinfo.substr(colon + 1));
  if (!user.ok()) return user.status();
  if (!pass.ok()) return pass.status();
  cfg->user = *user;
  cfg->password = *pass;
  return Status::OK();
}

Status ParseDb(const std::string& text, RedisConfig* cfg) {
  if (text.empty()) return Status::OK();
  Result<int64_t> n = ParseInt(text, 0, 1 << 20, "database");
  if (!n.ok()) return n.status();
  if (cfg->mode == RedisMode::kCluster && *n != 0)
    return Bad("Redis Cluster has database 0 only (drop '/" + text + "')");
  cfg->db = static_cast<int>(*n);
  return Status::OK();
}

// "/DB" (single, cluster) or "/MASTER[/DB]" (sentinel).
Status ParsePath(const std::string& path, RedisConfig* cfg) {
  if (cfg->mode != RedisMode::kSentinel) return ParseDb(path, cfg);
  const size_t slash = path.find('/');
  Result<std::string> name = PercentDecode(path.substr(0, slash));
  if (!name.ok()) return name.status();
  if (name->empty())
    return Bad("a sentinel URL names the primary: redis+sentinel://HOST:PORT/MASTER");
  cfg->master_name = *name;
  return slash == std::string::npos ? Status::OK() : ParseDb(path.substr(slash + 1), cfg);
}

Status ParseOption(const std::string& k, const std::string& v, RedisConfig* cfg) {
  const bool sentinel = cfg->mode == RedisMode::kSentinel;
  if (k == "tls" || k == "ssl") {
    if (v == "0" || v == "false") return Status::OK();
    return Status(DYAD_RC_NOTSUP, kNoTls);
  }
  if (k == "connect_timeout_ms" || k == "timeout_ms" || k == "retry_ms" ||
      (sentinel && k == "wait_replicas_ms")) {
    Result<int64_t> n = ParseInt(v, 1, 3600 * 1000, k);
    if (!n.ok()) return n.status();
    if (k == "timeout_ms") {
      cfg->command_timeout_ms = *n;
      cfg->command_timeout_set = true;
    } else if (k == "connect_timeout_ms") {
      cfg->connect_timeout_ms = *n;
    } else if (k == "retry_ms") {
      cfg->retry_ms = *n;
    } else {
      cfg->wait_replicas_ms = *n;
    }
    return Status::OK();
  }
  if (sentinel && k == "wait_replicas") {
    Result<int64_t> n = ParseInt(v, 0, 1000, k);
    if (!n.ok()) return n.status();
    cfg->wait_replicas = static_cast<int>(*n);
    return Status::OK();
  }
  if (k == "password_file" || (sentinel && k == "sentinel_password_file")) {
    Result<std::string> path = PercentDecode(v);
    if (!path.ok()) return path.status();
    if (path->empty()) return Bad("empty " + k);
    (k == "password_file" ? cfg->password_file : cfg->sentinel_password_file) = *path;
    return Status::OK();
  }
  if (k == "prefix") {
    if (v.empty() || v.find_first_of(":{}*?[]\\%") != std::string::npos)
      return Bad("prefix must be non-empty without : { } * ? [ ] \\ %");
    cfg->prefix = v;
    return Status::OK();
  }
  return Bad("unknown option '" + k +
             "' (known: connect_timeout_ms, timeout_ms, retry_ms, password_file, prefix, tls" +
             (sentinel ? ", sentinel_password_file, wait_replicas, wait_replicas_ms)" : ")"));
}

Status ParseQuery(const std::string& query, RedisConfig* cfg) {
  size_t pos = 0;
  while (pos < query.size()) {
    size_t amp = query.find('&', pos);
    if (amp == std::string::npos) amp = query.size();
    const std::string item = query.substr(pos, amp - pos);
    pos = amp + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    DYAD_RETURN_IF_ERROR(
        ParseOption(item.substr(0, eq), eq == std::string::npos ? "" : item.substr(eq + 1), cfg));
  }
  return Status::OK();
}

Result<std::string> ReadSecretFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return Status(DYAD_RC_AUTH, std::string(what) + " file '" + path +
                                    "' cannot be read: " + std::strerror(errno));
  }
  std::string secret;
  std::getline(in, secret);
  while (!secret.empty() && (secret.back() == '\r' || secret.back() == ' ')) secret.pop_back();
  if (secret.empty())
    return Status(DYAD_RC_AUTH, std::string(what) + " file '" + path + "' is empty");
  return secret;
}

}  // namespace

std::string RedisAddress::ToString() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<RedisConfig> ParseRedisUrl(const std::string& url) {
  if (StartsWith(url, "rediss")) return Status(DYAD_RC_NOTSUP, "'" + url + "': " + kNoTls);
  const Scheme* scheme = nullptr;
  for (const Scheme& s : kSchemes)
    if (StartsWith(url, s.text)) scheme = &s;
  if (scheme == nullptr) return Bad("'" + url + "' is not one of " + kRedisUrlForms);
  RedisConfig cfg;
  cfg.mode = scheme->mode;
  std::string rest = url.substr(std::strlen(scheme->text));
  const size_t q = rest.find('?');
  const std::string query = q == std::string::npos ? "" : rest.substr(q + 1);
  if (q != std::string::npos) rest.resize(q);
  const size_t at = rest.rfind('@');
  if (at != std::string::npos) {
    DYAD_RETURN_IF_ERROR(ParseUserinfo(rest.substr(0, at), &cfg));
    rest = rest.substr(at + 1);
  }
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    DYAD_RETURN_IF_ERROR(ParsePath(rest.substr(slash + 1), &cfg));
    rest.resize(slash);
  } else if (cfg.mode == RedisMode::kSentinel) {
    return Bad("a sentinel URL names the primary: redis+sentinel://HOST:PORT/MASTER");
  }
  size_t pos = 0;
  while (pos <= rest.size()) {
    size_t comma = rest.find(',', pos);
    if (comma == std::string::npos) comma = rest.size();
    Result<RedisAddress> a = ParseHostPort(rest.substr(pos, comma - pos), scheme->default_port);
    if (!a.ok()) return a.status();
    cfg.nodes.push_back(*a);
    pos = comma + 1;
  }
  if (cfg.mode == RedisMode::kSingle && cfg.nodes.size() != 1)
    return Bad("redis:// names one server; use redis+cluster:// or redis+sentinel:// for several");
  if (cfg.mode == RedisMode::kSentinel) cfg.wait_replicas = 1;
  Status st = ParseQuery(query, &cfg);
  if (st.code() == DYAD_RC_NOTSUP) return Status(DYAD_RC_NOTSUP, "'" + url + "': " + st.message());
  DYAD_RETURN_IF_ERROR(st);
  if (cfg.retry_ms == 0)
    cfg.retry_ms = cfg.mode == RedisMode::kSingle ? cfg.connect_timeout_ms : 10000;
  return cfg;
}

Status LoadRedisPasswords(RedisConfig* cfg) {
  if (cfg->password.empty() && !cfg->password_file.empty()) {
    Result<std::string> pw = ReadSecretFile(cfg->password_file, "redis password");
    if (!pw.ok()) return pw.status();
    cfg->password = *pw;
  } else if (cfg->password.empty()) {
    if (std::optional<std::string> env = GetEnv("DYAD_REDIS_PASSWORD")) cfg->password = *env;
  }
  if (!cfg->sentinel_password_file.empty()) {
    Result<std::string> pw = ReadSecretFile(cfg->sentinel_password_file, "sentinel password");
    if (!pw.ok()) return pw.status();
    cfg->sentinel_password = *pw;
  }
  if (!cfg->user.empty() && cfg->password.empty()) {
    return Status(DYAD_RC_BADREQUEST,
                  "redis user '" + cfg->user +
                      "' without a password (give USER:PASSWORD@, ?password_file=PATH or "
                      "$DYAD_REDIS_PASSWORD)");
  }
  return Status::OK();
}

}  // namespace dyad
