#include "transport/tcp/tcp_transport.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <vector>

#include "common/backend.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/time.h"
#include "common/wire_queue.h"
#include "proto/protocol.h"

namespace dyad {
namespace {

// Largest pipe we ask for: 1 MiB is the default unprivileged limit
// (/proc/sys/fs/pipe-max-size) and large enough to keep splice efficient.
constexpr size_t kMaxPipeBytes = 1u << 20;
constexpr size_t kMinPipeBytes = 64u << 10;
// Used when options.chunk_size is 0 (a misconfiguration, not a reason to fail).
constexpr size_t kDefaultChunk = 1u << 20;

Deadline IdleDeadline(int64_t idle_ms) {
  return idle_ms > 0 ? Deadline::AfterMs(idle_ms) : Deadline::Never();
}

std::string Progress(uint64_t got, uint64_t size) {
  return "received " + std::to_string(got) + " of " + std::to_string(size) + " bytes";
}

// A failed transfer leaves the session's byte stream out of step with its
// framing, so the session can never be reused. Shutting it down as well
// makes the peer fail at once instead of after its own idle bound.
Status FailSession(Channel& ch, const Status& st) {
  ch.MarkBroken();
  ::shutdown(ch.fd(), SHUT_RDWR);
  return st;
}

bool SpliceUnsupported(int err) {
  return err == EINVAL || err == ENOSYS || err == EOPNOTSUPP || err == ENOTSUP;
}

// Receives exactly `size` bytes from a session into a sink fd. Used by one
// Pull call on one thread.
class StreamReceiver {
 public:
  StreamReceiver(Channel& ch, uint64_t size, int sink_fd, const TransportOptions& options,
                 TransferStats* stats)
      : ch_(ch), size_(size), sink_(sink_fd), options_(options), stats_(stats) {}

  Status Run(bool try_splice) {
    if (try_splice) {
      bool unsupported = false;
      Status st = RunSplice(&unsupported);
      if (!st.ok() || !unsupported) return st;
      DYAD_LOG_DEBUG("tcp pull: splice unavailable, using buffered receive");
    }
    return RunBuffered();
  }

 private:
  // Waits until the socket has data or a hang-up to report; "no progress for
  // idle_ms" becomes DYAD_RC_TIMEOUT.
  Status WaitReadable() {
    // The first bytes follow the fetch reply immediately: spin for them
    // rather than pay a sleeping thread's wake-up (small files are all
    // first bytes).
    if (got_ == 0 && ch_.SpinFor(POLLIN)) return Status::OK();
    const Deadline deadline =
        options_.idle_ms > 0 ? Deadline::AfterMs(options_.idle_ms) : Deadline::Never();
    for (;;) {
      pollfd p{ch_.fd(), POLLIN, 0};
      const int n = ::poll(&p, 1, static_cast<int>(deadline.RemainingMs(1000)));
      if (n > 0) return Status::OK();  // hang-ups and errors surface in the next read
      if (n < 0 && errno != EINTR)
        return StatusFromErrno(errno, "poll (" + Progress(got_, size_) + ")", DYAD_RC_CONNLOST);
      if (n == 0 && deadline.expired())
        return Status(DYAD_RC_TIMEOUT, "no data from peer for " + std::to_string(options_.idle_ms) +
                                           " ms (" + Progress(got_, size_) + ")");
    }
  }

  Status PeerClosed() const {
    return Status(DYAD_RC_CONNLOST, "peer closed the connection (" + Progress(got_, size_) + ")");
  }

  Status SocketError(int err, const char* what) const {
    const dyad_rc_t code = IsConnectionLost(err) ? DYAD_RC_CONNLOST : DYAD_RC_SYSFAIL;
    return StatusFromErrno(err, std::string(what) + " (" + Progress(got_, size_) + ")", code);
  }

  Status SinkError(int err, const char* what) const {
    return StatusFromErrno(err, std::string(what) + " (" + Progress(got_, size_) + ")",
                           DYAD_RC_BADFIO);
  }

  // The bounce buffer is sized on first use and reused: at most
  // options.chunk_size bytes, and no more than the transfer needs.
  void EnsureBuffer() {
    if (!buf_.empty()) return;
    const size_t chunk = options_.chunk_size > 0 ? options_.chunk_size : kDefaultChunk;
    const uint64_t need = std::max<uint64_t>(1, size_ - got_);
    buf_.resize(static_cast<size_t>(std::min<uint64_t>(chunk, need)));
  }

  Status WriteSink(const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(sink_, p, n);
      if (w > 0) {
        p += w;
        n -= static_cast<size_t>(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      // write(2) returning 0 for a non-empty request means no space.
      return SinkError(w < 0 ? errno : ENOSPC, "write to sink");
    }
    return Status::OK();
  }

  Status RunBuffered() {
    EnsureBuffer();
    while (got_ < size_) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(buf_.size(), size_ - got_));
      const ssize_t n = ::recv(ch_.fd(), buf_.data(), want, MSG_DONTWAIT);
      if (n > 0) {
        DYAD_RETURN_IF_ERROR(WriteSink(buf_.data(), static_cast<size_t>(n)));
        got_ += static_cast<uint64_t>(n);
        Count(static_cast<uint64_t>(n));
        continue;
      }
      if (n == 0) return PeerClosed();
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        DYAD_RETURN_IF_ERROR(WaitReadable());
        continue;
      }
      return SocketError(errno, "recv");
    }
    return Status::OK();
  }

  // socket -> pipe -> sink without copying through user space. Sets
  // `*unsupported` (and returns OK with no bytes lost) when splice cannot be
  // used here; the caller then continues with RunBuffered.
  Status RunSplice(bool* unsupported) {
    ScopedNonBlocking nonblocking(ch_.fd());
    int fds[2];
    if (!nonblocking.ok() || ::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      // Without a non-blocking socket splice could wait unbounded; without a
      // pipe (descriptor or pipe quota exhausted) there is nothing to splice
      // into. The buffered path works in both cases.
      *unsupported = true;
      return Status::OK();
    }
    UniqueFd rd(fds[0]);
    UniqueFd wr(fds[1]);
    const size_t cap = SizePipe(wr.get());
    while (got_ < size_) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(cap, size_ - got_));
      const ssize_t n =
          ::splice(ch_.fd(), nullptr, wr.get(), nullptr, want, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n > 0) {
        bool sink_unsupported = false;
        DYAD_RETURN_IF_ERROR(DrainPipe(rd.get(), static_cast<size_t>(n), &sink_unsupported));
        got_ += static_cast<uint64_t>(n);
        Count(static_cast<uint64_t>(n));
        if (sink_unsupported) {
          *unsupported = true;
          return Status::OK();
        }
        continue;
      }
      if (n == 0) return PeerClosed();
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        DYAD_RETURN_IF_ERROR(WaitReadable());
        continue;
      }
      if (SpliceUnsupported(errno)) {
        // Nothing was taken from the socket by the failed call.
        *unsupported = true;
        return Status::OK();
      }
      return SocketError(errno, "splice from socket");
    }
    return Status::OK();
  }

  // Asks for a pipe as large as useful (up to kMaxPipeBytes); a smaller one
  // is fine when the system limit or the per-user pipe quota says no.
  size_t SizePipe(int pipe_fd) const {
    size_t want = kMaxPipeBytes;
    while (want > kMinPipeBytes && want / 2 >= size_ - got_) want /= 2;
    for (; want >= kMinPipeBytes; want /= 2) {
      if (::fcntl(pipe_fd, F_SETPIPE_SZ, static_cast<int>(want)) >= 0) break;
    }
    const int actual = ::fcntl(pipe_fd, F_GETPIPE_SZ);
    return actual > 0 ? static_cast<size_t>(actual) : 4096;
  }

  // Moves `n` bytes that sit in the pipe into the sink. If the sink cannot
  // take spliced data, the bytes are copied out through the buffer instead
  // and `*sink_unsupported` tells the caller to stop splicing.
  Status DrainPipe(int pipe_rd, size_t n, bool* sink_unsupported) {
    while (n > 0) {
      const ssize_t w = ::splice(pipe_rd, nullptr, sink_, nullptr, n, SPLICE_F_MOVE);
      if (w > 0) {
        n -= static_cast<size_t>(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && SpliceUnsupported(errno)) {
        *sink_unsupported = true;
        return DrainPipeBuffered(pipe_rd, n);
      }
      return SinkError(w < 0 ? errno : ENOSPC, "splice to sink");
    }
    return Status::OK();
  }

  Status DrainPipeBuffered(int pipe_rd, size_t n) {
    EnsureBuffer();
    while (n > 0) {
      const ssize_t r = ::read(pipe_rd, buf_.data(), std::min(n, buf_.size()));
      if (r < 0 && errno == EINTR) continue;
      // The bytes are known to be in the pipe, so anything else is a bug
      // or a broken system; report it rather than spin.
      if (r <= 0) return SinkError(r < 0 ? errno : EIO, "read from pipe");
      DYAD_RETURN_IF_ERROR(WriteSink(buf_.data(), static_cast<size_t>(r)));
      n -= static_cast<size_t>(r);
    }
    return Status::OK();
  }

  void Count(uint64_t n) {
    if (stats_ == nullptr) return;
    stats_->bytes += n;
    stats_->chunks += 1;
  }

  Channel& ch_;
  const uint64_t size_;
  const int sink_;
  const TransportOptions& options_;
  TransferStats* const stats_;
  uint64_t got_ = 0;
  std::vector<char> buf_;
};

}  // namespace

TcpTransport::TcpTransport(const TransportOptions& options) : options_(options) {}

size_t TcpTransport::SealedChunk() const {
  const size_t chunk = options_.chunk_size > 0 ? options_.chunk_size : kDefaultChunk;
  return std::min(chunk, kSealedChunkBytes);
}

Status TcpTransport::QueueChunk(Channel& session, const FileSource& src, uint64_t* offset,
                                WireQueue* out) {
  if (*offset >= src.size) return Status::OK();
  if (src.fd < 0) {
    // The FetchReply already promised bytes the requester will wait for.
    return FailSession(
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
  // Integrity only: the tag covers the bytes just read, and the kernel sends
  // them again from the page cache (no copy into the socket); should the
  // file change in between, the requester's check fails.
  const bool by_sendfile = !small && session.protection() == LinkProtection::kIntegrity;
  thread_local std::unique_ptr<char[]> scratch;
  thread_local size_t scratch_len = 0;
  std::string frame;
  char* data;
  if (by_sendfile) {
    if (scratch_len < len) {
      scratch.reset(new char[len]);
      scratch_len = len;
    }
    frame.resize(head + tail);
    data = scratch.get();
  } else {
    frame.resize(head + len + tail);
    data = frame.data() + head;
  }
  if (Status rs = PreadFully(src.fd, data, len, *offset); !rs.ok())
    return FailSession(
        session, rs.Annotate("tcp push of '" + src.path + "' at byte " + std::to_string(*offset)));
  if (sealed) {
    unsigned char* tag = reinterpret_cast<unsigned char*>(frame.data() + frame.size() - tail);
    Status st =
        session.SealFrame(static_cast<uint16_t>(MsgType::kFileData), data, len, frame.data(), tag);
    if (!st.ok()) return FailSession(session, st.Annotate("tcp push of '" + src.path + "'"));
  }
  if (by_sendfile) {
    out->Bytes(frame.substr(0, head));
    out->FileRange(src.fd, *offset, len);
    out->Bytes(frame.substr(head));
  } else {
    out->Bytes(std::move(frame));
  }
  *offset += len;
  return Status::OK();
}

Status TcpTransport::PullSealed(Channel& session, uint64_t size, int sink_fd,
                                TransferStats* stats) {
  // Each chunk is written as it streams in and verified at its end: the
  // socket keeps draining and the bytes are hashed while still in cache.
  // Unverified bytes only ever reach the sink, a temporary the fetcher
  // discards when this fails.
  const size_t buf_len = static_cast<size_t>(std::min<uint64_t>(kSealedReadBytes, size));
  std::unique_ptr<char[]> buf(new char[buf_len]);
  uint64_t got = 0;
  auto write = [&](const char* p, size_t n) -> Status {
    if (Status ws = WriteFully(sink_fd, p, n); !ws.ok())
      return Status(DYAD_RC_BADFIO, "write to sink: " + ws.message());
    return Status::OK();
  };
  while (got < size) {
    size_t len = 0;
    const size_t max_len = static_cast<size_t>(std::min<uint64_t>(kMaxFramePayload, size - got));
    Status st =
        session.RecvFrameStreaming(static_cast<uint16_t>(MsgType::kFileData), &len, max_len,
                                   buf.get(), buf_len, write, IdleDeadline(options_.idle_ms));
    if (!st.ok()) return st.Annotate(Progress(got, size));
    if (len == 0)
      return Status(DYAD_RC_BADUNPACK, "empty file data chunk (" + Progress(got, size) + ")");
    got += len;
    stats->bytes = got;
    ++stats->chunks;
  }
  return Status::OK();
}

Status TcpTransport::Push(Channel& session, const FileSource& src, const std::string& request_args,
                          TransferStats* stats) {
  (void)request_args;
  TransferStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  *stats = TransferStats();
  WireQueue out;
  uint64_t offset = 0;
  while (offset < src.size || !out.empty()) {
    while (offset < src.size && out.Gathering(kGatheredFileBytes)) {
      DYAD_RETURN_IF_ERROR(QueueChunk(session, src, &offset, &out));
      ++stats->chunks;
    }
    // options.idle_ms bounds each wait for room (<= 0: no bound).
    Result<WireQueue::Pumped> p = out.Pump(session, options_.idle_ms > 0 ? options_.idle_ms : 1000);
    Status st = p.status();
    if (st.ok() && *p == WireQueue::Pumped::kStalled && options_.idle_ms > 0)
      st = Status(DYAD_RC_TIMEOUT,
                  "peer made no progress for " + std::to_string(options_.idle_ms) + " ms");
    stats->bytes = std::min<uint64_t>(out.sent(), src.size);
    if (!st.ok())
      return FailSession(session, st.Annotate("tcp push of '" + src.path + "' (sent " +
                                              std::to_string(out.sent()) + " bytes of " +
                                              std::to_string(src.size) + ")"));
  }
  stats->bytes = src.size;
  return Status::OK();
}

Status TcpTransport::Pull(Channel& session, uint64_t size, const std::string& reply_args,
                          int sink_fd, TransferStats* stats) {
  TransferStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  *stats = TransferStats();
  if (size == 0) return Status::OK();
  if (sink_fd < 0)
    return FailSession(session, Status(DYAD_RC_BADFIO, "tcp pull: no sink file descriptor"));
  if (session.protection() != LinkProtection::kNone) {
    Status st = PullSealed(session, size, sink_fd, stats);
    if (!st.ok()) return FailSession(session, st.Annotate("tcp pull"));
    return Status::OK();
  }
  StreamReceiver receiver(session, size, sink_fd, options_, stats);
  Status st = receiver.Run(/*try_splice=*/size > kSpliceThreshold);
  if (!st.ok()) return FailSession(session, st.Annotate("tcp pull"));
  return Status::OK();
}

DYAD_DEFINE_TRANSPORT_FACTORY(tcp, TcpTransport)

}  // namespace dyad
