#include "service/resumable.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>

namespace dyad {
namespace {

int64_t RemainingNs(Deadline d, int64_t cap) {
  if (d.never()) return cap;
  const int64_t left =
      std::chrono::duration_cast<std::chrono::nanoseconds>(d.time_point() - SteadyClock::now())
          .count();
  return std::clamp<int64_t>(left, 0, cap);
}

// Waits until what `w` names is ready (true; a hang-up or error counts,
// the next step reports it) or for `limit_ns` / until its deadline (false).
bool WaitReady(const Resumable::Wait& w, int64_t limit_ns) {
  pollfd p[2] = {{w.ch ? w.ch->fd() : -1, POLLIN, 0}, {w.fd, w.events, 0}};
  for (;;) {
    const int64_t ns = RemainingNs(w.deadline, limit_ns);
    const timespec ts{static_cast<time_t>(ns / 1000000000), static_cast<long>(ns % 1000000000)};
    const int n = ::ppoll(p, 2, &ts, nullptr);  // negative fds are ignored
    if (n > 0) return true;
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return true;  // a broken descriptor: the step says what is wrong
    return false;
  }
}

bool Spun(const Resumable::Wait& w) { return w.spin && w.ch != nullptr && w.ch->SpinFor(POLLIN); }

void Park(RequestContext& ctx, std::shared_ptr<Resumable> op, const Resumable::Wait& w,
          FdWatcher* watcher, ServiceStats* stats, std::function<void(RequestContext&)> then,
          const char* counter) {
  stats->AddNamed(counter);
  std::shared_ptr<ParkedRequest> parked = ctx.parking->Park();
  // Resumes the request on a worker: `before` says why (nothing: bytes
  // arrived), then the operation goes on where it stopped.
  auto resume = [parked, op, watcher, stats, then,
                 counter](std::function<void(Resumable&)> before) {
    parked->Resume([op, watcher, stats, then, before, counter](RequestContext& c) {
      if (before) before(*op);
      RunParked(c, op, watcher, stats, then, counter);
    });
  };
  const std::array<FdWatcher::Interest, 2> any = {
      FdWatcher::Interest{w.ch ? w.ch->fd() : -1, POLLIN}, FdWatcher::Interest{w.fd, w.events}};
  Result<uint64_t> ticket = watcher->Watch(any, w.deadline, [resume](FdWatcher::Event ev) {
    if (ev == FdWatcher::Event::kReady) return resume(nullptr);
    if (ev == FdWatcher::Event::kTimeout) return resume([](Resumable& o) { o.Expired(); });
    resume([](Resumable& o) { o.Abandon(Status(DYAD_RC_CANCELLED, "the service is stopping")); });
  });
  if (!ticket.ok()) {
    return resume([st = ticket.status()](Resumable& o) { o.Abandon(st); });
  }
  // Exactly one of the watch and the hang-up resumes the request.
  parked->OnHangup([watcher, t = *ticket, resume] {
    if (watcher->Cancel(t))
      resume([](Resumable& o) { o.Abandon(Status(DYAD_RC_CANCELLED, "the requester went away")); });
  });
}

}  // namespace

void RunBlocking(Resumable& op) {
  for (;;) {
    Resumable::Wait w;
    if (op.Step(&w)) return;
    if (Spun(w)) continue;
    if (!WaitReady(w, 1000000000) && w.deadline.expired()) op.Expired();
  }
}

void RunParked(RequestContext& ctx, std::shared_ptr<Resumable> op, FdWatcher* watcher,
               ServiceStats* stats, std::function<void(RequestContext&)> then,
               const char* counter) {
  if (ctx.parking == nullptr || watcher == nullptr) {
    RunBlocking(*op);
    return then(ctx);
  }
  // This worker waits for the owner at most kOwnerParkAfterMs in all,
  // however the waits are spread: an owner that trickles a byte now and
  // then gets no more of a thread than one that sends nothing.
  int64_t budget_ns = kOwnerParkAfterMs * 1000000;
  for (;;) {
    Resumable::Wait w;
    if (op->Step(&w)) return then(ctx);
    if (w.deadline.expired()) {
      op->Expired();
      continue;
    }
    if (budget_ns <= 0)
      return Park(ctx, std::move(op), w, watcher, stats, std::move(then), counter);
    const uint64_t t0 = MonoNs();
    if (!Spun(w)) (void)WaitReady(w, budget_ns);
    budget_ns -= static_cast<int64_t>(MonoNs() - t0);
  }
}

}  // namespace dyad
