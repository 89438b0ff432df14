// ofi_transfer.h (internal to the "ofi" transport): what the requester's
// Pull (ofi_pull.cc) and the owner's Push (ofi_push.cc) share. Each is one
// straight-line coroutine on the service's runtime that keeps its state in
// a struct deriving from OfiTransfer: the session, frames taken from it
// only as far as it holds them, and the transfer's wait on its peer.
//
// The wait: until the session or the transfer's wake fd is readable (an
// event fd that our reads' completions, the pool giving a buffer back and
// the fabric finding a busy read worth retrying signal), the idle bound
// passing (DYAD_RC_TIMEOUT) or the operation's Stop firing (its reason).
// No thread is held meanwhile.
#pragma once

#include <cstdint>
#include <string>

#include "common/net.h"
#include "common/status.h"
#include "transport/transport.h"

namespace dyad {

class OfiTransfer {
 public:
  // A failure to make the event fd is kept in wake_error().
  OfiTransfer(Channel& session, TransferWaits& waits, int64_t idle_ms, TransferStats* stats,
              const char* waiting_for);
  OfiTransfer(const OfiTransfer&) = delete;
  OfiTransfer& operator=(const OfiTransfer&) = delete;

  const Status& wake_error() const { return wake_error_; }
  int wake_fd() const { return wake_.get(); }

  // Waits for the peer (see above), the idle bound restarted if
  // stats->bytes advanced since the last wait; then resets the wake fd
  // before the caller looks at what may have signalled it, so that a
  // signal after the look is not lost. OK: look again (also when nothing
  // came, see kWakeSliceMs).
  Task<Status> WaitForPeer();

  // The next frame if the session holds all of it now: OK(true) with
  // `*type` and payload() set; OK(false) otherwise. A closed session is
  // DYAD_RC_CONNLOST.
  Result<bool> NextFrame(uint16_t* type);
  const std::string& payload() const { return payload_; }

  // A wait goes in slices of at most this long, after each of which the
  // transfer looks again: one wake-up is never signalled (a send buffer
  // resting after a failed transfer becomes usable silently, ofi_pool.h),
  // so a transfer waiting for one must not sleep to its idle bound. The
  // old blocking driver polled at most a second at a time, too.
  static constexpr int64_t kWakeSliceMs = 1000;

 protected:
  ~OfiTransfer() = default;

  Channel& session_;
  TransferWaits& waits_;
  const int64_t idle_ms_;
  TransferStats* const stats_;

 private:
  const char* const waiting_for_;  // the TIMEOUT message: "<this> for N ms"
  IdleBound idle_;
  UniqueFd wake_;
  Status wake_error_;
  Channel::PartialFrame frame_;
  std::string payload_;
};

}  // namespace dyad
