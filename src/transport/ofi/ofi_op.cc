#include "transport/ofi/ofi_op.h"

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

}  // namespace dyad
