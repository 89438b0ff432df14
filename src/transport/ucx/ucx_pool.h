// ucx_pool.h: the UCX transport's registered transfer memory.
//
// RegisteredMemory is one buffer registered with the worker's context (its
// memory handle and packed remote key), released when destroyed. A
// BufferPool maps such buffers lazily, at most a set number, and hands them
// to transfers as BufferLeases; a lease gives its buffer back when the
// transfer ends, after a rest when the transfer failed and UCX may still
// write into it. Owners use the send pool and requesters the receive pool,
// so an owner never waits for buffers held by requesters (which could
// otherwise wait on each other across services).
//
// Thread-safe. Lock order: a pool's mutex before the worker's, never the
// reverse; waiting transfers' wake fds (ucx_wake.h) are signalled after the
// pool's mutex is released. Every buffer must be released before the
// worker is destroyed.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/time.h"
#include "transport/ucx/ucx_wake.h"
#include "transport/ucx/ucx_worker.h"

namespace dyad::ucx {

// Slots per registered buffer: up to this many chunks of one transfer are
// in flight at once.
constexpr int kSlots = 4;

// Slot size for a transport's chunk size: a buffer is 2 x chunk_size bytes
// cut into kSlots slots, one message each.
size_t SlotBytes(size_t chunk_size);

class RegisteredMemory {
 public:
  // `len` bytes allocated by UCX (ucp_mem_map with UCP_MEM_MAP_ALLOCATE),
  // which takes them from shared memory when it can, so that a same-host
  // peer can map them.
  static Result<std::unique_ptr<RegisteredMemory>> Allocate(Worker& worker, size_t len);
  // `len` bytes of anonymous memory mapped here, then registered.
  static Result<std::unique_ptr<RegisteredMemory>> MapAnonymous(Worker& worker, size_t len);

  ~RegisteredMemory();
  RegisteredMemory(const RegisteredMemory&) = delete;
  RegisteredMemory& operator=(const RegisteredMemory&) = delete;

  char* base() const { return base_; }
  size_t length() const { return len_; }
  // What a peer needs to reach this memory (ucp_rkey_pack).
  const std::string& packed_key() const { return rkey_; }
  // Allocated by UCX (see Allocate): the only kind a same-host owner may map.
  bool ucx_allocated() const { return ucx_allocated_; }

 private:
  RegisteredMemory(Worker& worker, char* base, size_t len, ucp_mem_h memh, std::string rkey,
                   bool ucx_allocated)
      : worker_(worker),
        base_(base),
        len_(len),
        memh_(memh),
        rkey_(std::move(rkey)),
        ucx_allocated_(ucx_allocated) {}

  Worker& worker_;
  char* const base_;
  const size_t len_;
  ucp_mem_h const memh_;
  const std::string rkey_;
  const bool ucx_allocated_;
};

class BufferPool;

// One transfer's use of a pool buffer (move-only). When destroyed it gives
// the buffer back: at once after MarkOk(), otherwise after a rest, since a
// request of the failed transfer may still write into it.
class BufferLease {
 public:
  BufferLease(BufferPool* pool, RegisteredMemory* mem, int64_t rest_ms)
      : pool_(pool), mem_(mem), rest_ms_(rest_ms) {}
  BufferLease(BufferLease&& o) noexcept;
  BufferLease(const BufferLease&) = delete;
  BufferLease& operator=(const BufferLease&) = delete;
  BufferLease& operator=(BufferLease&&) = delete;
  ~BufferLease();

  RegisteredMemory& memory() const { return *mem_; }
  void MarkOk() { ok_ = true; }
  // The owner is known to have stopped sending (it reported an error after
  // cancelling its sends, or its session is gone): only fragments already
  // on their way can still land, so a short rest is enough.
  void OwnerStopped();

 private:
  BufferPool* pool_;
  RegisteredMemory* mem_;
  int64_t rest_ms_;
  bool ok_ = false;
};

class BufferPool {
 public:
  enum class Kind { kReceive, kSend };

  BufferPool(Worker& worker, Kind kind, size_t slot_bytes, int max_buffers)
      : worker_(worker), kind_(kind), slot_bytes_(slot_bytes), max_buffers_(max_buffers) {}
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  size_t slot_bytes() const { return slot_bytes_; }
  size_t buffer_bytes() const { return kSlots * slot_bytes_; }
  int max_buffers() const { return max_buffers_; }
  size_t mapped();
  // Of those, the buffers leased now (not given back).
  size_t in_use();

  // Takes a buffer, mapping and registering a new one while the pool has
  // fewer than max_buffers(); waits (bounded) for one to come back
  // otherwise. After a failure the buffer rests `rest_ms` before reuse.
  Result<BufferLease> Acquire(Deadline deadline, int64_t rest_ms);
  // As Acquire, but never waits: no buffer now gives nullopt, and `waiter`
  // becomes readable when a buffer comes back (then try again).
  Result<std::optional<BufferLease>> TryAcquire(int64_t rest_ms, const WakeFd& waiter);

  // Maps one buffer ahead of the first transfer, with its pages touched, so
  // the first fetch finds it ready. Nothing when one is mapped already.
  Status Preallocate();

  // Releases every buffer (teardown, no transfer running).
  void Clear();

 private:
  friend class BufferLease;
  struct Entry {
    std::unique_ptr<RegisteredMemory> mem;
    bool in_use = false;
    // A buffer given back after a failed transfer is not reused before this
    // time: a request of that transfer may still be in flight.
    std::chrono::steady_clock::time_point usable_at{};
  };

  Result<std::unique_ptr<RegisteredMemory>> Map();
  Result<RegisteredMemory*> TakeOrMapLocked(std::chrono::steady_clock::time_point* wake)
      REQUIRES(mu_);
  RegisteredMemory* TakeLocked(std::chrono::steady_clock::time_point now,
                               std::chrono::steady_clock::time_point* wake, int* resting)
      REQUIRES(mu_);
  void Release(RegisteredMemory* mem, int64_t rest_ms);

  Worker& worker_;
  const Kind kind_;
  const size_t slot_bytes_;
  const int max_buffers_;
  Mutex mu_;
  std::condition_variable cv_;
  std::vector<Entry> entries_ GUARDED_BY(mu_);
  std::vector<uint64_t> waiters_
      GUARDED_BY(mu_);  // wake fd ids of transfers that found none (TryAcquire)
};

}  // namespace dyad::ucx
