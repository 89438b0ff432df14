// transport.cc: what every transport shares: the push of transports that
// frame the file on the session, the runs of Pull and Push for callers
// outside a runtime, and how a failed transfer ends its session.
#include "transport/transport.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "common/time.h"
#include "common/wire.h"

namespace dyad {

Deadline IdleDeadline(int64_t idle_ms) {
  return idle_ms > 0 ? Deadline::AfterMs(idle_ms) : Deadline::Never();
}

Status BreakSession(Channel& session, const Status& st) {
  session.MarkBroken();
  ::shutdown(session.fd(), SHUT_RDWR);
  return st;
}

Status TellAndBreakSession(Channel& session, uint16_t error_frame, const Status& st) {
  Encoder e;
  e.I32(static_cast<int32_t>(st.code())).Str(st.message());
  (void)session.SendFrame(error_frame, e.data(), Deadline::AfterMs(100));
  return BreakSession(session, st);
}

// Sends the chunks QueueChunk makes as the requester takes them.
Task<Status> Transport::Push(Channel& session, const FileSource& src,
                             const std::string& request_args, TransferStats* stats,
                             TransferWaits& waits) {
  (void)request_args;
  *stats = TransferStats();
  if (!queues_chunks())
    co_return Status(DYAD_RC_NOTSUP, name() + " does not frame files on the session");
  IdleBound idle(options_.idle_ms);
  WireQueue out;
  uint64_t offset = 0;
  while (offset < src.size || !out.empty()) {
    while (offset < src.size && out.Gathering(kGatheredFileBytes)) {
      if (Status st = QueueChunk(session, src, &offset, &out); !st.ok()) co_return st;
      ++stats->chunks;
    }
    Result<WireQueue::Pumped> p = out.Pump(session);
    Status st = p.status();
    stats->bytes = std::min<uint64_t>(out.sent(), src.size);
    idle.Saw(out.sent());
    if (st.ok() && *p != WireQueue::Pumped::kAllSent)
      st = co_await waits.ForRoom(session, idle, "the requester took no bytes");
    if (!st.ok())
      co_return BreakSession(session, st.Annotate(name() + " push of '" + src.path + "' (sent " +
                                                  std::to_string(out.sent()) + " bytes of " +
                                                  std::to_string(src.size) + ")"));
  }
  stats->bytes = src.size;
  co_return Status::OK();
}

Status Transport::PullNow(Channel& session, uint64_t size, const std::string& reply_args,
                          int sink_fd, TransferStats* stats) {
  TransferStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  return RunTransfer(session, [&](TransferWaits& waits) {
    return Pull(session, size, reply_args, sink_fd, stats, waits);
  });
}

Status Transport::PushNow(Channel& session, const FileSource& src, const std::string& request_args,
                          TransferStats* stats) {
  TransferStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  return RunTransfer(session, [&](TransferWaits& waits) {
    return Push(session, src, request_args, stats, waits);
  });
}

}  // namespace dyad
