// dyad_client.hpp: the C++ client of DYAD (libdyad_ctx).
//
// dyad::client::Client is the client the DYAD front ends are built on (the
// C API, the C++ streams and pydyad). It knows the
// producer- and consumer-managed directories of its Options and talks to the
// node's dyad-service over pooled Unix-socket connections: Produce()
// publishes a file that is complete in the producer directory; Consume()
// returns once a file is complete in the consumer directory, waiting for its
// publication and fetching it from its owner node when needed. Unlike the C
// API, a path outside the managed directory is an error here
// (DYAD_RC_UNTRACKED), so callers learn why nothing happened.
//
// Errors: every request returns a Status (a dyad_rc_t and a message) and
// throws nothing; output parameters are set only on success. Only the
// accessors that copy strings (options(), KeyOf()) may throw
// std::bad_alloc. Calls here do not touch dyad_last_error(), which belongs
// to the C API.
//
// Threading: a Client is a handle; copies share one immutable client and
// its connection pool, and every method may be called from any thread at
// once. Fork-safe: a child process opens its own connections.
//
// This header needs only C++11, so programs written for upstream DYAD and
// built with -std=c++11 can use it. The implementation is private.
#ifndef DYAD_CLIENT_DYAD_CLIENT_HPP
#define DYAD_CLIENT_DYAD_CLIENT_HPP

#include <dyad/common/dyad_rc.h>
#include <dyad/common/dyad_structures.h>
#include <dyad/dyad_config.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dyad {
namespace client {

// The outcome of a call: DYAD_RC_OK, or an error code and what failed
// ("consume 'a/b': not published within 5 s").
class Status {
 public:
  Status() : code_(DYAD_RC_OK) {}
  Status(dyad_rc_t code, std::string message) : code_(code), message_(std::move(message)) {}

  bool ok() const { return code_ == DYAD_RC_OK; }
  dyad_rc_t code() const { return code_; }
  const std::string& message() const { return message_; }
  // "DYAD_RC_TIMEOUT: consume 'a/b': ..." ("DYAD_RC_OK" on success).
  std::string ToString() const {
    std::string s = dyad_rc_name(code_);
    if (!message_.empty()) s += ": " + message_;
    return s;
  }

 private:
  dyad_rc_t code_;
  std::string message_;
};

// Every setting of a client, with the documented defaults
// (docs/configuration.md), the same in every language binding.
struct DYAD_DLL_EXPORTED Options {
  bool debug = false;                     // DYAD_SYNC_DEBUG: failures on stderr
  bool check = false;                     // DYAD_SYNC_CHECK: setenv DYAD_CHECK=ok after success
  bool shared_storage = false;            // DYAD_SHARED_STORAGE
  bool async_publish = false;             // DYAD_ASYNC_PUBLISH
  bool fsync_write = false;               // DYAD_FSYNC_WRITE
  uint32_t key_depth = 3;                 // DYAD_KEY_DEPTH
  uint32_t key_bins = 1024;               // DYAD_KEY_BINS (0 counts as 1)
  uint32_t service_mux = 1;               // DYAD_SERVICE_MUX (0 counts as 1)
  std::string kvs_namespace;              // DYAD_KVS_NAMESPACE ("" = the primary namespace)
  std::string producer_path;              // DYAD_PATH_PRODUCER ("" = none)
  std::string consumer_path;              // DYAD_PATH_CONSUMER ("" = none)
  bool relative_to_managed_path = false;  // DYAD_PATH_RELATIVE
  // DYAD_DTL_MODE, any case. "" chooses nothing: the local service's own
  // mode applies.
  std::string dtl_mode;
  std::string service_socket;       // DYAD_SERVICE_SOCKET ("" = the default socket)
  int64_t consume_timeout_ms = -1;  // DYAD_CONSUME_TIMEOUT (< 0: no limit)
  int64_t rpc_timeout_ms = 60000;   // DYAD_RPC_TIMEOUT (< 0: no limit)

  // Reads every DYAD_* variable. A malformed number or an unknown
  // DYAD_DTL_MODE gives an error naming the variable.
  static Status FromEnv(Options* out);
};

// Which managed directory a path is resolved against.
enum class Side { kProducer, kConsumer };

// A published file as the metadata store describes it.
struct Metadata {
  std::string path;                // relative to the managed directory
  uint32_t owner_rank = 0;         // rank of the service that owns it
  uint64_t owner_incarnation = 0;  // changes each time the owner restarts
  uint64_t size = 0;               // bytes, when published
  uint64_t version = 0;            // modification time (ns) of the published copy
  uint64_t published_ns = 0;       // wall clock at publication
};

// What a consume did (for tools and benchmarks).
struct ConsumeInfo {
  std::string path;          // relative to the consumer directory
  bool level1 = false;       // complete locally already: no request was sent
  bool transferred = false;  // this call caused a transfer
  bool joined = false;       // waited for a transfer another request had started
  bool local = false;        // no transfer needed (same directory or shared storage)
  uint64_t bytes = 0;        // bytes transferred
  Metadata metadata;         // the service's record (when a request was sent)
  uint64_t elapsed_ns = 0;   // time spent in the call
  // What moved the file: the transport's name ("tcp", "ucx", "ofi",
  // "local"; "" when nothing moved; with `local`, "prefetched" or "cached"
  // when the service found a current copy it had placed before: ahead of
  // any consume, or for an earlier one), and the owner service's address
  // ("" when the local service owns the file).
  std::string transport;
  std::string owner_address;
};

// One entry of List(): the metadata key and the record.
struct ListEntry {
  std::string key;
  Metadata metadata;
};

// The local service's identity (rank, directories, transport, store, ...)
// and counters, as `dyad status` shows them (docs/service.md).
// A transfer the local service has in flight.
struct DYAD_DLL_EXPORTED Transfer {
  static const uint64_t kUnknownBytes = ~0ull;
  bool outgoing = false;                // true: the local service sends (it owns the file)
  std::string path;                     // relative to the managed directory
  uint32_t peer_rank = 0;               // the service at the other end
  std::string transport;                // "tcp", "ucx", "ofi", ...
  uint64_t bytes_done = kUnknownBytes;  // kUnknownBytes when the transport cannot tell
  uint64_t bytes_total = 0;
  uint64_t elapsed_ns = 0;
};

struct ServiceStatus {
  std::string socket;  // the Unix socket of the service that answered
  std::map<std::string, std::string> info;
  std::map<std::string, uint64_t> counters;
  std::vector<Transfer> transfers;
};

// A request of a local process waiting in the local service for a file's
// publication (GetServiceStatus with waits).
struct WaitingRequest {
  std::string kind;  // "consume", or "locate" (a metadata wait)
  std::string path;  // relative to the managed directory (a locate: its key)
  std::string kvs_namespace;
  uint32_t pid = 0;     // the waiting process (0: unknown)
  uint64_t age_ns = 0;  // how long it has waited
  // A file by that name this node has but never published (e.g. written
  // by a shell redirection, outside DYAD): why nothing comes. "" if none.
  std::string unpublished_local_file;
};

// How the local service sees another service (Peers()).
enum class PeerState {
  kUnknown = 0,        // not probed
  kAlive = 1,          // answered as the registered rank and incarnation
  kDown = 2,           // did not answer within the bound
  kOtherIdentity = 3,  // its address answers as another service (a stale record)
  kRefused = 4,        // refused the cluster credential
  kStopped = 5,        // stopped cleanly (SIGTERM/SIGINT); its registration says so
};
// "unknown", "alive", "down", "stale", "refused", "stopped".
DYAD_DLL_EXPORTED const char* PeerStateName(PeerState state);

// A service registered in the metadata store, as the local service sees it.
struct Peer {
  uint32_t rank = 0;
  uint32_t node = 0;         // node index it registered with
  std::string address;       // host:port it serves on
  std::string host;          // its host name
  uint32_t pid = 0;          // 0 when unknown
  uint64_t incarnation = 0;  // changes each time it restarts
  uint64_t started_ns = 0;   // wall clock at its start
  PeerState state = PeerState::kUnknown;
  uint64_t last_contact_ns = 0;  // wall clock of the last authenticated exchange (0: never)
  uint64_t rtt_ns = 0;           // round trip of the probe
  std::string detail;            // why it is not alive, or "this service"
};

class DYAD_DLL_EXPORTED Client {
 public:
  // A client with `options`: relative managed paths are made absolute now,
  // the DTL mode is checked (DYAD_RC_BADDTLMODE). No connection is made
  // until the first request.
  static Status Create(const Options& options, Client* out);
  // Create() with Options::FromEnv().
  static Status FromEnv(Client* out);
  // The client of the C context `ctx` (dyad_ctx_get() after dyad_init):
  // its settings and its connections. DYAD_RC_NOCTX when `ctx` is not this
  // process's initialized context. A later dyad_init/dyad_finalize does
  // not affect a client already obtained.
  static Status FromContext(dyad_ctx_t* ctx, Client* out);

  // An empty handle: every request gives DYAD_RC_NOCTX.
  Client();
  ~Client();
  Client(const Client& other);
  Client& operator=(const Client& other);

  bool valid() const { return impl_ != nullptr; }
  // The settings in effect: managed paths absolute and normalized, the DTL
  // mode canonical ("" when not chosen), the socket resolved.
  Options options() const;
  bool has_producer_path() const;
  bool has_consumer_path() const;

  // The path of `path` relative to the `side` managed directory. Relative
  // names are taken against the working directory, or against the managed
  // directory with relative_to_managed_path. DYAD_RC_UNTRACKED outside the
  // directory, DYAD_RC_PERM for a relative name escaping it with "..",
  // DYAD_RC_BADMANAGEDPATH when that directory is not configured.
  Status Resolve(const std::string& path, Side side, std::string* relative) const;
  // True exactly when Resolve() would succeed; a few string comparisons for
  // normalized absolute names (no allocation, no system call).
  bool IsManaged(const char* path, Side side) const;
  bool IsManaged(const std::string& path, Side side) const { return IsManaged(path.c_str(), side); }

  // Publishes a file that is complete (closed) under the producer directory.
  Status Produce(const std::string& path);
  // Returns once `path` is complete under the consumer directory.
  Status Consume(const std::string& path, ConsumeInfo* info = nullptr);
  // Metadata of a published file. Without `wait`, an unpublished file gives
  // DYAD_RC_NOTFOUND; with it, waits like Consume().
  Status GetMetadata(const std::string& path, bool wait, Metadata* out);
  // Consume() when the metadata is known already: no request at all when
  // the local copy has the record's size and version.
  Status ConsumeWithMetadata(const std::string& path, const Metadata& metadata,
                             ConsumeInfo* info = nullptr);
  // Consumes every path of `paths` in one request: the service fetches them
  // concurrently. `*results` gets one Status per path (a missing or failed
  // file does not fail the others); the returned Status is the request's.
  Status ConsumeBatch(const std::vector<std::string>& paths, std::vector<Status>* results);
  // The same with `timeout_ms` replacing consume_timeout_ms for this batch:
  // 0 takes only files already published (look-ahead), the others end with
  // DYAD_RC_TIMEOUT at once.
  Status ConsumeBatch(const std::vector<std::string>& paths, int64_t timeout_ms,
                      std::vector<Status>* results);
  // Declares (with `cancel`, withdraws) that this process will read the
  // files matching `pattern`, a path prefix or glob under the consumer
  // directory: the node's service fetches each as it is published, so a
  // later Consume() is local (docs/prefetch.md). `*already_published`, when
  // not null, gets how many matching files were published before.
  Status Prefetch(const std::string& pattern, bool cancel = false,
                  uint32_t* already_published = nullptr);

  // Published files whose relative path starts with `prefix`, at most
  // `limit` (0 = all), in the configured namespace or in `kvs_namespace`.
  Status List(const std::string& prefix, uint32_t limit, std::vector<ListEntry>* out);
  Status ListNamespace(const std::string& kvs_namespace, const std::string& prefix, uint32_t limit,
                       std::vector<ListEntry>* out);
  // Identity, counters and transfers in flight of the local service.
  Status GetServiceStatus(ServiceStatus* out);
  // The same, and the requests waiting there for a publication (oldest
  // first; a service from before this list answers none).
  Status GetServiceStatus(ServiceStatus* out, std::vector<WaitingRequest>* waits);
  // The services registered in the metadata store (only `ranks`, or all
  // when empty), sorted by rank. With `probe_timeout_ms` > 0 the local
  // service probes each one, bounded by that time; otherwise states are
  // kUnknown.
  Status Peers(const std::vector<uint32_t>& ranks, int64_t probe_timeout_ms,
               std::vector<Peer>* out);
  // One round trip to the local service.
  Status Ping();

  // The metadata key of a path relative to a managed directory (seed's
  // gen_path_key with this client's key depth and bins).
  std::string KeyOf(const std::string& relative_path) const;

 private:
  class Impl;
  DYAD_DLL_HIDDEN explicit Client(std::shared_ptr<Impl> impl);

  std::shared_ptr<Impl> impl_;
};

// Installs the process-wide interrupt check (an empty function removes it).
// A call waiting for the service asks it at least every 200 ms and after a
// signal interrupted the wait; when it returns true the call gives up with
// DYAD_RC_CANCELLED. For runtimes that handle SIGINT themselves (pydyad).
DYAD_DLL_EXPORTED void SetInterruptCheck(std::function<bool()> check);

// Makes a failed `status` the calling thread's dyad_last_error() and
// returns its code (DYAD_RC_OK, touching nothing, for success): for layers
// that report through the C API's conventions on top of this client
// (libdyad_client, the C++ streams).
DYAD_DLL_EXPORTED dyad_rc_t SetLastError(const Status& status);

}  // namespace client
}  // namespace dyad

#endif  // DYAD_CLIENT_DYAD_CLIENT_HPP
