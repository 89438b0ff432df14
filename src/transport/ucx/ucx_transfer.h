// ucx_transfer.h: what one UcxTransport instance owns and all its transfers
// share (Resources), and the two state machines that move a file with them,
// as TransferOps whose Step never waits: the owner's push (ucx_push.cc) and
// the requester's pull (ucx_pull.cc). An op is used by one thread at a
// time (which may change between steps); Resources are thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/net.h"
#include "common/status.h"
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

// What both ends' transfers share: each Step drains the wake fd, drives the
// worker briefly (never waiting), then moves its state machine as far as
// the requests and the session allow. The session is read only with
// Channel::RecvFrameNow, so a Step never waits on the peer.
class UcxOp : public TransferOp {
 public:
  Result<bool> Step() final;
  int wake_fd() const override { return wake_ ? wake_->fd() : -1; }
  int64_t idle_ms() const override { return r_.options.idle_ms; }

 protected:
  UcxOp(Resources& r, Channel& session) : r_(r), session_(session) {}
  virtual Result<bool> StepStages() = 0;
  // Starts the worker and the wake fd (transfers that use UCX requests).
  Status StartWake();
  // The session's next frame if it is all there (true: `*type`, frame_).
  Result<bool> RecvNow(uint16_t* type);
  Deadline Idle() const { return IdleDeadline(r_.options.idle_ms); }

  Resources& r_;
  Channel& session_;
  std::unique_ptr<WakeFd> wake_;
  std::string frame_;  // the last frame RecvNow completed

 private:
  Channel::PartialFrame partial_;
};

// The owner's side of a fetch (Transport::StartPush).
std::unique_ptr<PushOp> StartPushOp(Resources& r, Channel& session, const FileSource& src,
                                    const std::string& request_args, TransferStats* stats);

// The requester's side of a fetch (Transport::StartPull).
std::unique_ptr<PullOp> StartPullOp(Resources& r, Channel& session, uint64_t size, int sink_fd,
                                    TransferStats* stats);

}  // namespace dyad::ucx
