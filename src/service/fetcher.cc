#include "service/fetcher.h"

#include "common/time.h"
#include "common/trace.h"
#include "service/peer_dial.h"
#include "service/peer_rpc.h"

namespace dyad {
namespace {

// Whatever happens in a conversation, its session goes back to the pool at
// the end unless it broke or is out of step (marked broken then).
struct GiveBack {
  PeerDirectory* peers;
  uint32_t rank;
  std::unique_ptr<Channel>* ch;
  ~GiveBack() { peers->Release(rank, std::move(*ch)); }
};

}  // namespace

Task<FetchResult> Fetcher::Fetch(const FileRecord& rec, Transport& transport,
                                 const SinkFn& open_sink, PeerWaits& waits) {
  const std::string what = "fetch '" + rec.upath + "' from rank " + std::to_string(rec.owner_rank);
  FetchResult out;
  TraceSpan span("fetch", "service");
  span.Arg("path", rec.upath).Arg("owner", rec.owner_rank).Arg("transport", transport.name());
  auto end = [&](dyad_rc_t code, const std::string& why) {
    out.status = Status(code, what + ": " + why);
    span.Rc(out.status);
    return std::move(out);
  };
  Deadline deadline = Deadline::AfterMs(rpc_timeout_ms_);
  Result<std::unique_ptr<Channel>> session =
      co_await DialPeer(*peers_, rec.owner_rank, deadline, waits);
  if (!session.ok()) {
    const bool stale = session.status().code() == DYAD_RC_STALE;
    out.outcome.retryable = stale;
    co_return end(stale ? DYAD_RC_BADFETCH : session.status().code(), session.status().message());
  }
  Channel& ch = **session;
  GiveBack give_back{peers_, rec.owner_rank, &*session};

  Result<std::string> args = transport.PrepareRequest();
  if (!args.ok()) co_return end(args.status().code(), args.status().message());
  FetchRequest req;
  req.upath = rec.upath;
  req.transport = transport.name();
  req.transport_args = *args;
  req.expect_version = rec.version;
  Encoder e;
  req.EncodeTo(e);
  Status st = ch.SendFrame(static_cast<uint16_t>(MsgType::kFetch), e.data(), deadline);
  const std::string late =
      " from the owner within " + std::to_string(rpc_timeout_ms_) + " ms (--rpc-timeout)";
  std::string body;
  int sink_fd = -1;
  if (st.ok()) {
    // The owner is at work: the sink is opened meanwhile, off the chain.
    Result<int> sink = open_sink();
    if (!sink.ok()) {
      ch.MarkBroken();  // its reply will come, unread
      out.status = sink.status();
      span.Rc(out.status);
      co_return std::move(out);
    }
    sink_fd = *sink;
    st = co_await AwaitReply(ch, deadline, waits, "no reply" + late, &body, nullptr,
                             /*just_sent=*/true);
  }
  if (!st.ok()) {
    // A broken session received nothing: it was dead before we used it.
    if (ch.broken()) out.outcome.retryable = st.code() == DYAD_RC_CONNLOST;
    co_return end(st.code(), st.message());
  }
  FetchReply reply;
  Decoder d(body);
  if (!reply.DecodeFrom(d) || !d.done()) {
    ch.MarkBroken();
    co_return end(DYAD_RC_BADUNPACK, "malformed reply");
  }
  // The record's size is what the node's budget admitted (prefetch) and
  // what the consumer was promised: a file of another size is not that
  // version, and none of its bytes are taken. The owner streams them
  // after its reply, so the session is out of step: it is not pooled.
  if (reply.size != rec.size) {
    ch.MarkBroken();
    co_return end(DYAD_RC_STALE, "the owner's file has " + std::to_string(reply.size) +
                                     " bytes, its record says " + std::to_string(rec.size) +
                                     "; the record does not describe the file, nothing was placed");
  }

  TransferStats ts;
  {
    TransferRegistry::Entry progress;
    if (transfers_ != nullptr)
      progress = transfers_->Begin(false, rec.upath, rec.owner_rank, transport.name(), reply.size,
                                   SinkProgress(sink_fd));
    st = co_await transport.Pull(ch, reply.size, reply.transport_args, sink_fd, &ts, waits);
  }
  span.Arg("bytes", reply.size);
  if (!st.ok()) {
    ch.MarkBroken();
    co_return end(st.code() == DYAD_RC_CONNLOST ? DYAD_RC_BADFETCH : st.code(), st.message());
  }

  // The owner's verdict: the file did not change while it was sent.
  st = co_await AwaitReply(ch, Deadline::AfterMs(rpc_timeout_ms_), waits, "no verdict" + late,
                           &body, nullptr);
  if (!st.ok()) {
    // (a verdict of "changed" leaves the session in step)
    if (st.code() != DYAD_RC_STALE) ch.MarkBroken();
    co_return end(st.code() == DYAD_RC_CONNLOST ? DYAD_RC_BADFETCH : st.code(), st.message());
  }
  out.outcome.version = reply.version;
  out.outcome.bytes = reply.size;
  out.outcome.mode = reply.mode;
  co_return std::move(out);
}

Task<Status> Fetcher::FetchBatch(uint32_t owner, const std::vector<const FileRecord*>& recs,
                                 uint64_t max_inline, const PartFn& on_part, size_t* answered,
                                 PeerWaits& waits) {
  *answered = 0;
  TraceSpan span("fetch.batch", "service");
  span.Arg("owner", owner).Arg("files", recs.size());
  const std::string what =
      "batch fetch of " + std::to_string(recs.size()) + " files from rank " + std::to_string(owner);
  auto fail = [&what](const Status& st) { return Status(st.code(), what + ": " + st.message()); };
  const Deadline setup = Deadline::AfterMs(rpc_timeout_ms_);
  Result<std::unique_ptr<Channel>> session = co_await DialPeer(*peers_, owner, setup, waits);
  if (!session.ok()) co_return fail(session.status());
  Channel& ch = **session;
  GiveBack give_back{peers_, owner, &*session};
  FetchBatchRequest req;
  req.max_inline = max_inline;
  for (const FileRecord* r : recs) req.items.push_back({r->upath, r->version});
  Encoder e;
  req.EncodeTo(e);
  Status st = ch.SendFrame(static_cast<uint16_t>(MsgType::kFetchBatch), e.data(), setup);
  if (!st.ok()) {
    ch.MarkBroken();
    co_return fail(st);
  }
  // Every answer is a reply frame, each within --rpc-timeout; one that
  // cannot be read leaves the session out of step, so any failure to
  // receive one ends it (AwaitReply marks it broken).
  const std::string late =
      "no answer from the owner within " + std::to_string(rpc_timeout_ms_) + " ms (--rpc-timeout)";
  std::string body;
  auto next = [&](Status* answer) -> Task<Status> {
    bool replied = false;
    Status rs =
        co_await AwaitReply(ch, Deadline::AfterMs(rpc_timeout_ms_), waits, late, &body, &replied);
    if (!replied || ch.broken()) {
      ch.MarkBroken();
      co_return rs;
    }
    *answer = rs;
    co_return Status::OK();
  };
  Status answer;
  st = co_await next(&answer);
  if (!st.ok()) co_return fail(st);
  if (!answer.ok()) {
    // An owner without batches names the request it does not serve.
    const dyad_rc_t code = answer.code() == DYAD_RC_BADREQUEST ? DYAD_RC_NOTSUP : answer.code();
    co_return Status(code, what + ": " + answer.message());
  }
  Decoder head(body);
  if (head.U32() != recs.size() || !head.done()) {
    ch.MarkBroken();
    co_return Status(DYAD_RC_BADUNPACK, what + ": malformed reply");
  }
  FetchBatchPart part;
  for (size_t i = 0; i < recs.size(); ++i) {
    st = co_await next(&answer);
    if (!st.ok()) co_return fail(st);
    if (answer.ok()) {
      Decoder d(body);
      if (!part.DecodeFrom(d) || !d.done()) {
        ch.MarkBroken();
        co_return Status(DYAD_RC_BADUNPACK, what + ": malformed part for '" + recs[i]->upath + "'");
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
  co_return Status::OK();
}

}  // namespace dyad
