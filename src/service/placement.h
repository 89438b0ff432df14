// placement.h: the one place that decides how a published file reaches a
// consumer directory on this node, and makes it so.
//
// For a located FileRecord and a consumer directory, Place() chooses a route:
//   kInPlace  nothing to move: the storage is shared by all nodes, or the
//             consumer reads the very directory the owner writes;
//   kOwnFile  this service owns the file: copy it inside the node;
//   kSameNode another service of this node owns it: the same-node transport
//             (the row whose capabilities say same_node_only);
//   kRemote   another node owns it: the requested or default transport.
// Every copy is de-duplicated (one transfer per destination file on this
// node; concurrent requests wait for it and share its result) and atomic
// (bytes land in a file without a name in the destination's directory,
// AtomicFile, which is stamped with the owner's version and linked into
// place when complete, so a later request can tell a current copy without
// asking anyone). Copies are indexed in the
// NodeCache, which says whether a copy is the record's version (a copy of
// the current version costs no transfer; another version is replaced by
// the atomic rename) and keeps them within the node's byte budget.
// Thread-safe.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/cancel.h"
#include "common/fsutil.h"
#include "common/trace.h"
#include "proto/protocol.h"
#include "proto/router.h"
#include "service/fetcher.h"
#include "service/node_cache.h"
#include "service/peers.h"
#include "service/stats.h"
#include "service/transfers.h"
#include "service/transports.h"

namespace dyad {

struct PlacementConfig {
  uint32_t rank = 0;
  uint32_t node_idx = 0;
  uint32_t service_mux = 1;
  std::string prod_real;  // this service's canonical producer path ("" = none)
  int64_t rpc_timeout_ms = 60000;
  // The free-space floor of prefetches: a prefetched copy is fetched only
  // when the consumer's file system keeps at least this much free after it
  // (the larger of the two; --prefetch-min-free).
  uint64_t prefetch_min_free_bytes = 0;
  uint32_t prefetch_min_free_pct = 10;
};

struct PlacementRequest {
  FileRecord record;
  std::string cons_root;        // the consumer's directory (absolute, canonical)
  bool shared_storage = false;  // DYAD_SHARED_STORAGE: synchronize only
  std::string dtl_mode;         // the client's choice ("" = this service's default)
  std::string ns;               // the record's namespace (indexes the copy)
  bool prefetched = false;      // fetched ahead of any consume (node cache: "waiting")
};

class Placement {
 public:
  // `transfers` (may be null) lists this node's incoming transfers while
  // they run (`dyad status`). `cache` may be null (no index: a copy is
  // current when its size and mtime match the record, as before versions
  // had a counter).
  Placement(PlacementConfig config, PeerDirectory* peers, TransportSet* transports,
            ServiceStats* stats, TransferRegistry* transfers = nullptr, NodeCache* cache = nullptr);

  // True when `dest` is a copy of exactly `rec`'s version.
  bool IsCurrentCopy(const std::string& dest, const FileRecord& rec) const;

  // Returns once cons_root/record.upath is a complete copy of the record's
  // file (or needs none), waiting for a transfer already in flight. A task
  // on the runtime: the fetch from a slow or silent owner, and the wait for
  // another consume's transfer of the same file, hold no thread; `stop`
  // (may be null) ends them (the requester went away, the service stops).
  Task<Result<ConsumeReply>> Place(PlacementRequest req, Deadline deadline, Stop* stop);
  // The runtime the placements run on; set before the first.
  void SetRuntime(Runtime* rt) { rt_ = rt; }

  // Places several files, as Place() each (placement_batch.cc): the small
  // files of `reqs` that another node owns travel together, one kFetchBatch
  // per owner (up to kMaxFetchBatchItems each), when their transport
  // carries data on the session (tcp); the rest, and any the owner's batch
  // did not deliver, one by one. Up to `parallelism` of these batches and
  // single files at once (tasks on the runtime: none holds a thread while
  // it waits on an owner). Results in the order of `reqs`. For the
  // prefetcher and batch consumes: one request per owner instead of one
  // per file. `stop` (may be null) ends the waits.
  Task<std::vector<Result<ConsumeReply>>> PlaceBatch(std::vector<PlacementRequest> reqs,
                                                     Deadline deadline, Stop* stop,
                                                     size_t parallelism = 1);
  // Largest file PlaceBatch sends inline in a batch.
  static constexpr uint64_t kBatchInline = 256u << 10;

  // How many times Room asked the file system for its free space (statvfs;
  // tests: it is cached, see FsRoom).
  uint64_t fs_checks() const {
    std::lock_guard<std::mutex> lk(room_mu_);
    return fs_checks_;
  }

 private:
  enum class Route { kInPlace, kOwnFile, kSameNode, kRemote };
  struct InFlight {
    bool done = false;
    Status status;
    ConsumeReply reply;
    // Joiners: called once with the result when it is settled.
    std::vector<std::function<void(const Result<ConsumeReply>&)>> joiners;
  };
  struct Plan {
    Route route = Route::kInPlace;
    Transport* transport = nullptr;  // null for kInPlace and kOwnFile
  };
  // One transfer into place, from the temporary to its end; the state a
  // parked transfer keeps between its steps.
  struct Moving {
    PlacementRequest req;
    Plan plan;
    std::string dest;
    std::shared_ptr<InFlight> flight;
    AtomicFile out;
    bool fetch = false;  // from the owner (else a copy within this node)
    FetchResult fetched;
    Status error;  // a failure outside the fetch (the temporary)
    bool retried = false;
    uint64_t t0 = 0;
    std::unique_ptr<TraceSpan> span;
    std::shared_ptr<void> room;  // the bytes reserved by Room until placed
  };

  Task<Result<Route>> Decide(const PlacementRequest& req);
  // The route and its transport.
  Task<Result<Plan>> Prepare(const PlacementRequest& req);
  ConsumeReply InPlace(const FileRecord& rec);
  // Whether a copy of `req.record` has room (before any byte moves): the
  // node cache's budget, the consumer file system's free space less what
  // transfers in flight have reserved, and for a prefetch its free-space
  // floor. DYAD_RC_NOSPACE with the figures if not; else `*hold` keeps the
  // file's size reserved until it is released (reset or destroyed).
  Status Room(const PlacementRequest& req, std::shared_ptr<void>* hold);
  // What to do for `dest`: join the transfer in flight (`*joined`), use the
  // current copy (null), or transfer (a new flight, registered).
  std::shared_ptr<InFlight> Claim(const std::string& dest, const FileRecord& rec, bool* joined);
  ConsumeReply CurrentCopy(const std::string& dest, const FileRecord& rec);
  // How long a consume with `deadline` waits for another's transfer of
  // the file it asked for (placement.cc).
  Deadline JoinBy(Deadline deadline) const;
  Task<Result<ConsumeReply>> Join(std::shared_ptr<InFlight> flight, FileRecord rec,
                                  Deadline deadline, Stop* stop);
  // A joiner's view of the flight's result.
  static Result<ConsumeReply> Joined(const Status& st, const ConsumeReply& reply);
  Task<Result<ConsumeReply>> Transfer(PlacementRequest req, Route route, Transport* transport,
                                      Stop* stop);
  // Transfer's steps: the temporary and the fetch; after the fetch ended,
  // true when it starts again on a fresh session (once, for a pooled
  // session that outlived its peer); the end (Finish, or abort).
  void Begin(Moving& m);
  // The temporary the copy is written to (AtomicFile::Create).
  Status Create(Moving& m);
  bool Retry(Moving& m);
  Result<ConsumeReply> Complete(Moving& m);
  // The end of every transfer: stamp, rename into place, index, count.
  Result<ConsumeReply> Finish(const PlacementRequest& req, Route route, Transport* transport,
                              AtomicFile& out, const FetchOutcome& outcome, uint64_t t0);
  // Ends `flight` (registered for `dest`) with `result`, waking its joiners.
  void Settle(const std::string& dest, const std::shared_ptr<InFlight>& flight,
              const Result<ConsumeReply>& result);
  // One owner's group of PlaceBatch: copies already current, the rest
  // through FetchTogether, joining transfers already in flight.
  Task<void> PlaceGroup(const std::vector<PlacementRequest>& reqs, const std::vector<size_t>& group,
                        Transport* transport, Deadline deadline, Stop* stop,
                        std::vector<std::shared_ptr<InFlight>>* flights,
                        std::vector<Result<ConsumeReply>>* out);
  // PlaceBatch's part: `mine` (indexes of `reqs`, one owner, flights
  // registered in `flights`) through one kFetchBatch, then one by one.
  Task<void> FetchTogether(const std::vector<PlacementRequest>& reqs,
                           const std::vector<size_t>& mine, Transport* transport, Stop* stop,
                           const std::vector<std::shared_ptr<InFlight>>& flights,
                           std::vector<Result<ConsumeReply>>* out);
  // Writes one file received inline and places it.
  Result<ConsumeReply> Land(const PlacementRequest& req, Transport* transport,
                            const FetchBatchPart& part, uint64_t t0);
  Status CopyOwnFile(const FileRecord& rec, int sink_fd, FetchOutcome* outcome);
  // What moved a file (transport, owner address) into `reply`, and the
  // per-transport counters.
  void NoteTransport(Route route, const Transport* transport, ConsumeReply* reply);

  const PlacementConfig cfg_;
  PeerDirectory* peers_;
  TransportSet* transports_;
  ServiceStats* stats_;
  TransferRegistry* transfers_;
  NodeCache* cache_;
  Fetcher fetcher_;
  Runtime* rt_ = nullptr;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<InFlight>> inflight_;
  // What Room knows of a directory's file system: a statvfs, reused while
  // younger than kRoomRefreshMs and until kRoomRefreshBytes more bytes were
  // released since (the bytes released are counted as written: the check
  // errs on the side of less room, never more), and taken again before
  // Room refuses anything.
  struct FsRoom {
    uint64_t free_bytes = 0;   // f_bavail, when taken
    uint64_t total_bytes = 0;  // f_blocks, when taken
    uint64_t taken_ns = 0;     // MonoNs
    uint64_t released_at = 0;  // released_ when taken
  };
  static constexpr uint64_t kRoomRefreshMs = 200;
  static constexpr uint64_t kRoomRefreshBytes = 64u << 20;
  bool TakeRoom(const PlacementRequest& req, const std::string& dir, FsRoom* room);

  mutable std::mutex room_mu_;
  uint64_t fs_checks_ = 0;               // statvfs calls (under room_mu_)
  uint64_t reserved_ = 0;                // bytes of transfers admitted by Room and not placed yet
  uint64_t released_ = 0;                // bytes of reservations released, ever (under room_mu_)
  std::map<std::string, FsRoom> rooms_;  // by directory (under room_mu_)
};

// True if `path` exists as a regular file with exactly this size and version.
bool IsCompleteCopy(const std::string& path, uint64_t size, uint64_t version);

}  // namespace dyad
