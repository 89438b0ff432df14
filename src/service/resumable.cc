#include "service/resumable.h"

#include <algorithm>

namespace dyad {

Task<void> Drive(Runtime& rt, Resumable& op, Stop* stop, ServiceStats* stats, const char* counter) {
  // The waits of one operation share a budget: an owner that trickles a
  // byte now and then counts as parked as one that sends nothing.
  constexpr int64_t kBudgetNs = kOwnerParkAfterMs * 1000000;
  int64_t budget_ns = kBudgetNs;
  for (;;) {
    Resumable::Wait w;
    bool done = false;  // (an if: GCC 12 mis-compiles a co_await inside ?:)
    if (op.NextStepBlocks())
      done = co_await rt.Offload([&op, &w] { return op.Step(&w); });
    else
      done = op.Step(&w);
    if (done) co_return;
    if (w.deadline.expired()) {
      op.Expired();
      continue;
    }
    auto wait = [&](Deadline until) -> Task<Ready> {
      if (w.ch != nullptr) co_return co_await WaitReady(*w.ch, POLLIN, until, stop, w.fd, w.events);
      co_return co_await WaitReady(w.fd, w.events, until, stop);
    };
    // Waited for within what is left of the budget first: past it, the
    // wait counts as parked (the peer is slow or silent), then goes on to
    // its deadline.
    const uint64_t t0 = MonoNs();
    const int64_t left_ms = std::max<int64_t>(1, (budget_ns + 999999) / 1000000);
    Ready r = co_await wait(w.deadline.Min(left_ms));
    budget_ns -= static_cast<int64_t>(MonoNs() - t0);
    if (r == Ready::kTimeout && !w.deadline.expired()) {
      if (stats != nullptr) stats->AddNamed(counter);
      budget_ns = kBudgetNs;
      rt.long_waits.fetch_add(1);
      r = co_await wait(w.deadline);
      rt.long_waits.fetch_sub(1);
    }
    if (r == Ready::kTimeout) op.Expired();
    if (r == Ready::kStopped)
      op.Abandon(stop != nullptr ? stop->why() : Status(DYAD_RC_CANCELLED, "stopped"));
  }
}

}  // namespace dyad
