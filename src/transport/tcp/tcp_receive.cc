#include "transport/tcp/tcp_receive.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/wire_queue.h"
#include "proto/protocol.h"
#include "transport/tcp/tcp_transport.h"

namespace dyad {
namespace tcp_internal {
namespace {

// Largest pipe we ask for: 1 MiB is the default unprivileged limit
// (/proc/sys/fs/pipe-max-size) and large enough to keep splice efficient.
constexpr size_t kMaxPipeBytes = 1u << 20;
constexpr size_t kMinPipeBytes = 64u << 10;
// Used when options.chunk_size is 0 (a misconfiguration, not a reason to fail).
constexpr size_t kDefaultChunk = 1u << 20;

bool SpliceUnsupported(int err) {
  return err == EINVAL || err == ENOSYS || err == EOPNOTSUPP || err == ENOTSUP;
}

// What both receives share: the session, the size, the progress so far,
// the wait for more bytes, and how a failure ends the session.
class TcpPull {
 protected:
  TcpPull(Channel& ch, uint64_t size, const TransportOptions& options, TransferStats* stats,
          TransferWaits& waits)
      : ch_(ch),
        size_(size),
        options_(options),
        stats_(stats),
        waits_(waits),
        idle_(options.idle_ms) {}

  // Until the socket holds more bytes: OK, or why the transfer ends (no
  // bytes for idle_ms, the operation stopped).
  Task<Status> MoreBytes() {
    idle_.Saw(got_);
    co_return co_await waits_.ForPeer(ch_, idle_, "no data from the owner");
  }
  Status Fail(const Status& why) {
    return BreakSession(ch_, why.Annotate("tcp pull (" + Progress(got_, size_) + ")"));
  }

  Channel& ch_;
  const uint64_t size_;
  const TransportOptions options_;
  TransferStats* const stats_;
  TransferWaits& waits_;
  IdleBound idle_;
  uint64_t got_ = 0;
};

// The unprotected stream: exactly `size` raw bytes, spliced socket -> pipe
// -> sink until splice proves unusable here (no pipe, a sink or socket
// that refuses it), then received through a buffer.
class StreamPull final : public TcpPull {
 public:
  StreamPull(Channel& ch, uint64_t size, int sink_fd, const TransportOptions& options,
             TransferStats* stats, TransferWaits& waits)
      : TcpPull(ch, size, options, stats, waits), sink_(sink_fd) {}

  Task<Status> Run() {
    Status st = TakeReadAhead();
    if (st.ok() && got_ < size_ && size_ > TcpTransport::kSpliceThreshold && SetUpSplice()) {
      bool unsupported = false;
      st = co_await Splice(&unsupported);
      if (st.ok() && unsupported)
        DYAD_LOG_DEBUG("tcp pull: splice unavailable, using buffered receive");
      rd_.reset();
      wr_.reset();
      nonblocking_.reset();
    }
    if (st.ok() && got_ < size_) st = co_await Buffered();
    if (!st.ok()) co_return Fail(st);
    co_return Status::OK();
  }

 private:
  // Bytes the session read ahead with the reply come first.
  Status TakeReadAhead() {
    while (got_ < size_ && ch_.has_unread()) {
      EnsureBuffer();
      const size_t want = static_cast<size_t>(std::min<uint64_t>(buf_.size(), size_ - got_));
      Result<size_t> n = ch_.RecvSome(buf_.data(), want, Deadline::AfterMs(0));
      if (!n.ok()) return n.status();
      DYAD_RETURN_IF_ERROR(WriteSink(buf_.data(), *n));
      Count(*n);
    }
    return Status::OK();
  }

  // Without a non-blocking socket splice could wait unbounded; without a
  // pipe (descriptor or pipe quota exhausted) there is nothing to splice
  // into. The buffered path works in both cases.
  bool SetUpSplice() {
    nonblocking_.emplace(ch_.fd());
    int fds[2];
    if (!nonblocking_->ok() || ::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      nonblocking_.reset();
      return false;
    }
    rd_.reset(fds[0]);
    wr_.reset(fds[1]);
    cap_ = SizePipe(wr_.get());
    return true;
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
    Status st = WriteFully(sink_, p, n);
    if (!st.ok()) return Status(DYAD_RC_BADFIO, st.message() + " (" + Progress(got_, size_) + ")");
    return st;
  }

  // Receives the rest through the buffer.
  Task<Status> Buffered() {
    EnsureBuffer();
    while (got_ < size_) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(buf_.size(), size_ - got_));
      const ssize_t n = ::recv(ch_.fd(), buf_.data(), want, MSG_DONTWAIT);
      if (n > 0) {
        DYAD_CO_RETURN_IF_ERROR(WriteSink(buf_.data(), static_cast<size_t>(n)));
        Count(static_cast<uint64_t>(n));
        continue;
      }
      if (n == 0) co_return PeerClosed();
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) co_return SocketError(errno, "recv");
      DYAD_CO_RETURN_IF_ERROR(co_await MoreBytes());
    }
    co_return Status::OK();
  }

  // socket -> pipe -> sink. Sets `*unsupported` (no bytes lost) and
  // returns when splice cannot be used here; the caller goes on buffered.
  Task<Status> Splice(bool* unsupported) {
    while (got_ < size_) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(cap_, size_ - got_));
      const ssize_t n =
          ::splice(ch_.fd(), nullptr, wr_.get(), nullptr, want, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n > 0) {
        DYAD_CO_RETURN_IF_ERROR(DrainPipe(static_cast<size_t>(n), unsupported));
        Count(static_cast<uint64_t>(n));
        if (*unsupported) co_return Status::OK();
        continue;
      }
      if (n == 0) co_return PeerClosed();
      if (errno == EINTR) continue;
      if (SpliceUnsupported(errno)) {  // nothing was taken from the socket
        *unsupported = true;
        co_return Status::OK();
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        co_return SocketError(errno, "splice from socket");
      DYAD_CO_RETURN_IF_ERROR(co_await MoreBytes());
    }
    co_return Status::OK();
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
  // take spliced data, they are copied out through the buffer instead and
  // `*sink_unsupported` tells the caller to stop splicing.
  Status DrainPipe(size_t n, bool* sink_unsupported) {
    while (n > 0) {
      const ssize_t w = ::splice(rd_.get(), nullptr, sink_, nullptr, n, SPLICE_F_MOVE);
      if (w > 0) {
        n -= static_cast<size_t>(w);
        continue;
      }
      if (w < 0 && errno == EINTR) continue;
      if (w < 0 && SpliceUnsupported(errno)) {
        *sink_unsupported = true;
        return DrainPipeBuffered(n);
      }
      return SinkError(w < 0 ? errno : ENOSPC, "splice to sink");
    }
    return Status::OK();
  }

  Status DrainPipeBuffered(size_t n) {
    EnsureBuffer();
    while (n > 0) {
      const ssize_t r = ::read(rd_.get(), buf_.data(), std::min(n, buf_.size()));
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
    got_ += n;
    stats_->bytes += n;
    stats_->chunks += 1;
  }

  const int sink_;
  std::vector<char> buf_;
  std::optional<ScopedNonBlocking> nonblocking_;  // while splicing
  UniqueFd rd_, wr_;                              // the pipe, while splicing
  size_t cap_ = 0;
};

// The protected stream: sealed kFileData frames, each written as it streams
// in and verified at its end, so the socket keeps draining and the bytes are
// hashed while still in cache. Unverified bytes only ever reach the sink, a
// temporary the fetcher discards when this fails.
class SealedPull final : public TcpPull {
 public:
  SealedPull(Channel& ch, uint64_t size, int sink_fd, const TransportOptions& options,
             TransferStats* stats, TransferWaits& waits, size_t read_bytes)
      : TcpPull(ch, size, options, stats, waits) {
    buf_len_ = static_cast<size_t>(std::min<uint64_t>(read_bytes, std::max<uint64_t>(1, size)));
    buf_.reset(new char[buf_len_]);
    write_ = [sink_fd](const char* p, size_t n) -> Status {
      if (Status ws = WriteFully(sink_fd, p, n); !ws.ok())
        return Status(DYAD_RC_BADFIO, "write to sink: " + ws.message());
      return Status::OK();
    };
  }

  Task<Status> Run() {
    Channel::PartialFrame frame;
    while (got_ < size_) {
      size_t len = 0;
      const size_t max_len =
          static_cast<size_t>(std::min<uint64_t>(kMaxFramePayload, size_ - got_));
      Result<bool> r = ch_.RecvFrameStreamingNow(&frame, static_cast<uint16_t>(MsgType::kFileData),
                                                 &len, max_len, buf_.get(), buf_len_, write_);
      if (r.ok() && *r && len == 0) r = Status(DYAD_RC_BADUNPACK, "empty file data chunk");
      if (!r.ok()) co_return Fail(r.status());
      if (!*r) {
        if (Status w = co_await MoreBytes(); !w.ok()) co_return Fail(w);
        continue;
      }
      frame.Reset();
      got_ += len;
      stats_->bytes = got_;
      ++stats_->chunks;
    }
    co_return Status::OK();
  }

 private:
  size_t buf_len_ = 0;
  std::unique_ptr<char[]> buf_;
  std::function<Status(const char*, size_t)> write_;
};

}  // namespace

std::string Progress(uint64_t got, uint64_t size) {
  return "received " + std::to_string(got) + " of " + std::to_string(size) + " bytes";
}

Task<Status> PullStream(Channel& ch, uint64_t size, int sink_fd, const TransportOptions& options,
                        TransferStats* stats, TransferWaits& waits) {
  StreamPull pull(ch, size, sink_fd, options, stats, waits);
  co_return co_await pull.Run();
}

Task<Status> PullSealed(Channel& ch, uint64_t size, int sink_fd, const TransportOptions& options,
                        TransferStats* stats, TransferWaits& waits, size_t read_bytes) {
  SealedPull pull(ch, size, sink_fd, options, stats, waits, read_bytes);
  co_return co_await pull.Run();
}

}  // namespace tcp_internal
}  // namespace dyad
