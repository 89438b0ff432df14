#include "service/peer_waits.h"

#include <algorithm>
#include <string>

namespace dyad {

Status PeerWaits::Stopped() const {
  if (stop_ != nullptr && stop_->fired()) return stop_->why();
  return Status(DYAD_RC_CANCELLED, "stopped");
}

Task<Ready> PeerWaits::Wait(Channel* ch, int fd, short events, Deadline deadline) {
  auto wait = [&](Deadline until) -> Task<Ready> {
    if (ch != nullptr) co_return co_await WaitReady(*ch, POLLIN, until, stop_, fd, events);
    co_return co_await WaitReady(fd, events, until, stop_);
  };
  // Within what is left of the budget first: past it, the wait counts as
  // parked, then goes on to its deadline with a fresh budget.
  const uint64_t t0 = MonoNs();
  const int64_t left_ms = std::max<int64_t>(1, (budget_ns_ + 999999) / 1000000);
  Ready r = co_await wait(deadline.Min(left_ms));
  budget_ns_ -= static_cast<int64_t>(MonoNs() - t0);
  if (r != Ready::kTimeout || deadline.expired()) co_return r;
  if (stats_ != nullptr) stats_->AddNamed(counter_);
  budget_ns_ = kOwnerParkAfterMs * 1000000;
  rt_.long_waits.fetch_add(1);
  r = co_await wait(deadline);
  rt_.long_waits.fetch_sub(1);
  co_return r;
}

Task<Status> DriveTransfer(TransferOp& op, Channel& session, PeerWaits& waits,
                           const char* idle_what) {
  const int64_t idle = op.idle_ms();
  Deadline deadline = IdleDeadline(idle);
  uint64_t moved = op.moved();
  for (;;) {
    Result<bool> r = co_await waits.Run(op.blocks(), [&op] { return op.Step(); });
    if (!r.ok()) co_return r.status();
    if (*r) co_return Status::OK();
    if (op.moved() != moved) {  // progress: the idle bound starts again
      moved = op.moved();
      deadline = IdleDeadline(idle);
    }
    const Ready w = co_await waits.Readable(session, deadline, op.wake_fd());
    if (w == Ready::kTimeout)
      co_return op.Fail(
          Status(DYAD_RC_TIMEOUT, std::string(idle_what) + " for " + std::to_string(idle) + " ms"));
    if (w == Ready::kStopped) co_return op.Fail(waits.Stopped());
  }
}

}  // namespace dyad
