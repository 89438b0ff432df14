// file_server_batch.cc: the owner's side of kFetchBatch (see protocol.h):
// many small files of one requester in one request, each sent inline in its
// own reply as soon as it is read. The same rules as a single fetch apply
// to every item: only regular files beneath the producer directory, read
// under the producer's shared lock, and sent only if unchanged by the end
// of the read.
#include <fcntl.h>
#include <sys/stat.h>

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
  Result<UniqueFd> fd = OpenBeneath(prod_real_, *upath, O_RDONLY | O_NONBLOCK);
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
  DYAD_RETURN_IF_ERROR(WaitShared(ctx, fd->get(), *upath));
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

void FileServer::HandleFetchBatch(RequestContext& ctx, const std::string& payload) {
  TraceSpan span("serve.batch", "service");
  stats_->AddNamed("requests.fetch_batch");
  FetchBatchRequest req;
  Decoder d(payload);
  if (!req.DecodeFrom(d) || !d.done())
    return Refuse(ctx, "", Status(DYAD_RC_BADUNPACK, "malformed batch fetch request"));
  if (prod_real_.empty())
    return Refuse(ctx, "",
                  Status(DYAD_RC_NOTFOUND,
                         "rank " + std::to_string(rank_) + " serves no producer directory"));
  Encoder head;
  head.U32(static_cast<uint32_t>(req.items.size()));
  SendReply(ctx.ch, Status::OK(), head.data(), rpc_timeout_ms_, stats_);
  uint64_t files = 0, bytes = 0;
  FetchBatchPart part;
  for (const FetchBatchItem& item : req.items) {
    if (ctx.ch.broken()) break;  // the requester is gone: stop reading files for it
    Status st = ReadInline(ctx, item, req.max_inline, &part);
    if (!st.ok()) {
      SendReply(ctx.ch, st, {}, rpc_timeout_ms_, stats_);
      continue;
    }
    Encoder e;
    part.EncodeTo(e);
    SendReply(ctx.ch, Status::OK(), e.data(), rpc_timeout_ms_, stats_);
    ++files;
    bytes += part.data.size();
  }
  span.Arg("files", files).Arg("bytes", bytes);
  if (ctx.peer != nullptr) span.Arg("to", ctx.peer->rank);
  // Counted like single fetches, under the session transport that carried them.
  stats_->Add(ServiceStats::kTransfersOut, files);
  stats_->Add(ServiceStats::kBytesOut, bytes);
  stats_->AddNamed("transfers.out.tcp", files);
  stats_->AddNamed("bytes.out.tcp", bytes);
}

}  // namespace dyad
