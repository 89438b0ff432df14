#include "transport/ucx/ucx_endpoints.h"

#include <cstring>
#include <mutex>

#include "common/log.h"
#include "common/thread_annotations.h"

namespace dyad::ucx {

void EndpointCache::Ref::Release() {
  if (cache_ != nullptr) cache_->ReleaseEndpoint(ep_);
  cache_ = nullptr;
}

Result<EndpointCache::Ref> EndpointCache::Get(const std::string& address) {
  MutexLock lk(worker_.mu());
  auto it = eps_.find(address);
  if (it != eps_.end()) {
    if (failed_.count(it->second) == 0) {
      ++users_[it->second];
      return Ref(this, it->second);
    }
    const ucp_ep_h failed = it->second;
    eps_.erase(it);
    RetireLocked(failed);
  }
  ucp_ep_params_t p;
  std::memset(&p, 0, sizeof(p));
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                 UCP_EP_PARAM_FIELD_ERR_HANDLER;
  p.address = reinterpret_cast<const ucp_address_t*>(address.data());
  p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  p.err_handler.cb = &EndpointCache::OnError;
  p.err_handler.arg = this;
  ucp_ep_h ep = nullptr;
  ucs_status_t s = ucp_ep_create(worker_.handle(), &p, &ep);
  if (s != UCS_OK) return UcxStatus(DYAD_RC_UCXEP_FAIL, "ucp_ep_create", s);
  eps_[address] = ep;
  ++users_[ep];
  return Ref(this, ep);
}

void EndpointCache::ReleaseEndpoint(ucp_ep_h ep) {
  MutexLock lk(worker_.mu());
  auto it = users_.find(ep);
  if (it == users_.end() || --it->second > 0) return;
  users_.erase(it);
  if (retired_.erase(ep) != 0) CloseLocked(ep);
}

void EndpointCache::Evict(const std::string& address, ucp_ep_h ep) {
  MutexLock lk(worker_.mu());
  auto it = eps_.find(address);
  if (it == eps_.end() || it->second != ep) return;
  eps_.erase(it);
  RetireLocked(ep);
}

Result<void*> EndpointCache::StartSend(ucp_ep_h ep, const void* buf, size_t len, uint64_t tag,
                                       const WakeFd* wake) {
  ucp_request_param_t p;
  std::memset(&p, 0, sizeof(p));
  if (wake != nullptr) wake->ForSend(&p);
  MutexLock lk(worker_.mu());
  if (failed_.count(ep) != 0)
    return Status(DYAD_RC_CONNLOST, "ucx endpoint to the requester failed");
  ucs_status_ptr_t r = ucp_tag_send_nbx(ep, buf, len, tag, &p);
  if (UCS_PTR_IS_ERR(r)) {
    const ucs_status_t s = UCS_PTR_STATUS(r);
    return UcxStatus(CodeForUcs(s), "ucp_tag_send_nbx", s);
  }
  return static_cast<void*>(r);
}

void EndpointCache::Clear() {
  MutexLock lk(worker_.mu());
  for (auto& [address, ep] : eps_) CloseLocked(ep);
  for (ucp_ep_h ep : retired_) CloseLocked(ep);
  eps_.clear();
  retired_.clear();
  users_.clear();
}

void EndpointCache::OnError(void* arg, ucp_ep_h ep, ucs_status_t status) {
  // Called from ucp_worker_progress, so the worker's mutex is already held.
  auto* self = static_cast<EndpointCache*>(arg);
  self->worker_.mu().AssertHeld();
  DYAD_LOG_DEBUG("ucx: endpoint error: %s", ucs_status_string(status));
  self->failed_.insert(ep);
}

void EndpointCache::RetireLocked(ucp_ep_h ep) {
  if (users_.count(ep) != 0) {
    retired_.insert(ep);
  } else {
    CloseLocked(ep);
  }
}

void EndpointCache::CloseLocked(ucp_ep_h ep) {
  failed_.erase(ep);
  worker_.CloseEndpointLocked(ep, /*force=*/true);
}

}  // namespace dyad::ucx
