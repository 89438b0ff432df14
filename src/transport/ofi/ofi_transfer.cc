#include "transport/ofi/ofi_transfer.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

namespace dyad {

OfiTransfer::OfiTransfer(Channel& session, TransferWaits& waits, int64_t idle_ms,
                         TransferStats* stats, const char* waiting_for)
    : session_(session),
      waits_(waits),
      idle_ms_(idle_ms),
      stats_(stats),
      waiting_for_(waiting_for),
      idle_(idle_ms) {
  wake_ = UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_.valid()) wake_error_ = StatusFromErrno(errno, "eventfd");
}

Task<Status> OfiTransfer::WaitForPeer() {
  idle_.Saw(stats_->bytes);
  DYAD_CO_RETURN_IF_ERROR(
      co_await waits_.ForPeer(session_, idle_, waiting_for_, wake_.get(), kWakeSliceMs));
  uint64_t v = 0;
  (void)!::read(wake_.get(), &v, sizeof(v));
  co_return Status::OK();
}

Result<bool> OfiTransfer::NextFrame(uint16_t* type) {
  Result<bool> r = session_.RecvFrameNow(&frame_, type, &payload_);
  if (r.ok() && *r) frame_.Reset();
  return r;
}

}  // namespace dyad
