// ucx_transfer.h: what one UcxTransport instance owns and all its transfers
// share (Resources), and the two coroutines that move a file with them:
// the owner's push (ucx_push.cc) and the requester's pull (ucx_pull.cc),
// each straight-line code that suspends (holding no thread) wherever it
// waits on its peer. A transfer runs on one runtime's loop; Resources are
// thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/net.h"
#include "common/runtime.h"
#include "common/status.h"
#include "transport/transfer_waits.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_direct.h"
#include "transport/ucx/ucx_endpoints.h"
#include "transport/ucx/ucx_pool.h"
#include "transport/ucx/ucx_wake.h"
#include "transport/ucx/ucx_worker.h"

namespace dyad::ucx {

struct Resources {
  explicit Resources(const TransportOptions& options);
  // Stops the progress thread, then releases mappings, endpoints and
  // buffers before the worker and context go.
  ~Resources();
  Resources(const Resources&) = delete;
  Resources& operator=(const Resources&) = delete;

  const TransportOptions options;
  Worker worker;  // first: destroyed last
  EndpointCache endpoints{worker};
  DirectPeers direct{worker};
  BufferPool recv_pool;  // requesters'
  BufferPool send_pool;  // owners'

 private:
  Resources(const TransportOptions& options, int pool_buffers);
};

// How long a buffer rests after a failed transfer left a request on it that
// UCX did not give back: the peer stops within its own idle bound.
int64_t FailureRestMs(int64_t idle_ms);

// What both ends' transfers share: the session (read only with
// Channel::RecvFrameNow, so a frame is taken whole or not at all), the
// transfer's wake fd, and its waits on the peer. A transfer is one
// straight-line coroutine on the service's runtime (Transport::Pull, Push)
// holding one of these (or a derived struct) as a local: its destructor
// runs also when the coroutine's frame is destroyed at a wait (the runtime
// shutting down), which is where cleanup that must happen belongs.
class Transfer {
 protected:
  Transfer(Resources& r, Channel& session, TransferWaits& waits, const char* idle_what)
      : r_(r), session_(session), waits_(waits), idle_(r.options.idle_ms), idle_what_(idle_what) {}
  ~Transfer() = default;
  Transfer(const Transfer&) = delete;
  Transfer& operator=(const Transfer&) = delete;

  // Starts the worker and the wake fd (transfers that use UCX requests).
  Status StartWake();
  // The session's next frame if it is all there (true: `*type`, frame_).
  Result<bool> RecvNow(uint16_t* type);
  Deadline Idle() const { return IdleDeadline(r_.options.idle_ms); }
  // Waits until the session or the wake fd is readable, then drains the
  // wake fd and drives the worker briefly (never waiting), so the caller
  // looks again at its requests and the session. `moved` (bytes so far;
  // on the owner credits count too) restarts the idle bound when it
  // advanced. Fails with DYAD_RC_TIMEOUT ("<idle_what> for N ms") once the
  // bound passed without progress, or with the Stop's reason (the
  // requester hung up, the service stops). `for_buffer`: the wait is for a
  // pool buffer, whose rest may end without any wake-up: cut into slices
  // (ucx_transport.cc says why).
  Task<Status> ForPeer(uint64_t moved, bool for_buffer = false);

  Resources& r_;
  Channel& session_;
  TransferWaits& waits_;
  std::unique_ptr<WakeFd> wake_;
  std::string frame_;  // the last frame RecvNow completed

 private:
  IdleBound idle_;
  const char* const idle_what_;
  Channel::PartialFrame partial_;
};

// The owner's side of a fetch (Transport::Push): moves `src` to the
// requester whose transport arguments are `request_args`.
Task<Status> PushFile(Resources& r, Channel& session, const FileSource& src,
                      std::string request_args, TransferStats* stats, TransferWaits& waits);

// The requester's side of a fetch (Transport::Pull): lands `size` bytes in
// `sink_fd`.
Task<Status> PullFile(Resources& r, Channel& session, uint64_t size, int sink_fd,
                      TransferStats* stats, TransferWaits& waits);

}  // namespace dyad::ucx
