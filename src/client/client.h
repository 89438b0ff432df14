// client.h: dyad::Client, the one client core behind every DYAD front end
// (the C API, the C++ streams, pydyad, the preload library, the `dyad`
// command).
//
// A Client holds the settings of one process (ClientConfig), recognizes
// paths under its producer- and consumer-managed directories, and talks to
// the node's dyad-service over a pooled Unix-socket connection: Produce()
// publishes a closed file, Consume() returns once a file is complete in the
// consumer directory (the service waits for its publication, fetches it,
// and renames it into place). The client never moves file data itself.
//
// Threading: a Client is immutable after Create() except for its connection
// pool, which is thread-safe, and two values it learns once (published with
// atomics); every method may be called from any thread at once. Changing a
// setting means creating a new Client (it may share the old one's pool).
// Fork-safe: no lock on a produce/consume path can be left held in a child
// (see service_pool.h for the pool).
#pragma once

#include <sys/stat.h>
#include <atomic>
#include <climits>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "client/flux_link.h"
#include "client/service_pool.h"
#include "common/status.h"
#include "proto/protocol.h"

namespace dyad {

// Every setting of dyad_init, plus this implementation's additions. The
// defaults are the documented ones (docs/configuration.md), identical for
// every language binding.
struct ClientConfig {
  bool debug = false;             // DYAD_SYNC_DEBUG: log failures to stderr
  bool check = false;             // DYAD_SYNC_CHECK: setenv DYAD_SYNC_HEALTH=ok after success
  bool shared_storage = false;    // DYAD_SHARED_STORAGE
  bool reinit = false;            // DYAD_REINIT (used by dyad_init only)
  bool async_publish = false;     // DYAD_ASYNC_PUBLISH
  bool fsync_write = false;       // DYAD_FSYNC_WRITE
  uint32_t key_depth = 3;         // DYAD_KEY_DEPTH
  uint32_t key_bins = 1024;       // DYAD_KEY_BINS (0 is treated as 1)
  uint32_t service_mux = 1;       // DYAD_SERVICE_MUX (0 is treated as 1)
  std::string kvs_namespace;      // DYAD_KVS_NAMESPACE ("" = primary namespace)
  std::string prod_managed_path;  // DYAD_PATH_PRODUCER ("" = none)
  std::string cons_managed_path;  // DYAD_PATH_CONSUMER ("" = none)
  bool relative_to_managed_path = false;  // DYAD_PATH_RELATIVE
  std::string dtl_mode = "FLUX_RPC";      // DYAD_DTL_MODE (canonical spelling)
  // Whether the process chose dtl_mode (DYAD_DTL_MODE set, or a mode given
  // to dyad_init). A mode other than the default is a choice anyway. Only a
  // choice overrides the local service's own mode (its -m).
  bool dtl_mode_chosen = false;
  std::string service_socket;       // DYAD_SERVICE_SOCKET ("" = DefaultServiceSocket())
  int64_t consume_timeout_ms = -1;  // DYAD_CONSUME_TIMEOUT (< 0: no limit)
  int64_t rpc_timeout_ms = 60000;   // DYAD_RPC_TIMEOUT (< 0: no limit)
  // DYAD_PREFETCH: ':'-separated prefixes or globs under the consumer
  // directory, declared to the service at the first consume.
  std::vector<std::string> prefetch;
  // Flux (docs/flux.md): the broker of this process (FLUX_URI, "" when not
  // under Flux) and the caller's open flux_t (dyad_init's flux_handle, not
  // owned; null when none). With either, a process whose broker runs no
  // dyad.so module consumes straight from the owner's module (flux_link.h).
  std::string flux_uri;
  void* flux_handle = nullptr;

  // Reads every DYAD_* variable of the configuration table. Malformed
  // numbers or an unknown DYAD_DTL_MODE give an error naming the variable.
  static Result<ClientConfig> FromEnv();
};

// Checks a DTL mode name against the transport rows (any case; aliases
// accepted) and returns its canonical upper-case spelling. Whether the
// transport is compiled into the service is for the service to say.
Result<std::string> NormalizeDtlMode(const std::string& name);

// DYAD_SYNC_CHECK: marks this process's last operation successful
// (setenv DYAD_SYNC_HEALTH=ok).
void MarkChecked();

// A managed directory, kept in two forms so that a path spelled either way
// matches without a realpath() per call: as given (made absolute and
// lexically normalized) and canonical (symlinks resolved when it existed).
class ManagedPath {
 public:
  ManagedPath() = default;
  // `path` may be relative (taken against the working directory now).
  explicit ManagedPath(const std::string& path);
  ~ManagedPath();
  ManagedPath(const ManagedPath&) = delete;
  ManagedPath& operator=(const ManagedPath&) = delete;

  bool empty() const { return given_.empty(); }
  // True once CurrentCanonical found the directory (its answer is final).
  bool resolved() const { return resolved_.load(std::memory_order_acquire) != nullptr; }
  const std::string& given() const { return given_; }
  const std::string& canonical() const { return canonical_; }
  // The canonical form now: realpath() is retried while the directory did
  // not exist, and cached once it does. Used for requests, not for matching.
  std::string CurrentCanonical() const;

  // If the normalized absolute `abs` is this directory or below it, returns
  // the part below ("" for the directory itself).
  std::optional<std::string> Match(const std::string& abs) const;
  // True when the normalized absolute `abs` is strictly below this directory.
  bool Contains(std::string_view abs) const;

 private:
  std::string given_;
  std::string canonical_;
  // Set once (null until the directory exists). An atomic pointer rather
  // than a mutex: this sits on every produce/consume, and a mutex held by
  // another thread at fork() would stay locked forever in the child.
  mutable std::atomic<const std::string*> resolved_{nullptr};
};

// Copies of the consumer directory found current by their version stamp,
// remembered by what an fstat tells of them, so that opening one again
// costs no second look at its stamp. Any change a stamp's verdict depends
// on changes the file's change time (ctime) or its inode: a write (also
// size and mtime), the service withdrawing or rewriting the stamp (an
// attribute change), a new copy renamed into place (another inode). A copy
// is remembered only once its ctime is older than kSettledNs, so a change
// within the same clock tick as the one remembered cannot keep the ctime
// (file systems take ctime from a coarse clock). A fixed table, one copy a
// slot, written without locks (fork-safe): a slot being written is a miss.
class StampMemo {
 public:
  static constexpr size_t kSlots = 4096;
  static constexpr uint64_t kSettledNs = 100'000'000;  // 100 ms
  StampMemo() = default;
  ~StampMemo();
  StampMemo(const StampMemo&) = delete;
  StampMemo& operator=(const StampMemo&) = delete;

  // True when `st` is a copy remembered as current, unchanged since.
  bool Knows(const struct stat& st) const;
  // Remembers `st` (taken before its stamp was read and found current),
  // when its ctime is settled.
  void Remember(const struct stat& st);

 private:
  struct Slot {
    std::atomic<uint64_t> seq{0};  // odd while being written
    std::atomic<uint64_t> dev{0}, ino{0}, ctime{0}, size{0}, mtime{0};
  };
  static size_t Index(const struct stat& st);
  std::atomic<Slot*> slots_{nullptr};  // made at the first Remember
};

// Which side a path is resolved against.
enum class Side { kProducer, kConsumer };

// What a consume did, for tools and benchmarks.
struct ConsumeInfo {
  std::string upath;
  bool level1 = false;  // satisfied by the local directory, no request sent
  ConsumeReply reply;   // the service's answer (when a request was sent)
  uint64_t elapsed_ns = 0;
};

// Whether `path` carries the version stamp of exactly `rec` (kVersionXattr,
// either form): a copy of that version, placed by DYAD.
bool HasStamp(const std::string& path, const FileRecord& rec);

class Client {
 public:
  // Validates and normalizes `config` (absolute managed paths, clamped bins
  // and mux, canonical DTL mode). `pool` lets a re-configured client keep
  // the previous one's connections; nullptr makes a new pool.
  static Result<std::shared_ptr<Client>> Create(ClientConfig config,
                                                std::shared_ptr<ServicePool> pool = nullptr);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  const ClientConfig& config() const { return config_; }
  const std::shared_ptr<ServicePool>& pool() const { return pool_; }
  // Non-null when the process runs under Flux (flux_uri or flux_handle).
  const std::shared_ptr<FluxLink>& flux() const { return flux_; }
  const ManagedPath& producer_path() const { return prod_; }
  const ManagedPath& consumer_path() const { return cons_; }
  bool has_producer_path() const { return !prod_.empty(); }
  bool has_consumer_path() const { return !cons_.empty(); }

  // Maps `fname` to its path relative to a managed directory ("upath"):
  // absolute names as they are, relative ones against the working directory,
  // or against the managed directory when relative_to_managed_path is set.
  // Names outside the directory give DYAD_RC_UNTRACKED; names escaping it
  // with ".." (relative mode) DYAD_RC_PERM; no such directory configured
  // DYAD_RC_BADMANAGEDPATH. Costs no system call for absolute names.
  Result<std::string> Resolve(const std::string& fname, Side side) const;

  // True exactly when Resolve(fname, side) would succeed. Allocation-free
  // for normalized absolute names (the common case of an intercepted
  // open()), so paths outside the managed directories cost a few string
  // comparisons.
  bool IsManaged(std::string_view fname, Side side) const;

  // Publishes a file that is complete under the producer directory. With
  // async_publish the request is pipelined (publish_pipeline.h): this
  // returns once it is written to the service's socket, and a failure is
  // returned by a later Produce or by FlushPublications.
  Status Produce(const std::string& fname);
  // Waits (up to the RPC timeout) until every asynchronous publication
  // sent on this client's connections (DYAD_ASYNC_PUBLISH) is answered by
  // the service, and returns the earliest failure not reported yet by a
  // produce (OK when none). dyad_finalize calls it; a synchronous publish
  // calls it first so as not to overtake queued ones.
  Status FlushPublications();
  // The same wait, leaving a failure for the next produce or flush to
  // report (a consume's ordering, not its result).
  void AwaitPublications();
  // Read-write ownership: `fname`, a file under the consumer directory that
  // this process wrote, becomes this node's: its bytes are copied to the
  // same path under the producer directory (under the producer lock) and
  // published from there; older copies on other nodes are dropped before
  // this returns (docs/consistency.md). `src_fd` (or -1) is a descriptor
  // of the written file to copy from. Needs a producer directory.
  Status Adopt(const std::string& fname, int src_fd = -1);
  // Returns once `fname` is complete under the consumer directory.
  Status Consume(const std::string& fname, ConsumeInfo* info = nullptr);
  // Metadata of a published file (kLocate). Without `wait`, an unpublished
  // file gives DYAD_RC_NOTFOUND; with it, waits up to the consume timeout.
  Result<FileRecord> GetMetadata(const std::string& fname, bool wait);
  // Like Consume with the metadata already known: no request at all when
  // the local copy matches the record's size and version.
  Status ConsumeWithRecord(const std::string& fname, const FileRecord& record,
                           ConsumeInfo* info = nullptr);
  // Consumes many files in one request; the service places them
  // concurrently. `results` gets one Status per name, in order (a missing
  // or failed file does not fail the others); the returned Status is that
  // of the request itself. Files already complete locally cost nothing.
  // `timeout_ms` (>= 0) replaces DYAD_CONSUME_TIMEOUT for this batch: 0
  // takes only files already published (look-ahead), the others end with
  // DYAD_RC_TIMEOUT at once.
  static constexpr int64_t kConfiguredTimeout = INT64_MIN;
  // A consume of a file the caller has opened already (`fd`, `st` its
  // fstat): true when it is complete here (level 1: the checks of Consume
  // on the descriptor, no path lookups, no message); false when the caller
  // must close it and Consume. For the preload library's opens.
  bool ConsumeOpened(int fd, const struct stat& st);
  // The same before any look at the descriptor: true when whatever the
  // caller opened in the consumer directory is complete here as it is (a
  // directory private to consumers: a regular file there is complete, and
  // anything else is none of DYAD's), so no fstat is needed; false when
  // the caller must fstat it and ask ConsumeOpened.
  bool ConsumeOpenedInPrivateDirectory();
  Status ConsumeBatch(const std::vector<std::string>& fnames, std::vector<Status>* results,
                      int64_t timeout_ms = kConfiguredTimeout);
  // Declares (or with `cancel` withdraws) that this process will read the
  // files matching `pattern`: a path prefix or glob, absolute under the
  // consumer directory or relative to it. The service then fetches each
  // into the consumer directory as it is published (already published
  // ones at once). Returns how many were already published.
  Result<uint32_t> Prefetch(const std::string& pattern, bool cancel = false);
  // `pattern` as the service wants it: relative to the consumer directory.
  Result<std::string> PrefetchPattern(const std::string& pattern) const;

  // Service identity and counters (kStatus).
  Result<StatusReply> ServiceStatus();
  // The services registered in the metadata store and their liveness (kPeers).
  Result<PeersReply> Peers(const PeersRequest& req);
  // Published files whose path starts with `prefix` (kList); `ns` defaults
  // to the configured namespace, `limit` 0 means all.
  Result<std::vector<std::pair<std::string, FileRecord>>> List(
      const std::string& prefix, uint32_t limit, const std::optional<std::string>& ns = {});
  Status Ping();

  // The metadata key of a path relative to a managed directory.
  std::string KeyOf(const std::string& upath) const;

 private:
  Client(ClientConfig config, std::shared_ptr<ServicePool> pool);

  // The operations without their DYAD_TRACE span.
  Status ProduceUntraced(const std::string& fname);
  Status ConsumeUntraced(const std::string& fname, ConsumeInfo* info);
  Status ConsumeWithRecordUntraced(const std::string& fname, const FileRecord& record,
                                   ConsumeInfo* info);
  Result<FileRecord> GetMetadataUntraced(const std::string& fname, bool wait);
  Status ConsumeRequestFor(const std::string& upath, const FileRecord* record, ConsumeInfo* info);
  Status Publish(const std::string& upath, const struct stat& st, const std::string& adopted_copy);
  Status CopyToProducer(const std::string& upath, int src_fd, struct stat* published);
  ConsumeRequest BuildConsumeRequest(const std::string& upath, const std::string& cons) const;
  // The consumer directory's canonical name, created first when missing
  // (the service places files beneath it). Checked once per client, or
  // again with `recheck` (a consume that failed, which a directory removed
  // meanwhile would explain); sets *created when it had to create it.
  std::string EnsureConsumerDir(bool recheck = false, bool* created = nullptr);
  // The Flux path (client_flux.cc), taken when the local service is not
  // reachable (DYAD_RC_NOSERVICE) and flux_ is set: the record from the
  // instance's KVS (waiting up to `wait_ms`, < 0 no limit), the bytes from
  // the owner's dyad.fetch, placed atomically into the consumer directory.
  Status ConsumeViaFlux(const std::string& upath, const FileRecord* record, int64_t wait_ms,
                        ConsumeInfo* info);
  Result<FileRecord> LocateViaFlux(const std::string& upath, bool wait, int64_t wait_ms);
  // `st` (DYAD_RC_NOSERVICE of a call that needs the local service) with a
  // message that says how to get one on Flux.
  Status NoModule(const Status& st, const char* op) const;
  // Sends the DYAD_PREFETCH declarations once (client_batch.cc).
  void DeclareConfiguredPrefetch();
  // DeclareConfiguredPrefetch when DYAD_PREFETCH names a pattern not yet
  // declared: an atomic load otherwise.
  void DeclarePrefetchOnce() {
    if (!config_.prefetch.empty() && !prefetch_declared_.load(std::memory_order_relaxed))
      DeclareConfiguredPrefetch();
  }
  // What every consume does first: the path under the managed directory,
  // a fresh `info` naming it, and DYAD_PREFETCH declared (before a level-1
  // hit can return without a message).
  Result<std::string> BeginConsume(const std::string& fname, ConsumeInfo* info);
  // Level 1 of the file locator: true when `path` (in the consumer
  // directory) is known complete without a message: a copy a service placed
  // that nobody changed since (its revocable version stamp describes it),
  // in either layout, or any regular file of a directory private to
  // consumers.
  bool Level1(const std::string& path);
  // The same for a file of the consumer directory, `st` its stat;
  // `read_stamp(buf, size)` reads its version attribute (getxattr's result),
  // only when the directory is not private.
  template <typename ReadStamp>
  bool Complete(const struct stat& st, ReadStamp read_stamp);
  // True when no producer writes into the consumer directory (see the .cc).
  bool ConsumerDirIsPrivate();
  Status Finish(Status st, const char* op, const std::string& fname) const;
  Deadline WaitDeadline() const;
  Deadline RpcDeadline() const { return Deadline::AfterMs(config_.rpc_timeout_ms); }

  ClientConfig config_;
  ManagedPath prod_;
  ManagedPath cons_;
  std::shared_ptr<ServicePool> pool_;
  std::shared_ptr<FluxLink> flux_;

  // The producer directory of the local service, learned once (kStatus) to
  // decide whether level 1 may trust files present in the consumer
  // directory; null until known. Atomic for the same fork reason as
  // ManagedPath::resolved_.
  std::atomic<const std::string*> service_prod_path_{nullptr};
  std::atomic<bool> prefetch_declared_{false};
  std::atomic<bool> cons_dir_seen_{false};  // EnsureConsumerDir found it once
  // ConsumerDirIsPrivate's answer once it is final (-1: not yet).
  std::atomic<int> private_verdict_{-1};
  StampMemo stamp_memo_;
};

}  // namespace dyad
