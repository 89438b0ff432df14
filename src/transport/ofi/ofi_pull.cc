// The requester's side of an "ofi" transfer (see ofi_transport.h) as a
// PullOp: read each announced chunk from the owner's registered memory into
// our own, write completed chunks out in order, return their slots. Each
// Step takes what is there now (announcements the session holds, reads
// that completed) and never waits; its wake fd is signalled by our reads'
// completions, by the receive pool when a buffer comes free, and by the
// fabric when a read it refused as busy is worth retrying.
#include <rdma/fi_errno.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <utility>

#include "common/fsutil.h"
#include "common/log.h"
#include "transport/ofi/ofi_engine.h"
#include "transport/ofi/ofi_op.h"
#include "transport/ofi/ofi_wire.h"

namespace dyad {
namespace {

// What Pull must do for a transfer it never started on the fabric: the
// data came inline (or there is none), or a check failed first.
class OfiSimplePull final : public PullOp {
 public:
  OfiSimplePull(Channel& session, std::string data, int sink_fd, int64_t idle_ms, Status error,
                bool owner_told, TransferStats* stats)
      : session_(session),
        data_(std::move(data)),
        sink_fd_(sink_fd),
        idle_ms_(idle_ms),
        error_(std::move(error)),
        owner_told_(owner_told),
        stats_(stats) {}

  Result<bool> Step() override {
    if (!error_.ok()) return Fail(error_);
    if (done_ || data_.empty()) return true;
    // Small files need no fabric: the data came in the reply, and the
    // owner sends nothing more.
    Status st = WriteFully(sink_fd_, data_.data(), data_.size());
    if (!st.ok()) return BreakSession(session_, st.Annotate("ofi pull"));
    stats_->bytes = data_.size();
    stats_->chunks = 1;
    done_ = true;
    return true;
  }
  uint64_t moved() const override { return stats_->bytes; }
  int64_t idle_ms() const override { return idle_ms_; }
  Status Fail(const Status& why) override {
    // The owner of an inline reply sends nothing more and waits for nothing.
    return owner_told_ ? BreakSession(session_, why)
                       : TellAndBreakSession(session_, kOfiErrorFrame, why);
  }

 private:
  Channel& session_;
  const std::string data_;
  const int sink_fd_;
  const int64_t idle_ms_;
  const Status error_;
  const bool owner_told_;
  TransferStats* const stats_;
  bool done_ = false;
};

class OfiRmaPull final : public OfiTransferOp {
 public:
  struct Setup {
    std::shared_ptr<OfiFabric> fabric;
    OfiPool* pool = nullptr;
    OfiGeometry g;
    std::string address;  // the owner's endpoint, held in the AV
    uint64_t instance = 0;
    fi_addr_t peer = FI_ADDR_UNSPEC;
    uint64_t size = 0;
    int sink_fd = -1;
  };
  OfiRmaPull(Channel& session, Setup s, int64_t idle_ms, TransferStats* stats)
      : OfiTransferOp(session, idle_ms, stats), s_(std::move(s)) {}
  ~OfiRmaPull() override {
    if (!ended_) (void)End(Status(DYAD_RC_CANCELLED, "ofi pull abandoned"));
  }

 private:
  Result<bool> StepRun() override;
  Status TakeBuffer(bool* got);
  Status ReadFrames();
  Status PostReads();
  Status WriteCompleted();
  Status End(const Status& st) override;
  uint64_t Length(uint64_t i) const { return std::min(s_.g.chunk, s_.size - i * s_.g.chunk); }
  char* Slot(uint64_t i) const { return buf_->base + (i % s_.g.window) * buf_->slot_bytes; }
  std::string What() const {
    return "ofi pull (received " + std::to_string(stats_->bytes) + " of " +
           std::to_string(s_.size) + " bytes)";
  }

  const Setup s_;
  OfiBuffer* buf_ = nullptr;
  std::unique_ptr<OfiActivity> active_;
  std::deque<OfiChunk> announced_;  // received, read not started yet
  uint64_t received_ = 0;           // announcements received
  uint64_t posted_ = 0;             // reads started
  uint64_t written_ = 0;            // chunks written to the sink
  bool owner_reported_ = false;
  bool local_error_ = false;
  bool busy_ = false;  // the provider refused the next read as busy (EAGAIN)
  std::chrono::steady_clock::time_point busy_since_;
};

Result<bool> OfiRmaPull::StepRun() {
  if (!wake_error_.ok()) return wake_error_;
  DrainWake();
  if (buf_ == nullptr) {
    bool got = false;
    DYAD_RETURN_IF_ERROR(TakeBuffer(&got));
    if (!got) return false;
  }
  for (;;) {
    const uint64_t before = received_ + posted_ + written_;
    DYAD_RETURN_IF_ERROR(WriteCompleted());
    DYAD_RETURN_IF_ERROR(ReadFrames());
    DYAD_RETURN_IF_ERROR(PostReads());
    if (received_ + posted_ + written_ == before) break;
  }
  if (written_ < s_.g.chunks) return false;
  DYAD_RETURN_IF_ERROR(OfiSendU64(session_, kOfiDoneFrame, s_.g.chunks, IdleDeadline(idle_ms_)));
  return true;
}

// The owner waits for kReady, which says we hold our receive buffer.
Status OfiRmaPull::TakeBuffer(bool* got) {
  Result<OfiBuffer*> b = s_.pool->TryAcquire(wake_.get());
  if (!b.ok() || *b == nullptr) return b.status();
  buf_ = *b;
  buf_->SetNotify(wake_.get());
  active_ = std::make_unique<OfiActivity>(*s_.fabric);
  *got = true;
  return OfiSendU64(session_, kOfiReadyFrame, 0, IdleDeadline(idle_ms_));
}

// Takes every announcement the session holds now (at most a window ahead
// of what was written, so the queue stays small).
Status OfiRmaPull::ReadFrames() {
  for (;;) {
    uint16_t type = 0;
    Result<bool> r = NextFrame(&type);
    if (!r.ok() || !*r) return r.status();
    if (type == kOfiErrorFrame) {
      owner_reported_ = true;
      return OfiDecodeError(payload_, "owner");
    }
    OfiChunk c;
    if (type != kOfiChunkFrame || !c.Decode(payload_))
      return Status(DYAD_RC_BADUNPACK, "unexpected frame from the owner during the transfer");
    if (c.index != received_ || c.index >= s_.g.chunks || c.index >= written_ + s_.g.window ||
        c.length != Length(c.index))
      return Status(DYAD_RC_BADUNPACK, "the owner announced chunk " + std::to_string(c.index) +
                                           " (" + std::to_string(c.length) + " bytes) out of turn");
    announced_.push_back(c);
    ++received_;
  }
}

// Starts the reads of announced chunks until the provider is busy (it
// signals the wake fd when a retry is worth it).
Status OfiRmaPull::PostReads() {
  while (!announced_.empty()) {
    const OfiChunk& c = announced_.front();
    OfiOp& op = buf_->ops[c.index % s_.g.window];
    buf_->in_flight.fetch_add(1, std::memory_order_acq_rel);
    Result<bool> posted = s_.fabric->TryRead(&op, Slot(c.index), static_cast<size_t>(c.length),
                                             buf_->region->registration().desc, s_.peer,
                                             c.remote_addr, c.key, wake_.get());
    if (!posted.ok() || !*posted) buf_->in_flight.fetch_sub(1, std::memory_order_acq_rel);
    if (!posted.ok()) return posted.status().Annotate("reading chunk " + std::to_string(c.index));
    if (!*posted) {
      if (!busy_) busy_since_ = std::chrono::steady_clock::now();
      busy_ = true;
      return Status::OK();
    }
    busy_ = false;
    announced_.pop_front();
    ++posted_;
  }
  return Status::OK();
}

// Writes out, in order, every chunk whose read completed, and hands its
// slot back to the owner when a later chunk will use it.
Status OfiRmaPull::WriteCompleted() {
  while (written_ < posted_) {
    OfiOp& op = buf_->ops[written_ % s_.g.window];
    if (op.state.load(std::memory_order_acquire) != OfiOp::kDone) break;
    op.state.store(OfiOp::kIdle, std::memory_order_relaxed);
    if (op.err != 0)
      return Status(OfiFabricErrorCode(op.err), "reading chunk " + std::to_string(written_) +
                                                    " from the owner: " + fi_strerror(op.err) +
                                                    " (provider error " +
                                                    std::to_string(op.prov_err) + ")");
    const uint64_t len = Length(written_);
    Status ws = WriteFully(s_.sink_fd, Slot(written_), static_cast<size_t>(len));
    if (!ws.ok()) {
      local_error_ = true;
      return Status(DYAD_RC_BADFIO, ws.message());
    }
    stats_->bytes += len;
    stats_->chunks += 1;
    if (written_ + s_.g.window < s_.g.chunks)
      DYAD_RETURN_IF_ERROR(OfiSendU64(session_, kOfiCreditFrame, written_, IdleDeadline(idle_ms_)));
    ++written_;
  }
  return Status::OK();
}

// Gives back what the transfer holds. Reads still in flight after a
// failure keep the buffer from reuse (OfiPool) without anyone waiting for
// them; their completions no longer signal our wake fd.
Status OfiRmaPull::End(const Status& st) {
  ended_ = true;
  s_.pool->CancelNotify(wake_.get());
  s_.fabric->CancelBusyNotify(wake_.get());
  active_.reset();
  if (buf_ != nullptr) s_.pool->Release(buf_, 0);
  buf_ = nullptr;
  // A failure that may be the fabric's (a failed read, a lost or silent
  // peer) drops the owner's address-vector entry.
  const bool suspect = !st.ok() && !owner_reported_ && !local_error_;
  s_.fabric->ReleasePeer(s_.address, s_.instance, s_.peer, suspect);
  if (st.ok()) return st;
  result_ = st;
  // A read the provider kept refusing (shm does so for an address outside
  // the owner's memory): say which, or the failure looks like a silent owner.
  if (busy_ && !announced_.empty()) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - busy_since_)
                        .count();
    result_ =
        result_.Annotate("reading chunk " + std::to_string(announced_.front().index) +
                         ": fi_read refused as busy (EAGAIN) for " + std::to_string(ms) + " ms");
  }
  result_ = result_.Annotate(What());
  return owner_reported_ ? BreakSession(session_, result_)
                         : TellAndBreakSession(session_, kOfiErrorFrame, result_);
}

}  // namespace

std::unique_ptr<PullOp> OfiTransport::StartPull(Channel& session, uint64_t size,
                                                const std::string& reply_args, int sink_fd,
                                                TransferStats* stats) {
  *stats = TransferStats();
  auto simple = [&](std::string data, Status st, bool owner_told) -> std::unique_ptr<PullOp> {
    return std::make_unique<OfiSimplePull>(session, std::move(data), sink_fd, options_.idle_ms,
                                           std::move(st), owner_told, stats);
  };
  if (size == 0) return simple(std::string(), Status::OK(), true);
  OfiReplyArgs args;
  Status st = args.Decode(reply_args);
  if (st.ok() && sink_fd < 0) st = Status(DYAD_RC_BADFIO, "no sink file");
  if (!st.ok()) return simple(std::string(), st.Annotate("ofi pull"), false);
  if (args.inline_data) {
    if (args.data.size() != size)
      return simple(std::string(),
                    Status(DYAD_RC_BADUNPACK, "ofi pull: the reply carries " +
                                                  std::to_string(args.data.size()) +
                                                  " bytes inline, not " + std::to_string(size)),
                    true);
    return simple(std::move(args.data), Status::OK(), true);
  }
  const std::string what = "ofi pull (received 0 of " + std::to_string(size) + " bytes)";
  Result<Engine*> e = Start();
  if (!e.ok()) return simple(std::string(), e.status().Annotate(what), false);
  Engine& engine = **e;
  st = CheckPeer(engine, args.provider, args.host, "owner");
  Result<OfiGeometry> g =
      OfiGeometryFor(size, args.slot_bytes, args.slots, engine.receive->slot_bytes(),
                     static_cast<uint32_t>(engine.receive->slots()));
  if (st.ok() && !g.ok()) st = g.status();
  if (!st.ok()) return simple(std::string(), st.Annotate(what), false);
  Result<fi_addr_t> peer = engine.fabric->AcquirePeer(args.address, args.instance);
  if (!peer.ok()) return simple(std::string(), peer.status().Annotate(what), false);
  OfiRmaPull::Setup s;
  s.fabric = engine.fabric;
  s.pool = engine.receive.get();
  s.g = *g;
  s.address = std::move(args.address);
  s.instance = args.instance;
  s.peer = *peer;
  s.size = size;
  s.sink_fd = sink_fd;
  return std::make_unique<OfiRmaPull>(session, std::move(s), options_.idle_ms, stats);
}

}  // namespace dyad
