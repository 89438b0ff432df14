// The owner's side of an "ofi" transfer (see ofi_transport.h): fill
// registered slots from the file, announce them, let the requester read.
#include <algorithm>

#include "common/fsutil.h"
#include "common/log.h"
#include "transport/ofi/ofi_engine.h"
#include "transport/ofi/ofi_fabric.h"
#include "transport/ofi/ofi_pool.h"
#include "transport/ofi/ofi_transport.h"
#include "transport/ofi/ofi_wire.h"

namespace dyad {

Status OfiTransport::Push(Channel& session, const FileSource& src, const std::string& request_args,
                          TransferStats* stats) {
  TransferStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  *stats = TransferStats();
  if (src.size <= kOfiInlineMaxBytes) {
    // Already sent inside the FetchReply (ReplyArgs).
    stats->bytes = src.size;
    stats->chunks = src.size > 0 ? 1 : 0;
    return Status::OK();
  }
  const std::string what = "ofi push of '" + src.path + "'";
  auto progress = [&] {
    return what + " (sent " + std::to_string(stats->bytes) + " of " + std::to_string(src.size) +
           " bytes)";
  };
  // The requester waits for chunks the FetchReply promised, so every
  // failure is reported to it.
  OfiRequestArgs req;
  Status st = req.Decode(request_args);
  Result<Engine*> e = st.ok() ? Start() : Result<Engine*>(st);
  if (e.ok()) st = CheckPeer(**e, req.provider, req.host, "requester");
  if (!e.ok() || !st.ok())
    return OfiSendErrorAndFail(session, (e.ok() ? st : e.status()).Annotate(what));
  if (src.fd < 0)
    return OfiSendErrorAndFail(session, Status(DYAD_RC_BADFIO, what + ": no open file descriptor"));
  Engine& engine = **e;
  Result<OfiGeometry> g =
      OfiGeometryFor(src.size, engine.send->slot_bytes(),
                     static_cast<uint32_t>(engine.send->slots()), req.slot_bytes, req.slots);
  if (!g.ok()) return OfiSendErrorAndFail(session, g.status().Annotate(what));
  // Only a requester that holds its receive buffer gets a send buffer, so
  // transfers waiting for buffers can never wait on each other in a circle.
  st = OfiExpectU64(session, kOfiReadyFrame, 0, "requester", OfiIdle(options_.idle_ms));
  if (!st.ok()) return OfiSendErrorAndFail(session, st.Annotate(what));
  Result<OfiBuffer*> buf = engine.send->Acquire(OfiIdle(options_.idle_ms));
  if (!buf.ok()) return OfiSendErrorAndFail(session, buf.status().Annotate(what));
  // After a failure the requester may still read a slot it was told
  // about: the buffer rests until its reads have surely stopped.
  OfiLease lease(engine.send.get(), *buf, 2 * std::max<int64_t>(options_.idle_ms, 1000));
  {
    OfiActivity active(*engine.fabric);
    st = PushChunks(session, src, **buf, *g, stats);
  }
  if (!st.ok()) return OfiSendErrorAndFail(session, st.Annotate(progress()));
  lease.MarkOk();
  return Status::OK();
}

// Chunk i goes to slot i % window once the requester returned the slot
// (kCredit {i - window}); the transfer ends with the requester's kDone.
Status OfiTransport::PushChunks(Channel& session, const FileSource& src, OfiBuffer& buf,
                                const OfiGeometry& g, TransferStats* stats) const {
  const uint64_t key = buf.region->registration().key;
  for (uint64_t i = 0; i < g.chunks; ++i) {
    if (i >= g.window)
      DYAD_RETURN_IF_ERROR(OfiExpectU64(session, kOfiCreditFrame, i - g.window, "requester",
                                        OfiIdle(options_.idle_ms)));
    const uint64_t slot = i % g.window;
    OfiChunk c;
    c.index = i;
    c.length = std::min(g.chunk, src.size - i * g.chunk);
    c.remote_addr = buf.region->registration().remote_base + slot * buf.slot_bytes;
    c.key = key;
    DYAD_RETURN_IF_ERROR(PreadFully(src.fd, buf.base + slot * buf.slot_bytes,
                                    static_cast<size_t>(c.length), i * g.chunk));
    DYAD_RETURN_IF_ERROR(session.SendFrame(kOfiChunkFrame, c.Encode(), OfiIdle(options_.idle_ms)));
    stats->bytes += c.length;
    stats->chunks += 1;
  }
  return OfiExpectU64(session, kOfiDoneFrame, g.chunks, "requester", OfiIdle(options_.idle_ms));
}

}  // namespace dyad
