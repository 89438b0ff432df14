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

bool ConnectionError(int err) {
  return err == ECONNRESET || err == EPIPE || err == ENOTCONN || err == ECONNABORTED ||
         err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETRESET;
}

// sendfile(2) on a socket whose peer is gone raises SIGPIPE, and unlike
// send() it has no MSG_NOSIGNAL. A library must not rely on the process
// ignoring SIGPIPE, so Push blocks it on the calling thread and consumes any
// SIGPIPE it caused before restoring the mask (the error still arrives as
// EPIPE).
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock() {
    sigemptyset(&pipe_set_);
    sigaddset(&pipe_set_, SIGPIPE);
    sigset_t pending;
    sigemptyset(&pending);
    was_pending_ = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
    sigemptyset(&old_mask_);
    pthread_sigmask(SIG_BLOCK, &pipe_set_, &old_mask_);
  }
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;
  ~ScopedSigpipeBlock() {
    if (!was_pending_) {
      sigset_t pending;
      sigemptyset(&pending);
      if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        while (sigtimedwait(&pipe_set_, nullptr, &zero) < 0 && errno == EINTR) {
        }
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }

 private:
  sigset_t pipe_set_;
  sigset_t old_mask_;
  bool was_pending_ = false;
};

// splice(2) from a TCP socket ignores SPLICE_F_NONBLOCK and blocks (with no
// bound) until data arrives when the socket itself is blocking, as session
// sockets are. While splicing, the socket is switched to O_NONBLOCK so every
// wait happens in our bounded poll; the Channel's own calls work either way
// (they pass MSG_DONTWAIT), and the previous flags are restored on exit.
class ScopedNonBlocking {
 public:
  explicit ScopedNonBlocking(int fd) : fd_(fd), old_flags_(::fcntl(fd, F_GETFL)) {
    ok_ = old_flags_ >= 0 &&
          ((old_flags_ & O_NONBLOCK) != 0 || ::fcntl(fd, F_SETFL, old_flags_ | O_NONBLOCK) == 0);
  }
  ScopedNonBlocking(const ScopedNonBlocking&) = delete;
  ScopedNonBlocking& operator=(const ScopedNonBlocking&) = delete;
  ~ScopedNonBlocking() {
    if (ok_ && (old_flags_ & O_NONBLOCK) == 0) ::fcntl(fd_, F_SETFL, old_flags_);
  }
  bool ok() const { return ok_; }

 private:
  const int fd_;
  const int old_flags_;
  bool ok_ = false;
};

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
    const dyad_rc_t code = ConnectionError(err) ? DYAD_RC_CONNLOST : DYAD_RC_SYSFAIL;
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

Status TcpTransport::PushSealed(Channel& session, const FileSource& src, TransferStats* stats) {
  std::unique_ptr<char[]> buf(
      new char[static_cast<size_t>(std::min<uint64_t>(SealedChunk(), src.size))]);
  uint64_t offset = 0;
  while (offset < src.size) {
    const size_t len = static_cast<size_t>(std::min<uint64_t>(SealedChunk(), src.size - offset));
    size_t have = 0;
    while (have < len) {
      const ssize_t n =
          ::pread(src.fd, buf.get() + have, len - have, static_cast<off_t>(offset + have));
      if (n > 0) {
        have += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      const Status st = n == 0 ? Status(DYAD_RC_BADFIO, "file shrank while being sent")
                               : StatusFromErrno(errno, "read", DYAD_RC_BADFIO);
      return FailSession(session, st.Annotate("tcp push of '" + src.path + "' at byte " +
                                              std::to_string(offset + have)));
    }
    // Integrity only: the bytes just read are what the tag covers, and the
    // kernel sends them from the page cache (no copy into the socket).
    // Encrypted: sealed in place and sent from the buffer.
    Status st =
        session.protection() == LinkProtection::kIntegrity
            ? session.SendSealedFileRange(static_cast<uint16_t>(MsgType::kFileData), src.fd, offset,
                                          buf.get(), len, std::max<int64_t>(0, options_.idle_ms))
            : session.SendFrameInPlace(static_cast<uint16_t>(MsgType::kFileData), buf.get(), len,
                                       IdleDeadline(options_.idle_ms));
    if (!st.ok()) {
      return FailSession(
          session, st.Annotate("tcp push of '" + src.path + "' (sent " + std::to_string(offset) +
                               " of " + std::to_string(src.size) + " bytes)"));
    }
    offset += len;
    stats->bytes = offset;
    ++stats->chunks;
  }
  return Status::OK();
}

Status TcpTransport::PushFromMemory(Channel& session, const FileSource& src, TransferStats* stats) {
  // One frame (sealed sessions) or the bare bytes, through ordinary sends
  // the file server may gather with its reply and verdict (backend.h).
  const size_t len = static_cast<size_t>(src.size);
  std::unique_ptr<char[]> buf(new char[len]);
  if (Status rs = PreadFully(src.fd, buf.get(), len, 0); !rs.ok())
    return FailSession(session, rs.Annotate("tcp push of '" + src.path + "'"));
  Status st = session.protection() != LinkProtection::kNone
                  ? session.SendFrameInPlace(static_cast<uint16_t>(MsgType::kFileData), buf.get(),
                                             len, IdleDeadline(options_.idle_ms))
                  : session.SendAll(buf.get(), len, IdleDeadline(options_.idle_ms));
  if (!st.ok()) return FailSession(session, st.Annotate("tcp push of '" + src.path + "'"));
  stats->bytes = src.size;
  stats->chunks = 1;
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
  TransferStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  *stats = TransferStats();
  if (src.size == 0) return Status::OK();
  if (src.fd < 0) {
    // The FetchReply already promised bytes the requester will wait for.
    return FailSession(
        session, Status(DYAD_RC_BADFIO, "tcp push of '" + src.path + "': no open file descriptor"));
  }
  ScopedSigpipeBlock no_sigpipe;
  if (src.size <= kGatheredFileBytes) return PushFromMemory(session, src, stats);
  if (session.protection() != LinkProtection::kNone) return PushSealed(session, src, stats);
  // Sent in slices of chunk_size so stats count pipeline chunks; each slice
  // is still one zero-copy sendfile loop inside the Channel.
  const uint64_t slice = options_.chunk_size > 0 ? options_.chunk_size : kDefaultChunk;
  const int64_t idle_ms = std::max<int64_t>(0, options_.idle_ms);
  uint64_t offset = 0;
  while (offset < src.size) {
    const uint64_t len = std::min(slice, src.size - offset);
    uint64_t sent = 0;
    Status st = session.SendFileRange(src.fd, offset, len, idle_ms, &sent);
    offset += sent;
    stats->bytes = offset;
    if (!st.ok()) {
      return FailSession(
          session, st.Annotate("tcp push of '" + src.path + "' (sent " + std::to_string(offset) +
                               " of " + std::to_string(src.size) + " bytes)"));
    }
    ++stats->chunks;
  }
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
