// wire_queue.h: a response's bytes, queued and sent as the socket takes them.
//
// An owner streaming a file to a requester used to write it with blocking
// sends, so a requester that stopped reading held the owner's thread until
// the idle bound (a minute). A WireQueue holds what comes next instead
// (memory, or a range of an open file sent with sendfile(2)), and Pump()
// writes what the socket takes now, never waiting. The caller waits for
// room on its runtime (no thread held) and pumps again, or fails the
// transfer when its bound passed.
//
// The socket is switched to O_NONBLOCK while a file range is sent (and back
// afterwards); SIGPIPE is blocked on the pumping thread meanwhile (sendfile
// has no MSG_NOSIGNAL).
//
// Not thread-safe: one response, pumped by one thread at a time.
#pragma once

#include <signal.h>

#include <cstdint>
#include <deque>
#include <string>

#include "common/net.h"
#include "common/status.h"

namespace dyad {

class WireQueue {
 public:
  // Appends bytes to send (a sealed frame, say).
  void Bytes(std::string bytes);
  // Appends `len` bytes of `fd` from `offset`; `fd` must stay open until
  // they are sent.
  void FileRange(int fd, uint64_t offset, uint64_t len);

  bool empty() const { return pieces_.empty(); }
  // A file range is queued (its bytes are read only as they are sent).
  bool has_file() const { return has_file_; }
  // True while more may be queued before the next write: nothing but
  // memory, and less than `bytes` of it (a small response then leaves in
  // one system call).
  bool Gathering(size_t bytes) const { return !has_file_ && queued_bytes_ < bytes; }
  // Bytes of memory pieces queued and not yet completely sent (what the
  // queue holds in memory; file ranges are read as they are sent).
  size_t memory_bytes() const { return queued_bytes_; }
  // Bytes written to the socket so far.
  uint64_t sent() const { return sent_; }

  enum class Pumped { kAllSent, kStalled };
  // Writes what the socket takes now: kAllSent once the queue is empty,
  // kStalled when the socket is full (wait until it is writable, then pump
  // again). The queue keeps whatever is unsent. A socket error, a file that
  // shrank, or a peer that hung up marks `ch` broken and is returned.
  Result<Pumped> Pump(Channel& ch);

 private:
  struct Piece {
    std::string bytes;  // memory, or empty for a file range
    int fd = -1;
    uint64_t offset = 0;
    uint64_t len = 0;
    uint64_t done = 0;  // of bytes.size() or len
  };
  // One write of the head piece (or of several memory pieces in one
  // sendmsg); false with errno set when the socket took nothing.
  Result<bool> WriteSome(int sock);
  void Consumed(uint64_t n);

  std::deque<Piece> pieces_;
  size_t queued_bytes_ = 0;  // memory queued, for Gathering()
  bool has_file_ = false;    // a file range is queued
  uint64_t sent_ = 0;
};

// Blocks SIGPIPE on this thread for its lifetime and discards a SIGPIPE that
// arrived meanwhile (the error still arrives as EPIPE), unless one was
// pending before: a library must not rely on the process ignoring SIGPIPE.
class ScopedSigpipeBlock {
 public:
  ScopedSigpipeBlock();
  ~ScopedSigpipeBlock();
  ScopedSigpipeBlock(const ScopedSigpipeBlock&) = delete;
  ScopedSigpipeBlock& operator=(const ScopedSigpipeBlock&) = delete;

 private:
  sigset_t pipe_set_;
  sigset_t old_mask_;
  bool was_pending_ = false;
};

// Sets O_NONBLOCK on `fd` for its lifetime if it was not set (splice and
// sendfile ignore their own non-blocking flags on a blocking socket).
class ScopedNonBlocking {
 public:
  explicit ScopedNonBlocking(int fd);
  ~ScopedNonBlocking();
  ScopedNonBlocking(const ScopedNonBlocking&) = delete;
  ScopedNonBlocking& operator=(const ScopedNonBlocking&) = delete;
  bool ok() const { return ok_; }

 private:
  const int fd_;
  const int old_flags_;
  bool ok_ = false;
};

}  // namespace dyad
