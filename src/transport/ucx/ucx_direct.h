// ucx_direct.h: the memory side of the same-host direct path.
//
// When owner and requester share a host and UCX has shared memory, the
// owner maps the requester's receive buffer (UCX allocated it from shared
// memory; its packed remote key names the segment) and reads file chunks
// straight into it. DirectPeers keeps, per requester worker address, an
// endpoint whose lanes are all shared memory (used only to unpack keys,
// never for traffic) and the keys mapped through it, checks every mapped
// range against /proc/self/maps, and unmaps idle, surplus or failed
// requesters. See docs/ucx.md, "Same-host direct path".
//
// Thread-safe: all state is guarded by the worker's mutex. A requester's
// mappings are destroyed only once no transfer writes through them.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "transport/ucx/ucx_worker.h"

namespace dyad::ucx {

class DirectPeers {
 public:
  struct Peer;

  // One transfer's use of one of a requester's buffers, mapped here.
  // Move-only; ends the use when destroyed (as a failure unless Done(true)
  // was called).
  class Mapping {
   public:
    Mapping(DirectPeers* owner, std::string address, std::shared_ptr<Peer> peer, char* ptr)
        : owner_(owner), address_(std::move(address)), peer_(std::move(peer)), ptr_(ptr) {}
    Mapping(Mapping&& o) noexcept = default;
    Mapping(const Mapping&) = delete;
    Mapping& operator=(const Mapping&) = delete;
    Mapping& operator=(Mapping&&) = delete;
    ~Mapping() { Done(false); }

    // The buffer's first byte, in this process.
    char* ptr() const { return ptr_; }
    // Ends the use. After a failure the requester's mappings are dropped
    // (it may have died or restarted), once no transfer uses them.
    void Done(bool ok);

   private:
    DirectPeers* owner_;
    std::string address_;
    std::shared_ptr<Peer> peer_;
    char* ptr_;
  };

  explicit DirectPeers(Worker& worker) : worker_(worker) {}
  ~DirectPeers();
  DirectPeers(const DirectPeers&) = delete;
  DirectPeers& operator=(const DirectPeers&) = delete;

  // Maps [base, base + len) of the requester at worker `address`, described
  // by the packed remote key `rkey`. Fails (NOTSUP) when there is no
  // shared-memory path to it, which is remembered; BADUNPACK when the range
  // is not one shared mapping here.
  Result<Mapping> Map(const std::string& address, const std::string& rkey, uint64_t base,
                      uint64_t len);

  // Unmaps idle and surplus requesters, but never `keep` (the progress
  // thread's housekeeping; worker mutex held).
  void TrimLocked(const Peer* keep = nullptr) REQUIRES(worker_.mu());

  // Unmaps everything (teardown, progress thread stopped).
  void Clear();

 private:
  struct MappedKey;
  Result<std::shared_ptr<Peer>> PeerLocked(const std::string& address) REQUIRES(worker_.mu());
  Result<MappedKey*> KeyLocked(Peer& peer, const std::string& rkey) REQUIRES(worker_.mu());
  Result<ucp_ep_h> SharedMemoryEndpointLocked(const std::string& address) REQUIRES(worker_.mu());
  Status NotMappableLocked(const std::string& address, const Status& st) REQUIRES(worker_.mu());
  void ReleaseLocked(const std::string& address, const std::shared_ptr<Peer>& peer, bool failed)
      REQUIRES(worker_.mu());
  void DestroyLocked(Peer& peer) REQUIRES(worker_.mu());

  Worker& worker_;
  std::map<std::string, std::shared_ptr<Peer>> peers_
      GUARDED_BY(worker_.mu());                                       // by worker address
  std::set<std::shared_ptr<Peer>> retired_ GUARDED_BY(worker_.mu());  // destroyed at last release
  std::set<std::string> unmappable_
      GUARDED_BY(worker_.mu());  // addresses without a shared-memory path
};

}  // namespace dyad::ucx
