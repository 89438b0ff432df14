// The requester's side of an "ofi" transfer (see ofi_transport.h) as one
// coroutine, OfiTransport::Pull: take a receive buffer and say so (kReady),
// then read each announced chunk from the owner's registered memory into
// our own, write completed chunks out in order and return their slots
// (kCredit), and end with kDone. Between looks at what is there (the
// announcements the session holds, the reads that completed) it waits for
// the session or its wake fd (ofi_transfer.h), which our reads'
// completions, the receive pool (a buffer came free) and the fabric (a
// read it refused as busy is worth retrying) signal.
#include <rdma/fi_errno.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <utility>

#include "common/fsutil.h"
#include "common/log.h"
#include "transport/ofi/ofi_engine.h"
#include "transport/ofi/ofi_transfer.h"
#include "transport/ofi/ofi_wire.h"

namespace dyad {
namespace {

// One RMA pull's state. Whatever it holds (the buffer, its wake fd's
// registrations, the peer's address-vector entry) goes back in End, which
// the destructor calls if the coroutine never got there (its frame
// destroyed while it waited, e.g. when the runtime shut down).
struct RmaPull final : OfiTransfer {
  RmaPull(Channel& session, TransferWaits& waits, int64_t idle_ms, TransferStats* stats,
          std::shared_ptr<OfiFabric> fabric, OfiPool* pool, OfiGeometry g, std::string address,
          uint64_t instance, fi_addr_t peer, uint64_t size, int sink_fd)
      : OfiTransfer(session, waits, idle_ms, stats, "no data from the owner"),
        fabric(std::move(fabric)),
        pool(pool),
        g(g),
        address(std::move(address)),
        instance(instance),
        peer(peer),
        size(size),
        sink_fd(sink_fd) {}
  ~RmaPull() {
    if (!ended) (void)End(Status(DYAD_RC_CANCELLED, "ofi pull abandoned"));
  }

  Status TakeBuffer(bool* got);
  Status Move();
  Status ReadFrames();
  Status PostReads();
  Status WriteCompleted();
  Status End(const Status& st);
  uint64_t Length(uint64_t i) const { return std::min(g.chunk, size - i * g.chunk); }
  char* Slot(uint64_t i) const { return buf->base + (i % g.window) * buf->slot_bytes; }

  const std::shared_ptr<OfiFabric> fabric;
  OfiPool* const pool;
  const OfiGeometry g;
  const std::string address;  // the owner's endpoint, held in the AV
  const uint64_t instance;
  const fi_addr_t peer;
  const uint64_t size;
  const int sink_fd;

  OfiBuffer* buf = nullptr;
  std::unique_ptr<OfiActivity> active;
  std::deque<OfiChunk> announced;  // received, read not started yet
  uint64_t received = 0;           // announcements received
  uint64_t posted = 0;             // reads started
  uint64_t written = 0;            // chunks written to the sink
  bool owner_reported = false;
  bool local_error = false;
  bool busy = false;  // the provider refused the next read as busy (EAGAIN)
  std::chrono::steady_clock::time_point busy_since;
  bool ended = false;
};

// The owner waits for kReady, which says we hold our receive buffer.
Status RmaPull::TakeBuffer(bool* got) {
  Result<OfiBuffer*> b = pool->TryAcquire(wake_fd());
  if (!b.ok() || *b == nullptr) return b.status();
  buf = *b;
  buf->SetNotify(wake_fd());
  active = std::make_unique<OfiActivity>(*fabric);
  *got = true;
  return OfiSendU64(session_, kOfiReadyFrame, 0, IdleDeadline(idle_ms_));
}

// Does all that can be done now: writes what completed, takes the
// announcements, starts their reads, until a round changes nothing.
Status RmaPull::Move() {
  for (;;) {
    const uint64_t before = received + posted + written;
    DYAD_RETURN_IF_ERROR(WriteCompleted());
    DYAD_RETURN_IF_ERROR(ReadFrames());
    DYAD_RETURN_IF_ERROR(PostReads());
    if (received + posted + written == before) return Status::OK();
  }
}

// Takes every announcement the session holds now (at most a window ahead
// of what was written, so the queue stays small).
Status RmaPull::ReadFrames() {
  for (;;) {
    uint16_t type = 0;
    Result<bool> r = NextFrame(&type);
    if (!r.ok() || !*r) return r.status();
    if (type == kOfiErrorFrame) {
      owner_reported = true;
      return OfiDecodeError(payload(), "owner");
    }
    OfiChunk c;
    if (type != kOfiChunkFrame || !c.Decode(payload()))
      return Status(DYAD_RC_BADUNPACK, "unexpected frame from the owner during the transfer");
    if (c.index != received || c.index >= g.chunks || c.index >= written + g.window ||
        c.length != Length(c.index))
      return Status(DYAD_RC_BADUNPACK, "the owner announced chunk " + std::to_string(c.index) +
                                           " (" + std::to_string(c.length) + " bytes) out of turn");
    announced.push_back(c);
    ++received;
  }
}

// Starts the reads of announced chunks until the provider is busy (it
// signals the wake fd when a retry is worth it).
Status RmaPull::PostReads() {
  while (!announced.empty()) {
    const OfiChunk& c = announced.front();
    OfiOp& op = buf->ops[c.index % g.window];
    buf->in_flight.fetch_add(1, std::memory_order_acq_rel);
    Result<bool> posted_now =
        fabric->TryRead(&op, Slot(c.index), static_cast<size_t>(c.length),
                        buf->region->registration().desc, peer, c.remote_addr, c.key, wake_fd());
    if (!posted_now.ok() || !*posted_now) buf->in_flight.fetch_sub(1, std::memory_order_acq_rel);
    if (!posted_now.ok())
      return posted_now.status().Annotate("reading chunk " + std::to_string(c.index));
    if (!*posted_now) {
      if (!busy) busy_since = std::chrono::steady_clock::now();
      busy = true;
      return Status::OK();
    }
    busy = false;
    announced.pop_front();
    ++posted;
  }
  return Status::OK();
}

// Writes out, in order, every chunk whose read completed, and hands its
// slot back to the owner when a later chunk will use it.
Status RmaPull::WriteCompleted() {
  while (written < posted) {
    OfiOp& op = buf->ops[written % g.window];
    if (op.state.load(std::memory_order_acquire) != OfiOp::kDone) break;
    op.state.store(OfiOp::kIdle, std::memory_order_relaxed);
    if (op.err != 0)
      return Status(OfiFabricErrorCode(op.err), "reading chunk " + std::to_string(written) +
                                                    " from the owner: " + fi_strerror(op.err) +
                                                    " (provider error " +
                                                    std::to_string(op.prov_err) + ")");
    const uint64_t len = Length(written);
    Status ws = WriteFully(sink_fd, Slot(written), static_cast<size_t>(len));
    if (!ws.ok()) {
      local_error = true;
      return Status(DYAD_RC_BADFIO, ws.message());
    }
    stats_->bytes += len;
    stats_->chunks += 1;
    if (written + g.window < g.chunks)
      DYAD_RETURN_IF_ERROR(OfiSendU64(session_, kOfiCreditFrame, written, IdleDeadline(idle_ms_)));
    ++written;
  }
  return Status::OK();
}

// Gives back what the transfer holds (once). Reads still in flight after
// a failure keep the buffer from reuse (OfiPool) without anyone waiting
// for them; their completions no longer signal our wake fd. A failure is
// told to the owner (unless it told us) and breaks the session.
Status RmaPull::End(const Status& st) {
  ended = true;
  pool->CancelNotify(wake_fd());
  fabric->CancelBusyNotify(wake_fd());
  active.reset();
  if (buf != nullptr) pool->Release(buf, 0);
  buf = nullptr;
  // A failure that may be the fabric's (a failed read, a lost or silent
  // peer) drops the owner's address-vector entry.
  const bool suspect = !st.ok() && !owner_reported && !local_error;
  fabric->ReleasePeer(address, instance, peer, suspect);
  if (st.ok()) return st;
  Status result = st;
  // A read the provider kept refusing (shm does so for an address outside
  // the owner's memory): say which, or the failure looks like a silent owner.
  if (busy && !announced.empty()) {
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::steady_clock::now() - busy_since)
                        .count();
    result =
        result.Annotate("reading chunk " + std::to_string(announced.front().index) +
                        ": fi_read refused as busy (EAGAIN) for " + std::to_string(ms) + " ms");
  }
  result = result.Annotate("ofi pull (received " + std::to_string(stats_->bytes) + " of " +
                           std::to_string(size) + " bytes)");
  return owner_reported ? BreakSession(session_, result)
                        : TellAndBreakSession(session_, kOfiErrorFrame, result);
}

}  // namespace

Task<Status> OfiTransport::Pull(Channel& session, uint64_t size, const std::string& reply_args,
                                int sink_fd, TransferStats* stats, TransferWaits& waits) {
  *stats = TransferStats();
  if (size == 0) co_return Status::OK();
  OfiReplyArgs args;
  Status st = args.Decode(reply_args);
  if (st.ok() && sink_fd < 0) st = Status(DYAD_RC_BADFIO, "no sink file");
  // The owner waits for kReady: tell it.
  if (!st.ok()) co_return TellAndBreakSession(session, kOfiErrorFrame, st.Annotate("ofi pull"));
  if (args.inline_data) {
    // Small files need no fabric: the data came in the reply, and the
    // owner sends nothing more and waits for nothing.
    if (args.data.size() != size)
      co_return BreakSession(
          session, Status(DYAD_RC_BADUNPACK, "ofi pull: the reply carries " +
                                                 std::to_string(args.data.size()) +
                                                 " bytes inline, not " + std::to_string(size)));
    st = WriteFully(sink_fd, args.data.data(), args.data.size());
    if (!st.ok()) co_return BreakSession(session, st.Annotate("ofi pull"));
    stats->bytes = size;
    stats->chunks = 1;
    co_return Status::OK();
  }

  const std::string what = "ofi pull (received 0 of " + std::to_string(size) + " bytes)";
  Result<Engine*> e = Start();
  if (!e.ok()) co_return TellAndBreakSession(session, kOfiErrorFrame, e.status().Annotate(what));
  Engine& engine = **e;
  st = CheckPeer(engine, args.provider, args.host, "owner");
  Result<OfiGeometry> g =
      OfiGeometryFor(size, args.slot_bytes, args.slots, engine.receive->slot_bytes(),
                     static_cast<uint32_t>(engine.receive->slots()));
  if (st.ok() && !g.ok()) st = g.status();
  if (!st.ok()) co_return TellAndBreakSession(session, kOfiErrorFrame, st.Annotate(what));
  Result<fi_addr_t> peer = engine.fabric->AcquirePeer(args.address, args.instance);
  if (!peer.ok())
    co_return TellAndBreakSession(session, kOfiErrorFrame, peer.status().Annotate(what));

  RmaPull p(session, waits, options_.idle_ms, stats, engine.fabric, engine.receive.get(), *g,
            std::move(args.address), args.instance, *peer, size, sink_fd);
  if (!p.wake_error().ok()) co_return p.End(p.wake_error());
  for (bool got = false; !got;) {
    if (st = p.TakeBuffer(&got); !st.ok()) co_return p.End(st);
    if (!got && !(st = co_await p.WaitForPeer()).ok()) co_return p.End(st);
  }
  for (;;) {
    if (st = p.Move(); !st.ok()) co_return p.End(st);
    if (p.written == g->chunks) break;
    if (st = co_await p.WaitForPeer(); !st.ok()) co_return p.End(st);
  }
  st = OfiSendU64(session, kOfiDoneFrame, g->chunks, IdleDeadline(options_.idle_ms));
  co_return p.End(st);
}

}  // namespace dyad
