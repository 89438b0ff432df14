// peer_waits.h: how an operation on the service's runtime waits on another
// service, and the one way a transfer is driven there.
//
// A fetch waits on its owner for a session (a connect and handshake, or
// another fetch's dial to it), then for the reply, the bytes and the
// verdict; a version notice waits for its receiver's answer; the owner's
// push waits for the requester's offers and credits. Each of these is a
// straight-line coroutine (common/runtime.h) whose waits go through one
// PeerWaits: a wait holds no thread, ends at its deadline or when the
// operation's Stop fires (the requester hung up, the service stops), and
// the waits of one operation share a budget: once they have lasted
// kOwnerParkAfterMs together, the operation counts as parked on its peer
// (a counter of ServiceStats and the runtime's long_waits gauge), a sign
// of a slow or silent peer.
#pragma once

#include <poll.h>

#include <cstdint>

#include "common/net.h"
#include "common/runtime.h"
#include "common/time.h"
#include "service/stats.h"
#include "transport/transport.h"

namespace dyad {

// A wait on a peer that lasts longer than this counts as parked.
constexpr int64_t kOwnerParkAfterMs = 100;

class PeerWaits {
 public:
  // `stop` (may be null) ends the waits; `counter` names the parked count
  // (stats may be null: not counted).
  PeerWaits(Runtime& rt, Stop* stop, ServiceStats* stats,
            const char* counter = "consume.parked_for_owner")
      : rt_(rt), stop_(stop), stats_(stats), counter_(counter) {}

  Runtime& rt() const { return rt_; }
  // Why the waits ended early: the Stop's reason.
  Status Stopped() const;
  bool stopped() const { return stop_ != nullptr && stop_->fired(); }

  // Until `ch` is readable (a hang-up counts) or `fd` ready for `events`
  // (-1: none), `deadline`, or the Stop.
  Task<Ready> Readable(Channel& ch, Deadline deadline, int fd = -1, short events = POLLIN) {
    return Wait(&ch, fd, events, deadline);
  }
  // Until `fd` is ready for `events`, `deadline`, or the Stop.
  Task<Ready> OnFd(int fd, short events, Deadline deadline) {
    return Wait(nullptr, fd, events, deadline);
  }

  // `fn()` here, or on the runtime's pool when `blocks` (a store lookup,
  // a copy on disk).
  template <typename F>
  Task<std::invoke_result_t<F>> Run(bool blocks, F fn) {
    if (blocks) co_return co_await rt_.Offload(std::move(fn));
    co_return fn();
  }

 private:
  Task<Ready> Wait(Channel* ch, int fd, short events, Deadline deadline);

  Runtime& rt_;
  Stop* const stop_;
  ServiceStats* const stats_;
  const char* const counter_;
  int64_t budget_ns_ = kOwnerParkAfterMs * 1000000;
};

// Runs a transport's op (transport.h) to its end on the runtime: each Step
// moves what it can (on the pool when the op blocks()); between steps the
// operation waits for the session or the op's wake_fd. No progress within
// the op's idle bound fails it with DYAD_RC_TIMEOUT ("`idle_what` for N
// ms"); the Stop fails it with the Stop's reason. Either way the op breaks
// the session.
Task<Status> DriveTransfer(TransferOp& op, Channel& session, PeerWaits& waits,
                           const char* idle_what);

}  // namespace dyad
