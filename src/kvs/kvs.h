// kvs.h: the metadata store interface (the global level of the file locator).
//
// A Kvs maps (namespace, key) to an opaque value. DYAD stores FileRecords
// under gen_path_key keys and ServiceRecords under kMembersNamespace.
// Implementations are the store rows (common/backend.h; `dyad info` lists
// them), each in its folder under src/kvs/, selected by URL through
// OpenKvs() (kvs/registry.cc), never by static initialization.
//
// Contract shared by all backends (tests/unit/kvs_conformance_test.cc):
//  * Put overwrites and wakes every waiter on that key;
//  * Wait returns at once if the key exists, else blocks until it is put,
//    the deadline passes (DYAD_RC_TIMEOUT) or `cancel` reports true
//    (DYAD_RC_CANCELLED); there is no lost wake-up between check and wait;
//  * namespaces are disjoint; List returns keys starting with a prefix, in
//    lexicographic order, at most `limit` (0 = all).
// MultiGet reads many keys of a namespace as Get would, in as few round
// trips as the store allows (a default loops over Get).
// StartWait is the same wait without a blocked thread, for callers that
// park thousands of waits at once; every store has it (KvsCaps::async_wait),
// and Wait's default is built on it.
// Optional (KvsCaps::watch): Watch, a feed of every Put in a namespace
// pushed by the store (prefetch on publication, service/prefetch.h).
// All methods are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/backend.h"
#include "common/cancel.h"
#include "common/runtime.h"
#include "common/status.h"
#include "common/time.h"

namespace dyad {
class Authenticator;
}

namespace dyad {

class RequestRouter;

using KvsEntry = std::pair<std::string, std::string>;  // key, value
using KvsValues = std::vector<std::optional<std::string>>;

// How an asynchronous wait ends: the value, or the Status Wait would give.
using KvsWaitCallback = std::function<void(Result<std::string>)>;
using KvsWaitTicket = uint64_t;

// One event of a watched namespace: a Put of (key, value), or `resync`:
// changes may have been missed (a link to the store was lost, the watcher
// fell behind, the store restarted) and the watcher should List the
// namespace again to catch up; or `lost`: the link to the store broke just
// now, changes may be missed until the resync that follows once it is back
// (not every store reports it).
struct KvsChange {
  std::string key;
  std::string value;
  bool resync = false;
  bool lost = false;
};
using KvsWatchCallback = std::function<void(const KvsChange&)>;
using KvsWatchTicket = uint64_t;

class Kvs {
 public:
  virtual ~Kvs() = default;
  virtual std::string name() const = 0;
  // True when every call answers from this process's memory, never waiting
  // on another process (the root's own store): a caller on an event loop
  // may call it there rather than hand it to a thread.
  virtual bool in_process() const { return false; }
  // The capabilities of this store's row (common/backend.h).
  KvsCaps caps() const;
  // Runs `fn`, blocking calls of this store: at once when it answers from
  // this process (in_process()), else on `rt`'s pool. What the *Task
  // defaults do, and what a service does with a blocking call sequence.
  template <typename F>
  Task<std::invoke_result_t<F>> Run(Runtime& rt, F fn) {
    if (in_process()) co_return fn();
    co_return co_await rt.Offload(std::move(fn));
  }

  virtual Status Put(const std::string& ns, const std::string& key, const std::string& value) = 0;
  virtual Result<std::optional<std::string>> Get(const std::string& ns, const std::string& key) = 0;
  // Get, as a task of a service's runtime (common/runtime.h): a store
  // whose client can wait for its reply on the loop does (the embedded
  // store: its links are dialled and read there, holding no thread); the
  // others run Get on the runtime's pool, or at once when they answer from
  // this process.
  virtual Task<Result<std::optional<std::string>>> GetTask(Runtime& rt, const std::string& ns,
                                                           const std::string& key);
  // Put, Remove and List the same way.
  virtual Task<Status> PutTask(Runtime& rt, const std::string& ns, const std::string& key,
                               const std::string& value);
  virtual Task<Status> RemoveTask(Runtime& rt, const std::string& ns, const std::string& key);
  virtual Task<Result<std::vector<KvsEntry>>> ListTask(Runtime& rt, const std::string& ns,
                                                       const std::string& prefix,
                                                       uint32_t limit = 0);
  // The default is StartWait plus a sleep of this thread (AwaitCallback,
  // `cancel` asked every kCancelAskMs).
  virtual Result<std::string> Wait(const std::string& ns, const std::string& key, Deadline deadline,
                                   const CancelFn& cancel = nullptr);
  virtual Status Remove(const std::string& ns, const std::string& key) = 0;
  virtual Result<std::vector<KvsEntry>> List(const std::string& ns, const std::string& prefix,
                                             uint32_t limit = 0) = 0;
  // The values of `keys` in `ns`, in their order (nullopt: absent), as one
  // Get each would give, but in as few round trips as the store allows:
  // one request to the embedded root, one MGET per 256 keys on one Redis
  // server, one pipeline per master of a Redis Cluster. Each value is as
  // current as a Get made during the call; the set is no snapshot. An error
  // means no values (the caller may Get one by one). This default loops
  // over Get.
  virtual Result<KvsValues> MultiGet(const std::string& ns, const std::vector<std::string>& keys);
  // MultiGet as a task, as GetTask is Get's.
  virtual Task<Result<KvsValues>> MultiGetTask(Runtime& rt, const std::string& ns,
                                               const std::vector<std::string>& keys);
  // Wakes every wait in progress with DYAD_RC_CANCELLED and refuses new
  // ones (the owning service is stopping). Idempotent.
  virtual void Shutdown() {}

  // Wait without a thread: returns at once, and `done` is called exactly
  // once, later, on a thread of the store (never inside StartWait), with
  // what Wait would return: the value when the key exists or is put,
  // DYAD_RC_TIMEOUT at the deadline, DYAD_RC_CANCELLED after CancelWait or
  // Shutdown. `done` must be quick and must not block (hand the result to
  // your own thread); it may call StartWait and CancelWait. When StartWait
  // returns an error, `done` is never called.
  virtual Result<KvsWaitTicket> StartWait(const std::string& ns, const std::string& key,
                                          Deadline deadline, KvsWaitCallback done) = 0;
  // Ends a pending StartWait with DYAD_RC_CANCELLED (its `done` runs on
  // this thread before CancelWait returns). A wait that already ended, or
  // whose `done` is running elsewhere, is left alone: `done` still runs
  // exactly once, so anything it touches must stay valid until it has.
  virtual void CancelWait(KvsWaitTicket ticket) = 0;

  // Calls `on_change` for every later Put in `ns` (not for keys already
  // there: List them after Watch returns, and nothing is missed), on a
  // thread of the store or of the Put, possibly concurrently for different
  // keys; `on_change` must be quick and must not block or call Unwatch.
  // The Puts of one key are reported in their order; those of different
  // keys in any order (a Redis Cluster delivers them from different
  // masters; while a cluster slot migrates, one key's too). A Redis
  // Cluster may also report a Put made just before Watch: its publication
  // crosses the cluster bus after the subscription. Callers treat a change
  // as "this key has (had) this value", which such a report still is.
  // Removals are not reported. Stores without it (KvsCaps::watch false)
  // return DYAD_RC_NOTSUP.
  virtual Result<KvsWatchTicket> Watch(const std::string& ns, KvsWatchCallback on_change);
  // After Unwatch returns, the callback is not running and never runs again.
  virtual void Unwatch(KvsWatchTicket ticket) { (void)ticket; }
};

// A StartWait's outcome in the form AwaitCallback and parked requests take:
// its error when it could not start, else nothing (the wait is parked) with
// *ticket set.
inline std::optional<Result<std::string>> Parked(Result<KvsWaitTicket> started,
                                                 KvsWaitTicket* ticket) {
  if (!started.ok()) return Result<std::string>(started.status());
  *ticket = *started;
  return std::nullopt;
}

struct KvsOptions {
  std::string secret;  // cluster secret for authenticated backends
  // How to authenticate to a remote store (credentials and link protection);
  // when null, `secret` alone with the default protection.
  std::shared_ptr<const Authenticator> auth;
  uint32_t self_rank = 0;  // identity presented to a remote store
  uint64_t self_incarnation = 0;
  int64_t rpc_timeout_ms = 60000;  // bound on one non-wait request
  // Set by a dyad-service opening its store: a store the service hosts
  // (KvsCaps::hosted_by_service) registers its request handlers here.
  RequestRouter* router = nullptr;
  // The same service's runtime: a store it hosts runs its timers on its
  // loop, and the embedded store's client its feeds and waits. It must
  // outlive the store, or the store's Shutdown() must be called while it
  // runs (the store may then be released later, on any thread).
  Runtime* runtime = nullptr;
  bool host_root = false;  // --root: host the store on a rank other than 0
};

// Opens a store from a URL through the row whose URL form matches
// (common/backend.h). An unknown or not compiled-in form gives
// DYAD_RC_NOTSUP with a message listing those available.
Result<std::unique_ptr<Kvs>> OpenKvs(const std::string& url, const KvsOptions& options);
// Names of the stores compiled in.
std::vector<std::string> KvsBackendNames();

}  // namespace dyad
