// net.h: sockets and the framed connection (Channel) every DYAD link uses.
//
// Addresses are "HOST:PORT" (TCP, IPv4 or a resolvable name) or
// "unix:/path" / "/path" (Unix domain socket). A Channel owns one connected
// socket and moves frames (a 12-byte header: magic, version, type, payload
// length; then the payload) and raw bytes. Every blocking call takes a
// Deadline and fails with DYAD_RC_TIMEOUT when it passes; a peer that closes
// gives DYAD_RC_CONNLOST. A Channel is used by one thread at a time.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "common/time.h"

namespace dyad {

// Owns a file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct SocketAddress {
  bool is_unix = false;
  std::string host;  // TCP host or Unix socket path
  uint16_t port = 0;
  std::string ToString() const;
};

// Parses "HOST:PORT", "unix:/path" or "/path".
Result<SocketAddress> ParseAddress(std::string_view text);

// Listening socket. For TCP, port 0 picks a free port (see BoundAddress).
Result<UniqueFd> Listen(const SocketAddress& addr, int backlog = 512);
// The address a listening TCP socket is bound to (resolves port 0).
Result<SocketAddress> BoundAddress(int listen_fd);
// Accepts one connection, waiting at most until `deadline`.
Result<UniqueFd> Accept(int listen_fd, Deadline deadline);
// Connects with a bounded wait.
Result<UniqueFd> Connect(const SocketAddress& addr, Deadline deadline);

constexpr uint32_t kFrameMagic = 0x44594144;  // "DYAD"
constexpr uint16_t kWireVersion = 1;
constexpr size_t kFrameHeaderSize = 12;
constexpr uint32_t kMaxFramePayload = 16u << 20;

// Microseconds a Channel spins (polling and yielding) for an expected
// frame before sleeping: $DYAD_SPIN_US, default kDefaultSpinUs, 0 disables.
constexpr int kDefaultSpinUs = 50;
int SpinBudgetUs();

class Channel {
 public:
  explicit Channel(UniqueFd fd);
  Channel(Channel&&) = default;
  Channel& operator=(Channel&&) = default;

  int fd() const { return fd_.get(); }
  bool broken() const { return broken_; }
  // Marks the channel unusable (e.g. after a protocol error); pools drop it.
  void MarkBroken() { broken_ = true; }

  Status SendFrame(uint16_t type, std::string_view payload, Deadline deadline);
  // Receives one frame. A bad magic/version or an oversize length gives
  // DYAD_RC_BADUNPACK and marks the channel broken.
  Status RecvFrame(uint16_t* type, std::string* payload, Deadline deadline);

  Status SendAll(const void* buf, size_t len, Deadline deadline);
  Status RecvAll(void* buf, size_t len, Deadline deadline);
  // Receives up to `len` bytes (at least 1); returns the count.
  Result<size_t> RecvSome(void* buf, size_t len, Deadline deadline);
  // Sends `len` bytes of `file_fd` from `offset` with sendfile(2).
  // `idle_ms` bounds the time without progress, not the whole transfer.
  Status SendFileRange(int file_fd, uint64_t offset, uint64_t len, int64_t idle_ms,
                       uint64_t* sent = nullptr);

  // Polls for `events` for up to SpinBudgetUs() without sleeping; true if
  // they arrived. For waits whose answer is known to be imminent.
  bool SpinFor(short events);

  // True if the peer hung up (checked without blocking).
  bool PeerClosed() const;

 private:
  Status WaitFor(short events, Deadline deadline);
  UniqueFd fd_;
  bool broken_ = false;
  bool expecting_ = false;  // a frame was just sent; the answer is imminent
};

// Writes all of `len` bytes to a file descriptor (retries short writes/EINTR).
Status WriteFully(int fd, const void* buf, size_t len);

}  // namespace dyad
