// ucx_transfer.h: what one UcxTransport instance owns and all its transfers
// share (Resources), and the two state machines that move a file with them:
// PushFile on the owner (ucx_push.cc) and PullFile on the requester
// (ucx_pull.cc). Each transfer runs on its caller's thread and uses its
// session only from that thread; Resources are thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "common/net.h"
#include "common/status.h"
#include "transport/transport.h"
#include "transport/ucx/ucx_direct.h"
#include "transport/ucx/ucx_endpoints.h"
#include "transport/ucx/ucx_pool.h"
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

// The owner's side of a fetch (Transport::Push).
Status PushFile(Resources& r, Channel& session, const FileSource& src,
                const std::string& request_args, TransferStats* stats);

// The requester's side of a fetch (Transport::Pull).
Status PullFile(Resources& r, Channel& session, uint64_t size, int sink_fd, TransferStats* stats);

}  // namespace dyad::ucx
