#include "transport/ucx/ucx_transport.h"

#include <algorithm>

#include "transport/host_id.h"
#include "transport/ucx/ucx_config.h"
#include "transport/ucx/ucx_transfer.h"
#include "transport/ucx/ucx_wire.h"

namespace dyad {
namespace ucx {

Resources::Resources(const TransportOptions& options) : Resources(options, PoolBuffersFromEnv()) {}

Resources::Resources(const TransportOptions& options, int pool_buffers)
    : options(options),
      recv_pool(worker, BufferPool::Kind::kReceive, SlotBytes(options.chunk_size), pool_buffers),
      send_pool(worker, BufferPool::Kind::kSend, SlotBytes(options.chunk_size), pool_buffers) {
  // Run by the progress thread with worker.mu() held (`direct`'s worker is
  // `worker`, which the analysis cannot tell).
  worker.SetHousekeeping([this]() NO_THREAD_SAFETY_ANALYSIS { direct.TrimLocked(); });
}

Resources::~Resources() {
  worker.StopProgress();
  direct.Clear();
  endpoints.Clear();
  worker.DrainCloses();
  recv_pool.Clear();
  send_pool.Clear();
}

int64_t FailureRestMs(int64_t idle_ms) { return 2 * std::max<int64_t>(idle_ms, 1000); }

// A wait for a pool buffer is cut into slices of at most this much: a
// buffer resting after a failed transfer becomes usable when its rest ends,
// and nothing signals that (the pool makes waiters' wake fds readable only
// when a transfer gives a buffer back). Every other wait ends on a signal:
// bytes or a hang-up on the session, or the completion of one of the
// transfer's UCX requests, whose callback the progress thread runs within
// 100 ms even when the worker's event fd says nothing (ucx_worker.cc).
constexpr int64_t kBufferSliceMs = 1000;

Task<Status> Transfer::ForPeer(uint64_t moved, bool for_buffer) {
  idle_.Saw(moved);
  const int wake = wake_ ? wake_->fd() : -1;
  Status st =
      co_await waits_.ForPeer(session_, idle_, idle_what_, wake, for_buffer ? kBufferSliceMs : 0);
  if (st.ok() && wake_) {
    // Before the caller looks at its requests: a completion after this
    // makes the fd readable anew.
    wake_->Drain();
    (void)r_.worker.ProgressBriefly();
  }
  co_return st;
}

Status Transfer::StartWake() {
  DYAD_RETURN_IF_ERROR(r_.worker.Start());
  Result<std::unique_ptr<WakeFd>> wake = WakeFd::Create();
  if (!wake.ok()) return wake.status();
  wake_ = std::move(wake).value();
  return Status::OK();
}

Result<bool> Transfer::RecvNow(uint16_t* type) {
  Result<bool> got = session_.RecvFrameNow(&partial_, type, &frame_);
  if (got.ok() && *got) partial_.Reset();
  return got;
}

}  // namespace ucx

UcxTransport::UcxTransport(const TransportOptions& options)
    : Transport(options), resources_(std::make_unique<ucx::Resources>(options)) {}

UcxTransport::~UcxTransport() = default;

// "same-host direct path on; messages all eager (no RMA network); buffers
// mapped: 1 receive, 1 send of 8388608 bytes (at most 4 each)"
std::string UcxTransport::Details() const {
  ucx::Resources& r = *resources_;
  if (!r.worker.started()) return "not started";
  std::string d = std::string("same-host direct path ") +
                  (!r.worker.shm_capable()   ? "unavailable (no shared memory in UCX_TLS)"
                   : ucx::ShmDirectAllowed() ? "on"
                                             : "off (DYAD_UCX_SHM)");
  d += r.worker.eager_only() ? "; messages all eager (no RMA network)"
                             : "; messages eager, large ones by rendezvous RMA";
  d += "; buffers mapped: " + std::to_string(r.recv_pool.mapped()) + " receive, " +
       std::to_string(r.send_pool.mapped()) + " send of " +
       std::to_string(r.recv_pool.buffer_bytes()) + " bytes (at most " +
       std::to_string(r.recv_pool.max_buffers()) + " each)";
  return d;
}

// The service calls this at start, so that the first fetch finds the
// context, the worker and one buffer of each pool (pages touched) ready.
Status UcxTransport::Warm() {
  DYAD_RETURN_IF_ERROR(resources_->worker.Start());
  DYAD_RETURN_IF_ERROR(resources_->recv_pool.Preallocate());
  return resources_->send_pool.Preallocate();
}

Result<std::string> UcxTransport::PrepareRequest() {
  DYAD_RETURN_IF_ERROR(resources_->worker.Start());
  return ucx::EncodeRequestArgs({resources_->worker.address(), SameHostId()});
}

Task<Status> UcxTransport::Push(Channel& session, const FileSource& src,
                                const std::string& request_args, TransferStats* stats,
                                TransferWaits& waits) {
  return ucx::PushFile(*resources_, session, src, request_args, stats, waits);
}

Task<Status> UcxTransport::Pull(Channel& session, uint64_t size, const std::string& reply_args,
                                int sink_fd, TransferStats* stats, TransferWaits& waits) {
  (void)reply_args;  // the owner's reply carries nothing for this transport
  return ucx::PullFile(*resources_, session, size, sink_fd, stats, waits);
}

DYAD_DEFINE_TRANSPORT_FACTORY(ucx, UcxTransport)

}  // namespace dyad
