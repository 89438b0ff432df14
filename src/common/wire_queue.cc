#include "common/wire_queue.h"

#include <fcntl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <optional>

namespace dyad {

namespace {

// Memory pieces written by one sendmsg (a sealed frame is three).
constexpr size_t kMaxIov = 8;

Status SendError(int err, const char* what) {
  return StatusFromErrno(err, what, IsConnectionLost(err) ? DYAD_RC_CONNLOST : DYAD_RC_BADFIO);
}

}  // namespace

void WireQueue::Bytes(std::string bytes) {
  if (bytes.empty()) return;
  queued_bytes_ += bytes.size();
  Piece p;
  p.bytes = std::move(bytes);
  pieces_.push_back(std::move(p));
}

void WireQueue::FileRange(int fd, uint64_t offset, uint64_t len) {
  if (len == 0) return;
  Piece p;
  p.fd = fd;
  p.offset = offset;
  p.len = len;
  pieces_.push_back(std::move(p));
  has_file_ = true;
}

void WireQueue::Consumed(uint64_t n) {
  sent_ += n;
  while (n > 0 && !pieces_.empty()) {
    Piece& head = pieces_.front();
    const uint64_t size = head.fd >= 0 ? head.len : head.bytes.size();
    const uint64_t take = std::min(n, size - head.done);
    head.done += take;
    n -= take;
    if (head.done < size) break;
    if (head.fd < 0) queued_bytes_ -= head.bytes.size();
    pieces_.pop_front();
  }
  has_file_ = std::any_of(pieces_.begin(), pieces_.end(), [](const Piece& p) { return p.fd >= 0; });
}

Result<bool> WireQueue::WriteSome(int sock) {
  Piece& head = pieces_.front();
  ssize_t n;
  if (head.fd >= 0) {
    off_t off = static_cast<off_t>(head.offset + head.done);
    const size_t want = static_cast<size_t>(std::min<uint64_t>(head.len - head.done, 1u << 30));
    n = ::sendfile(sock, head.fd, &off, want);
    if (n == 0)
      return Status(DYAD_RC_BADFIO, "file shrank while being sent (" +
                                        std::to_string(head.offset + head.done) + " bytes in)");
    if (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
      return SendError(errno, "sendfile");
  } else {
    iovec iov[kMaxIov];
    size_t count = 0;
    auto it = pieces_.begin();
    for (; it != pieces_.end() && it->fd < 0 && count < kMaxIov; ++it, ++count)
      iov[count] = iovec{it->bytes.data() + it->done, it->bytes.size() - it->done};
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = count;
    // A header before a file range waits for the range's first bytes
    // rather than leaving in a packet of its own.
    const int more = it != pieces_.end() ? MSG_MORE : 0;
    n = ::sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT | more);
    if (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK)
      return SendError(errno, "send");
  }
  if (n > 0) {
    Consumed(static_cast<uint64_t>(n));
    return true;
  }
  return errno == EINTR;  // EAGAIN: no room
}

Result<WireQueue::Pumped> WireQueue::Pump(Channel& ch) {
  if (pieces_.empty()) return Pumped::kAllSent;
  if (ch.broken()) return Status(DYAD_RC_CONNLOST, "the session failed earlier");
  std::optional<ScopedSigpipeBlock> no_sigpipe;
  std::optional<ScopedNonBlocking> nonblocking;
  if (has_file_) {
    no_sigpipe.emplace();
    nonblocking.emplace(ch.fd());
    if (!nonblocking->ok()) {
      ch.MarkBroken();
      return StatusFromErrno(errno, "fcntl(O_NONBLOCK)");
    }
  }
  while (!pieces_.empty()) {
    Result<bool> wrote = WriteSome(ch.fd());
    if (!wrote.ok()) {
      ch.MarkBroken();
      return wrote.status();
    }
    if (!*wrote) return Pumped::kStalled;
  }
  return Pumped::kAllSent;
}

ScopedSigpipeBlock::ScopedSigpipeBlock() {
  sigemptyset(&pipe_set_);
  sigaddset(&pipe_set_, SIGPIPE);
  sigset_t pending;
  sigemptyset(&pending);
  was_pending_ = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
  sigemptyset(&old_mask_);
  pthread_sigmask(SIG_BLOCK, &pipe_set_, &old_mask_);
}

ScopedSigpipeBlock::~ScopedSigpipeBlock() {
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

ScopedNonBlocking::ScopedNonBlocking(int fd) : fd_(fd), old_flags_(::fcntl(fd, F_GETFL)) {
  ok_ = old_flags_ >= 0 &&
        ((old_flags_ & O_NONBLOCK) != 0 || ::fcntl(fd, F_SETFL, old_flags_ | O_NONBLOCK) == 0);
}

ScopedNonBlocking::~ScopedNonBlocking() {
  if (ok_ && (old_flags_ & O_NONBLOCK) == 0) ::fcntl(fd_, F_SETFL, old_flags_);
}

}  // namespace dyad
