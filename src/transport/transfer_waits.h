// transfer_waits.h: how an operation on the service's runtime waits on
// another service, transfers included.
//
// A fetch waits on its owner for a session, the reply, the bytes and the
// verdict; the owner's push waits for the requester's offers and credits;
// a version notice waits for its receiver's answer. Each is a straight-line
// coroutine (common/runtime.h) whose waits go through one TransferWaits: a
// wait holds no thread, ends at its deadline or when the operation's Stop
// fires (the requester hung up, the service stops), and the waits of one
// operation share a budget: once they have lasted kOwnerParkAfterMs
// together, the operation counts as parked on its peer (Parked(), and the
// runtime's long_waits gauge), a sign of a slow or silent peer.
//
// A transfer (transport.h) bounds its waits with an IdleBound: no progress
// for the transport's idle_ms fails it. A caller outside any runtime (a
// test, a tool) runs a transfer to its end with RunTransfer.
#pragma once

#include <poll.h>

#include <cstdint>
#include <functional>
#include <type_traits>

#include "common/net.h"
#include "common/runtime.h"
#include "common/status.h"
#include "common/time.h"

namespace dyad {

// A wait on a peer that lasts longer than this counts as parked.
constexpr int64_t kOwnerParkAfterMs = 100;

// A transfer's bound on waiting without progress: `idle_ms` (<= 0: none)
// from the last time the bytes moved advanced.
class IdleBound {
 public:
  explicit IdleBound(int64_t idle_ms);
  // Starts the bound again when `moved` (bytes so far) advanced.
  void Saw(uint64_t moved);
  Deadline deadline() const { return deadline_; }
  int64_t idle_ms() const { return idle_ms_; }

 private:
  const int64_t idle_ms_;
  uint64_t moved_ = 0;
  Deadline deadline_;
};

class TransferWaits {
 public:
  // `stop` (may be null) ends the waits.
  TransferWaits(Runtime& rt, Stop* stop) : rt_(rt), stop_(stop) {}
  virtual ~TransferWaits() = default;
  TransferWaits(const TransferWaits&) = delete;
  TransferWaits& operator=(const TransferWaits&) = delete;

  Runtime& rt() const { return rt_; }
  // Why the waits ended early: the Stop's reason.
  Status Stopped() const;
  bool stopped() const { return stop_ != nullptr && stop_->fired(); }

  // Until `ch` is readable (a hang-up counts) or `fd` ready for `events`
  // (-1: none), `deadline`, or the Stop.
  Task<Ready> Readable(Channel& ch, Deadline deadline, int fd = -1, short events = POLLIN) {
    return Wait(&ch, POLLIN, fd, events, deadline);
  }
  // Until `ch` can take bytes (a hang-up counts), `deadline`, or the Stop.
  Task<Ready> Writable(Channel& ch, Deadline deadline) {
    return Wait(&ch, POLLOUT, -1, 0, deadline);
  }
  // Until `fd` is ready for `events`, `deadline`, or the Stop.
  Task<Ready> OnFd(int fd, short events, Deadline deadline) {
    return Wait(nullptr, 0, fd, events, deadline);
  }

  // A transfer's wait for its peer: until the session (or `wake_fd`, -1:
  // none) is readable. OK then; DYAD_RC_TIMEOUT ("`what` for N ms") when
  // `idle` passed first; the Stop's reason when it fired. `slice_ms` > 0:
  // also OK once that long has passed while the idle bound has more left,
  // for a transfer waiting for something nobody signals (a buffer whose
  // rest ends), which then looks again.
  Task<Status> ForPeer(Channel& session, const IdleBound& idle, const char* what, int wake_fd = -1,
                       int64_t slice_ms = 0);
  // The same for room on the session to send.
  Task<Status> ForRoom(Channel& session, const IdleBound& idle, const char* what);

  // `fn()` here, or on the runtime's pool when `blocks` (a store lookup,
  // a copy on disk).
  template <typename F>
  Task<std::invoke_result_t<F>> Run(bool blocks, F fn) {
    if (blocks) co_return co_await rt_.Offload(std::move(fn));
    co_return fn();
  }

 protected:
  // Called once per stall: a wait that outlasted the budget, with the waits
  // after it until the peer is ready again (counted by the service; nothing
  // here).
  virtual void Parked() {}

 private:
  Task<Ready> Wait(Channel* ch, short ch_events, int fd, short events, Deadline deadline);
  Status Ended(Ready r, const IdleBound& idle, const char* what) const;

  Runtime& rt_;
  Stop* const stop_;
  int64_t budget_ns_ = kOwnerParkAfterMs * 1000000;
  bool stalled_ = false;  // Parked() was called and the peer was not ready since
};

// For a caller outside any runtime (a test, a tool): runs `transfer` on
// `session` to its end on a runtime of its own, blocking this thread
// meanwhile. The waits it is given end when the transfer's own bounds say
// so; the session leaves with no registration on that runtime.
Status RunTransfer(Channel& session, const std::function<Task<Status>(TransferWaits&)>& transfer);

}  // namespace dyad
