#include "transport/tcp/tcp_transport.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <vector>

#include "common/backend.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/wire_queue.h"
#include "proto/protocol.h"
#include "transport/tcp/tcp_receive.h"

namespace dyad {
namespace {

// Used when options.chunk_size is 0 (a misconfiguration, not a reason to fail).
constexpr size_t kDefaultChunk = 1u << 20;

}  // namespace

TcpTransport::TcpTransport(const TransportOptions& options) : Transport(options) {}

size_t TcpTransport::SealedChunk() const {
  const size_t chunk = options_.chunk_size > 0 ? options_.chunk_size : kDefaultChunk;
  return std::min(chunk, kSealedChunkBytes);
}

Status TcpTransport::QueueChunk(Channel& session, const FileSource& src, uint64_t* offset,
                                WireQueue* out) {
  if (*offset >= src.size) return Status::OK();
  if (src.fd < 0) {
    // The FetchReply already promised bytes the requester will wait for.
    return BreakSession(
        session, Status(DYAD_RC_BADFIO, "tcp push of '" + src.path + "': no open file descriptor"));
  }
  const bool sealed = session.protection() != LinkProtection::kNone;
  const bool small = src.size <= kGatheredFileBytes;
  if (!sealed && !small) {
    // Sent in slices of chunk_size so stats count pipeline chunks; each
    // slice is one zero-copy sendfile loop.
    const uint64_t slice = options_.chunk_size > 0 ? options_.chunk_size : kDefaultChunk;
    const uint64_t len = std::min(slice, src.size - *offset);
    out->FileRange(src.fd, *offset, len);
    *offset += len;
    return Status::OK();
  }
  // A small file is one piece of memory (one frame when sealed) that the
  // file server gathers with its reply and verdict (backend.h); a large one
  // goes in sealed frames of at most SealedChunk() bytes.
  const size_t len =
      static_cast<size_t>(small ? src.size : std::min<uint64_t>(SealedChunk(), src.size - *offset));
  const size_t head = sealed ? kFrameHeaderSize : 0;
  const size_t tail = sealed ? kSealTagSize : 0;
  // The bytes sent are the bytes sealed, read once: a file rewritten on
  // its owner while it is sent reaches the requester intact as records, and
  // the owner's verdict names the change (FileServer), instead of failing
  // the requester's integrity check as if the link had altered it.
  std::string frame(head + len + tail, '\0');
  char* data = frame.data() + head;
  if (Status rs = PreadFully(src.fd, data, len, *offset); !rs.ok())
    return BreakSession(
        session, rs.Annotate("tcp push of '" + src.path + "' at byte " + std::to_string(*offset)));
  if (sealed) {
    unsigned char* tag = reinterpret_cast<unsigned char*>(frame.data() + frame.size() - tail);
    Status st =
        session.SealFrame(static_cast<uint16_t>(MsgType::kFileData), data, len, frame.data(), tag);
    if (!st.ok()) return BreakSession(session, st.Annotate("tcp push of '" + src.path + "'"));
  }
  out->Bytes(std::move(frame));
  *offset += len;
  return Status::OK();
}

Task<Status> TcpTransport::Pull(Channel& session, uint64_t size, const std::string& reply_args,
                                int sink_fd, TransferStats* stats, TransferWaits& waits) {
  (void)reply_args;
  *stats = TransferStats();
  if (size == 0) co_return Status::OK();
  if (sink_fd < 0)
    co_return BreakSession(session, Status(DYAD_RC_BADFIO, "tcp pull: no sink file descriptor"));
  if (session.protection() != LinkProtection::kNone)
    co_return co_await tcp_internal::PullSealed(session, size, sink_fd, options_, stats, waits,
                                                kSealedReadBytes);
  co_return co_await tcp_internal::PullStream(session, size, sink_fd, options_, stats, waits);
}

DYAD_DEFINE_TRANSPORT_FACTORY(tcp, TcpTransport)

}  // namespace dyad
