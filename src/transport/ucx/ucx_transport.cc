#include "transport/ucx/ucx_transport.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <thread>

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

Result<bool> UcxOp::Step() {
  if (wake_) {
    wake_->Drain();
    busy_ = r_.worker.ProgressBriefly();
  }
  return StepStages();
}

Status UcxOp::StartWake() {
  DYAD_RETURN_IF_ERROR(r_.worker.Start());
  Result<std::unique_ptr<WakeFd>> wake = WakeFd::Create();
  if (!wake.ok()) return wake.status();
  wake_ = std::move(wake).value();
  return Status::OK();
}

Result<bool> UcxOp::RecvNow(uint16_t* type) {
  Result<bool> got = session_.RecvFrameNow(&partial_, type, &frame_);
  if (got.ok() && *got) partial_.Reset();
  return got;
}

namespace {

// How long DriveOp keeps stepping after the worker last moved before it
// sleeps: over tcp each progress call moves about one segment, and a
// sleep between calls (even a millisecond) caps a transfer at a few
// hundred MB/s.
constexpr auto kSpin = std::chrono::microseconds(500);

// Sleeps until the session or `wake_fd` is readable, at most until
// `deadline` and 100 ms (so a stop is never missed for long).
void SleepUntilReadable(Channel& session, int wake_fd, Deadline deadline) {
  int64_t ms = 100;
  if (!deadline.never()) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline.time_point() -
                                                                            SteadyClock::now());
    ms = std::clamp<int64_t>(left.count() + 1, 0, ms);
  }
  pollfd p[2] = {{session.fd(), POLLIN, 0}, {wake_fd, POLLIN, 0}};
  (void)::poll(p, 2, static_cast<int>(ms));  // a negative fd is ignored
}

}  // namespace

Status DriveOp(Channel& session, UcxOp& op) {
  using Clock = std::chrono::steady_clock;
  uint64_t last = op.moved();
  Deadline idle = IdleDeadline(op.idle_ms());
  auto spin_until = Clock::now() + kSpin;
  for (;;) {
    Result<bool> r = op.Step();
    if (!r.ok()) return r.status();
    if (*r) return Status::OK();
    if (op.moved() != last) {
      last = op.moved();
      idle = IdleDeadline(op.idle_ms());
    }
    if (op.busy()) spin_until = Clock::now() + kSpin;
    if (Clock::now() < spin_until) {
      std::this_thread::yield();
      continue;
    }
    if (idle.expired())
      return op.Fail(
          Status(DYAD_RC_TIMEOUT, "no progress for " + std::to_string(op.idle_ms()) + " ms"));
    SleepUntilReadable(session, op.wake_fd(), idle);
    spin_until = Clock::now() + kSpin;
  }
}

}  // namespace ucx

UcxTransport::UcxTransport(const TransportOptions& options)
    : resources_(std::make_unique<ucx::Resources>(options)) {}

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

std::unique_ptr<PushOp> UcxTransport::StartPush(Channel& session, const FileSource& src,
                                                const std::string& request_args,
                                                TransferStats* stats) {
  return ucx::StartPushOp(*resources_, session, src, request_args, stats);
}

std::unique_ptr<PullOp> UcxTransport::StartPull(Channel& session, uint64_t size,
                                                const std::string& reply_args, int sink_fd,
                                                TransferStats* stats) {
  (void)reply_args;  // the owner's reply carries nothing for this transport
  return ucx::StartPullOp(*resources_, session, size, sink_fd, stats);
}

// Push and Pull are their ops run on this thread: one implementation each.
Status UcxTransport::Push(Channel& session, const FileSource& src, const std::string& request_args,
                          TransferStats* stats) {
  TransferStats local_stats;
  std::unique_ptr<PushOp> op =
      StartPush(session, src, request_args, stats != nullptr ? stats : &local_stats);
  return ucx::DriveOp(session, static_cast<ucx::UcxOp&>(*op));
}

Status UcxTransport::Pull(Channel& session, uint64_t size, const std::string& reply_args,
                          int sink_fd, TransferStats* stats) {
  TransferStats local_stats;
  std::unique_ptr<PullOp> op =
      StartPull(session, size, reply_args, sink_fd, stats != nullptr ? stats : &local_stats);
  return ucx::DriveOp(session, static_cast<ucx::UcxOp&>(*op));
}

DYAD_DEFINE_TRANSPORT_FACTORY(ucx, UcxTransport)

}  // namespace dyad
