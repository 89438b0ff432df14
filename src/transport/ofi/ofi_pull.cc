// The requester's side of an "ofi" transfer (see ofi_transport.h): read
// each announced chunk from the owner's registered memory into our own,
// write completed chunks out in order, return their slots.
#include <poll.h>
#include <rdma/fi_errno.h>

#include <algorithm>

#include "common/log.h"
#include "transport/ofi/ofi_engine.h"
#include "transport/ofi/ofi_wire.h"

namespace dyad {
namespace {

// How long a failed transfer waits for its reads still in flight before
// leaving the buffer to the pool, which reuses it once they complete.
constexpr int64_t kDrainMs = 1000;

// One pull: frames from the owner and completions of our reads, both
// waited for with one poll(2) on the session and the buffer's eventfd.
class PullRun {
 public:
  PullRun(OfiFabric& fabric, Channel& session, OfiBuffer& buf, const OfiGeometry& g, fi_addr_t peer,
          uint64_t size, int sink_fd, int64_t idle_ms, TransferStats* stats)
      : fabric_(fabric),
        session_(session),
        buf_(buf),
        g_(g),
        peer_(peer),
        size_(size),
        sink_fd_(sink_fd),
        idle_ms_(idle_ms),
        stats_(stats) {}

  Status Run();
  // Waits (at most kDrainMs) for reads still in flight after a failure.
  void Drain();
  // Whether the owner reported the failure itself (no need to tell it).
  bool owner_reported() const { return owner_reported_; }
  // Whether the failure may be the fabric's (a failed read, a lost or
  // silent peer): the peer's address-vector entry is then dropped.
  bool fabric_suspect() const { return !owner_reported_ && !local_error_; }

 private:
  Status OnFrame();
  Status WriteCompleted();
  uint64_t Length(uint64_t i) const { return std::min(g_.chunk, size_ - i * g_.chunk); }
  char* Slot(uint64_t i) const { return buf_.base + (i % g_.window) * buf_.slot_bytes; }

  OfiFabric& fabric_;
  Channel& session_;
  OfiBuffer& buf_;
  const OfiGeometry g_;
  const fi_addr_t peer_;
  const uint64_t size_;
  const int sink_fd_;
  const int64_t idle_ms_;
  TransferStats* const stats_;
  uint64_t announced_ = 0;  // chunks whose read was started
  uint64_t written_ = 0;    // chunks written to the sink
  bool owner_reported_ = false;
  bool local_error_ = false;
};

Status PullRun::Run() {
  Deadline idle = OfiIdle(idle_ms_);
  while (written_ < g_.chunks) {
    pollfd p[2] = {{buf_.event.get(), POLLIN, 0}, {session_.fd(), POLLIN, 0}};
    const int n = ::poll(p, 2, static_cast<int>(idle.RemainingMs(1000)));
    if (n < 0 && errno != EINTR) return StatusFromErrno(errno, "poll");
    if (n > 0 && p[0].revents != 0) {
      buf_.DrainEvent();
      const uint64_t before = written_;
      DYAD_RETURN_IF_ERROR(WriteCompleted());
      if (written_ != before) idle = OfiIdle(idle_ms_);
    }
    if (n > 0 && p[1].revents != 0) {
      DYAD_RETURN_IF_ERROR(OnFrame());
      idle = OfiIdle(idle_ms_);
    }
    if (n == 0 && idle.expired())
      return Status(DYAD_RC_TIMEOUT, "no progress for " + std::to_string(idle_ms_) + " ms");
  }
  return OfiSendU64(session_, kOfiDoneFrame, g_.chunks, OfiIdle(idle_ms_));
}

// An announcement starts the read of its chunk; anything else ends the pull.
Status PullRun::OnFrame() {
  uint16_t type = 0;
  std::string payload;
  DYAD_RETURN_IF_ERROR(session_.RecvFrame(&type, &payload, OfiIdle(idle_ms_)));
  if (type == kOfiErrorFrame) {
    owner_reported_ = true;
    return OfiDecodeError(payload, "owner");
  }
  OfiChunk c;
  if (type != kOfiChunkFrame || !c.Decode(payload))
    return Status(DYAD_RC_BADUNPACK, "unexpected frame from the owner during the transfer");
  if (c.index != announced_ || c.index >= g_.chunks || c.index >= written_ + g_.window ||
      c.length != Length(c.index))
    return Status(DYAD_RC_BADUNPACK, "the owner announced chunk " + std::to_string(c.index) + " (" +
                                         std::to_string(c.length) + " bytes) out of turn");
  OfiOp& op = buf_.ops[c.index % g_.window];
  buf_.in_flight.fetch_add(1, std::memory_order_acq_rel);
  Status st = fabric_.Read(&op, Slot(c.index), static_cast<size_t>(c.length),
                           buf_.region->registration().desc, peer_, c.remote_addr, c.key,
                           OfiIdle(idle_ms_));
  if (!st.ok()) {
    buf_.in_flight.fetch_sub(1, std::memory_order_acq_rel);
    return st.Annotate("reading chunk " + std::to_string(c.index));
  }
  ++announced_;
  return Status::OK();
}

// Writes out, in order, every chunk whose read completed, and hands its
// slot back to the owner when a later chunk will use it.
Status PullRun::WriteCompleted() {
  while (written_ < announced_) {
    OfiOp& op = buf_.ops[written_ % g_.window];
    if (op.state.load(std::memory_order_acquire) != OfiOp::kDone) break;
    op.state.store(OfiOp::kIdle, std::memory_order_relaxed);
    if (op.err != 0)
      return Status(OfiFabricErrorCode(op.err), "reading chunk " + std::to_string(written_) +
                                                    " from the owner: " + fi_strerror(op.err) +
                                                    " (provider error " +
                                                    std::to_string(op.prov_err) + ")");
    const uint64_t len = Length(written_);
    Status ws = WriteFully(sink_fd_, Slot(written_), static_cast<size_t>(len));
    if (!ws.ok()) {
      local_error_ = true;
      return Status(DYAD_RC_BADFIO, ws.message());
    }
    stats_->bytes += len;
    stats_->chunks += 1;
    if (written_ + g_.window < g_.chunks)
      DYAD_RETURN_IF_ERROR(OfiSendU64(session_, kOfiCreditFrame, written_, OfiIdle(idle_ms_)));
    ++written_;
  }
  return Status::OK();
}

void PullRun::Drain() {
  const Deadline d = Deadline::AfterMs(kDrainMs);
  while (buf_.in_flight.load(std::memory_order_acquire) > 0 && !d.expired()) {
    pollfd p{buf_.event.get(), POLLIN, 0};
    (void)::poll(&p, 1, static_cast<int>(d.RemainingMs(kDrainMs)));
    buf_.DrainEvent();
  }
}

}  // namespace

Status OfiTransport::Pull(Channel& session, uint64_t size, const std::string& reply_args,
                          int sink_fd, TransferStats* stats) {
  TransferStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  *stats = TransferStats();
  if (size == 0) return Status::OK();
  OfiReplyArgs args;
  Status st = args.Decode(reply_args);
  if (st.ok() && sink_fd < 0) st = Status(DYAD_RC_BADFIO, "no sink file");
  if (!st.ok()) return OfiSendErrorAndFail(session, st.Annotate("ofi pull"));
  if (args.inline_data) {
    // Small files need no fabric: the data came in the reply, and the
    // owner sends nothing more.
    if (args.data.size() != size)
      st = Status(DYAD_RC_BADUNPACK, "the reply carries " + std::to_string(args.data.size()) +
                                         " bytes inline, not " + std::to_string(size));
    if (st.ok()) st = WriteFully(sink_fd, args.data.data(), args.data.size());
    if (!st.ok()) return OfiFailSession(session, st.Annotate("ofi pull"));
    stats->bytes = size;
    stats->chunks = 1;
    return Status::OK();
  }
  Result<Engine*> e = Start();
  if (!e.ok()) return OfiSendErrorAndFail(session, e.status().Annotate("ofi pull"));
  return PullRma(**e, session, size, args, sink_fd, stats);
}

Status OfiTransport::PullRma(Engine& e, Channel& session, uint64_t size, const OfiReplyArgs& args,
                             int sink_fd, TransferStats* stats) const {
  auto what = [&] {
    return "ofi pull (received " + std::to_string(stats->bytes) + " of " + std::to_string(size) +
           " bytes)";
  };
  Status st = CheckPeer(e, args.provider, args.host, "owner");
  Result<OfiGeometry> g = OfiGeometryFor(size, args.slot_bytes, args.slots, e.receive->slot_bytes(),
                                         static_cast<uint32_t>(e.receive->slots()));
  if (st.ok() && !g.ok()) st = g.status();
  if (!st.ok()) return OfiSendErrorAndFail(session, st.Annotate(what()));
  Result<fi_addr_t> peer = e.fabric->AcquirePeer(args.address, args.instance);
  if (!peer.ok()) return OfiSendErrorAndFail(session, peer.status().Annotate(what()));
  Result<OfiBuffer*> buf = e.receive->Acquire(OfiIdle(options_.idle_ms));
  if (!buf.ok()) {
    e.fabric->ReleasePeer(args.address, args.instance, *peer, false);
    return OfiSendErrorAndFail(session, buf.status().Annotate(what()));
  }
  // Reads still in flight after a failure keep the buffer from reuse
  // (OfiPool), so it needs no rest time.
  OfiLease lease(e.receive.get(), *buf, 0);
  st = OfiSendU64(session, kOfiReadyFrame, 0, OfiIdle(options_.idle_ms));
  if (!st.ok()) {
    e.fabric->ReleasePeer(args.address, args.instance, *peer, false);
    return OfiFailSession(session, st.Annotate(what()));
  }
  OfiActivity active(*e.fabric);
  PullRun run(*e.fabric, session, **buf, *g, *peer, size, sink_fd, options_.idle_ms, stats);
  st = run.Run();
  if (st.ok()) {
    lease.MarkOk();
    e.fabric->ReleasePeer(args.address, args.instance, *peer, false);
    return Status::OK();
  }
  run.Drain();
  e.fabric->ReleasePeer(args.address, args.instance, *peer, run.fabric_suspect());
  st = st.Annotate(what());
  return run.owner_reported() ? OfiFailSession(session, st) : OfiSendErrorAndFail(session, st);
}

}  // namespace dyad
