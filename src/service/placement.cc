#include "service/placement.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>

#include "common/log.h"
#include "common/time.h"
#include "common/trace.h"
#include "service/peer_waits.h"
#include "transport/local/local_transport.h"

namespace dyad {

bool IsCompleteCopy(const std::string& path, uint64_t size, uint64_t version) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  return static_cast<uint64_t>(st.st_size) == size && MtimeNs(st) == version;
}

Placement::Placement(PlacementConfig config, PeerDirectory* peers, TransportSet* transports,
                     ServiceStats* stats, TransferRegistry* transfers, NodeCache* cache)
    : cfg_(std::move(config)),
      peers_(peers),
      transports_(transports),
      stats_(stats),
      transfers_(transfers),
      cache_(cache),
      fetcher_(peers, cfg_.rpc_timeout_ms, transfers) {}

bool Placement::IsCurrentCopy(const std::string& dest, const FileRecord& rec) const {
  if (cache_ == nullptr) return IsCompleteCopy(dest, rec.size, rec.version);
  return cache_->IsCurrent(dest, rec);
}

Task<Result<ConsumeReply>> Placement::Place(PlacementRequest req, Deadline deadline, Stop* stop) {
  Result<Plan> plan = co_await Prepare(req);
  if (!plan.ok()) co_return plan.status();
  if (plan->route == Route::kInPlace) co_return InPlace(req.record);
  const FileRecord& rec = req.record;
  const std::string dest = req.cons_root + "/" + rec.upath;
  const Deadline join_by = JoinBy(deadline);
  for (;;) {
    bool joined = false;
    std::shared_ptr<InFlight> flight = Claim(dest, rec, &joined);
    if (!flight) co_return CurrentCopy(dest, rec);
    if (!joined) {
      Result<ConsumeReply> result = co_await Transfer(req, plan->route, plan->transport, stop);
      Settle(dest, flight, result);
      co_return result;
    }
    Result<ConsumeReply> r = co_await Join(flight, rec, join_by, stop);
    // The consume that led the transfer went away (and took it along):
    // this one places the file itself.
    if (r.ok() || r.status().code() != DYAD_RC_CANCELLED || join_by.expired() ||
        (stop != nullptr && stop->fired()))
      co_return r;
  }
}

Task<Result<Placement::Plan>> Placement::Prepare(const PlacementRequest& req) {
  Result<Route> route = co_await Decide(req);
  if (!route.ok()) co_return route.status();
  Plan plan;
  plan.route = *route;
  if (*route == Route::kInPlace || *route == Route::kOwnFile) co_return plan;
  Result<Transport*> t =
      *route == Route::kSameNode ? transports_->SameNode() : transports_->ForMode(req.dtl_mode);
  if (!t.ok()) co_return t.status();
  if (*route == Route::kRemote && (*t)->caps().same_node_only) {
    // e.g. DYAD_DTL_MODE=LOCAL for a file of another node: say so, rather
    // than let the copy fail on a path that is not here.
    const std::string chosen = req.dtl_mode.empty()
                                   ? "this service's transport '" + (*t)->name() + "' (-m)"
                                   : "DYAD_DTL_MODE=" + req.dtl_mode;
    co_return Status(DYAD_RC_NOTSUP,
                     chosen + " reaches only owners on this node, and '" + req.record.upath +
                         "' is owned by rank " + std::to_string(req.record.owner_rank) +
                         " on node " + std::to_string(req.record.owner_rank / cfg_.service_mux) +
                         " (this is node " + std::to_string(cfg_.node_idx) +
                         "): unset DYAD_DTL_MODE, or choose a transport that crosses nodes "
                         "(FLUX_RPC, UCX, OFI)");
  }
  plan.transport = *t;
  co_return plan;
}

ConsumeReply Placement::InPlace(const FileRecord& rec) {
  ConsumeReply reply;
  reply.record = rec;
  reply.local = true;
  stats_->Add(ServiceStats::kConsumeLocal);
  return reply;
}

Task<Result<Placement::Route>> Placement::Decide(const PlacementRequest& req) {
  const FileRecord& rec = req.record;
  if (req.shared_storage) co_return Route::kInPlace;
  if (rec.owner_rank == cfg_.rank)
    co_return cfg_.prod_real == req.cons_root ? Route::kInPlace : Route::kOwnFile;
  if (rec.owner_rank / cfg_.service_mux != cfg_.node_idx) co_return Route::kRemote;
  // Same node: when the consumer reads the very directory the owner writes,
  // the file is there, complete, since it was published after its close.
  Result<ServiceRecord> owner = co_await peers_->Resolve(rec.owner_rank, false);
  if (!owner.ok()) co_return owner.status();
  if (!owner->prod_path.empty() && owner->prod_path == req.cons_root) co_return Route::kInPlace;
  co_return Route::kSameNode;
}

std::shared_ptr<Placement::InFlight> Placement::Claim(const std::string& dest,
                                                      const FileRecord& rec, bool* joined) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = inflight_.find(dest);
  *joined = it != inflight_.end();
  if (*joined) return it->second;
  // Checked under the lock so that a transfer finishing right now is
  // either seen here as complete or found in flight, never neither.
  if (IsCurrentCopy(dest, rec)) return nullptr;
  auto flight = std::make_shared<InFlight>();
  inflight_[dest] = flight;
  return flight;
}

ConsumeReply Placement::CurrentCopy(const std::string& dest, const FileRecord& rec) {
  // May evict others: outside our lock.
  const bool prefetched = cache_ != nullptr && cache_->NoteHit(dest);
  ConsumeReply reply = InPlace(rec);
  // Nothing moved now; say why (`dyad consume -v`): a copy placed ahead
  // by the prefetcher, or one an earlier consume fetched.
  reply.transport = prefetched ? "prefetched" : "cached";
  return reply;
}

void Placement::Settle(const std::string& dest, const std::shared_ptr<InFlight>& flight,
                       const Result<ConsumeReply>& result) {
  std::vector<std::function<void(const Result<ConsumeReply>&)>> joiners;
  {
    std::lock_guard<std::mutex> lk(mu_);
    flight->done = true;
    flight->status = result.ok() ? Status::OK() : result.status();
    if (result.ok()) flight->reply = *result;
    joiners.swap(flight->joiners);
    inflight_.erase(dest);
  }
  if (joiners.empty()) return;
  const Result<ConsumeReply> joined = Joined(flight->status, flight->reply);
  for (auto& j : joiners) j(joined);
}

Result<ConsumeReply> Placement::Joined(const Status& st, const ConsumeReply& reply) {
  if (!st.ok()) return st;
  ConsumeReply r = reply;
  r.transferred = false;
  r.joined = true;
  return r;
}

Deadline Placement::JoinBy(Deadline deadline) const {
  // A consume's deadline bounds its wait for the publication (0: "only if
  // published"); the file is published once a transfer of it is in flight,
  // and a transfer of its own would run to its end whatever that deadline.
  // So a joiner waits as long as that: at least one --rpc-timeout.
  const Deadline transfer = Deadline::AfterMs(cfg_.rpc_timeout_ms);
  return deadline.never() || deadline.time_point() > transfer.time_point() ? deadline : transfer;
}

Task<Result<ConsumeReply>> Placement::Join(std::shared_ptr<InFlight> flight, FileRecord rec,
                                           Deadline deadline, Stop* stop) {
  stats_->Add(ServiceStats::kConsumeJoined);
  auto joined = std::make_shared<Rendezvous<Result<ConsumeReply>>>(rt_->executor());
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (flight->done) co_return Joined(flight->status, flight->reply);
    flight->joiners.push_back([joined](const Result<ConsumeReply>& r) { joined->Deliver(r); });
  }
  // Past kOwnerParkAfterMs the wait counts as parked, as a fetch's would.
  std::optional<Result<ConsumeReply>> r =
      co_await joined->Take(deadline.Min(kOwnerParkAfterMs), stop);
  if (!r && !deadline.expired() && (stop == nullptr || !stop->fired())) {
    stats_->AddNamed("consume.parked_for_owner");
    rt_->long_waits.fetch_add(1);
    r = co_await joined->Take(deadline, stop);
    rt_->long_waits.fetch_sub(1);
  }
  if (r) co_return std::move(*r);
  if (stop != nullptr && stop->fired()) co_return Status(DYAD_RC_CANCELLED, "consumer went away");
  co_return Status(DYAD_RC_TIMEOUT, "timed out waiting for the transfer of '" + rec.upath +
                                        "' started by another consumer");
}

Task<Result<ConsumeReply>> Placement::Transfer(PlacementRequest req, Route route,
                                               Transport* transport, Stop* stop) {
  Moving m;
  m.req = std::move(req);
  m.plan = Plan{route, transport};
  Begin(m);
  if (m.error.ok() && m.fetch) {
    PeerWaits waits(*rt_, stop, stats_);
    const Fetcher::SinkFn open_sink = [this, &m]() -> Result<int> {
      m.error = Create(m);
      if (!m.error.ok()) return m.error;
      return m.out.fd();
    };
    do {
      m.fetched = co_await fetcher_.Fetch(m.req.record, *m.plan.transport, open_sink, waits);
    } while (Retry(m));
    co_return Complete(m);
  }
  // A copy within this node (or a failure before any): the disk, on the pool.
  co_return co_await rt_->Offload([this, &m] { return Complete(m); });
}

bool Placement::TakeRoom(const PlacementRequest& req, const std::string& dir, FsRoom* room) {
  struct statvfs vfs;
  ++fs_checks_;
  if (::statvfs(dir.c_str(), &vfs) != 0 && ::statvfs(req.cons_root.c_str(), &vfs) != 0)
    return false;
  const uint64_t unit = vfs.f_frsize != 0 ? vfs.f_frsize : vfs.f_bsize;
  room->free_bytes = static_cast<uint64_t>(vfs.f_bavail) * unit;
  room->total_bytes = static_cast<uint64_t>(vfs.f_blocks) * unit;
  room->taken_ns = MonoNs();
  room->released_at = released_;
  return true;
}

Status Placement::Room(const PlacementRequest& req, std::shared_ptr<void>* hold) {
  const FileRecord& rec = req.record;
  const uint64_t budget = cache_ != nullptr ? cache_->budget() : 0;
  if (budget != 0 && rec.size > budget)
    return Status(DYAD_RC_NOSPACE,
                  "'" + rec.upath + "' is " + std::to_string(rec.size) +
                      " bytes, more than this node's cache budget of " + std::to_string(budget) +
                      " bytes (dyad-service --cache-bytes / DYAD_CACHE_BYTES): a copy of it "
                      "cannot be kept here; raise the budget");
  // The file's own directory when it exists (it may be another mount).
  const std::string dest = req.cons_root + "/" + rec.upath;
  const std::string parent = dest.substr(0, dest.rfind('/'));
  // Transfers admitted but not placed yet hold their size (checked and
  // reserved together: concurrent prefetches cannot all pass one check).
  std::lock_guard<std::mutex> lk(room_mu_);
  if (rooms_.size() >= 1024) rooms_.clear();  // bounded: directories come and go
  auto it = rooms_.find(parent);
  bool fresh = false;
  if (it == rooms_.end() || MonoNs() - it->second.taken_ns > kRoomRefreshMs * 1000000ull ||
      released_ - it->second.released_at > kRoomRefreshBytes) {
    FsRoom taken;
    if (!TakeRoom(req, parent, &taken)) return Status::OK();  // AtomicFile::Create reports it
    it = rooms_.insert_or_assign(parent, taken).first;
    fresh = true;
  }
  uint64_t avail = 0, floor = 0;
  for (;;) {
    const FsRoom& r = it->second;
    // What was placed since the statvfs is not in its figure: count every
    // byte released since as written.
    const uint64_t since = released_ - r.released_at;
    const uint64_t free_now = r.free_bytes > since ? r.free_bytes - since : 0;
    avail = free_now > reserved_ ? free_now - reserved_ : 0;
    floor = req.prefetched ? std::max(cfg_.prefetch_min_free_bytes,
                                      r.total_bytes / 100 * cfg_.prefetch_min_free_pct)
                           : 0;
    const bool short_of_room = rec.size > avail || (req.prefetched && avail - rec.size < floor);
    if (!short_of_room || fresh) break;
    // Refused only on a figure taken now.
    if (!TakeRoom(req, parent, &it->second)) return Status::OK();
    fresh = true;
  }
  if (rec.size > avail)
    return Status(DYAD_RC_NOSPACE, "'" + rec.upath + "' is " + std::to_string(rec.size) +
                                       " bytes but the consumer directory '" + req.cons_root +
                                       "' has " + std::to_string(avail) + " bytes free" +
                                       (reserved_ != 0 ? " (less what transfers in flight will "
                                                         "write)"
                                                       : "") +
                                       "; nothing was transferred");
  if (req.prefetched && avail - rec.size < floor)
    return Status(DYAD_RC_NOSPACE,
                  "prefetch of '" + rec.upath + "' (" + std::to_string(rec.size) +
                      " bytes) would leave less than the free-space floor of " +
                      std::to_string(floor) + " bytes in '" + req.cons_root +
                      "' (dyad-service --prefetch-min-free); it is fetched when consumed");
  reserved_ += rec.size;
  const uint64_t size = rec.size;
  *hold = std::shared_ptr<void>(nullptr, [this, size](void*) {
    std::lock_guard<std::mutex> g(room_mu_);
    reserved_ -= size;
    released_ += size;
  });
  return Status::OK();
}

void Placement::Begin(Moving& m) {
  const FileRecord& rec = m.req.record;
  m.span = std::make_unique<TraceSpan>("place", "service");
  m.span->Arg("path", rec.upath).Arg("owner", rec.owner_rank);
  m.t0 = MonoNs();
  if (m.plan.route != Route::kInPlace) {
    m.error = Room(m.req, &m.room);
    if (!m.error.ok()) return;
  }
  m.fetch = m.plan.route != Route::kOwnFile;
  // A fetch opens the temporary once its request is on its way.
  if (!m.fetch) m.error = Create(m);
}

Status Placement::Create(Moving& m) {
  Status st = m.out.Create(m.req.cons_root, m.req.record.upath);
  if (st.ok()) return st;
  return st.Annotate("prepare '" + m.req.record.upath + "' in consumer directory");
}

bool Placement::Retry(Moving& m) {
  const Status& st = m.fetched.status;
  if (st.ok() || !m.fetched.outcome.retryable || m.retried) return false;
  m.retried = true;
  // A pooled session may have outlived its peer (restart, idle close):
  // forget what we know about the owner and try once more on a fresh file.
  const FileRecord& rec = m.req.record;
  DYAD_LOG_DEBUG("fetch '%s' from rank %u failed (%s); retrying with a fresh session",
                 rec.upath.c_str(), rec.owner_rank, st.ToString().c_str());
  peers_->Invalidate(rec.owner_rank);
  m.out.Abort();  // the next attempt opens a fresh one
  return true;
}

Result<ConsumeReply> Placement::Complete(Moving& m) {
  FetchOutcome outcome;
  Status st = m.error;
  if (st.ok() && m.fetch) {
    st = m.fetched.status;
    outcome = m.fetched.outcome;
  } else if (st.ok()) {
    st = CopyOwnFile(m.req.record, m.out.fd(), &outcome);
  }
  m.room.reset();  // the bytes are on disk now (or the temporary is removed below)
  if (m.span) m.span->Rc(st);
  m.span.reset();
  if (!st.ok()) {
    m.out.Abort();
    return st;
  }
  return Finish(m.req, m.plan.route, m.plan.transport, m.out, outcome, m.t0);
}

Result<ConsumeReply> Placement::Finish(const PlacementRequest& req, Route route,
                                       Transport* transport, AtomicFile& out,
                                       const FetchOutcome& outcome, uint64_t t0) {
  const FileRecord& rec = req.record;
  FileRecord placed = rec;
  placed.version = outcome.version;
  placed.size = outcome.bytes;
  AtomicFile::CommitOptions commit;
  commit.version_ns = outcome.version;
  commit.mode = outcome.mode;
  // The copy's version for clients that know the record
  // (dyad_consume_w_metadata), and for every client when revocable (level
  // 1 in the producer tree: node_cache.h): best effort, without user
  // attributes they ask the service instead.
  commit.xattr_name = kVersionXattr;
  commit.xattr_value = VersionStamp(
      placed, cache_ != nullptr && cache_->StampRevocable(req.ns, req.cons_root + "/" + rec.upath));
  // Checked again on arrival, whatever the transport: the bytes that
  // landed are as many as the record announced (a file of this node's
  // producer is copied as it is now).
  if (route != Route::kOwnFile) {
    if (outcome.bytes != rec.size)
      return Status(DYAD_RC_STALE, "'" + rec.upath + "': " + std::to_string(outcome.bytes) +
                                       " bytes arrived, its record says " +
                                       std::to_string(rec.size) + "; nothing was placed");
    commit.expect_size = static_cast<int64_t>(rec.size);
  }
  struct stat st;
  commit.placed = &st;
  Status committed = out.Commit(commit);
  if (!committed.ok()) return committed.Annotate("place '" + rec.upath + "'");
  if (cache_ != nullptr)
    cache_->NoteFetched(req.ns, req.cons_root + "/" + rec.upath, placed,
                        /*consumed=*/!req.prefetched, st);
  stats_->Add(ServiceStats::kTransfersIn);
  stats_->Add(ServiceStats::kBytesIn, outcome.bytes);
  ConsumeReply reply;
  reply.record = rec;
  reply.transferred = true;
  reply.bytes = outcome.bytes;
  reply.transfer_ns = MonoNs() - t0;
  reply.record.version = outcome.version;
  reply.record.size = outcome.bytes;
  NoteTransport(route, transport, &reply);
  return reply;
}

void Placement::NoteTransport(Route route, const Transport* transport, ConsumeReply* reply) {
  reply->transport = transport != nullptr ? transport->name() : "local";
  if (route != Route::kOwnFile) {
    // (Known: the fetch has just reached it.)
    std::optional<ServiceRecord> owner = peers_->Cached(reply->record.owner_rank);
    if (owner) reply->owner_address = owner->address;
  }
  stats_->AddNamed("transfers.in." + reply->transport);
  stats_->AddNamed("bytes.in." + reply->transport, reply->bytes);
}

Status Placement::CopyOwnFile(const FileRecord& rec, int sink_fd, FetchOutcome* outcome) {
  if (cfg_.prod_real.empty())
    return Status(DYAD_RC_BADMANAGEDPATH, "this service serves no producer directory");
  Result<UniqueFd> src = OpenBeneath(cfg_.prod_real, rec.upath, O_RDONLY | O_NONBLOCK);
  if (!src.ok()) return src.status().Annotate("open published file '" + rec.upath + "'");
  struct stat st;
  if (fstat(src->get(), &st) != 0) return StatusFromErrno(errno, "stat '" + rec.upath + "'");
  if (!S_ISREG(st.st_mode))
    return Status(DYAD_RC_BADFIO, "'" + rec.upath + "' is not a regular file");
  TransferStats ts;
  TransferRegistry::Entry progress;
  if (transfers_ != nullptr)
    progress = transfers_->Begin(false, rec.upath, cfg_.rank, "local",
                                 static_cast<uint64_t>(st.st_size), SinkProgress(sink_fd));
  DYAD_RETURN_IF_ERROR(
      LocalTransport::CopyRange(src->get(), sink_fd, static_cast<uint64_t>(st.st_size), &ts));
  outcome->version = MtimeNs(st);
  outcome->bytes = static_cast<uint64_t>(st.st_size);
  outcome->mode = st.st_mode & 0777;
  return Status::OK();
}

}  // namespace dyad
