#include "service/file_server.h"

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

void FileServer::Drive(RequestContext& ctx, const std::shared_ptr<Response>& r) {
  // This worker waits for the requester at most kParkAfterMs in all, however
  // the waits are spread: one that reads a byte now and then gets no more
  // of a thread than one that does not read.
  int64_t wait_budget_ns = kParkAfterMs * 1000000;
  for (;;) {
    bool flush = false;
    while (!r->ended && !flush && r->out.Gathering(kGatheredFileBytes)) {
      Result<Fill> f = r->fill(ctx, r->out);
      if (!f.ok()) {
        ctx.ch.MarkBroken();
        return r->done(ctx, f.status());
      }
      if (*f == Fill::kPeer) return WaitForPeer(ctx, r);
      r->ended = *f == Fill::kEnd;
      flush = *f == Fill::kFlush;
    }
    if (r->ended && r->out.empty()) return r->done(ctx, Status::OK());
    // A requester slower than this worker costs no thread for longer than
    // kParkAfterMs: the request then waits on the event loop for room.
    // Without a loop to park on, the idle bound is the only limit.
    Result<WireQueue::Pumped> p = ctx.parking != nullptr
                                      ? r->out.Pump(ctx.ch, kParkAfterMs, &wait_budget_ns)
                                      : r->out.Pump(ctx.ch, rpc_timeout_ms_);
    if (!p.ok()) return r->done(ctx, p.status());
    if (*p == WireQueue::Pumped::kAllSent) continue;
    const Status idle(DYAD_RC_TIMEOUT, "the requester took no bytes for " +
                                           std::to_string(rpc_timeout_ms_) +
                                           " ms (--rpc-timeout), or hung up");
    if (ctx.parking == nullptr) {
      ctx.ch.MarkBroken();
      return r->done(ctx, idle);
    }
    // What it holds unsent is counted while it waits: sessions that stop
    // reading cannot together hold more than kParkedOutputCap.
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
      return r->done(ctx, full);
    }
    stats_->AddNamed("fetch.parked_for_room");
    ctx.parking->ParkUntilWritable(
        [this, r](RequestContext& c) {
          Uncharge(*r);
          Drive(c, r);
        },
        [this, r, idle](RequestContext& c) {
          Uncharge(*r);
          r->done(c, idle);
        },
        rpc_timeout_ms_);
    return;
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

void FileServer::WaitForPeer(RequestContext& ctx, const std::shared_ptr<Response>& r) {
  RunParked(
      ctx, r->peer(), watcher_, stats_, [this, r](RequestContext& c) { Drive(c, r); },
      "fetch.parked_for_peer");
}

void FileServer::QueueReply(Channel& ch, WireQueue& out, const Status& st,
                            const std::string& body) {
  std::string frame;
  ch.CaptureSends(&frame);
  SendReply(ch, st, body, rpc_timeout_ms_, stats_);
  ch.CaptureSends(nullptr);
  out.Bytes(std::move(frame));
}

void FileServer::Respond(RequestContext& ctx, const std::string& payload, Prepare prepare) {
  auto r = std::make_shared<Response>();
  // Every reply goes through the response's queue, in order.
  ctx.ch.CaptureSends(&r->captured);
  (this->*prepare)(ctx, payload, r.get());
  ctx.ch.CaptureSends(nullptr);
  r->out.Bytes(std::move(r->captured));
  Drive(ctx, r);
}

void FileServer::HandleFetch(RequestContext& ctx, const std::string& payload) {
  Respond(ctx, payload, &FileServer::PrepareFetch);
}

// What a fetch being sent holds on to.
struct FileServer::Sending {
  UniqueFd fd;
  FileSource src;
  Transport* transport = nullptr;
  std::string request_args;
  uint64_t queued = 0;           // bytes of the file queued so far (QueueChunk)
  bool pushed = false;           // Push done (transports that send whole files)
  std::unique_ptr<PushOp> push;  // the push in progress, when the transport has ops
  Status push_status;            // how the push ended
  std::shared_ptr<Resumable> push_wait;
  bool same = false;  // the verdict
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
  r->peer = [s] { return s->push_wait; };
  r->done = [this, s](RequestContext& c, const Status& why) { FetchDone(c, *s, why); };
}

// A transport's PushOp as a Resumable (resumable.h): each step moves what
// the op can now; between steps the request waits for the session (the
// requester's offer, credits, error or hang-up) or the op's wake fd (its
// sends completing). No progress within the transport's idle bound ends
// the push. The op is released as soon as the push ends.
class FileServer::PushWait final : public Resumable {
 public:
  PushWait(Channel& ch, Sending& s) : ch_(ch), s_(s) { Progressed(); }

  bool Step(Wait* wait) override {
    if (s_.pushed) return true;
    Result<bool> r = s_.push->Step();
    if (!r.ok() || *r) {
      Finish(r.status());
      return true;
    }
    if (s_.push->moved() != last_) Progressed();
    *wait = Wait{&ch_, deadline_};
    wait->fd = s_.push->wake_fd();
    return false;
  }
  void Expired() override {
    Finish(s_.push->Fail(Status(DYAD_RC_TIMEOUT, "the requester made no progress for " +
                                                     std::to_string(s_.push->idle_ms()) + " ms")));
  }
  void Abandon(const Status& why) override { Finish(s_.push->Fail(why)); }

 private:
  void Progressed() {
    last_ = s_.push->moved();
    const int64_t idle = s_.push->idle_ms();
    deadline_ = idle > 0 ? Deadline::AfterMs(idle) : Deadline::Never();
  }
  void Finish(const Status& st) {
    if (s_.pushed) return;
    s_.pushed = true;
    s_.push_status = st;
    s_.push.reset();
  }

  Channel& ch_;
  Sending& s_;  // owns this
  uint64_t last_ = 0;
  Deadline deadline_ = Deadline::Never();
};

Result<FileServer::Fill> FileServer::FillFetch(RequestContext& ctx, Sending& s, WireQueue& out) {
  if (s.transport->queues_chunks() && s.queued < s.src.size) {
    DYAD_RETURN_IF_ERROR(s.transport->QueueChunk(ctx.ch, s.src, &s.queued, &out));
    ++s.ts.chunks;
    s.ts.bytes = s.queued;
    return Fill::kQueued;
  }
  if (!s.transport->queues_chunks() && !s.pushed) {
    // The transport writes the session itself: the reply must be out first.
    if (!out.empty()) return Fill::kFlush;
    if (s.push_wait) return Fill::kPeer;  // (a push that ended set `pushed`)
    s.push = s.transport->StartPush(ctx.ch, s.src, s.request_args, &s.ts);
    if (s.push) {
      s.push_wait = std::make_shared<PushWait>(ctx.ch, s);
      return Fill::kPeer;
    }
    // A transport without ops waits on its own completions here.
    DYAD_RETURN_IF_ERROR(s.transport->Push(ctx.ch, s.src, s.request_args, &s.ts));
    s.pushed = true;
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
