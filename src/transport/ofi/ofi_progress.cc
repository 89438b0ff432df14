// The completion side of OfiFabric: the progress thread, reading the CQ,
// and posting reads (which may have to progress the provider themselves
// while it is busy setting up a connection).
#include <poll.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <type_traits>

#include "common/log.h"
#include "transport/ofi/ofi_fabric.h"

namespace dyad {
namespace {

static_assert(std::is_standard_layout<OfiOp>::value && offsetof(OfiOp, context) == 0,
              "libfabric returns &OfiOp::context as the op context");

// The progress thread re-checks for shutdown at least this often (the wake
// eventfd normally ends its sleep sooner).
constexpr int kProgressPollMs = 1000;
// Completions read per fi_cq_read, and read batches per drain before the
// lock is let go for other threads.
constexpr int kBatch = 16;
constexpr int kMaxBatches = 64;
// Polled mode (no CQ wait object) while transfers run: empty CQ reads in a
// row before the progress thread rests, and how long it rests.
constexpr int kPolledSpinRounds = 64;
constexpr int kPolledRestUs = 20;

// Errors that mean the peer, or the way to it, is gone.
dyad_rc_t CodeForFabricError(int err) {
  switch (err) {
    case FI_ECONNRESET:
    case FI_ECONNREFUSED:
    case FI_ECONNABORTED:
    case FI_ENOTCONN:
    case FI_ECANCELED:
    case FI_EHOSTUNREACH:
    case FI_ENETUNREACH:
    case FI_ESHUTDOWN:
    case EPIPE:
      return DYAD_RC_CONNLOST;
    case FI_ETIMEDOUT:
      return DYAD_RC_TIMEOUT;
    default:
      return DYAD_RC_BADFETCH;
  }
}

}  // namespace

dyad_rc_t OfiFabricErrorCode(int err) { return CodeForFabricError(err < 0 ? -err : err); }

void OfiFabric::ProgressLoop() {
  MutexLock lk(mu_);
  int empty_rounds = 0;
  bool progressed = true;
  while (!stopping_) {
    if (polled()) {
      // Nothing to drive while no transfer runs: a peer's read can only
      // target our memory after we announced it (an active Push).
      if (active_ == 0) {
        lk.WaitFor(active_cv_, std::chrono::milliseconds(kProgressPollMs));
        continue;
      }
      // Spin while completions come; after a run of empty reads, sleep a
      // little on the condition variable. Waiting there lets go of mu_ for
      // long enough that threads blocked on it get in: a yield alone let
      // this thread take the lock straight back, so on a busy machine a
      // transfer ending (EndActivity) or Stop() could starve for seconds.
      const bool seen = DrainLocked() > 0;
      // Completions free the provider's queue; otherwise a refused read
      // retries every kBusyRetryMs, not at the pace of this loop.
      if (!busy_fds_.empty() && (seen || std::chrono::steady_clock::now() - busy_since_ >=
                                             std::chrono::milliseconds(kBusyRetryMs)))
        SignalBusyLocked();
      if (seen) {
        empty_rounds = 0;
      } else if (++empty_rounds < kPolledSpinRounds) {
        lk.Unlock();
        std::this_thread::yield();
        lk.Lock();
      } else {
        empty_rounds = 0;
        lk.WaitFor(active_cv_, std::chrono::microseconds(kPolledRestUs));
      }
      continue;
    }
    DrainLocked();
    // The provider was progressed after a wait (not only woken by a new
    // busy read): let the busy reads retry.
    if (progressed && !busy_fds_.empty()) SignalBusyLocked();
    fid* fids[1] = {&cq_->fid};
    const bool may_block = fi_trywait(fabric_, fids, 1) == FI_SUCCESS;
    // A refused read needs the provider progressed soon even if the CQ
    // fd stays quiet (connection setup may not signal it).
    const int timeout = busy_fds_.empty() ? kProgressPollMs : kBusyRetryMs;
    lk.Unlock();
    progressed = true;
    if (may_block) {
      pollfd p[2] = {{cq_fd_, POLLIN, 0}, {wake_fd_.get(), POLLIN, 0}};
      if (::poll(p, 2, timeout) > 0 && p[1].revents != 0) {
        uint64_t v = 0;
        (void)!::read(wake_fd_.get(), &v, sizeof(v));
        progressed = p[0].revents != 0;
      }
    }
    lk.Lock();
  }
}

void OfiFabric::SignalBusyLocked() {
  const uint64_t one = 1;
  for (int fd : busy_fds_) (void)!::write(fd, &one, sizeof(one));
  busy_fds_.clear();
}

int OfiFabric::DrainLocked() {
  int seen = 0;
  fi_cq_entry entries[kBatch];
  for (int batch = 0; batch < kMaxBatches; ++batch) {
    const ssize_t n = fi_cq_read(cq_, entries, kBatch);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i)
        CompleteLocked(static_cast<OfiOp*>(entries[i].op_context), 0, 0);
      seen += static_cast<int>(n);
      continue;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry e;
      std::memset(&e, 0, sizeof(e));
      if (fi_cq_readerr(cq_, &e, 0) > 0) {
        CompleteLocked(static_cast<OfiOp*>(e.op_context), e.err != 0 ? e.err : FI_EIO,
                       e.prov_errno);
        ++seen;
      }
      continue;
    }
    if (n != -FI_EAGAIN) DYAD_LOG_DEBUG("ofi: fi_cq_read: %s", fi_strerror(static_cast<int>(-n)));
    break;
  }
  return seen;
}

void OfiFabric::CompleteLocked(OfiOp* op, int err, int prov_err) {
  if (op == nullptr) return;  // not one of ours (nothing else asks for completions)
  if (err != 0) ++read_errors_;
  op->err = err;
  op->prov_err = prov_err;
  op->state.store(OfiOp::kDone, std::memory_order_release);
  if (op->on_done != nullptr) op->on_done(op);
}

Result<bool> OfiFabric::TryRead(OfiOp* op, void* local, size_t len, void* desc, fi_addr_t peer,
                                uint64_t remote_addr, uint64_t key, int notify_fd) {
  MutexLock lk(mu_);
  if (stopping_) return Status(DYAD_RC_CANCELLED, "ofi transport is shutting down");
  op->err = 0;
  op->prov_err = 0;
  op->state.store(OfiOp::kPending, std::memory_order_relaxed);
  const ssize_t rc = fi_read(ep_, local, len, desc, peer, remote_addr, key, &op->context);
  if (rc == 0) {
    ++reads_;
    // Without a wait object nothing wakes a sleeper for this read, and a
    // provider like shm completes it at once: dispatch it now rather
    // than through the polling thread.
    if (polled()) DrainLocked();
    return true;
  }
  op->state.store(OfiOp::kIdle, std::memory_order_relaxed);
  if (rc != -FI_EAGAIN)
    return Status(CodeForFabricError(static_cast<int>(-rc)), OfiError("fi_read", rc));
  ++eagain_;
  // Busy (a connection being set up, or the queue full): progress now, and
  // have the progress thread call the transfer back after its next round.
  DrainLocked();
  if (busy_fds_.empty()) busy_since_ = std::chrono::steady_clock::now();
  if (std::find(busy_fds_.begin(), busy_fds_.end(), notify_fd) == busy_fds_.end())
    busy_fds_.push_back(notify_fd);
  if (!polled()) {
    lk.Unlock();
    const uint64_t one = 1;  // out of a long sleep on a quiet CQ
    (void)!::write(wake_fd_.get(), &one, sizeof(one));
  }
  return false;
}

void OfiFabric::CancelBusyNotify(int notify_fd) {
  MutexLock lk(mu_);
  busy_fds_.erase(std::remove(busy_fds_.begin(), busy_fds_.end(), notify_fd), busy_fds_.end());
}

void OfiFabric::BeginActivity() {
  MutexLock lk(mu_);
  if (++active_ == 1) active_cv_.notify_all();
}

void OfiFabric::EndActivity() {
  MutexLock lk(mu_);
  --active_;
}

void OfiFabric::Stop() {
  {
    MutexLock lk(mu_);
    if (stopped_) return;
    stopping_ = true;
    active_cv_.notify_all();
  }
  const uint64_t one = 1;
  if (wake_fd_.valid()) (void)!::write(wake_fd_.get(), &one, sizeof(one));
  if (progress_.joinable()) progress_.join();
  MutexLock lk(mu_);
  stopped_ = true;
}

}  // namespace dyad
