#include "service/file_server.h"

#include <sys/inotify.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <thread>

#include "common/fsutil.h"
#include "common/log.h"
#include "common/trace.h"
#include "common/wire_queue.h"

namespace dyad {

void SendReply(Channel& ch, const Status& st, const std::string& body, int64_t timeout_ms,
               ServiceStats* stats) {
  if (!st.ok()) stats->Add(ServiceStats::kErrors);
  Status s = ch.SendFrame(static_cast<uint16_t>(MsgType::kReply), EncodeReply(st, body),
                          Deadline::AfterMs(timeout_ms));
  if (!s.ok()) DYAD_LOG_DEBUG("reply not delivered: %s", s.ToString().c_str());
}

void FileServer::Route(RequestRouter& router, bool batches) {
  router.RouteTask(
      Link::kPeer, MsgType::kFetch, "requests.fetch",
      [this](RequestContext& ctx, const std::string& payload) { return HandleFetch(ctx, payload); },
      true);
  if (!batches) return;
  router.RouteTask(
      Link::kPeer, MsgType::kFetchBatch, nullptr,
      [this](RequestContext& ctx, const std::string& payload) {
        return HandleFetchBatch(ctx, payload);
      },
      true);
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

bool FileServer::TryShared(int fd) {
  // A producer holds an exclusive lock while writing: a half-written file
  // is never served.
  while (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    return errno != EWOULDBLOCK;  // no locking there: serve anyway
  }
  return true;
}

Task<bool> FileServer::WaitUnlocked(RequestContext& ctx, const std::string& upath,
                                    Deadline deadline, int64_t* pause_ms) {
  // Woken when the producer closes the file (which ends its lock), else
  // looked at again after a pause that grows: a lock given up without a
  // close is seen within a second.
  UniqueFd watch(::inotify_init1(IN_NONBLOCK | IN_CLOEXEC));
  if (watch.valid() &&
      ::inotify_add_watch(watch.get(), (prod_real_ + "/" + upath).c_str(),
                          IN_CLOSE_WRITE | IN_CLOSE_NOWRITE | IN_DELETE_SELF | IN_MOVE_SELF) < 0)
    watch.reset();
  const Ready r = co_await WaitReady(watch.valid() ? watch.get() : -1, POLLIN,
                                     deadline.Min(*pause_ms), ctx.stop);
  *pause_ms = std::min<int64_t>(*pause_ms * 2, 1000);
  co_return r != Ready::kStopped && !deadline.expired();
}

TransferRegistry::Entry FileServer::TrackSend(RequestContext& ctx, const std::string& upath,
                                              Transport& transport, uint64_t size) {
  if (transfers_ == nullptr) return {};
  // A file that leaves with its reply (kGatheredFileBytes) is gone before
  // anyone could ask how far it got: no probe (its TCP_INFO read is a
  // system call per fetch), its progress shows as unknown.
  const bool probe = transport.caps().data_on_session && size > kGatheredFileBytes;
  return transfers_->Begin(true, upath, ctx.peer != nullptr ? ctx.peer->rank : 0u, transport.name(),
                           size, probe ? SessionProgress(ctx.ch.fd(), size) : nullptr);
}

Task<void> FileServer::Send(RequestContext& ctx, std::shared_ptr<Response> r) {
  const Status idle(DYAD_RC_TIMEOUT, "the requester took no bytes for " +
                                         std::to_string(rpc_timeout_ms_) +
                                         " ms (--rpc-timeout), or hung up");
  for (;;) {
    bool flush = false;
    while (!r->ended && !flush && r->out.Gathering(kGatheredFileBytes)) {
      Result<Fill> f = r->fill(ctx, r->out);
      if (!f.ok()) {
        ctx.ch.MarkBroken();
        co_return r->done(ctx, f.status());
      }
      if (*f == Fill::kPeer) {
        // The transport waits on the requester (its offer, credits): the
        // wait holds no thread.
        PeerWaits waits(*ctx.runtime, ctx.stop, stats_, "fetch.parked_for_peer");
        co_await r->peer(ctx, waits);
        continue;
      }
      r->ended = *f == Fill::kEnd;
      flush = *f == Fill::kFlush;
    }
    if (r->ended && r->out.empty()) co_return r->done(ctx, Status::OK());
    Result<WireQueue::Pumped> p = r->out.Pump(ctx.ch);
    if (!p.ok()) co_return r->done(ctx, p.status());
    if (*p == WireQueue::Pumped::kAllSent) continue;
    // The requester has not taken what is queued: wait for room (no
    // thread held). Past kParkAfterMs the wait counts as parked, and what
    // the response holds unsent is charged: sessions that stop reading
    // cannot together hold more than kParkedOutputCap.
    Ready room = co_await WaitReady(ctx.ch, POLLOUT, Deadline::AfterMs(kParkAfterMs), ctx.stop);
    if (room == Ready::kTimeout) {
      if (!Charge(*r)) {
        const uint32_t peer = ctx.peer != nullptr ? ctx.peer->rank : 0u;
        const Status full(DYAD_RC_CONNLOST,
                          "closed the session of rank " + std::to_string(peer) +
                              ": it took none of " + std::to_string(r->out.memory_bytes()) +
                              " reply bytes for " + std::to_string(kParkAfterMs) +
                              " ms while replies waiting for their requesters already hold " +
                              std::to_string(unsent_bytes()) + " bytes (at most " +
                              std::to_string(kParkedOutputCap) + ")");
        stats_->AddNamed("fetch.closed_for_output");
        DYAD_LOG_WARN("%s", full.message().c_str());
        ctx.ch.MarkBroken();
        co_return r->done(ctx, full);
      }
      stats_->AddNamed("fetch.parked_for_room");
      room = co_await WaitReady(ctx.ch, POLLOUT, Deadline::AfterMs(rpc_timeout_ms_), ctx.stop);
      Uncharge(*r);
    }
    if (room != Ready::kReady) {
      if (room == Ready::kStopped || room == Ready::kTimeout) {
        DYAD_LOG_WARN("%s took no bytes of its response within its bound; closing",
                      ctx.peer != nullptr ? ("peer rank " + std::to_string(ctx.peer->rank)).c_str()
                                          : "requester");
      }
      co_return r->done(ctx, BreakSession(ctx.ch, idle));
    }
  }
}

bool FileServer::Charge(Response& r) {
  const uint64_t held = r.out.memory_bytes();
  uint64_t cur = parked_bytes_.load(std::memory_order_relaxed);
  do {
    if (cur + held > kParkedOutputCap) return false;
  } while (!parked_bytes_.compare_exchange_weak(cur, cur + held, std::memory_order_relaxed));
  r.charged = held;
  return true;
}

void FileServer::Uncharge(Response& r) {
  parked_bytes_.fetch_sub(r.charged, std::memory_order_relaxed);
  r.charged = 0;
}

void FileServer::QueueReply(Channel& ch, WireQueue& out, const Status& st,
                            const std::string& body) {
  std::string frame;
  ch.CaptureSends(&frame);
  SendReply(ch, st, body, rpc_timeout_ms_, stats_);
  ch.CaptureSends(nullptr);
  out.Bytes(std::move(frame));
}

Task<void> FileServer::Respond(RequestContext& ctx, const std::string& payload, Prepare prepare) {
  const Deadline locked_until = Deadline::AfterMs(rpc_timeout_ms_);
  int64_t pause_ms = 10;
  for (;;) {
    auto r = std::make_shared<Response>();
    // Every reply goes through the response's queue, in order.
    ctx.ch.CaptureSends(&r->captured);
    (this->*prepare)(ctx, payload, r.get());
    ctx.ch.CaptureSends(nullptr);
    if (!r->locked.empty()) {
      // Its producer holds the file locked (writing it): wait, bounded.
      if (co_await WaitUnlocked(ctx, r->locked, locked_until, &pause_ms)) continue;
      const Status st(DYAD_RC_TIMEOUT, "'" + r->locked + "' stayed locked by its producer");
      ctx.ch.CaptureSends(&r->captured);
      SendReply(ctx.ch, st, {}, rpc_timeout_ms_, stats_);
      ctx.ch.CaptureSends(nullptr);
    }
    r->out.Bytes(std::move(r->captured));
    co_await Send(ctx, std::move(r));
    co_return;
  }
}

Result<struct stat> FileServer::StatPublished(const std::string& upath) {
  Result<UniqueFd> fd = root_.Open(upath, O_PATH);
  if (!fd.ok()) return fd.status();
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return StatusFromErrno(errno, "stat '" + upath + "'");
  if (!S_ISREG(st.st_mode))
    return Status(DYAD_RC_BADFIO, "'" + upath + "' in '" + prod_real_ + "' is not a regular file");
  return st;
}

Task<void> FileServer::HandleFetch(RequestContext& ctx, const std::string& payload) {
  co_await Respond(ctx, payload, &FileServer::PrepareFetch);
}

// What a fetch being sent holds on to.
struct FileServer::Sending {
  UniqueFd fd;
  FileSource src;
  Transport* transport = nullptr;
  std::string request_args;
  uint64_t queued = 0;  // bytes of the file queued so far (QueueChunk)
  bool pushed = false;  // the Push ended (transports that send whole files)
  Status push_status;   // how
  bool same = false;    // the verdict
  TransferStats ts;
  TransferRegistry::Entry progress;
  std::unique_ptr<TraceSpan> span;
};

void FileServer::PrepareFetch(RequestContext& ctx, const std::string& payload, Response* r) {
  auto span = std::make_unique<TraceSpan>("serve", "service");
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
  Result<UniqueFd> fd = root_.Open(*upath, O_RDONLY | O_NONBLOCK);
  if (!fd.ok()) {
    if (fd.status().code() == DYAD_RC_PERM) return Refuse(ctx, *upath, fd.status());
    const dyad_rc_t code =
        fd.status().code() == DYAD_RC_BADFIO ? DYAD_RC_BADFETCH : fd.status().code();
    return SendReply(ctx.ch,
                     Status(code, "rank " + std::to_string(rank_) + ": published file '" + *upath +
                                      "' cannot be read: " + fd.status().message()),
                     {}, rpc_timeout_ms_, stats_);
  }
  // Under the shared lock a producer that follows the protocol cannot be
  // rewriting the file; one that does not is caught by the check after it.
  // The lock comes first (a descriptor of any type takes it), so that the
  // file is looked at once, as it is while locked.
  const bool locked = !TryShared(fd->get());
  struct stat st;
  if (fstat(fd->get(), &st) != 0)
    return SendReply(ctx.ch, StatusFromErrno(errno, "stat '" + *upath + "'"), {}, rpc_timeout_ms_,
                     stats_);
  if (!S_ISREG(st.st_mode))
    return Refuse(ctx, *upath, Status(DYAD_RC_PERM, "'" + *upath + "' is not a regular file"));
  if (locked) {
    r->locked = *upath;  // Respond waits for the producer, then prepares again
    return;
  }
  auto s = std::make_shared<Sending>();
  s->src.fd = fd->get();
  s->src.size = static_cast<uint64_t>(st.st_size);
  s->src.version = MtimeNs(st);
  s->src.path = prod_real_ + "/" + *upath;
  s->src.root = prod_real_;
  s->src.upath = *upath;
  s->src.dev = st.st_dev;
  s->src.ino = st.st_ino;
  if (req.expect_version != 0 && req.expect_version != s->src.version)
    return SendReply(ctx.ch, Stale(*upath, "since it was published"), {}, rpc_timeout_ms_, stats_);
  if (on_serve_ && ctx.peer != nullptr) on_serve_(*upath, ctx.peer->rank);
  Result<std::string> rargs = (*transport)->ReplyArgs(s->src);
  if (!rargs.ok()) return SendReply(ctx.ch, rargs.status(), {}, rpc_timeout_ms_, stats_);
  FetchReply fr;
  fr.size = s->src.size;
  fr.version = s->src.version;
  fr.transport_args = *rargs;
  fr.mode = st.st_mode & 0777;
  Encoder e;
  fr.EncodeTo(e);
  SendReply(ctx.ch, Status::OK(), e.data(), rpc_timeout_ms_, stats_);
  s->fd = std::move(*fd);
  s->transport = *transport;
  s->request_args = std::move(req.transport_args);
  span->Arg("path", *upath).Arg("bytes", s->src.size).Arg("transport", s->transport->name());
  if (ctx.peer != nullptr) span->Arg("to", ctx.peer->rank);
  s->span = std::move(span);
  s->progress = TrackSend(ctx, *upath, *s->transport, s->src.size);
  r->fill = [this, s](RequestContext& c, WireQueue& out) { return FillFetch(c, *s, out); };
  r->peer = [this, s](RequestContext& c, PeerWaits& waits) { return Push(c, *s, waits); };
  r->done = [this, s](RequestContext& c, const Status& why) { FetchDone(c, *s, why); };
}

Task<void> FileServer::Push(RequestContext& ctx, Sending& s, PeerWaits& waits) {
  s.push_status = co_await s.transport->Push(ctx.ch, s.src, s.request_args, &s.ts, waits);
  s.pushed = true;
}

Result<FileServer::Fill> FileServer::FillFetch(RequestContext& ctx, Sending& s, WireQueue& out) {
  if (s.transport->queues_chunks() && s.queued < s.src.size) {
    DYAD_RETURN_IF_ERROR(s.transport->QueueChunk(ctx.ch, s.src, &s.queued, &out));
    ++s.ts.chunks;
    s.ts.bytes = s.queued;
    return Fill::kQueued;
  }
  if (!s.transport->queues_chunks() && !s.pushed) {
    // The transport writes the session itself (Push): the reply must be
    // out first.
    return out.empty() ? Fill::kPeer : Fill::kFlush;
  }
  DYAD_RETURN_IF_ERROR(s.push_status);
  // The verdict: the requester places the copy only if the file is still
  // the one whose bytes were sent (sendfile reads them as they leave, so
  // this comes once they all have).
  if (out.has_file()) return Fill::kFlush;
  struct stat st;
  s.same = fstat(s.fd.get(), &st) == 0 && static_cast<uint64_t>(st.st_size) == s.src.size &&
           MtimeNs(st) == s.src.version;
  QueueReply(ctx.ch, out, s.same ? Status::OK() : Stale(s.src.upath, "while it was sent"), {});
  return Fill::kEnd;
}

void FileServer::FetchDone(RequestContext& ctx, Sending& s, const Status& why) {
  s.progress.Reset();
  s.span->Rc(why);
  if (!why.ok()) {
    ctx.ch.MarkBroken();
    stats_->Add(ServiceStats::kErrors);
    DYAD_LOG_WARN("sending '%s' to rank %u failed: %s", s.src.upath.c_str(),
                  ctx.peer != nullptr ? ctx.peer->rank : 0u, why.ToString().c_str());
    return;
  }
  if (!s.same) return;
  const std::string& name = s.transport->name();
  stats_->Add(ServiceStats::kTransfersOut);
  stats_->Add(ServiceStats::kBytesOut, s.src.size);
  stats_->Add(ServiceStats::kBytesOutDirect, s.ts.direct_bytes);
  stats_->AddNamed("transfers.out." + name);
  stats_->AddNamed("bytes.out." + name, s.src.size);
}

}  // namespace dyad
