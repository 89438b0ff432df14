#include "service/file_server.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <thread>

#include "common/fsutil.h"
#include "common/log.h"
#include "common/trace.h"

namespace dyad {

void SendReply(Channel& ch, const Status& st, const std::string& body, int64_t timeout_ms,
               ServiceStats* stats) {
  if (!st.ok()) stats->Add(ServiceStats::kErrors);
  Status s = ch.SendFrame(static_cast<uint16_t>(MsgType::kReply), EncodeReply(st, body),
                          Deadline::AfterMs(timeout_ms));
  if (!s.ok()) DYAD_LOG_DEBUG("reply not delivered: %s", s.ToString().c_str());
}

void FileServer::Route(RequestRouter& router, bool batches) {
  router.Route(
      Link::kPeer, MsgType::kFetch, "requests.fetch",
      [this](RequestContext& ctx, const std::string& payload) { HandleFetch(ctx, payload); });
  if (!batches) return;
  router.Route(
      Link::kPeer, MsgType::kFetchBatch, nullptr,
      [this](RequestContext& ctx, const std::string& payload) { HandleFetchBatch(ctx, payload); });
}

Status FileServer::Stale(const std::string& upath, const char* when) const {
  return Status(DYAD_RC_STALE, "rank " + std::to_string(rank_) + ": '" + upath + "' changed " +
                                   when +
                                   "; it must be published again (dyad_produce after the "
                                   "producer closes it)");
}

void FileServer::Refuse(RequestContext& ctx, const std::string& upath, const Status& st) {
  stats_->Add(ServiceStats::kFetchRefused);
  DYAD_LOG_WARN("refused fetch of '%s' from rank %u: %s", upath.c_str(),
                ctx.peer != nullptr ? ctx.peer->rank : 0u, st.ToString().c_str());
  SendReply(ctx.ch, st, {}, rpc_timeout_ms_, stats_);
}

Status FileServer::WaitShared(RequestContext& ctx, int fd, const std::string& upath) {
  // A producer holds an exclusive lock while writing; wait for it, bounded,
  // so a half-written file is never served.
  const Deadline deadline = Deadline::AfterMs(rpc_timeout_ms_);
  while (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) return Status::OK();  // no locking: serve anyway
    if (deadline.expired() || (ctx.cancel && ctx.cancel()))
      return Status(DYAD_RC_TIMEOUT, "'" + upath + "' stayed locked by its producer");
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return Status::OK();
}

Status FileServer::LockShared(RequestContext& ctx, int fd, const std::string& upath) {
  Status st = WaitShared(ctx, fd, upath);
  if (!st.ok()) SendReply(ctx.ch, st, {}, rpc_timeout_ms_, stats_);
  return st;
}

TransferRegistry::Entry FileServer::TrackSend(RequestContext& ctx, const std::string& upath,
                                              Transport& transport, uint64_t size) {
  if (transfers_ == nullptr) return {};
  return transfers_->Begin(
      true, upath, ctx.peer != nullptr ? ctx.peer->rank : 0u, transport.name(), size,
      transport.caps().data_on_session ? SessionProgress(ctx.ch.fd(), size) : nullptr);
}

void FileServer::HandleFetch(RequestContext& ctx, const std::string& payload) {
  TraceSpan span("serve", "service");
  FetchRequest req;
  Decoder d(payload);
  if (!req.DecodeFrom(d) || !d.done())
    return Refuse(ctx, "", Status(DYAD_RC_BADUNPACK, "malformed fetch request"));
  if (prod_real_.empty())
    return Refuse(ctx, req.upath,
                  Status(DYAD_RC_NOTFOUND,
                         "rank " + std::to_string(rank_) + " serves no producer directory"));
  Result<std::string> upath = ValidateUpath(req.upath);
  if (!upath.ok()) return Refuse(ctx, req.upath, upath.status());
  Result<Transport*> transport = transports_->ForMode(req.transport);
  if (!transport.ok()) return Refuse(ctx, *upath, transport.status());
  Result<UniqueFd> fd = OpenBeneath(prod_real_, *upath, O_RDONLY | O_NONBLOCK);
  if (!fd.ok()) {
    if (fd.status().code() == DYAD_RC_PERM) return Refuse(ctx, *upath, fd.status());
    const dyad_rc_t code =
        fd.status().code() == DYAD_RC_BADFIO ? DYAD_RC_BADFETCH : fd.status().code();
    return SendReply(ctx.ch,
                     Status(code, "rank " + std::to_string(rank_) + ": published file '" + *upath +
                                      "' cannot be read: " + fd.status().message()),
                     {}, rpc_timeout_ms_, stats_);
  }
  struct stat st;
  if (fstat(fd->get(), &st) != 0)
    return SendReply(ctx.ch, StatusFromErrno(errno, "stat '" + *upath + "'"), {}, rpc_timeout_ms_,
                     stats_);
  if (!S_ISREG(st.st_mode))
    return Refuse(ctx, *upath, Status(DYAD_RC_PERM, "'" + *upath + "' is not a regular file"));
  // Under the shared lock a producer that follows the protocol cannot be
  // rewriting the file; one that does not is caught by the check after it.
  if (!LockShared(ctx, fd->get(), *upath).ok()) return;
  if (fstat(fd->get(), &st) != 0)
    return SendReply(ctx.ch, StatusFromErrno(errno, "stat '" + *upath + "'"), {}, rpc_timeout_ms_,
                     stats_);
  FileSource src;
  src.fd = fd->get();
  src.size = static_cast<uint64_t>(st.st_size);
  src.version = MtimeNs(st);
  src.path = prod_real_ + "/" + *upath;
  src.root = prod_real_;
  src.upath = *upath;
  src.dev = st.st_dev;
  src.ino = st.st_ino;
  if (req.expect_version != 0 && req.expect_version != src.version)
    return SendReply(ctx.ch, Stale(*upath, "since it was published"), {}, rpc_timeout_ms_, stats_);
  if (on_serve_ && ctx.peer != nullptr) on_serve_(*upath, ctx.peer->rank);
  Result<std::string> rargs = (*transport)->ReplyArgs(src);
  if (!rargs.ok()) return SendReply(ctx.ch, rargs.status(), {}, rpc_timeout_ms_, stats_);
  FetchReply fr;
  fr.size = src.size;
  fr.version = src.version;
  fr.transport_args = *rargs;
  fr.mode = st.st_mode & 0777;
  Encoder e;
  fr.EncodeTo(e);
  // A small file on the session goes out in one write: the reply, the
  // bytes (read into memory, backend.h) and the verdict, which can then be
  // decided before anything leaves.
  std::string gathered;
  const bool gather = (*transport)->caps().data_on_session && src.size <= kGatheredFileBytes;
  if (gather) ctx.ch.CaptureSends(&gathered);
  SendReply(ctx.ch, Status::OK(), e.data(), rpc_timeout_ms_, stats_);
  if (ctx.ch.broken()) return ctx.ch.CaptureSends(nullptr);
  TransferStats ts;
  span.Arg("path", *upath).Arg("bytes", src.size).Arg("transport", (*transport)->name());
  if (ctx.peer != nullptr) span.Arg("to", ctx.peer->rank);
  TransferRegistry::Entry progress = TrackSend(ctx, *upath, **transport, src.size);
  auto failed = [&](const Status& why) {
    span.Rc(why);
    ctx.ch.MarkBroken();
    stats_->Add(ServiceStats::kErrors);
    DYAD_LOG_WARN("sending '%s' to rank %u failed: %s", upath->c_str(),
                  ctx.peer != nullptr ? ctx.peer->rank : 0u, why.ToString().c_str());
  };
  Status ps = (*transport)->Push(ctx.ch, src, req.transport_args, &ts);
  progress.Reset();
  if (!ps.ok()) {
    ctx.ch.CaptureSends(nullptr);
    return failed(ps);
  }
  // The verdict: the requester places the copy only if the file is still
  // the one whose bytes were sent.
  const bool same = fstat(fd->get(), &st) == 0 && static_cast<uint64_t>(st.st_size) == src.size &&
                    MtimeNs(st) == src.version;
  SendReply(ctx.ch, same ? Status::OK() : Stale(*upath, "while it was sent"), {}, rpc_timeout_ms_,
            stats_);
  if (gather) {
    ctx.ch.CaptureSends(nullptr);
    ps = ctx.ch.SendAll(gathered.data(), gathered.size(), Deadline::AfterMs(rpc_timeout_ms_));
  }
  if (!ps.ok()) return failed(ps);
  span.Rc(ps);
  if (!same) return;
  stats_->Add(ServiceStats::kTransfersOut);
  stats_->Add(ServiceStats::kBytesOut, src.size);
  stats_->Add(ServiceStats::kBytesOutDirect, ts.direct_bytes);
  stats_->AddNamed("transfers.out." + (*transport)->name());
  stats_->AddNamed("bytes.out." + (*transport)->name(), src.size);
}

}  // namespace dyad
