// service.h: dyad-service, the per-node DYAD daemon.
//
// A Service listens on a Unix socket for the node's application processes
// (publish, locate, consume, list, status) and on TCP for the other
// services (fetch requests for files in its producer directory, and, on the
// root, the embedded metadata store). The service is plumbing: requests are
// looked up in a table (Dispatcher) filled by the parts that serve them
// (its own local handlers, the FileServer, a store it hosts); how a file
// reaches a consumer directory is Placement's decision. Connections belong
// to an event loop and requests run on bounded worker pools (reactor.h), so
// threads and memory follow the work, not the number of connections; a
// request that waits for a publication is parked without a thread.
//
// Start() returns once both listeners are open and the service is
// registered in the metadata store; Stop() (also from a signal-handling
// thread, also while Start() is still waiting for the store) cancels waits,
// closes connections and joins all threads. A Stop() during Start() makes
// Start() return DYAD_RC_CANCELLED within a fraction of a second.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>

#include "common/net.h"
#include "common/runtime.h"
#include "common/status.h"
#include "kvs/kvs.h"
#include "proto/auth.h"
#include "proto/protocol.h"
#include "service/metadata_cache.h"
#include "service/stats.h"
#include "service/versions.h"

namespace dyad {

class Dispatcher;
class TraceSpan;
class FileServer;
class PeerDirectory;
class NodeCache;
class Placement;
struct PlacementRequest;
class Server;
class VersionNotices;
class TransferRegistry;
class Prefetcher;
class RecordFeed;
class StoreCallThread;  // membership.cc
class TransportSet;
class WaitRegistry;
struct RequestContext;

struct ServiceOptions {
  uint32_t rank = 0;
  uint32_t service_mux = 1;
  std::string prod_path;  // producer-managed directory served ("" = none)
  std::string cons_path;  // consumer directory to clean at start ("" = none)
  std::string listen = "0.0.0.0:7590";
  std::string advertise;    // "" = derived from listen
  std::string socket_path;  // Unix socket for local clients
  std::string kvs_url = "embedded";
  bool host_root = false;  // host the embedded store
  std::string dtl_mode;    // "" = the default of DYAD_DTL_MODE
  std::string secret;
  bool munge = false;        // MUNGE credentials for peers (with or instead of the secret)
  std::string munge_socket;  // munged's socket ("" = libmunge's default)
  LinkProtection protection = LinkProtection::kIntegrity;  // of the links between services
  bool insecure = false;  // allow listening beyond loopback without any credential
  size_t chunk_size = 4u << 20;
  int64_t rpc_timeout_ms = 60000;
  // Connection caps: the excess is closed at once (counted, logged at most
  // every 10 s). Unauthenticated = peer links still in their handshake.
  uint32_t max_connections = 16384;
  uint32_t max_unauthenticated = 64;
  uint32_t max_per_peer = 16;      // unauthenticated ones per remote address
  uint32_t workers = 8;            // threads of each worker pool (local clients, peers)
  int64_t worker_idle_ms = 30000;  // DYAD_WORKER_IDLE_MS: an idle worker ends
  // False: answer batched fetches as a service from before them did (no
  // such request), so that a mixed-version cluster can be checked.
  bool serve_fetch_batch = true;
  std::string ready_file;
  // Mode of the ready file (DYAD_SERVICE_FILE_MODE); the umask narrows it.
  unsigned file_mode = 0600;
  bool debug = false;
  uint64_t cache_bytes = 0;  // budget of fetched copies (0 = unlimited)
  // Free-space floor of prefetches (the larger of the two; PlacementConfig).
  uint64_t prefetch_min_free_bytes = 0;
  uint32_t prefetch_min_free_pct = 10;
  // A local request waiting this long for a publication is logged (info),
  // once (0: never).
  int64_t wait_log_ms = 10000;
  uint32_t prefetch_concurrency = 8;  // DYAD_PREFETCH_CONCURRENCY
  uint32_t prefetch_per_peer = 8;     // DYAD_PREFETCH_PER_PEER
  bool follow_records = true;         // DYAD_FOLLOW_RECORDS (service/record_feed.h)
};

class Service {
 public:
  explicit Service(ServiceOptions options);
  ~Service();
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  Status Start();
  // Idempotent; safe from any thread at any time.
  void Stop();
  // Blocks until Stop() has been called and everything is joined.
  void Wait();
  // Wait(), bounded: false if the service has not stopped within `ms`
  // (a thread stuck where no shutdown reaches it, e.g. inside a provider).
  bool WaitFor(int64_t ms);

  const ServiceOptions& options() const { return opt_; }
  std::string tcp_address() const { return advertise_; }
  uint64_t incarnation() const { return incarnation_; }
  ServiceStats& stats() { return stats_; }
  bool stopping() const { return stopping_.load(); }

 private:
  // Start's steps.
  void RaiseDescriptorLimit();
  Status StartSteps();
  Status PrepareDirectories();
  Status OpenListeners();
  Status OpenStore();
  void BuildParts();
  void RouteRequests();
  std::string StoreDescription() const;

  // Connection plumbing (server.h): each connection a task on the runtime.
  Status StartServer();
  void NoteRefusal(const std::string& why);
  // service_parking.cc: the value of `key` once it is published (at once
  // when it is), waited for by a task (no thread held) until `deadline`
  // or the request's Stop. DYAD_RC_TIMEOUT at the deadline (its cause set
  // when the store was unreachable meanwhile), DYAD_RC_CANCELLED when the
  // requester went away. The wait is listed (waits.h) for `dyad status`.
  Task<Result<std::string>> WaitPublished(RequestContext& ctx, const std::string& ns,
                                          const std::string& key, Deadline deadline,
                                          const std::string& upath = {},
                                          const std::string& cons_path = {});
  // One pass of housekeeping (every kHousekeepingMs on the upkeep thread):
  // trims the node cache to its budget and logs (info) each wait for a
  // publication that passes --wait-log.
  void Housekeep();
  // Whether Housekeep has work now (the cache over its budget, waits to
  // log), so that an idle service wakes no pool thread for it. Cheap.
  bool HousekeepingDue() const;
  static constexpr int64_t kHousekeepingMs = 1000;

  // Local client requests (service_requests.cc); each sends one reply.
  Task<void> HandlePublish(RequestContext& ctx, PublishRequest req);
  // The publication up to the store's record, on the loop (memory, and one
  // lstat of an adopted copy). True when it replied already (an error, or
  // an asynchronous publish, queued); else the record to put and the
  // services to notify.
  bool PreparePublication(RequestContext& ctx, const PublishRequest& req, FileRecord* rec,
                          std::set<uint32_t>* previous);
  Task<void> HandleLocate(RequestContext& ctx, LocateRequest req);
  Task<void> HandleConsume(RequestContext& ctx, ConsumeRequest req);
  // A consume's reply.
  void ReplyConsume(RequestContext& ctx, const ConsumeRequest& req, const Result<ConsumeReply>& r,
                    TraceSpan& span);
  Task<void> HandleList(RequestContext& ctx, ListRequest req);
  Task<void> HandleRemove(RequestContext& ctx, RemoveRequest req);
  void HandleStatus(RequestContext& ctx);
  // Read-write ownership (service_versions.cc).
  Task<void> HandleSupersede(RequestContext& ctx, SupersedeNotice n);
  Status AdoptCopy(const PublishRequest& req, const FileRecord& rec);
  std::set<uint32_t> PreviousOwners(const std::string& ns, const std::string& key,
                                    const std::string& upath);
  // Tells the previous owners and this node's readers of `rec.upath` of
  // its new version, then runs `then` (parked meanwhile when a receiver is
  // slow: service_versions.cc).
  Task<void> NotifyPreviousOwners(RequestContext& ctx, const std::set<uint32_t>& owners,
                                  const PublishRequest& req, const FileRecord& rec);
  // The notices NotifyPreviousOwners sends (the readers are taken).
  VersionNotices::Addressed AddressNotices(const std::set<uint32_t>& owners,
                                           const PublishRequest& req, const FileRecord& rec);
  // The store's record when it is the version notice `n` names, else why
  // the notice is not acted on.
  Task<Result<FileRecord>> ConfirmNotice(const SupersedeNotice& n);
  Task<void> HandlePeers(RequestContext& ctx, PeersRequest req);  // service_peers.cc
  // Prefetch declarations and batch consumes (service_batch.cc).
  void HandlePrefetch(RequestContext& ctx, const PrefetchRequest& req);
  Task<void> HandleConsumeBatch(RequestContext& ctx, ConsumeBatchRequest req);
  // The batch's items whose record is known, placed together; each result
  // goes to settle(index in items, result).
  Task<void> PlacePublished(const std::vector<ConsumeRequest>& items,
                            const std::vector<std::optional<FileRecord>>& records, dyad::Stop* stop,
                            const std::function<void(size_t, const Result<ConsumeReply>&)>& settle);
  void Reply(Channel& ch, const Status& st, const std::string& body = {});

  // What Locate looks up: `key` of `ns`; with `wait`, waited for until
  // `deadline` when not published yet (the wait listed with `upath` and
  // `cons_path`); `published`: what the store has just returned for the
  // key, if anything (not asked again).
  struct LocateArgs {
    LocateArgs(std::string n, std::string k) : ns(std::move(n)), key(std::move(k)) {}
    std::string ns;
    std::string key;
    bool wait = false;
    Deadline deadline = Deadline::AfterMs(0);
    std::string upath;
    std::string cons_path;
    std::optional<std::string> published;
  };
  // The record: the metadata cache's (`*from_cache` set), else the
  // store's, read by a task (no thread held while the store answers).
  Task<Result<FileRecord>> Locate(RequestContext& ctx, const LocateArgs& a,
                                  bool* from_cache = nullptr);
  // One consume: the record (the request's, or located, waited for until
  // `deadline`), then its placement; the request's Stop ends its waits.
  Task<Result<ConsumeReply>> Consume(RequestContext& ctx, const ConsumeRequest& req,
                                     Deadline deadline);
  // Consume()'s parts: the record to place (the request's own, else located:
  // waited for until `*wait_until` when set; a cached record the local copy
  // already matches is confirmed with the store), what to ask the
  // placement, and after a failed placement, forgetting a cached record
  // that pointed at a copy that failed.
  Task<Result<FileRecord>> ConsumeRecord(RequestContext& ctx, const ConsumeRequest& req,
                                         std::optional<Deadline> wait_until,
                                         std::optional<std::string> published = std::nullopt);
  PlacementRequest PlacementFor(const ConsumeRequest& req, const FileRecord& rec) const;
  void ForgetFailedRecord(const ConsumeRequest& req, const Result<ConsumeReply>& r);
  // After a placement of `failed` (a located record, not one the request
  // carried) that its owner refused as stale (`r`): the store's record,
  // when it names another version (to place once more), else an error.
  Task<Result<FileRecord>> RecordAfterStale(RequestContext& ctx, const ConsumeRequest& req,
                                            const FileRecord& failed,
                                            const Result<ConsumeReply>& r);

  // membership.cc: take the rank (refusing one a live service holds) and
  // keep it. RegisterMembership runs Register, one task on the runtime,
  // to its end: the pauses between attempts and the waits for the store's
  // calls (on `calls`' thread) end at once when startup_stop_ fires.
  Status RegisterMembership();
  Task<Status> Register(StoreCallThread& calls);
  // Refuses (at start) a default transport that reaches only this host when
  // a service of another host is registered (libfabric's shm provider).
  Task<Status> CheckSameHostPeers(StoreCallThread& calls);
  Task<Status> ClaimRank(StoreCallThread& calls);
  Task<Status> CheckOwnAddress();
  // A probe of `rec` during start-up, ended by a stop request.
  Task<ProbeResult> ProbeNow(const ServiceRecord& rec);
  ServiceRecord OwnRecord() const;
  Status WriteReadyFile();
  // Stops listeners, connections and threads (once; from Stop or Start).
  void Teardown();
  // The upkeep task: Housekeep() every kHousekeepingMs, and every 3 s
  // re-registers this service when its membership record disappears (a
  // restarted in-memory root) so peers can still resolve it.
  Task<void> Upkeep();
  // One membership check of Upkeep (its store calls are tasks on the loop).
  Task<void> CheckMembership(uint64_t* reported);
  // On a clean stop: marks this service's registration as stopped
  // (ServiceRecord::stopped_ns) so `dyad peers` says "stopped", not "down",
  // and a restart takes the rank without a warning. Bounded (2 s at most).
  void Deregister();

  ServiceOptions opt_;
  std::string prod_real_;  // canonical producer path ("" = none)
  uint64_t incarnation_ = 0;
  uint32_t node_idx_ = 0;
  std::string advertise_;
  std::string hostname_;
  uint64_t started_ns_ = 0;
  std::shared_ptr<const Authenticator> auth_;  // set by Start()
  // The runtime every part runs on (common/runtime.h); destroyed after them.
  std::unique_ptr<Runtime> runtime_;
  // Ends the start-up's waits on the runtime (probes, store calls, pauses
  // between attempts) when the service is asked to stop while starting;
  // set with runtime_, under stop_mu_.
  std::unique_ptr<dyad::Stop> startup_stop_;
  ServiceStats stats_;
  MetadataCache cache_;
  std::atomic<uint64_t> publish_seq_{0};  // FileRecord::seq of this incarnation

  std::unique_ptr<Dispatcher> dispatch_;
  std::shared_ptr<Kvs> kvs_;  // the store this service uses
  std::unique_ptr<TransportSet> transports_;
  std::unique_ptr<PeerDirectory> peers_;
  std::unique_ptr<NodeCache> node_cache_;  // fetched copies, versions, byte budget
  std::unique_ptr<Placement> placement_;
  std::unique_ptr<VersionNotices> notices_;  // new versions to holders of old ones
  std::unique_ptr<FileServer> file_server_;
  std::unique_ptr<TransferRegistry> transfers_in_flight_;
  std::unique_ptr<Prefetcher> prefetch_;
  std::unique_ptr<RecordFeed> record_feed_;  // records of the namespaces consumed here
  std::unique_ptr<WaitRegistry> waits_;      // parked waits for a publication (dyad status)

  UniqueFd unix_listener_;
  UniqueFd tcp_listener_;
  std::unique_ptr<Server> server_;
  std::mutex refusal_mu_;
  uint64_t refused_since_log_ = 0;
  uint64_t last_refusal_log_ns_ = 0;

  // Asynchronous publication queue.
  struct PendingPublish {
    std::string ns, key, value;
    // Sent once the store holds the record (receivers confirm a notice
    // with the store), naming the file `upath`.
    VersionNotices::Addressed notices;
    std::string upath;
  };
  // Queues an asynchronous publication's record for the store.
  void QueueAsyncPublish(PendingPublish p);
  // Stores the queued records in order, each retried with a backoff, then
  // sends its version notices; a task that runs while the queue has any.
  Task<void> DrainAsyncPublications();
  std::mutex async_mu_;
  std::list<PendingPublish> async_queue_;  // guarded by async_mu_
  bool async_draining_ = false;            // a DrainAsyncPublications runs; guarded by async_mu_
  std::string listen_bound_;  // where the peer listener is bound (the ready file's listen=)
  std::string member_value_;

  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;
  // Signalled when the stop is done (Wait, WaitFor).
  std::condition_variable stop_cv_;
  bool stopped_ = false;
  bool started_ = false;
  bool starting_ = false;  // Start() runs; a Stop() meanwhile leaves Teardown to it
};

}  // namespace dyad
