// resumable.h: an operation that waits on a peer, and the two ways to run it.
//
// A fetch from another service waits on its owner for a session (a new
// one's connect and handshake, or another fetch's dial to it: PeerDial,
// peer_dial.h), then three times (the reply, the file bytes, the verdict).
// Written as a Resumable, its Step makes the progress the session allows
// without blocking and otherwise says what it waits for (the session
// readable, a connecting socket writable, by a deadline). Two drivers run the same
// object, so there is one implementation of each such operation:
//  * RunBlocking waits on the calling thread (the prefetcher's threads,
//    PlaceBatch, any caller without a request that can park);
//  * RunParked serves a request: it waits on its worker as RunBlocking
//    does while the waits are short (kParkAfterMs in all per stint: the
//    fast path stays a spin and a poll), then parks the request
//    (router.h) with the session watched by the service's FdWatcher, and
//    runs the next step on a worker when bytes arrive. A slow or silent
//    owner therefore holds no worker of the requesting service.
// A Resumable is used by one thread at a time; the drivers guarantee it.
#pragma once

#include <poll.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "common/net.h"
#include "common/time.h"
#include "proto/router.h"
#include "service/fd_watch.h"
#include "service/stats.h"

namespace dyad {

class Resumable {
 public:
  // What the next Step waits for: any of `ch` readable and `fd` ready
  // (either may be absent), or the deadline.
  struct Wait {
    Channel* ch = nullptr;  // until ch->fd() is readable (or hung up)
    Deadline deadline = Deadline::Never();
    bool spin = false;  // the bytes are likely microseconds away (Channel::SpinFor)
    // Also (or instead) until `fd` is ready for `events` (POLLIN or
    // POLLOUT): a socket still connecting, a transport's completion event.
    int fd = -1;
    short events = POLLIN;
  };
  virtual ~Resumable() = default;
  // Makes what progress it can without blocking. True once the operation
  // ended (its outcome is its own business); false with `*wait` set.
  virtual bool Step(Wait* wait) = 0;
  // The wait's deadline passed: the operation ends (the next Step says so).
  virtual void Expired() = 0;
  // The requester hung up or the service stops: the operation ends with
  // `why`, releasing what it holds (its session is shut down).
  virtual void Abandon(const Status& why) = 0;
};

// Runs `op` to its end on this thread, polling between steps.
void RunBlocking(Resumable& op);

// A request waits on its worker at most this long in all per stint before
// it parks: as the owner side's FileServer::kParkAfterMs, a park costs
// thread hand-offs, and on a loaded node a reply or a chunk may take tens
// of milliseconds without anything being wrong.
constexpr int64_t kOwnerParkAfterMs = 100;

// Runs `op` for the request of `ctx` (see above); `then` runs with the
// request's context once `op` ended, on this thread when it never parked,
// else on a worker after the request resumed. Without ctx.parking or a
// watcher, as RunBlocking. Each park counts `counter` (a requester's wait
// on its owner by default; an owner's wait on its requester names its own).
void RunParked(RequestContext& ctx, std::shared_ptr<Resumable> op, FdWatcher* watcher,
               ServiceStats* stats, std::function<void(RequestContext&)> then,
               const char* counter = "consume.parked_for_owner");

}  // namespace dyad
