// The owner's side of an "ofi" transfer (see ofi_transport.h) as a PushOp:
// fill registered slots from the file, announce them, let the requester
// read. Each Step takes the requester's frames the session holds now
// (ready, credits, done) and announces what they allow; it never waits.
// Its wake fd is signalled by the send pool when a buffer comes free; the
// requester's reads need no wake-up here (the fabric's progress thread
// serves them).
#include <algorithm>
#include <memory>
#include <utility>

#include "common/fsutil.h"
#include "common/log.h"
#include "transport/ofi/ofi_engine.h"
#include "transport/ofi/ofi_op.h"
#include "transport/ofi/ofi_wire.h"

namespace dyad {
namespace {

// A push with nothing to move on the fabric: the file went inline in the
// FetchReply, or a check failed before the transfer began (the requester
// waits for chunks the reply promised, so it is told).
class OfiSimplePush final : public PushOp {
 public:
  OfiSimplePush(Channel& session, uint64_t size, int64_t idle_ms, Status error,
                TransferStats* stats)
      : session_(session),
        size_(size),
        idle_ms_(idle_ms),
        error_(std::move(error)),
        stats_(stats) {}

  Result<bool> Step() override {
    if (!error_.ok()) return Fail(error_);
    stats_->bytes = size_;
    stats_->chunks = size_ > 0 ? 1 : 0;
    return true;
  }
  uint64_t moved() const override { return stats_->bytes; }
  int64_t idle_ms() const override { return idle_ms_; }
  Status Fail(const Status& why) override {
    return TellAndBreakSession(session_, kOfiErrorFrame, why);
  }

 private:
  Channel& session_;
  const uint64_t size_;
  const int64_t idle_ms_;
  const Status error_;
  TransferStats* const stats_;
};

class OfiRmaPush final : public OfiTransferOp {
 public:
  OfiRmaPush(Channel& session, const FileSource& src, std::shared_ptr<OfiFabric> fabric,
             OfiPool* pool, OfiGeometry g, int64_t idle_ms, TransferStats* stats)
      : OfiTransferOp(session, idle_ms, stats),
        src_(src),
        fabric_(std::move(fabric)),
        pool_(pool),
        g_(g) {}
  ~OfiRmaPush() override {
    if (!ended_) (void)End(Status(DYAD_RC_CANCELLED, "ofi push abandoned"));
  }

 private:
  Result<bool> StepRun() override;
  Status Announce();
  Status OnFrame(uint16_t type);
  Status End(const Status& st) override;

  const FileSource& src_;
  const std::shared_ptr<OfiFabric> fabric_;
  OfiPool* const pool_;
  const OfiGeometry g_;
  bool ready_ = false;  // the requester holds its receive buffer
  OfiBuffer* buf_ = nullptr;
  std::unique_ptr<OfiActivity> active_;
  uint64_t next_ = 0;     // chunks announced
  uint64_t credits_ = 0;  // slots the requester gave back
  bool done_ = false;     // every chunk landed
};

Result<bool> OfiRmaPush::StepRun() {
  if (!wake_error_.ok()) return wake_error_;
  DrainWake();
  uint16_t type = 0;
  if (!ready_) {
    Result<bool> r = NextFrame(&type);
    if (!r.ok() || !*r) return r;
    DYAD_RETURN_IF_ERROR(OfiCheckU64(type, payload_, kOfiReadyFrame, 0, "requester"));
    ready_ = true;
  }
  // Only a requester that holds its receive buffer gets a send buffer, so
  // transfers waiting for buffers can never wait on each other in a circle.
  if (buf_ == nullptr) {
    Result<OfiBuffer*> b = pool_->TryAcquire(wake_.get());
    if (!b.ok()) return b.status();
    if (*b == nullptr) return false;
    buf_ = *b;
    active_ = std::make_unique<OfiActivity>(*fabric_);
  }
  for (;;) {
    DYAD_RETURN_IF_ERROR(Announce());
    if (done_) return true;
    Result<bool> r = NextFrame(&type);
    if (!r.ok() || !*r) return r;
    DYAD_RETURN_IF_ERROR(OnFrame(type));
  }
}

// Chunk i goes to slot i % window once the requester returned the slot
// (kCredit {i - window}).
Status OfiRmaPush::Announce() {
  const uint64_t key = buf_->region->registration().key;
  while (next_ < g_.chunks && (next_ < g_.window || next_ - g_.window < credits_)) {
    const uint64_t slot = next_ % g_.window;
    OfiChunk c;
    c.index = next_;
    c.length = std::min(g_.chunk, src_.size - next_ * g_.chunk);
    c.remote_addr = buf_->region->registration().remote_base + slot * buf_->slot_bytes;
    c.key = key;
    DYAD_RETURN_IF_ERROR(PreadFully(src_.fd, buf_->base + slot * buf_->slot_bytes,
                                    static_cast<size_t>(c.length), next_ * g_.chunk));
    DYAD_RETURN_IF_ERROR(session_.SendFrame(kOfiChunkFrame, c.Encode(), IdleDeadline(idle_ms_)));
    stats_->bytes += c.length;
    stats_->chunks += 1;
    ++next_;
  }
  return Status::OK();
}

// The requester sends, in order, a credit for each slot a later chunk
// needs, then kDone with the chunk count.
Status OfiRmaPush::OnFrame(uint16_t type) {
  if (credits_ + g_.window < g_.chunks) {
    DYAD_RETURN_IF_ERROR(OfiCheckU64(type, payload_, kOfiCreditFrame, credits_, "requester"));
    if (credits_ >= next_)
      return Status(DYAD_RC_BADUNPACK, "the requester gave back the slot of chunk " +
                                           std::to_string(credits_) + " before it was announced");
    ++credits_;
    return Status::OK();
  }
  DYAD_RETURN_IF_ERROR(OfiCheckU64(type, payload_, kOfiDoneFrame, g_.chunks, "requester"));
  if (next_ < g_.chunks)
    return Status(DYAD_RC_BADUNPACK, "the requester said done after " + std::to_string(next_) +
                                         " of " + std::to_string(g_.chunks) + " chunks");
  done_ = true;
  return Status::OK();
}

Status OfiRmaPush::End(const Status& st) {
  ended_ = true;
  pool_->CancelNotify(wake_.get());
  active_.reset();
  if (buf_ != nullptr) {
    // After a failure the requester may still read a slot it was told
    // about: the buffer rests until its reads have surely stopped.
    pool_->Release(buf_, st.ok() ? 0 : 2 * std::max<int64_t>(idle_ms_, 1000));
    buf_ = nullptr;
  }
  if (st.ok()) return st;
  result_ = st.Annotate("ofi push of '" + src_.path + "' (sent " + std::to_string(stats_->bytes) +
                        " of " + std::to_string(src_.size) + " bytes)");
  return TellAndBreakSession(session_, kOfiErrorFrame, result_);
}

}  // namespace

std::unique_ptr<PushOp> OfiTransport::StartPush(Channel& session, const FileSource& src,
                                                const std::string& request_args,
                                                TransferStats* stats) {
  *stats = TransferStats();
  auto simple = [&](Status st) -> std::unique_ptr<PushOp> {
    return std::make_unique<OfiSimplePush>(session, src.size, options_.idle_ms, std::move(st),
                                           stats);
  };
  // Already sent inside the FetchReply (ReplyArgs).
  if (src.size <= kOfiInlineMaxBytes) return simple(Status::OK());
  const std::string what = "ofi push of '" + src.path + "'";
  OfiRequestArgs req;
  Status st = req.Decode(request_args);
  Result<Engine*> e = st.ok() ? Start() : Result<Engine*>(st);
  if (e.ok()) st = CheckPeer(**e, req.provider, req.host, "requester");
  if (!e.ok() || !st.ok()) return simple((e.ok() ? st : e.status()).Annotate(what));
  if (src.fd < 0) return simple(Status(DYAD_RC_BADFIO, what + ": no open file descriptor"));
  Engine& engine = **e;
  Result<OfiGeometry> g =
      OfiGeometryFor(src.size, engine.send->slot_bytes(),
                     static_cast<uint32_t>(engine.send->slots()), req.slot_bytes, req.slots);
  if (!g.ok()) return simple(g.status().Annotate(what));
  return std::make_unique<OfiRmaPush>(session, src, engine.fabric, engine.send.get(), *g,
                                      options_.idle_ms, stats);
}

}  // namespace dyad
