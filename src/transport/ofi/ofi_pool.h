// ofi_pool.h: the registered memory of the "ofi" transport.
//
// Memory is registered once, never per transfer: a pool hands out buffers
// of `slots` slots of `slot_bytes` each, creating (mapping, touching and
// registering) one only when all existing ones are busy and the pool holds
// fewer than `max_buffers`, and keeps them until the transport goes. Each
// transport has two pools, so an owner never waits for memory a requester
// holds (services fetch from each other at the same time):
//   send pool:    the owner preads file chunks into slots that requesters
//                 read remotely (registered FI_REMOTE_READ);
//   receive pool: the requester's fi_read targets (registered FI_READ), one
//                 OfiOp per slot; each completed read signals the event fd
//                 its transfer set (SetNotify), which is that transfer's
//                 wake fd (ofi_transfer.h).
// A receive buffer is reusable only once every read into it has completed
// (after a failure the provider still owns the slots until it reports each
// read: a live owner may still write them); a send buffer given back after
// a failure rests for a while, since the requester may still be reading
// it. Buffers held back that way do not count against max_buffers, up to
// kHeldBackFactor times as many: a provider that never completes the reads
// to a peer that died (shm in libfabric 1.17 can leave them pending) costs
// memory, not the service's ability to transfer.
//
// Taking a buffer never waits (TryAcquire): a transfer that finds none
// busy-free leaves an event fd, which the next Release (or a held-back
// buffer's last read completing) signals, and waits for it on the
// runtime (no thread held). A buffer resting after a failure signals no
// one when its rest ends: it only matters beyond max_buffers x (1 +
// kHeldBackFactor) buffers, and a transfer's wait looks again at least
// every OfiTransfer::kWakeSliceMs, so waiters find it then (or at the
// next release).
//
// Threading: thread-safe. Lock order: the fabric's lock (held when a read
// completes) before the pool's, never the reverse.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/net.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "common/time.h"
#include "transport/ofi/ofi_fabric.h"
#include "transport/transport.h"

namespace dyad {

// Memory registered with a fabric; deregistered when destroyed. The packed
// key is what a peer needs to read it: the remote address of its first
// byte and the key (8 bytes each, little-endian).
class OfiRegion final {
 public:
  OfiRegion(std::shared_ptr<OfiFabric> fabric, void* addr, size_t len, OfiFabric::Registration reg);
  ~OfiRegion();
  OfiRegion(const OfiRegion&) = delete;
  OfiRegion& operator=(const OfiRegion&) = delete;

  void* addr() const { return addr_; }
  size_t length() const { return len_; }
  std::string PackedKey() const;
  const OfiFabric::Registration& registration() const { return reg_; }

 private:
  std::shared_ptr<OfiFabric> fabric_;
  void* const addr_;
  const size_t len_;
  OfiFabric::Registration reg_;
};

class OfiPool;

struct OfiBuffer {
  OfiPool* pool = nullptr;
  char* base = nullptr;
  size_t len = 0;
  size_t slot_bytes = 0;
  int slots = 0;
  std::unique_ptr<OfiRegion> region;
  std::unique_ptr<OfiOp[]> ops;   // receive buffers: the read of each slot
  std::atomic<int> in_flight{0};  // reads into it not yet completed
  // Pool bookkeeping (guarded by the pool's lock).
  bool in_use = false;
  std::chrono::steady_clock::time_point usable_at{};

  char* slot(uint64_t i) { return base + (i % static_cast<uint64_t>(slots)) * slot_bytes; }
  // Receive buffers: the event fd each completed read signals (-1: none).
  // Cleared before that fd is closed; reads of a failed transfer may
  // complete long after it ended.
  void SetNotify(int fd);
  // Signals the notify fd (the completion callback; fabric's lock held).
  void Notify();

 private:
  Mutex notify_mu_;
  int notify_fd_ GUARDED_BY(notify_mu_) = -1;
};

class OfiPool {
 public:
  enum class Kind { kSend, kReceive };
  static constexpr int kHeldBackFactor = 4;

  OfiPool(std::shared_ptr<OfiFabric> fabric, Kind kind, size_t slot_bytes, int slots,
          int max_buffers);
  ~OfiPool();
  OfiPool(const OfiPool&) = delete;
  OfiPool& operator=(const OfiPool&) = delete;

  size_t slot_bytes() const { return slot_bytes_; }
  int slots() const { return slots_; }

  // A free buffer now, or null when all allowed ones are busy: `notify_fd`
  // (an event fd) is then signalled when one may have become free (once;
  // call again). Errors: a buffer could not be made.
  Result<OfiBuffer*> TryAcquire(int notify_fd);
  // Forgets a waiter registered by TryAcquire (before its fd is closed).
  void CancelNotify(int notify_fd);
  // Gives a buffer back; it is reused no sooner than `rest_ms` from now
  // (and, for receive buffers, once its reads completed).
  void Release(OfiBuffer* b, int64_t rest_ms);
  // Maps one buffer ahead of the first transfer (see OfiTransport::Warm).
  Status Preallocate();
  // "2 of at most 4 buffers of 8 MiB mapped".
  std::string Describe();
  // Buffers lent out now (TryAcquire'd, not Released).
  int InUse();

  // Wakes waiters when a released buffer's last read completed.
  void Wake();

 private:
  Result<std::unique_ptr<OfiBuffer>> MakeBuffer();
  bool Usable(const OfiBuffer& b, std::chrono::steady_clock::time_point now) const;

  std::shared_ptr<OfiFabric> fabric_;
  const Kind kind_;
  const size_t slot_bytes_;
  const int slots_;
  const int max_buffers_;

  void SignalWaitersLocked() REQUIRES(mu_);

  Mutex mu_;
  std::vector<std::unique_ptr<OfiBuffer>> buffers_ GUARDED_BY(mu_);
  std::vector<int> waiters_ GUARDED_BY(mu_);  // event fds of transfers waiting for a buffer
  int creating_ GUARDED_BY(mu_) = 0;          // buffers being registered outside the lock
};

}  // namespace dyad
