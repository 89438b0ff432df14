#include "service/fetcher.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fsutil.h"
#include "common/log.h"
#include "common/time.h"
#include "transport/local/local_transport.h"

namespace dyad {

bool IsCompleteCopy(const std::string& path, uint64_t size, uint64_t version) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  return static_cast<uint64_t>(st.st_size) == size && MtimeNs(st) == version;
}

Fetcher::Fetcher(FetcherConfig config, PeerDirectory* peers, ServiceStats* stats,
                 TransportLookup transports)
    : cfg_(std::move(config)), peers_(peers), stats_(stats), transports_(std::move(transports)) {}

Result<ConsumeReply> Fetcher::Ensure(const FileRecord& rec, const std::string& cons_root,
                                     const std::string& transport, Deadline deadline,
                                     const CancelFn& cancel) {
  const std::string dest = cons_root + "/" + rec.upath;
  std::shared_ptr<InFlight> flight;
  bool leader = false;
  {
    std::unique_lock<std::mutex> lk(mu_);
    auto it = inflight_.find(dest);
    if (it != inflight_.end()) {
      flight = it->second;
    } else {
      // Checked under the lock so that a transfer finishing right now is
      // either seen here as complete or found in flight, never neither.
      if (IsCompleteCopy(dest, rec.size, rec.version)) {
        ConsumeReply r;
        r.record = rec;
        r.local = true;
        stats_->Add(ServiceStats::kConsumeLocal);
        return r;
      }
      flight = std::make_shared<InFlight>();
      inflight_[dest] = flight;
      leader = true;
    }
  }

  if (!leader) {
    stats_->Add(ServiceStats::kConsumeJoined);
    std::unique_lock<std::mutex> lk(mu_);
    while (!flight->done) {
      const Deadline slice = deadline.Min(250);
      flight->cv.wait_until(lk, slice.time_point());
      if (flight->done) break;
      if (deadline.expired())
        return Status(DYAD_RC_TIMEOUT, "timed out waiting for the transfer of '" + rec.upath +
                                           "' started by another consumer");
      if (cancel && cancel()) return Status(DYAD_RC_CANCELLED, "consumer went away");
    }
    if (!flight->status.ok()) return flight->status;
    ConsumeReply r = flight->reply;
    r.transferred = false;
    r.joined = true;
    return r;
  }

  Result<ConsumeReply> result = Transfer(rec, cons_root, transport);
  {
    std::lock_guard<std::mutex> lk(mu_);
    flight->done = true;
    flight->status = result.ok() ? Status::OK() : result.status();
    if (result.ok()) flight->reply = *result;
    inflight_.erase(dest);
  }
  flight->cv.notify_all();
  return result;
}

Result<ConsumeReply> Fetcher::Transfer(const FileRecord& rec, const std::string& cons_root,
                                       const std::string& transport) {
  const uint64_t t0 = MonoNs();
  ConsumeReply reply;
  reply.record = rec;
  AtomicFile out;
  Status st = out.Create(cons_root, rec.upath);
  if (!st.ok()) return st.Annotate("prepare '" + rec.upath + "' in consumer directory");

  uint64_t version = rec.version;
  uint64_t bytes = 0;
  const bool same_service = rec.owner_rank == cfg_.rank;
  const bool same_node = rec.owner_rank / cfg_.service_mux == cfg_.node_idx;
  if (same_service) {
    st = CopyOwnFile(rec, out, &version, &bytes);
  } else {
    const std::string tname = same_node ? std::string("local") : transport;
    bool retryable = false;
    st = FetchRemote(rec, tname, out, &version, &bytes, &retryable);
    if (!st.ok() && retryable) {
      // A pooled session may have outlived its peer (restart, idle close):
      // forget what we know about the owner and try once more.
      DYAD_LOG_DEBUG("fetch '%s' from rank %u failed (%s); retrying with a fresh session",
                     rec.upath.c_str(), rec.owner_rank, st.ToString().c_str());
      peers_->Invalidate(rec.owner_rank);
      out.Abort();
      Status cs = out.Create(cons_root, rec.upath);
      if (!cs.ok()) return cs;
      st = FetchRemote(rec, tname, out, &version, &bytes, &retryable);
    }
  }
  if (!st.ok()) {
    out.Abort();
    return st;
  }
  st = out.Commit(version, false);
  if (!st.ok()) return st;
  stats_->Add(ServiceStats::kTransfersIn);
  stats_->Add(ServiceStats::kBytesIn, bytes);
  reply.transferred = true;
  reply.bytes = bytes;
  reply.transfer_ns = MonoNs() - t0;
  reply.record.version = version;
  reply.record.size = bytes;
  return reply;
}

Status Fetcher::CopyOwnFile(const FileRecord& rec, AtomicFile& out, uint64_t* version,
                            uint64_t* bytes) {
  if (cfg_.prod_real.empty())
    return Status(DYAD_RC_BADMANAGEDPATH, "this service serves no producer directory");
  Result<UniqueFd> src = OpenBeneath(cfg_.prod_real, rec.upath, O_RDONLY);
  if (!src.ok()) return src.status().Annotate("open published file '" + rec.upath + "'");
  struct stat st;
  if (fstat(src->get(), &st) != 0) return StatusFromErrno(errno, "stat '" + rec.upath + "'");
  if (!S_ISREG(st.st_mode))
    return Status(DYAD_RC_BADFIO, "'" + rec.upath + "' is not a regular file");
  TransferStats ts;
  DYAD_RETURN_IF_ERROR(
      LocalTransport::CopyRange(src->get(), out.fd(), static_cast<uint64_t>(st.st_size), &ts));
  *version = MtimeNs(st);
  *bytes = static_cast<uint64_t>(st.st_size);
  return Status::OK();
}

Status Fetcher::FetchRemote(const FileRecord& rec, const std::string& tname, AtomicFile& out,
                            uint64_t* version, uint64_t* bytes, bool* retryable) {
  *retryable = false;
  const std::string who = "rank " + std::to_string(rec.owner_rank);
  Result<Transport*> transport = transports_(tname);
  if (!transport.ok()) return transport.status();

  const Deadline setup = Deadline::AfterMs(cfg_.rpc_timeout_ms);
  Result<std::unique_ptr<Channel>> session = peers_->Acquire(rec.owner_rank, setup);
  if (!session.ok()) {
    *retryable = session.status().code() == DYAD_RC_STALE;
    return Status(session.status().code() == DYAD_RC_STALE ? DYAD_RC_BADFETCH
                                                           : session.status().code(),
                  "fetch '" + rec.upath + "' from " + who + ": " + session.status().message());
  }
  Channel& ch = **session;

  Result<std::string> args = (*transport)->PrepareRequest();
  if (!args.ok()) return args.status();
  FetchRequest req;
  req.upath = rec.upath;
  req.transport = tname;
  req.transport_args = *args;
  req.expect_version = rec.version;
  Encoder e;
  req.EncodeTo(e);
  std::string body;
  Status st = CallRpc(ch, MsgType::kFetch, e.data(), &body, setup);
  if (!st.ok()) {
    if (ch.broken()) {
      // Nothing was received: the session was dead before we used it.
      *retryable = st.code() == DYAD_RC_CONNLOST;
      return Status(st.code() == DYAD_RC_CONNLOST ? DYAD_RC_CONNLOST : st.code(),
                    "fetch '" + rec.upath + "' from " + who + ": " + st.message());
    }
    peers_->Release(rec.owner_rank, std::move(*session));
    return Status(st.code(), "fetch '" + rec.upath + "' from " + who + ": " + st.message());
  }
  FetchReply fr;
  Decoder d(body);
  if (!fr.DecodeFrom(d) || !d.done()) {
    ch.MarkBroken();
    return Status(DYAD_RC_BADUNPACK, "fetch '" + rec.upath + "' from " + who + ": malformed reply");
  }
  TransferStats ts;
  st = (*transport)->Pull(ch, fr.size, fr.transport_args, out.fd(), &ts);
  if (!st.ok()) {
    ch.MarkBroken();
    return Status(st.code() == DYAD_RC_CONNLOST ? DYAD_RC_BADFETCH : st.code(),
                  "fetch '" + rec.upath + "' from " + who + ": " + st.message());
  }
  peers_->Release(rec.owner_rank, std::move(*session));
  *version = fr.version;
  *bytes = fr.size;
  return Status::OK();
}

}  // namespace dyad
