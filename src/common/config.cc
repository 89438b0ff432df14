#include "common/config.h"

#include "common/backend.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/time.h"

namespace dyad {

namespace {

// Settings of the core; each backend's own settings are in its row
// (src/transport/*/row.cc, src/kvs/*/row.cc) and join the table below.
std::vector<ConfigEntry> CoreEntries() {
  return {
      {"DYAD_PATH_PRODUCER", ConfigKind::kString, "", "both",
       "Producer-managed directory: files closed here are published. The service serves files "
       "from its producer path (or its positional argument)."},
      {"DYAD_PATH_CONSUMER", ConfigKind::kString, "", "client",
       "Consumer-managed directory: opening a file here waits for its publication and fetches it."},
      {"DYAD_KVS_NAMESPACE", ConfigKind::kString, "", "client",
       "Metadata namespace; producers and consumers of one workflow must use the same one. "
       "Unset means the primary namespace."},
      {"DYAD_DTL_MODE", ConfigKind::kString, "FLUX_RPC", "both",
       "Data transport for fetches between nodes: the service's -m/--mode is the default of its "
       "clients, and a client's DYAD_DTL_MODE overrides it for that client's consumes. The modes "
       "are listed in the transports table (FLUX_RPC, upstream's default, selects TCP). Same-node "
       "copies always use the local transport."},
      {"DYAD_SHARED_STORAGE", ConfigKind::kBool, "false", "client",
       "The managed directory is shared by all nodes (e.g. Lustre): synchronize only, never "
       "transfer."},
      {"DYAD_ASYNC_PUBLISH", ConfigKind::kBool, "false", "client",
       "Pipeline publications: produce returns once its request is written to the node's "
       "service, without waiting for its reply. A failed publication is reported by the next "
       "produce of the process (which then does not publish its own file) and by dyad_finalize, "
       "which waits up to DYAD_RPC_TIMEOUT for every reply."},
      {"DYAD_FSYNC_WRITE", ConfigKind::kBool, "false", "client",
       "fsync a produced file and its directory entry before publishing it."},
      {"DYAD_KEY_DEPTH", ConfigKind::kUint, "3", "client",
       "Levels of hash bins in metadata keys (gen_path_key)."},
      {"DYAD_KEY_BINS", ConfigKind::kUint, "1024", "client", "Hash bins per key level."},
      {"DYAD_SERVICE_MUX", ConfigKind::kUint, "1", "both",
       "Services per node sharing node-local storage; node index = rank / mux."},
      {"DYAD_PATH_RELATIVE", ConfigKind::kBool, "false", "client",
       "Relative paths given to produce/consume are relative to the managed directory instead "
       "of the working directory."},
      {"DYAD_SYNC_DEBUG", ConfigKind::kBool, "false", "both", "Debug logging."},
      {"DYAD_SYNC_CHECK", ConfigKind::kBool, "false", "client",
       "Set DYAD_SYNC_HEALTH=ok in the environment after each successful produce/consume (testing "
       "aid)."},
      {"DYAD_REINIT", ConfigKind::kBool, "false", "client",
       "Re-initialize an already initialized context."},
      {"DYAD_SERVICE_SOCKET", ConfigKind::kString, "/tmp/dyad-<uid>/service.sock", "both",
       "Unix socket of the node's dyad-service. Under Flux (FLUX_URI set) the default is "
       "the socket of the broker's dyad.so module: local:///DIR/NAME gives "
       "/DIR/dyad-NAME.sock."},
      {"DYAD_CONSUME_TIMEOUT", ConfigKind::kSeconds, "0", "client",
       "Longest a consume waits for publication plus transfer, in seconds; 0 waits without "
       "limit (interruptible). Expiry returns DYAD_RC_TIMEOUT."},
      {"DYAD_RPC_TIMEOUT", ConfigKind::kSeconds, "60", "both",
       "Bound on any single request to a service that is not a wait for publication, and on a "
       "transfer making no progress, in seconds."},
      {"DYAD_PREFETCH", ConfigKind::kString, "", "client",
       "What this consumer will read, so the node's service fetches it as soon as it is "
       "published and later consumes are local hits: path prefixes or globs ('*' also crosses "
       "'/') under the consumer directory, separated by ':'. Declared at the first consume; "
       "files published earlier are included (docs/prefetch.md)."},
      {"DYAD_LOOKAHEAD", ConfigKind::kUint, "0", "client",
       "pydyad.data.DyadDataset: samples of the sampler's order fetched ahead while the current "
       "batch trains (its lookahead argument overrides it; 0 = off)."},
      {"DYAD_LOOKAHEAD_BATCHES", ConfigKind::kUint, "2", "client",
       "pydyad.data.DyadDataset: the look-ahead's batch consumes in flight at once, each of up "
       "to min(ceil(DYAD_LOOKAHEAD / this), 64) samples (its lookahead_batches argument "
       "overrides it; at least 1)."},
      {"DYAD_PREFETCH_CONCURRENCY", ConfigKind::kUint, "8", "service",
       "Most prefetch fetches a service runs at once (explicit consumes never wait for them); "
       "a fetch is one file, or a batch of up to 64 files of at most 256 KiB from one owner."},
      {"DYAD_FOLLOW_RECORDS", ConfigKind::kBool, "true", "service",
       "Keep a local replica of the records of each namespace this node consumes from (up to 8), "
       "fed by the store's watch, so that a consume asks its owner but not the store. Each "
       "followed namespace holds one change feed of the store open."},
      {"DYAD_PREFETCH_PER_PEER", ConfigKind::kUint, "8", "service",
       "Most prefetch fetches a service runs at once from one owner (batches from one owner: "
       "at most 2, so that new publications gather into the next batch)."},
      {"DYAD_PRELOAD_ON_ERROR", ConfigKind::kString, "fail", "client",
       "What libdyad_wrapper.so does when DYAD cannot serve a managed open or close (service "
       "unreachable, timeout): 'fail' the call with an errno (EIO, ETIMEDOUT, ...) or 'pass' it "
       "through to the file system. Either way one message goes to stderr."},
      {"DYAD_WAIT_NOTICE", ConfigKind::kSeconds, "", "client",
       "libdyad_wrapper.so: after this many seconds a read waiting for a publication prints one "
       "line on stderr, once per file, saying whether the file exists here unpublished; 0: "
       "never. Unset: 5 when stderr is a terminal, else never (docs/preload.md)."},
      {"DYAD_PRELOAD_QUIET", ConfigKind::kBool, "false", "client",
       "Hide the one line libdyad_wrapper.so writes to stderr (once per process) when it is "
       "preloaded but neither DYAD_PATH_CONSUMER nor DYAD_PATH_PRODUCER is set, i.e. when it "
       "manages no directory."},
      {"DYAD_PRELOAD_LIST", ConfigKind::kBool, "false", "client",
       "libdyad_wrapper.so: true makes a listing (opendir/readdir: ls, os.listdir, os.scandir, "
       "glob, ImageFolder) of the consumer directory or a directory below it show the files "
       "published elsewhere that are not here yet (one request per listed tree); a look at each "
       "listed name (ls -l, du) then brings that file here. False lists the files here only."},
      {"DYAD_TRACE", ConfigKind::kString, "", "both",
       "Write a Chrome/Perfetto trace (JSON trace events) of publish, locate, consume, fetch and "
       "serve spans to this file; processes of one user may share it, and %p (pid) and %h (host) "
       "in the name give one file per process. Keep it in a private directory, e.g. "
       "$XDG_RUNTIME_DIR/dyad-%h-%p.json: a file of another user, one group or others may "
       "write, or a symlink is refused; a new one is created 0600 (docs/operations.md)."},
      {"DYAD_EMU_NO_NETNS", ConfigKind::kBool, "false", "tests",
       "`dyad demo`, the tests and the benchmarks: emulate nodes with loopback ports instead of "
       "network namespaces (automatic when namespaces cannot be created)."},
      {"DYAD_SERVICE_BIN", ConfigKind::kString, "", "tests",
       "`dyad demo`, the tests and the benchmarks: the dyad-service program their emulated "
       "nodes run (default: the one beside the program, then PATH)."},
      {"DYAD_TEST_REDIS_SERVER", ConfigKind::kString, "", "tests",
       "The tests and the metadata benchmark: the redis-server program to start (default: "
       "/usr/bin, /usr/local/bin or /usr/sbin)."},
      {"DYAD_SERVICE_RANK", ConfigKind::kUint, "", "service",
       "Rank of this node's service (-r overrides it); when unset, taken from FLUX_TASK_RANK, "
       "SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK or PMIX_RANK; with none of them the "
       "service refuses to start."},
      {"DYAD_SERVICE_LISTEN", ConfigKind::kString, "0.0.0.0:7590", "service",
       "TCP address the service listens on for other services."},
      {"DYAD_SERVICE_ADVERTISE", ConfigKind::kString, "", "service",
       "Address other services use to reach this one (default: the listen address; on 0.0.0.0 "
       "the host name, or the address of the interface that routes to the metadata store when "
       "the name resolves to loopback; docs/operations.md)."},
      {"DYAD_KVS", ConfigKind::kString, "embedded", "service",
       "Metadata store URL: 'embedded' on the rank that hosts the store (rank 0), "
       "'embedded://ROOT_HOST:PORT' on the others; the other stores and their URL forms are in "
       "the stores table (docs/configuration.md, `dyad info`)."},
      {"DYAD_MAX_CONNECTIONS", ConfigKind::kUint, "16384", "service",
       "Most connections (local clients and peers) a service keeps open at once; more are closed "
       "at accept, counted in connections.refused and logged at most every 10 s. An idle "
       "connection costs a descriptor and a few KiB, no thread; the service lowers the cap to fit "
       "its descriptor limit."},
      {"DYAD_WORKERS", ConfigKind::kUint, "8", "service",
       "Most threads serving requests, in each of the service's two pools (local clients, other "
       "services), started as requests need them; connections wait in one event loop, and requests "
       "waiting for a publication, "
       "or on an owner slow to send a file, hold no thread."},
      {"DYAD_WORKER_IDLE_MS", ConfigKind::kUint, "30000", "service",
       "Milliseconds a worker thread waits for a request before it ends; workers start again as "
       "requests need them (up to DYAD_WORKERS per pool), so an idle service runs none."},
      {"DYAD_MAX_UNAUTHENTICATED", ConfigKind::kUint, "64", "service",
       "Most peer connections still in their handshake at once (a flood of silent connections "
       "cannot take the service's memory or descriptors)."},
      {"DYAD_MAX_UNAUTHENTICATED_PER_PEER", ConfigKind::kUint, "16", "service",
       "Most connections in their handshake from one remote address, so one host cannot take "
       "every handshake slot."},
      {"DYAD_SECRET_FILE", ConfigKind::kString, "", "service",
       "File holding the cluster secret that services use to authenticate each other (mode 600; "
       "at least 128 random bits, e.g. 32 hex digits: `dyad secret init FILE` writes one)."},
      {"DYAD_SECRET", ConfigKind::kString, "", "service",
       "The cluster secret itself (prefer DYAD_SECRET_FILE; at least 128 random bits). "
       "dyad-service removes it from its environment once read; `dyad info` shows only whether "
       "it is set."},
      {"DYAD_MUNGE", ConfigKind::kBool, "false", "service",
       "Services also authenticate each other with MUNGE credentials of the same uid (with a "
       "secret: both are required; without one: MUNGE alone). Needs munged on every node "
       "(docs/security.md)."},
      {"DYAD_MUNGE_SOCKET", ConfigKind::kString, "", "service",
       "Socket of munged (default: libmunge's, /run/munge/munge.socket.2)."},
      {"DYAD_LINK_PROTECTION", ConfigKind::kString, "integrity", "service",
       "Protection of the links between services after the handshake: 'integrity' (every "
       "message and file chunk carries an AES-256-GCM tag), 'encrypt' (also encrypted), 'none' "
       "(zero-copy file data and no integrity: a trusted fabric only). Peers use the stronger "
       "of their two settings (docs/security.md)."},
      {"DYAD_CACHE_BYTES", ConfigKind::kUint, "0", "service",
       "Byte budget for the copies the service fetches into consumer directories (0: no "
       "limit). Past it, the least recently consumed copies are removed (never one a process "
       "holds open, one consumed within the last second, or a file this node produced); a "
       "removed file is fetched again by its next consume (docs/consistency.md). Copies count "
       "wherever they are, a consumer directory that is the producer directory included; a file "
       "larger than the budget is refused at its consume (DYAD_RC_NOSPACE)."},
      {"DYAD_PREFETCH_MIN_FREE", ConfigKind::kString, "10%", "service",
       "Free space a prefetch leaves in the consumer's file system: a percentage of its size "
       "('10%') or bytes ('2G', '500M'); a file that would go below it is fetched only when "
       "consumed (docs/prefetch.md)."},
      {"DYAD_SERVICE_FILE_MODE", ConfigKind::kString, "0600", "service",
       "Octal mode of the files the service creates for its operator: the -i/-e logs (an "
       "existing one of the service's user that is wider is narrowed) and the --ready-file. The "
       "umask narrows it further. Logs quote paths and peers' addresses: widen it (e.g. 0640) "
       "only for a group that may read them."},
      {"DYAD_INSECURE", ConfigKind::kBool, "false", "service",
       "Let a service without any credential listen, on loopback too (it refuses otherwise): "
       "every process reaching its port (on loopback: every local user) can then fetch any "
       "file of its producer directory and use the metadata store."},
  };
}

}  // namespace

const std::vector<ConfigEntry>& ConfigTable() {
  static const std::vector<ConfigEntry> table = [] {
    std::vector<ConfigEntry> all = CoreEntries();
    for (const BackendRow* row : BackendRows())
      all.insert(all.end(), row->config.begin(), row->config.end());
    return all;
  }();
  return table;
}

const char* ConfigKindName(ConfigKind kind) {
  switch (kind) {
    case ConfigKind::kBool:
      return "bool";
    case ConfigKind::kUint:
      return "integer";
    case ConfigKind::kString:
      return "string";
    case ConfigKind::kSeconds:
      return "seconds";
  }
  return "?";
}

const ConfigEntry* FindConfigEntry(const std::string& name) {
  for (const auto& e : ConfigTable())
    if (name == e.name) return &e;
  return nullptr;
}

std::optional<std::string> GetEnv(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

void EraseEnv(const char* name) {
  if (char* v = std::getenv(name)) {
    // volatile: the compiler may not drop stores to memory it sees no use of.
    volatile char* p = v;
    while (*p != '\0') *p++ = '\0';
  }
  ::unsetenv(name);
}

bool ParseBool(const std::string& text) {
  std::string t = text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  return !(t == "0" || t == "false" || t == "no" || t == "off");
}

bool EnvBool(const char* name, bool def) {
  auto v = GetEnv(name);
  if (!v) return def;
  return ParseBool(*v);
}

Result<uint64_t> EnvUint(const char* name, uint64_t def) {
  auto v = GetEnv(name);
  if (!v || v->empty()) return def;
  char* end = nullptr;
  errno = 0;
  const unsigned long long x = std::strtoull(v->c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || (*v)[0] == '-')
    return Status(DYAD_RC_BADREQUEST,
                  std::string(name) + "='" + *v + "' is not a non-negative integer");
  return static_cast<uint64_t>(x);
}

Result<int64_t> EnvTimeoutMs(const char* name, int64_t def_ms) {
  auto v = GetEnv(name);
  if (!v) return def_ms;
  if (v->empty() || *v == "inf" || *v == "none") return int64_t{-1};
  char* end = nullptr;
  const double s = std::strtod(v->c_str(), &end);
  if (*end != '\0' || !std::isfinite(s) || s < 0)
    return Status(DYAD_RC_BADREQUEST,
                  std::string(name) + "='" + *v + "' is not a number of seconds");
  if (s == 0) return int64_t{-1};
  // Huge values (1e300) mean "practically no limit", never an overflow.
  return SecondsToMsSaturating(s);
}

bool ConfigValueIsSecret(const std::string& name) {
  const bool names_a_file = name.size() >= 5 && name.compare(name.size() - 5, 5, "_FILE") == 0;
  return !names_a_file &&
         (name.find("SECRET") != std::string::npos || name.find("PASSWORD") != std::string::npos);
}

std::string RedactSecrets(const std::string& value) {
  std::string out = value;
  // scheme://[USER]:PASSWORD@HOST...: the password becomes ***.
  const size_t scheme = out.find("://");
  if (scheme != std::string::npos) {
    const size_t start = scheme + 3;
    const size_t end = out.find_first_of("/?#", start);
    const size_t at = out.rfind('@', end == std::string::npos ? std::string::npos : end);
    if (at != std::string::npos && at >= start) {
      const size_t colon = out.find(':', start);
      if (colon != std::string::npos && colon < at) out.replace(colon + 1, at - colon - 1, "***");
    }
  }
  // ?password=...&secret=...: the values become *** (password_file stays:
  // a path).
  for (const char* key : {"password=", "pass=", "secret=", "token="}) {
    for (size_t pos = out.find(key); pos != std::string::npos; pos = out.find(key, pos + 1)) {
      if (pos > 0 && out[pos - 1] != '?' && out[pos - 1] != '&' && out[pos - 1] != ';') continue;
      const size_t v = pos + std::strlen(key);
      const size_t e = out.find_first_of("&;#", v);
      out.replace(v, (e == std::string::npos ? out.size() : e) - v, "***");
    }
  }
  return out;
}

std::string ConfigValueForDisplay(const std::string& name, const std::string& value) {
  if (ConfigValueIsSecret(name))
    return value.empty() ? std::string("(set, empty)") : std::string("(set, hidden)");
  return RedactSecrets(value);
}

std::string FluxServiceSocket(const std::string& flux_uri) {
  static const std::string kScheme = "local://";
  if (flux_uri.compare(0, kScheme.size(), kScheme) != 0) return "";
  std::string path = flux_uri.substr(kScheme.size());
  // (a query or fragment is not part of the path)
  if (const size_t q = path.find_first_of("?#"); q != std::string::npos) path.resize(q);
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  if (path.empty() || path[0] != '/') return "";
  const size_t slash = path.rfind('/');
  const std::string name = path.substr(slash + 1);
  if (slash == 0 || name.empty() || name == "." || name == "..") return "";
  return path.substr(0, slash + 1) + "dyad-" + name + ".sock";
}

std::string DefaultServiceSocket() {
  if (auto v = GetEnv("DYAD_SERVICE_SOCKET"); v && !v->empty()) return *v;
  if (auto uri = GetEnv("FLUX_URI"); uri && !uri->empty()) {
    if (std::string sock = FluxServiceSocket(*uri); !sock.empty()) return sock;
  }
  return "/tmp/dyad-" + std::to_string(getuid()) + "/service.sock";
}

}  // namespace dyad
