// The owner's side of an "ofi" transfer (see ofi_transport.h) as one
// coroutine, OfiTransport::Push: wait for the requester's kReady, take a
// send buffer, then fill registered slots from the file and announce them
// (kChunk) as the requester's credits allow, until its kDone. Between
// looks at the requester's frames the session holds it waits for the
// session or its wake fd (ofi_transfer.h), which the send pool signals
// when a buffer comes free; the requester's reads need no wake-up here
// (the fabric's progress thread serves them).
#include <algorithm>
#include <memory>
#include <utility>

#include "common/fsutil.h"
#include "common/log.h"
#include "transport/ofi/ofi_engine.h"
#include "transport/ofi/ofi_transfer.h"
#include "transport/ofi/ofi_wire.h"

namespace dyad {
namespace {

// One RMA push's state. Its send buffer goes back in End, which the
// destructor calls if the coroutine never got there (its frame destroyed
// while it waited, e.g. when the runtime shut down).
struct RmaPush final : OfiTransfer {
  RmaPush(Channel& session, TransferWaits& waits, int64_t idle_ms, TransferStats* stats,
          const FileSource& src, std::shared_ptr<OfiFabric> fabric, OfiPool* pool, OfiGeometry g)
      : OfiTransfer(session, waits, idle_ms, stats, "the requester made no progress"),
        src(src),
        fabric(std::move(fabric)),
        pool(pool),
        g(g) {}
  ~RmaPush() {
    if (!ended) (void)End(Status(DYAD_RC_CANCELLED, "ofi push abandoned"));
  }

  Status TakeBuffer(bool* got);
  Status Announce();
  Status OnFrame(uint16_t type);
  Status End(const Status& st);

  const FileSource& src;
  const std::shared_ptr<OfiFabric> fabric;
  OfiPool* const pool;
  const OfiGeometry g;
  OfiBuffer* buf = nullptr;
  std::unique_ptr<OfiActivity> active;
  uint64_t next = 0;     // chunks announced
  uint64_t credits = 0;  // slots the requester gave back
  bool done = false;     // every chunk landed
  bool ended = false;
};

// Only a requester that holds its receive buffer gets a send buffer, so
// transfers waiting for buffers can never wait on each other in a circle.
Status RmaPush::TakeBuffer(bool* got) {
  Result<OfiBuffer*> b = pool->TryAcquire(wake_fd());
  if (!b.ok() || *b == nullptr) return b.status();
  buf = *b;
  active = std::make_unique<OfiActivity>(*fabric);
  *got = true;
  return Status::OK();
}

// Chunk i goes to slot i % window once the requester returned the slot
// (kCredit {i - window}).
Status RmaPush::Announce() {
  const uint64_t key = buf->region->registration().key;
  while (next < g.chunks && (next < g.window || next - g.window < credits)) {
    const uint64_t slot = next % g.window;
    OfiChunk c;
    c.index = next;
    c.length = std::min(g.chunk, src.size - next * g.chunk);
    c.remote_addr = buf->region->registration().remote_base + slot * buf->slot_bytes;
    c.key = key;
    DYAD_RETURN_IF_ERROR(PreadFully(src.fd, buf->base + slot * buf->slot_bytes,
                                    static_cast<size_t>(c.length), next * g.chunk));
    DYAD_RETURN_IF_ERROR(session_.SendFrame(kOfiChunkFrame, c.Encode(), IdleDeadline(idle_ms_)));
    stats_->bytes += c.length;
    stats_->chunks += 1;
    ++next;
  }
  return Status::OK();
}

// The requester sends, in order, a credit for each slot a later chunk
// needs, then kDone with the chunk count.
Status RmaPush::OnFrame(uint16_t type) {
  if (credits + g.window < g.chunks) {
    DYAD_RETURN_IF_ERROR(OfiCheckU64(type, payload(), kOfiCreditFrame, credits, "requester"));
    if (credits >= next)
      return Status(DYAD_RC_BADUNPACK, "the requester gave back the slot of chunk " +
                                           std::to_string(credits) + " before it was announced");
    ++credits;
    return Status::OK();
  }
  DYAD_RETURN_IF_ERROR(OfiCheckU64(type, payload(), kOfiDoneFrame, g.chunks, "requester"));
  if (next < g.chunks)
    return Status(DYAD_RC_BADUNPACK, "the requester said done after " + std::to_string(next) +
                                         " of " + std::to_string(g.chunks) + " chunks");
  done = true;
  return Status::OK();
}

// Gives the buffer back (once); a failure is told to the requester and
// breaks the session.
Status RmaPush::End(const Status& st) {
  ended = true;
  pool->CancelNotify(wake_fd());
  active.reset();
  if (buf != nullptr) {
    // After a failure the requester may still read a slot it was told
    // about: the buffer rests until its reads have surely stopped.
    pool->Release(buf, st.ok() ? 0 : 2 * std::max<int64_t>(idle_ms_, 1000));
    buf = nullptr;
  }
  if (st.ok()) return st;
  return TellAndBreakSession(
      session_, kOfiErrorFrame,
      st.Annotate("ofi push of '" + src.path + "' (sent " + std::to_string(stats_->bytes) + " of " +
                  std::to_string(src.size) + " bytes)"));
}

}  // namespace

Task<Status> OfiTransport::Push(Channel& session, const FileSource& src,
                                const std::string& request_args, TransferStats* stats,
                                TransferWaits& waits) {
  *stats = TransferStats();
  // Already sent inside the FetchReply (ReplyArgs).
  if (src.size <= kOfiInlineMaxBytes) {
    stats->bytes = src.size;
    stats->chunks = src.size > 0 ? 1 : 0;
    co_return Status::OK();
  }
  // A check that fails before the transfer began is told to the requester,
  // which waits for the chunks the reply promised.
  const std::string what = "ofi push of '" + src.path + "'";
  OfiRequestArgs req;
  Status st = req.Decode(request_args);
  Result<Engine*> e = st.ok() ? Start() : Result<Engine*>(st);
  if (e.ok()) st = CheckPeer(**e, req.provider, req.host, "requester");
  if (!e.ok() || !st.ok())
    co_return TellAndBreakSession(session, kOfiErrorFrame,
                                  (e.ok() ? st : e.status()).Annotate(what));
  if (src.fd < 0)
    co_return TellAndBreakSession(session, kOfiErrorFrame,
                                  Status(DYAD_RC_BADFIO, what + ": no open file descriptor"));
  Engine& engine = **e;
  Result<OfiGeometry> g =
      OfiGeometryFor(src.size, engine.send->slot_bytes(),
                     static_cast<uint32_t>(engine.send->slots()), req.slot_bytes, req.slots);
  if (!g.ok()) co_return TellAndBreakSession(session, kOfiErrorFrame, g.status().Annotate(what));

  RmaPush p(session, waits, options_.idle_ms, stats, src, engine.fabric, engine.send.get(), *g);
  if (!p.wake_error().ok()) co_return p.End(p.wake_error());
  // The requester's kReady: it holds its receive buffer.
  for (;;) {
    uint16_t type = 0;
    Result<bool> r = p.NextFrame(&type);
    if (!r.ok()) co_return p.End(r.status());
    if (*r) {
      if (st = OfiCheckU64(type, p.payload(), kOfiReadyFrame, 0, "requester"); !st.ok())
        co_return p.End(st);
      break;
    }
    if (st = co_await p.WaitForPeer(); !st.ok()) co_return p.End(st);
  }
  for (bool got = false; !got;) {
    if (st = p.TakeBuffer(&got); !st.ok()) co_return p.End(st);
    if (!got && !(st = co_await p.WaitForPeer()).ok()) co_return p.End(st);
  }
  // Announce what the credits allow, take the requester's next frame.
  for (;;) {
    if (st = p.Announce(); !st.ok()) co_return p.End(st);
    if (p.done) co_return p.End(Status::OK());
    uint16_t type = 0;
    Result<bool> r = p.NextFrame(&type);
    if (!r.ok()) co_return p.End(r.status());
    if (*r) {
      if (st = p.OnFrame(type); !st.ok()) co_return p.End(st);
    } else if (st = co_await p.WaitForPeer(); !st.ok()) {
      co_return p.End(st);
    }
  }
}

}  // namespace dyad
