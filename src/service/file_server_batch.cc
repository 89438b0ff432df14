// file_server_batch.cc: the owner's side of kFetchBatch (see protocol.h):
// many small files of one requester in one request, each sent inline in its
// own reply as soon as it is read. The same rules as a single fetch apply
// to every item: only regular files beneath the producer directory, read
// under the producer's shared lock, and sent only if unchanged by the end
// of the read. An item whose file is locked by its producer is answered
// busy at once (never waited for: see ReadInline).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <memory>

#include "common/fsutil.h"
#include "common/log.h"
#include "common/trace.h"
#include "service/file_server.h"

namespace dyad {

Status FileServer::ReadInline(RequestContext& ctx, const FetchBatchItem& item, uint64_t max_inline,
                              FetchBatchPart* part) {
  const uint32_t peer = ctx.peer != nullptr ? ctx.peer->rank : 0u;
  Result<std::string> upath = ValidateUpath(item.upath);
  if (!upath.ok()) {
    stats_->Add(ServiceStats::kFetchRefused);
    DYAD_LOG_WARN("refused batch fetch of '%s' from rank %u: %s", item.upath.c_str(), peer,
                  upath.status().ToString().c_str());
    return upath.status();
  }
  Result<UniqueFd> fd = root_.Open(*upath, O_RDONLY | O_NONBLOCK);
  if (!fd.ok()) {
    if (fd.status().code() == DYAD_RC_PERM) {
      stats_->Add(ServiceStats::kFetchRefused);
      return fd.status();
    }
    const dyad_rc_t code =
        fd.status().code() == DYAD_RC_BADFIO ? DYAD_RC_BADFETCH : fd.status().code();
    return Status(code, "rank " + std::to_string(rank_) + ": published file '" + *upath +
                            "' cannot be read: " + fd.status().message());
  }
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) return StatusFromErrno(errno, "stat '" + *upath + "'");
  if (!S_ISREG(st.st_mode)) {
    stats_->Add(ServiceStats::kFetchRefused);
    return Status(DYAD_RC_PERM, "'" + *upath + "' is not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > max_inline)
    return Status(DYAD_RC_NOTSUP, "'" + *upath + "' is too large to send inline");
  // A file its producer is writing is not waited for here: that would hold
  // this worker for up to --rpc-timeout per item, and a few batches naming
  // locked files would take every peer worker. The item is answered busy
  // at once (DYAD_RC_NOTSUP, which requesters of every version answer by
  // fetching the file alone, after the batch) and the rest go on.
  if (::flock(fd->get(), LOCK_SH | LOCK_NB) != 0 && (errno == EWOULDBLOCK || errno == EINTR)) {
    stats_->AddNamed("fetch_batch.busy");
    return Status(DYAD_RC_NOTSUP, "busy: rank " + std::to_string(rank_) + ": '" + *upath +
                                      "' is locked by its producer; fetch it alone");
  }
  if (::fstat(fd->get(), &st) != 0) return StatusFromErrno(errno, "stat '" + *upath + "'");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  const uint64_t version = MtimeNs(st);
  if (size > max_inline) return Status(DYAD_RC_NOTSUP, "'" + *upath + "' grew too large");
  if (item.expect_version != 0 && item.expect_version != version)
    return Stale(*upath, "since it was published");
  if (on_serve_ && ctx.peer != nullptr) on_serve_(*upath, ctx.peer->rank);
  part->data.resize(size);
  DYAD_RETURN_IF_ERROR(PreadFully(fd->get(), part->data.data(), size, 0));
  // What was read is what was published only if the file is still that one.
  if (::fstat(fd->get(), &st) != 0 || static_cast<uint64_t>(st.st_size) != size ||
      MtimeNs(st) != version)
    return Stale(*upath, "while it was sent");
  part->version = version;
  part->mode = st.st_mode & 0777;
  return Status::OK();
}

// A batch being answered: the request, the next item, and what was sent.
struct FileServer::Batch {
  FetchBatchRequest req;
  size_t next = 0;
  uint64_t files = 0;
  uint64_t bytes = 0;
  FetchBatchPart part;
  std::unique_ptr<TraceSpan> span;
};

Task<void> FileServer::HandleFetchBatch(RequestContext& ctx, const std::string& payload) {
  stats_->AddNamed("requests.fetch_batch");
  // Files are read one at a time, as the requester takes the replies
  // before them.
  co_await Respond(ctx, payload, &FileServer::PrepareBatch);
}

void FileServer::PrepareBatch(RequestContext& ctx, const std::string& payload, Response* r) {
  auto b = std::make_shared<Batch>();
  b->span = std::make_unique<TraceSpan>("serve.batch", "service");
  Decoder d(payload);
  if (!b->req.DecodeFrom(d) || !d.done())
    return Refuse(ctx, "", Status(DYAD_RC_BADUNPACK, "malformed batch fetch request"));
  if (prod_real_.empty())
    return Refuse(ctx, "",
                  Status(DYAD_RC_NOTFOUND,
                         "rank " + std::to_string(rank_) + " serves no producer directory"));
  // However large the request allows: what a session that stops reading
  // can hold stays small (FileServer::kMaxServedInline).
  b->req.max_inline = std::min<uint64_t>(b->req.max_inline, kMaxServedInline);
  Encoder head;
  head.U32(static_cast<uint32_t>(b->req.items.size()));
  SendReply(ctx.ch, Status::OK(), head.data(), rpc_timeout_ms_, stats_);
  r->fill = [this, b](RequestContext& c, WireQueue& out) { return FillBatch(c, *b, out); };
  r->done = [this, b](RequestContext& c, const Status& why) { BatchDone(c, *b, why); };
}

Result<FileServer::Fill> FileServer::FillBatch(RequestContext& ctx, Batch& b, WireQueue& out) {
  if (b.next == b.req.items.size()) return Fill::kEnd;
  const FetchBatchItem& item = b.req.items[b.next++];
  Status st = ReadInline(ctx, item, b.req.max_inline, &b.part);
  if (!st.ok()) {
    QueueReply(ctx.ch, out, st, {});
    return Fill::kQueued;
  }
  Encoder e;
  b.part.EncodeTo(e);
  ++b.files;
  b.bytes += b.part.data.size();
  std::string().swap(b.part.data);  // only the queued frame holds the bytes now
  QueueReply(ctx.ch, out, Status::OK(), e.data());
  return Fill::kQueued;
}

void FileServer::BatchDone(RequestContext& ctx, Batch& b, const Status& why) {
  b.span->Arg("files", b.files).Arg("bytes", b.bytes);
  if (ctx.peer != nullptr) b.span->Arg("to", ctx.peer->rank);
  b.span->Rc(why);
  if (!why.ok()) {
    stats_->Add(ServiceStats::kErrors);
    DYAD_LOG_WARN("answering a batch fetch of rank %u failed after %" PRIu64 " files: %s",
                  ctx.peer != nullptr ? ctx.peer->rank : 0u, b.files, why.ToString().c_str());
    return;
  }
  // Counted like single fetches, under the session transport that carried them.
  stats_->Add(ServiceStats::kTransfersOut, b.files);
  stats_->Add(ServiceStats::kBytesOut, b.bytes);
  stats_->AddNamed("transfers.out.tcp", b.files);
  stats_->AddNamed("bytes.out.tcp", b.bytes);
}

}  // namespace dyad
