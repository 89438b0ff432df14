// ofi_op.h (internal to the "ofi" transport): what the requester's PullOp
// and the owner's PushOp share (transport.h has the TransferOp contract):
// an event fd as wake_fd, which the transfer's completions, its pool
// (a buffer given back) and the fabric (a busy read worth retrying)
// signal; and frames taken from the session only as far as it holds them.
#pragma once

#include <cstdint>
#include <string>

#include "common/net.h"
#include "common/status.h"
#include "transport/transport.h"

namespace dyad {

class OfiTransferOp : public TransferOp {
 public:
  // Runs StepRun until the transfer ends; its end (either way) goes
  // through End once, whose outcome every later call repeats.
  Result<bool> Step() final;
  Status Fail(const Status& why) final;
  uint64_t moved() const override { return stats_->bytes; }
  int wake_fd() const override { return wake_.get(); }
  int64_t idle_ms() const override { return idle_ms_; }

 protected:
  // A failure to make the event fd is kept and returned by the first Step.
  OfiTransferOp(Channel& session, int64_t idle_ms, TransferStats* stats);
  // The transfer's own step (true: complete) and its end: releases what it
  // holds and, on a failure, sets result_ and tells the peer.
  virtual Result<bool> StepRun() = 0;
  virtual Status End(const Status& st) = 0;
  // Resets the event fd (before looking at what may have signalled it, so
  // that a signal after the look is not lost).
  void DrainWake();
  // The next frame if the session holds all of it now: OK(true) with
  // `*type` and payload_ set; OK(false) otherwise. A closed session is
  // DYAD_RC_CONNLOST.
  Result<bool> NextFrame(uint16_t* type);

  Channel& session_;
  const int64_t idle_ms_;
  TransferStats* const stats_;
  bool ended_ = false;
  Status result_;  // a failed end's status
  UniqueFd wake_;
  Status wake_error_;
  std::string payload_;

 private:
  Channel::PartialFrame frame_;
};

}  // namespace dyad
