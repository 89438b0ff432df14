#include "service/fetcher.h"

#include "service/fetch_op.h"

#include "common/time.h"
#include "common/trace.h"

namespace dyad {

std::shared_ptr<FetchOp> Fetcher::NewOp(const FileRecord& rec, Transport& transport, int sink_fd) {
  return std::make_shared<FetchOp>(peers_, rpc_timeout_ms_, transfers_, rec, &transport, sink_fd);
}

Status Fetcher::FetchBatch(uint32_t owner, const std::vector<const FileRecord*>& recs,
                           uint64_t max_inline, const PartFn& on_part, size_t* answered) {
  *answered = 0;
  TraceSpan span("fetch.batch", "service");
  span.Arg("owner", owner).Arg("files", recs.size());
  const std::string what =
      "batch fetch of " + std::to_string(recs.size()) + " files from rank " + std::to_string(owner);
  const Deadline setup = Deadline::AfterMs(rpc_timeout_ms_);
  Result<std::unique_ptr<Channel>> session = peers_->Acquire(owner, setup);
  if (!session.ok())
    return Status(session.status().code(), what + ": " + session.status().message());
  Channel& ch = **session;
  FetchBatchRequest req;
  req.max_inline = max_inline;
  for (const FileRecord* r : recs) req.items.push_back({r->upath, r->version});
  Encoder e;
  req.EncodeTo(e);
  Status st = ch.SendFrame(static_cast<uint16_t>(MsgType::kFetchBatch), e.data(), setup);
  if (!st.ok()) {
    ch.MarkBroken();
    return Status(st.code(), what + ": " + st.message());
  }
  // Every answer is a reply frame; one that cannot be read leaves the
  // session out of step, so any failure to receive one ends it.
  std::string body;
  auto next = [&ch, &body, this](Status* answer) -> Status {
    uint16_t type = 0;
    std::string payload;
    Status rs = ch.RecvFrame(&type, &payload, Deadline::AfterMs(rpc_timeout_ms_));
    if (rs.ok() &&
        (type != static_cast<uint16_t>(MsgType::kReply) || !DecodeReply(payload, answer, &body)))
      rs = Status(DYAD_RC_BADUNPACK, "malformed reply");
    if (!rs.ok()) ch.MarkBroken();
    return rs;
  };
  Status answer;
  st = next(&answer);
  if (!st.ok()) return Status(st.code(), what + ": " + st.message());
  if (!answer.ok()) {
    peers_->Release(owner, std::move(*session));
    // An owner without batches names the request it does not serve.
    const dyad_rc_t code = answer.code() == DYAD_RC_BADREQUEST ? DYAD_RC_NOTSUP : answer.code();
    return Status(code, what + ": " + answer.message());
  }
  Decoder head(body);
  if (head.U32() != recs.size() || !head.done()) {
    ch.MarkBroken();
    return Status(DYAD_RC_BADUNPACK, what + ": malformed reply");
  }
  FetchBatchPart part;
  for (size_t i = 0; i < recs.size(); ++i) {
    st = next(&answer);
    if (!st.ok()) return Status(st.code(), what + ": " + st.message());
    if (answer.ok()) {
      Decoder d(body);
      if (!part.DecodeFrom(d) || !d.done()) {
        ch.MarkBroken();
        return Status(DYAD_RC_BADUNPACK, what + ": malformed part for '" + recs[i]->upath + "'");
      }
    }
    // Bytes the record does not announce are not taken (the budget
    // admitted the record's size).
    if (answer.ok() && part.data.size() != recs[i]->size)
      answer =
          Status(DYAD_RC_STALE, "batch fetch of '" + recs[i]->upath + "' from rank " +
                                    std::to_string(owner) + ": the owner sent " +
                                    std::to_string(part.data.size()) + " bytes, its record says " +
                                    std::to_string(recs[i]->size) + "; nothing was placed");
    *answered = i + 1;
    on_part(i, answer, answer.ok() ? &part : nullptr);
  }
  peers_->Release(owner, std::move(*session));
  return Status::OK();
}

}  // namespace dyad
