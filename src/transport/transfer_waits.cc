#include "transport/transfer_waits.h"

#include <algorithm>
#include <string>

namespace dyad {

IdleBound::IdleBound(int64_t idle_ms)
    : idle_ms_(idle_ms), deadline_(idle_ms > 0 ? Deadline::AfterMs(idle_ms) : Deadline::Never()) {}

void IdleBound::Saw(uint64_t moved) {
  if (moved == moved_) return;
  moved_ = moved;
  deadline_ = idle_ms_ > 0 ? Deadline::AfterMs(idle_ms_) : Deadline::Never();
}

Status TransferWaits::Stopped() const {
  if (stop_ != nullptr && stop_->fired()) return stop_->why();
  return Status(DYAD_RC_CANCELLED, "stopped");
}

Task<Ready> TransferWaits::Wait(Channel* ch, short ch_events, int fd, short events,
                                Deadline deadline) {
  auto wait = [&](Deadline until) -> Task<Ready> {
    if (ch != nullptr) co_return co_await WaitReady(*ch, ch_events, until, stop_, fd, events);
    co_return co_await WaitReady(fd, events, until, stop_);
  };
  // Within what is left of the budget first: past it, the wait counts as
  // parked, then goes on to its deadline with a fresh budget.
  const uint64_t t0 = MonoNs();
  const int64_t left_ms = std::max<int64_t>(1, (budget_ns_ + 999999) / 1000000);
  Ready r = co_await wait(deadline.Min(left_ms));
  budget_ns_ -= static_cast<int64_t>(MonoNs() - t0);
  if (r != Ready::kTimeout || deadline.expired()) {
    if (r == Ready::kReady) stalled_ = false;
    co_return r;
  }
  // One stall counts once, however many waits it takes (a transport that
  // looks again every second waits in slices).
  if (!stalled_) Parked();
  stalled_ = true;
  budget_ns_ = kOwnerParkAfterMs * 1000000;
  rt_.long_waits.fetch_add(1);
  r = co_await wait(deadline);
  rt_.long_waits.fetch_sub(1);
  if (r == Ready::kReady) stalled_ = false;
  co_return r;
}

Status TransferWaits::Ended(Ready r, const IdleBound& idle, const char* what) const {
  if (r == Ready::kReady) return Status::OK();
  if (r == Ready::kStopped) return Stopped();
  return Status(DYAD_RC_TIMEOUT,
                std::string(what) + " for " + std::to_string(idle.idle_ms()) + " ms");
}

Task<Status> TransferWaits::ForPeer(Channel& session, const IdleBound& idle, const char* what,
                                    int wake_fd, int64_t slice_ms) {
  if (slice_ms > 0 && idle.deadline().RemainingMs(slice_ms + 1) > slice_ms) {
    // A slice: its end, like a wake-up, only means "look again".
    const Ready r = co_await Readable(session, Deadline::AfterMs(slice_ms), wake_fd);
    co_return r == Ready::kStopped ? Stopped() : Status::OK();
  }
  co_return Ended(co_await Readable(session, idle.deadline(), wake_fd), idle, what);
}

Task<Status> TransferWaits::ForRoom(Channel& session, const IdleBound& idle, const char* what) {
  co_return Ended(co_await Writable(session, idle.deadline()), idle, what);
}

Status RunTransfer(Channel& session, const std::function<Task<Status>(TransferWaits&)>& transfer) {
  Runtime rt(2, 1000);
  if (Status st = rt.Start(); !st.ok()) return st.Annotate("transfer runtime");
  TransferWaits waits(rt, &rt.stopping());
  Status st = rt.RunSync([&]() -> Task<Status> {
    Status s = co_await transfer(waits);
    // The session's registration belongs to this runtime, which ends here.
    session.attachment().reset();
    co_return s;
  }());
  rt.Shutdown();
  return st;
}

}  // namespace dyad
