#include "transport/ofi/ofi_pool.h"

#include <rdma/fi_domain.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "common/log.h"
#include "common/wire.h"

namespace dyad {
namespace {

void SignalEventFd(int fd) {
  const uint64_t one = 1;
  (void)!::write(fd, &one, sizeof(one));
}

// Runs on the thread that read the completion, under the fabric's lock.
void OnReadDone(OfiOp* op) {
  auto* b = static_cast<OfiBuffer*>(op->owner);
  b->Notify();
  if (b->in_flight.fetch_sub(1, std::memory_order_acq_rel) == 1) b->pool->Wake();
}

std::string Mib(size_t bytes) {
  return bytes % (1u << 20) == 0 ? std::to_string(bytes >> 20) + " MiB"
                                 : std::to_string(bytes) + " bytes";
}

}  // namespace

OfiRegion::OfiRegion(std::shared_ptr<OfiFabric> fabric, void* addr, size_t len,
                     OfiFabric::Registration reg)
    : fabric_(std::move(fabric)), addr_(addr), len_(len), reg_(reg) {}

OfiRegion::~OfiRegion() { fabric_->Deregister(&reg_); }

std::string OfiRegion::PackedKey() const {
  Encoder e;
  e.U64(reg_.remote_base).U64(reg_.key);
  return e.Take();
}

void OfiBuffer::SetNotify(int fd) {
  MutexLock lk(notify_mu_);
  notify_fd_ = fd;
}

void OfiBuffer::Notify() {
  MutexLock lk(notify_mu_);
  if (notify_fd_ >= 0) SignalEventFd(notify_fd_);
}

OfiPool::OfiPool(std::shared_ptr<OfiFabric> fabric, Kind kind, size_t slot_bytes, int slots,
                 int max_buffers)
    : fabric_(std::move(fabric)),
      kind_(kind),
      slot_bytes_(slot_bytes),
      slots_(slots),
      max_buffers_(max_buffers) {}

OfiPool::~OfiPool() {
  // The fabric was stopped first: no completion can reach these buffers.
  for (std::unique_ptr<OfiBuffer>& b : buffers_) {
    b->region.reset();
    ::munmap(b->base, b->len);
  }
}

Result<std::unique_ptr<OfiBuffer>> OfiPool::MakeBuffer() {
  auto b = std::make_unique<OfiBuffer>();
  b->pool = this;
  b->slot_bytes = slot_bytes_;
  b->slots = slots_;
  b->len = slot_bytes_ * static_cast<size_t>(slots_);
  void* p = ::mmap(nullptr, b->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return StatusFromErrno(errno, "mmap ofi transfer buffer");
  b->base = static_cast<char*>(p);
  // Backed before registration (FI_MR_ALLOCATED), and no page faults later.
  std::memset(b->base, 0, b->len);
  const uint64_t access = kind_ == Kind::kSend ? FI_REMOTE_READ : FI_READ;
  Result<OfiFabric::Registration> reg = fabric_->Register(b->base, b->len, access);
  if (!reg.ok()) {
    ::munmap(b->base, b->len);
    return reg.status();
  }
  b->region = std::make_unique<OfiRegion>(fabric_, b->base, b->len, *reg);
  if (kind_ == Kind::kReceive) {
    b->ops = std::make_unique<OfiOp[]>(static_cast<size_t>(slots_));
    for (int i = 0; i < slots_; ++i) {
      b->ops[i].on_done = &OnReadDone;
      b->ops[i].owner = b.get();
    }
  }
  return Result<std::unique_ptr<OfiBuffer>>(std::move(b));
}

bool OfiPool::Usable(const OfiBuffer& b, std::chrono::steady_clock::time_point now) const {
  return !b.in_use && b.usable_at <= now && b.in_flight.load(std::memory_order_acquire) == 0;
}

Result<OfiBuffer*> OfiPool::TryAcquire(int notify_fd) {
  MutexLock lk(mu_);
  const auto now = std::chrono::steady_clock::now();
  int held_back = 0;
  for (std::unique_ptr<OfiBuffer>& b : buffers_) {
    if (Usable(*b, now)) {
      b->in_use = true;
      return b.get();
    }
    if (!b->in_use) ++held_back;
  }
  const int limit = max_buffers_ + std::min(held_back, kHeldBackFactor * max_buffers_);
  if (static_cast<int>(buffers_.size()) + creating_ >= limit) {
    // Busy: whoever gives one back (Release, Wake) signals the waiter.
    if (std::find(waiters_.begin(), waiters_.end(), notify_fd) == waiters_.end())
      waiters_.push_back(notify_fd);
    return static_cast<OfiBuffer*>(nullptr);
  }
  ++creating_;
  lk.Unlock();  // registration takes the fabric's lock
  Result<std::unique_ptr<OfiBuffer>> made = MakeBuffer();
  lk.Lock();
  --creating_;
  if (!made.ok()) {
    SignalWaitersLocked();  // they may count on the buffer that failed
    return made.status();
  }
  buffers_.push_back(std::move(made).value());
  buffers_.back()->in_use = true;
  return buffers_.back().get();
}

void OfiPool::CancelNotify(int notify_fd) {
  MutexLock lk(mu_);
  waiters_.erase(std::remove(waiters_.begin(), waiters_.end(), notify_fd), waiters_.end());
}

void OfiPool::SignalWaitersLocked() {
  for (int fd : waiters_) SignalEventFd(fd);
  waiters_.clear();
}

void OfiPool::Release(OfiBuffer* b, int64_t rest_ms) {
  if (kind_ == Kind::kReceive) b->SetNotify(-1);
  MutexLock lk(mu_);
  b->in_use = false;
  b->usable_at =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, rest_ms));
  SignalWaitersLocked();
}

void OfiPool::Wake() {
  MutexLock lk(mu_);
  SignalWaitersLocked();
}

Status OfiPool::Preallocate() {
  {
    MutexLock lk(mu_);
    if (!buffers_.empty() || creating_ > 0) return Status::OK();
    ++creating_;
  }
  Result<std::unique_ptr<OfiBuffer>> made = MakeBuffer();
  MutexLock lk(mu_);
  --creating_;
  if (!made.ok()) return made.status();
  buffers_.push_back(std::move(made).value());
  SignalWaitersLocked();
  return Status::OK();
}

int OfiPool::InUse() {
  MutexLock lk(mu_);
  int n = 0;
  for (const std::unique_ptr<OfiBuffer>& b : buffers_) n += b->in_use ? 1 : 0;
  return n;
}

std::string OfiPool::Describe() {
  MutexLock lk(mu_);
  int stuck = 0;
  for (const std::unique_ptr<OfiBuffer>& b : buffers_)
    stuck += !b->in_use && b->in_flight.load(std::memory_order_acquire) > 0 ? 1 : 0;
  return std::to_string(buffers_.size()) + " " + (kind_ == Kind::kSend ? "send" : "receive") +
         " of at most " + std::to_string(max_buffers_) + " buffers of " +
         Mib(slot_bytes_ * static_cast<size_t>(slots_)) + " (" + std::to_string(slots_) + " slots" +
         (stuck > 0 ? ", " + std::to_string(stuck) + " held by unfinished reads" : "") + ")";
}

}  // namespace dyad
