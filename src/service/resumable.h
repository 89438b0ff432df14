// resumable.h: an operation that waits on a peer, written as steps, and
// the one way to run it (Drive, a task on the service's runtime).
//
// A fetch from another service waits on its owner for a session (a new
// one's connect and handshake, or another fetch's dial to it: PeerDial,
// peer_dial.h), then three times (the reply, the file bytes, the verdict).
// Written as a Resumable, its Step makes the progress the session allows
// without blocking and otherwise says what it waits for (the session
// readable, a connecting socket writable, by a deadline). Drive runs it as
// a task (common/runtime.h): the waits hold no thread, a step that may
// block (a store lookup, a copy on disk) runs on the runtime's pool, and a
// caller outside the loop runs the same task with Runtime::RunSync.
// A Resumable is used by one task at a time.
#pragma once

#include <poll.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "common/net.h"
#include "common/runtime.h"
#include "common/time.h"
#include "service/stats.h"

namespace dyad {

class Resumable {
 public:
  // What the next Step waits for: any of `ch` readable and `fd` ready
  // (either may be absent), or the deadline.
  struct Wait {
    Channel* ch = nullptr;  // until ch->fd() is readable (or hung up)
    Deadline deadline = Deadline::Never();
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
  // True when the next Step may block in the kernel or a library (a store
  // lookup, a copy on disk): Drive runs it on the runtime's pool.
  virtual bool NextStepBlocks() const { return false; }
};

// A wait on a peer that lasts longer than this counts as "parked" (the
// counter Drive is given): a sign of a slow or silent peer.
constexpr int64_t kOwnerParkAfterMs = 100;

// Runs `op` to its end (see above). `stop` (may be null) ends its waits:
// the op is told to Abandon. Each wait that lasts kOwnerParkAfterMs counts
// `counter` (a requester's wait on its owner by default).
Task<void> Drive(Runtime& rt, Resumable& op, Stop* stop, ServiceStats* stats,
                 const char* counter = "consume.parked_for_owner");

}  // namespace dyad
