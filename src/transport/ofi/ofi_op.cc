#include "transport/ofi/ofi_op.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "transport/ofi/ofi_wire.h"

namespace dyad {

OfiTransferOp::OfiTransferOp(Channel& session, int64_t idle_ms, TransferStats* stats)
    : session_(session), idle_ms_(idle_ms), stats_(stats) {
  wake_ = UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_.valid()) wake_error_ = StatusFromErrno(errno, "eventfd");
}

Result<bool> OfiTransferOp::Step() {
  if (ended_) return result_.ok() ? Result<bool>(true) : Result<bool>(result_);
  Result<bool> r = StepRun();
  if (!r.ok()) return End(r.status());
  if (*r) (void)End(Status::OK());
  return r;
}

Status OfiTransferOp::Fail(const Status& why) {
  if (ended_) return result_.ok() ? why : result_;
  return End(why);
}

void OfiTransferOp::DrainWake() {
  uint64_t v = 0;
  (void)!::read(wake_.get(), &v, sizeof(v));
}

Result<bool> OfiTransferOp::NextFrame(uint16_t* type) {
  Result<bool> r = session_.RecvFrameNow(&frame_, type, &payload_);
  if (r.ok() && *r) frame_.Reset();
  return r;
}

Status DriveOfiOp(Channel& session, TransferOp& op) {
  const int64_t idle_ms = op.idle_ms();
  Deadline idle = OfiIdle(idle_ms);
  uint64_t moved = op.moved();
  for (;;) {
    Result<bool> r = op.Step();
    if (!r.ok()) return r.status();
    if (*r) return Status::OK();
    if (op.moved() != moved) {
      moved = op.moved();
      idle = OfiIdle(idle_ms);
    }
    pollfd p[2] = {{session.fd(), POLLIN, 0}, {op.wake_fd(), POLLIN, 0}};
    const int n = ::poll(p, op.wake_fd() >= 0 ? 2 : 1, static_cast<int>(idle.RemainingMs(1000)));
    if (n < 0 && errno != EINTR) return op.Fail(StatusFromErrno(errno, "poll", DYAD_RC_CONNLOST));
    // Hang-ups and errors on the session surface in the next step.
    if (n == 0 && idle.expired())
      return op.Fail(Status(DYAD_RC_TIMEOUT, "no progress for " + std::to_string(idle_ms) + " ms"));
  }
}

}  // namespace dyad
