// wire_queue.h: a response's bytes, queued and sent as the socket takes them.
//
// An owner streaming a file to a requester used to write it with blocking
// sends, so a requester that stopped reading held the owner's thread until
// the idle bound (a minute). A WireQueue holds what comes next instead
// (memory, or a range of an open file sent with sendfile(2)), and Pump()
// writes it until it is all sent or the socket has had no room for a given
// time. The caller then decides: a service parks the request until the
// socket is writable (router.h, RequestParking::ParkUntilWritable) and
// pumps again on whichever worker resumes it; a caller with nothing else to
// do pumps again or fails the transfer.
//
// The socket is switched to O_NONBLOCK while a file range is sent (and back
// afterwards), so every wait is our own bounded poll; SIGPIPE is blocked on
// the pumping thread meanwhile (sendfile has no MSG_NOSIGNAL).
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
  // Writes what is queued: kAllSent once the queue is empty, kStalled when
  // the socket stayed full for `stall_ms` (<= 0: do not wait at all) or,
  // when `wait_budget_ns` is given, once the waits for room have used it up
  // (each wait is subtracted from it): a requester that reads, but slowly,
  // then stalls the caller no longer than one that does not read at all.
  // The queue keeps whatever is unsent. A socket error, a file that shrank,
  // or a peer that hung up marks `ch` broken and is returned.
  Result<Pumped> Pump(Channel& ch, int64_t stall_ms, int64_t* wait_budget_ns = nullptr);

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
