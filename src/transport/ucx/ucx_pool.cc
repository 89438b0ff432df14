#include "transport/ucx/ucx_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/log.h"
#include "common/thread_annotations.h"

namespace dyad::ucx {
namespace {

// Used when options.chunk_size is 0 (a misconfiguration, not a reason to fail).
constexpr size_t kDefaultChunk = 4u << 20;
// Rest of a receive buffer after a failed transfer whose owner is known to
// have stopped sending (see BufferLease::OwnerStopped).
constexpr int64_t kShortRestMs = 1000;

}  // namespace

size_t SlotBytes(size_t chunk_size) {
  const size_t chunk = chunk_size > 0 ? chunk_size : kDefaultChunk;
  return std::max<size_t>(4096, 2 * chunk / kSlots);
}

// ---- RegisteredMemory.

namespace {

// The packed remote key of `memh`, with the worker's mutex held.
ucs_status_t PackKeyLocked(ucp_context_h context, ucp_mem_h memh, std::string* rkey) {
  void* packed = nullptr;
  size_t packed_len = 0;
  const ucs_status_t s = ucp_rkey_pack(context, memh, &packed, &packed_len);
  if (s != UCS_OK) return s;
  rkey->assign(static_cast<const char*>(packed), packed_len);
  ucp_rkey_buffer_release(packed);
  return UCS_OK;
}

}  // namespace

Result<std::unique_ptr<RegisteredMemory>> RegisteredMemory::Allocate(Worker& worker, size_t len) {
  ucp_mem_map_params_t mp;
  std::memset(&mp, 0, sizeof(mp));
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
  mp.length = len;
  mp.flags = UCP_MEM_MAP_ALLOCATE;
  MutexLock lk(worker.mu());
  ucp_mem_h memh = nullptr;
  ucs_status_t s = ucp_mem_map(worker.context(), &mp, &memh);
  if (s != UCS_OK) return UcxStatus(DYAD_RC_UCXMMAP_FAIL, "ucp_mem_map (allocate)", s);
  ucp_mem_attr_t attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
  s = ucp_mem_query(memh, &attr);
  if (s == UCS_OK && attr.length < len) s = UCS_ERR_NO_MEMORY;
  std::string rkey;
  if (s == UCS_OK) s = PackKeyLocked(worker.context(), memh, &rkey);
  if (s != UCS_OK) {
    ucp_mem_unmap(worker.context(), memh);
    return UcxStatus(DYAD_RC_UCXMMAP_FAIL, "ucp_mem_query/ucp_rkey_pack", s);
  }
  return std::unique_ptr<RegisteredMemory>(new RegisteredMemory(
      worker, static_cast<char*>(attr.address), len, memh, std::move(rkey), true));
}

Result<std::unique_ptr<RegisteredMemory>> RegisteredMemory::MapAnonymous(Worker& worker,
                                                                         size_t len) {
  void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) return StatusFromErrno(errno, "mmap ucx transfer buffer");
  ucp_mem_map_params_t mp;
  std::memset(&mp, 0, sizeof(mp));
  mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
  mp.address = p;
  mp.length = len;
  Status st;
  ucp_mem_h memh = nullptr;
  std::string rkey;
  {
    MutexLock lk(worker.mu());
    ucs_status_t s = ucp_mem_map(worker.context(), &mp, &memh);
    if (s != UCS_OK) {
      st = UcxStatus(DYAD_RC_UCXMMAP_FAIL, "ucp_mem_map", s);
    } else if ((s = PackKeyLocked(worker.context(), memh, &rkey)) != UCS_OK) {
      ucp_mem_unmap(worker.context(), memh);
      st = UcxStatus(DYAD_RC_UCXRKEY_PACK_FAILED, "ucp_rkey_pack", s);
    }
  }
  if (!st.ok()) {
    ::munmap(p, len);
    return st;
  }
  return std::unique_ptr<RegisteredMemory>(
      new RegisteredMemory(worker, static_cast<char*>(p), len, memh, std::move(rkey), false));
}

RegisteredMemory::~RegisteredMemory() {
  {
    MutexLock lk(worker_.mu());
    ucp_mem_unmap(worker_.context(), memh_);
  }
  if (!ucx_allocated_) ::munmap(base_, len_);
}

// ---- BufferLease.

BufferLease::BufferLease(BufferLease&& o) noexcept
    : pool_(o.pool_), mem_(o.mem_), rest_ms_(o.rest_ms_), ok_(o.ok_) {
  o.pool_ = nullptr;
}

BufferLease::~BufferLease() {
  if (pool_ != nullptr) pool_->Release(mem_, ok_ ? 0 : rest_ms_);
}

void BufferLease::OwnerStopped() { rest_ms_ = kShortRestMs; }

// ---- BufferPool.

size_t BufferPool::mapped() {
  MutexLock lk(mu_);
  return entries_.size();
}

size_t BufferPool::in_use() {
  MutexLock lk(mu_);
  return static_cast<size_t>(
      std::count_if(entries_.begin(), entries_.end(), [](const Entry& e) { return e.in_use; }));
}

// A free buffer, or a new one while the pool may grow; null otherwise
// (`*wake`: when a resting buffer becomes usable).
Result<RegisteredMemory*> BufferPool::TakeOrMapLocked(std::chrono::steady_clock::time_point* wake) {
  const auto now = std::chrono::steady_clock::now();
  int resting = 0;
  if (RegisteredMemory* m = TakeLocked(now, wake, &resting)) return m;
  // Buffers resting after a failure do not count against the pool (so
  // failures cannot starve later transfers), up to twice its size.
  const int limit = max_buffers_ + std::min(resting, max_buffers_);
  if (static_cast<int>(entries_.size()) >= limit) return static_cast<RegisteredMemory*>(nullptr);
  Result<std::unique_ptr<RegisteredMemory>> made = Map();
  if (!made.ok()) return made.status();
  entries_.push_back(Entry{std::move(made).value(), true, {}});
  return entries_.back().mem.get();
}

Result<BufferLease> BufferPool::Acquire(Deadline deadline, int64_t rest_ms) {
  MutexLock lk(mu_);
  for (;;) {
    auto wake = std::chrono::steady_clock::time_point::max();
    Result<RegisteredMemory*> m = TakeOrMapLocked(&wake);
    if (!m.ok()) return m.status();
    if (*m != nullptr) return BufferLease(this, *m, rest_ms);
    if (deadline.expired())
      return Status(DYAD_RC_TIMEOUT, std::string("all ") + std::to_string(max_buffers_) +
                                         " registered " +
                                         (kind_ == Kind::kReceive ? "receive" : "send") +
                                         " buffers stayed busy (DYAD_UCX_POOL_BUFFERS)");
    const auto now = std::chrono::steady_clock::now();
    auto until = now + std::chrono::milliseconds(deadline.RemainingMs(1000));
    lk.WaitUntil(cv_, std::min(until, wake));
  }
}

Result<std::optional<BufferLease>> BufferPool::TryAcquire(int64_t rest_ms, const WakeFd& waiter) {
  MutexLock lk(mu_);
  auto wake = std::chrono::steady_clock::time_point::max();
  Result<RegisteredMemory*> m = TakeOrMapLocked(&wake);
  if (!m.ok()) return m.status();
  if (*m != nullptr) return std::optional<BufferLease>(BufferLease(this, *m, rest_ms));
  if (std::find(waiters_.begin(), waiters_.end(), waiter.id()) == waiters_.end())
    waiters_.push_back(waiter.id());
  return std::optional<BufferLease>();
}

// A free buffer whose rest is over, marked in use; else null, with the
// earliest end of a rest in *wake and the number of resting buffers.
RegisteredMemory* BufferPool::TakeLocked(std::chrono::steady_clock::time_point now,
                                         std::chrono::steady_clock::time_point* wake,
                                         int* resting) {
  for (Entry& e : entries_) {
    if (e.in_use) continue;
    if (e.usable_at <= now) {
      e.in_use = true;
      return e.mem.get();
    }
    *wake = std::min(*wake, e.usable_at);
    ++*resting;
  }
  return nullptr;
}

Status BufferPool::Preallocate() {
  MutexLock lk(mu_);
  if (!entries_.empty()) return Status::OK();
  Result<std::unique_ptr<RegisteredMemory>> made = Map();
  if (!made.ok()) return made.status();
  std::memset((*made)->base(), 0, (*made)->length());
  entries_.push_back(Entry{std::move(made).value(), false, {}});
  return Status::OK();
}

void BufferPool::Release(RegisteredMemory* mem, int64_t rest_ms) {
  std::vector<uint64_t> waiters;
  {
    MutexLock lk(mu_);
    for (Entry& e : entries_) {
      if (e.mem.get() != mem) continue;
      e.in_use = false;
      e.usable_at = std::chrono::steady_clock::now() +
                    std::chrono::milliseconds(std::max<int64_t>(0, rest_ms));
    }
    waiters.swap(waiters_);
  }
  cv_.notify_all();
  // Every waiting transfer tries again; those that lose the race wait anew.
  for (uint64_t id : waiters) WakeFd::SignalId(id);
}

void BufferPool::Clear() {
  MutexLock lk(mu_);
  entries_.clear();
}

// Receive buffers are allocated by UCX, which takes them from shared memory
// when it can (System V or POSIX segments), so that a same-host owner can
// map them; send buffers are plain anonymous memory.
Result<std::unique_ptr<RegisteredMemory>> BufferPool::Map() {
  if (kind_ == Kind::kReceive && worker_.shm_capable()) {
    Result<std::unique_ptr<RegisteredMemory>> m =
        RegisteredMemory::Allocate(worker_, buffer_bytes());
    if (m.ok()) return m;
    DYAD_LOG_DEBUG("ucx: %s; using anonymous memory", m.status().ToString().c_str());
  }
  return RegisteredMemory::MapAnonymous(worker_, buffer_bytes());
}

}  // namespace dyad::ucx
