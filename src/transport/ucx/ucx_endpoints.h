// ucx_endpoints.h: the owner's endpoints to requesters' workers, cached by
// worker address bytes (a restarted peer has a new address, hence a new
// entry), with peer error handling, and the tagged sends made on them.
//
// An endpoint that reports an error, or whose transfer failed, is evicted
// and force-closed once no transfer uses it any more, which also fails
// whatever it still has outstanding; a handle another thread holds never
// dangles. Thread-safe: all state is guarded by the worker's mutex.
#pragma once

#include <ucp/api/ucp.h>

#include <map>
#include <set>
#include <string>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "transport/ucx/ucx_worker.h"

namespace dyad::ucx {

class EndpointCache {
 public:
  // One transfer's use of a cached endpoint; gives it back when destroyed.
  class Ref {
   public:
    Ref(EndpointCache* cache, ucp_ep_h ep) : cache_(cache), ep_(ep) {}
    Ref(Ref&& o) noexcept : cache_(o.cache_), ep_(o.ep_) { o.cache_ = nullptr; }
    Ref(const Ref&) = delete;
    Ref& operator=(const Ref&) = delete;
    Ref& operator=(Ref&&) = delete;
    ~Ref() { Release(); }
    ucp_ep_h get() const { return ep_; }
    void Release();

   private:
    EndpointCache* cache_;
    ucp_ep_h ep_;
  };

  explicit EndpointCache(Worker& worker) : worker_(worker) {}
  EndpointCache(const EndpointCache&) = delete;
  EndpointCache& operator=(const EndpointCache&) = delete;

  // The cached endpoint to the worker at `address`, created on first use.
  Result<Ref> Get(const std::string& address);

  // Drops `ep` from the cache (if it is still the entry for `address`); it
  // is force-closed when its last user releases it.
  void Evict(const std::string& address, ucp_ep_h ep);

  // Starts a tagged send of `len` bytes at `buf`. Returns the request, or
  // nullptr when the send completed at once; a later completion makes
  // `wake` readable when given.
  Result<void*> StartSend(ucp_ep_h ep, const void* buf, size_t len, uint64_t tag,
                          const WakeFd* wake = nullptr);

  // Force-closes every endpoint (teardown, progress thread stopped).
  void Clear();

 private:
  static void OnError(void* arg, ucp_ep_h ep, ucs_status_t status);
  void ReleaseEndpoint(ucp_ep_h ep);
  void RetireLocked(ucp_ep_h ep) REQUIRES(worker_.mu());
  void CloseLocked(ucp_ep_h ep) REQUIRES(worker_.mu());

  Worker& worker_;
  std::map<std::string, ucp_ep_h> eps_ GUARDED_BY(worker_.mu());  // by worker address
  std::set<ucp_ep_h> failed_ GUARDED_BY(worker_.mu());            // reported an error
  std::map<ucp_ep_h, int> users_ GUARDED_BY(worker_.mu());        // transfers holding each endpoint
  std::set<ucp_ep_h> retired_ GUARDED_BY(worker_.mu());  // out of the cache, closed at last release
};

}  // namespace dyad::ucx
