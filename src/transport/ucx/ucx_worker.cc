#include "transport/ucx/ucx_worker.h"

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "common/log.h"
#include "transport/ucx/ucx_config.h"

namespace dyad::ucx {
namespace {

// Rounds of ProgressBriefly: enough to take what arrived, short enough
// that a transfer holds its loop thread only for a moment.
constexpr int kBriefRounds = 64;
// The progress thread re-checks for shutdown at least this often.
constexpr int kProgressPollMs = 100;

// Frees the requests of `v` that completed (`req_of` gives an element's).
template <typename T, typename ReqOf>
void FreeCompleted(std::vector<T>& v, ReqOf req_of) {
  v.erase(std::remove_if(v.begin(), v.end(),
                         [&](T& e) {
                           void* r = req_of(e);
                           if (ucp_request_check_status(r) == UCS_INPROGRESS) return false;
                           ucp_request_free(r);
                           return true;
                         }),
          v.end());
}

}  // namespace

Status UcxStatus(dyad_rc_t code, const std::string& what, ucs_status_t s) {
  return Status(code, what + ": " + ucs_status_string(s));
}

dyad_rc_t CodeForUcs(ucs_status_t s) {
  switch (s) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_CANCELED:
      return DYAD_RC_CONNLOST;
    case UCS_ERR_TIMED_OUT:
      return DYAD_RC_TIMEOUT;
    default:
      return DYAD_RC_UCXCOMM_FAIL;
  }
}

Worker::~Worker() {
  StopProgress();
  DrainCloses();
  MutexLock lk(mu_);
  DestroyUcx();
}

bool Worker::started() {
  MutexLock start_lock(start_mu_);
  return started_;
}

Status Worker::Start() {
  MutexLock start_lock(start_mu_);
  if (started_) return Status::OK();
  bool eager_only = false;
  DYAD_RETURN_IF_ERROR(CreateContext(&eager_only));
  {
    // No other thread uses the worker yet; held because every use of the
    // worker is (UCS_THREAD_MODE_SERIALIZED), which the analysis checks.
    MutexLock lk(mu_);
    Status st = CreateWorker();
    if (!st.ok()) {
      DestroyUcx();
      return st;
    }
    stopping_ = false;
  }
  shm_capable_ = HasMappableMemory(context_);
  eager_only_ = eager_only;
  progress_ = std::thread([this] { ProgressLoop(); });
  started_ = true;
  DYAD_LOG_DEBUG("ucx: worker up (address %zu bytes, shared memory %s, messages %s)",
                 address_.size(), shm_capable_ ? "yes" : "no",
                 eager_only ? "all eager (no RMA network)" : "eager and rendezvous");
  return Status::OK();
}

Status Worker::CreateContext(bool* eager_only) {
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  if (s != UCS_OK) return UcxStatus(DYAD_RC_UCXINIT_FAIL, "ucp_config_read", s);
  *eager_only = TuneTcp(config);
  ucp_params_t params;
  std::memset(&params, 0, sizeof(params));
  params.field_mask = UCP_PARAM_FIELD_FEATURES;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
  s = ucp_init(&params, config, &context_);
  if (s == UCS_OK && !*eager_only && std::getenv("UCX_RNDV_THRESH") == nullptr &&
      !HasRmaNetwork(context_)) {
    // UCX_TLS allowed RMA transports, but this host has no RMA network (no
    // InfiniBand/RoCE device): messages to other hosts go over tcp, where
    // rendezvous means emulated puts (see TuneTcp). Start again with every
    // message eager.
    ucp_cleanup(context_);
    context_ = nullptr;
    s = ucp_config_modify(config, "RNDV_THRESH", "inf");
    if (s == UCS_OK) s = ucp_init(&params, config, &context_);
    *eager_only = true;
  }
  ucp_config_release(config);
  if (s != UCS_OK) {
    context_ = nullptr;
    return UcxStatus(DYAD_RC_UCXINIT_FAIL, "ucp_init", s);
  }
  return Status::OK();
}

Status Worker::CreateWorker() {
  ucp_worker_params_t wparams;
  std::memset(&wparams, 0, sizeof(wparams));
  wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // mu_ serializes every call; the library need not lock again.
  wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucs_status_t s = ucp_worker_create(context_, &wparams, &worker_);
  if (s != UCS_OK) {
    worker_ = nullptr;
    return UcxStatus(DYAD_RC_UCXINIT_FAIL, "ucp_worker_create", s);
  }
  s = ucp_worker_get_efd(worker_, &efd_);
  if (s != UCS_OK) return UcxStatus(DYAD_RC_UCXINIT_FAIL, "ucp_worker_get_efd", s);
  ucp_address_t* addr = nullptr;
  size_t addr_len = 0;
  s = ucp_worker_get_address(worker_, &addr, &addr_len);
  if (s != UCS_OK) return UcxStatus(DYAD_RC_UCXINIT_FAIL, "ucp_worker_get_address", s);
  address_.assign(reinterpret_cast<const char*>(addr), addr_len);
  ucp_worker_release_address(worker_, addr);
  return Status::OK();
}

void Worker::DestroyUcx() {
  if (worker_ != nullptr) ucp_worker_destroy(worker_);
  worker_ = nullptr;
  if (context_ != nullptr) ucp_cleanup(context_);
  context_ = nullptr;
  efd_ = -1;
}

void Worker::StopProgress() {
  {
    MutexLock lk(mu_);
    if (!progress_.joinable()) return;
    stopping_ = true;
    ucp_worker_signal(worker_);
  }
  progress_.join();
}

void Worker::DrainCloses() {
  MutexLock lk(mu_);
  const Deadline d = Deadline::AfterMs(kDrainMs);
  while (!closing_.empty() && !d.expired()) {
    ucp_worker_progress(worker_);
    ReapClosesLocked();
  }
  // Requests still not done are abandoned with the worker.
  closing_.clear();
  for (Dropping& drop : dropping_) ucp_request_free(drop.req);
  dropping_.clear();
}

// Drives the worker: progresses while there is work, then arms the event
// fd and sleeps on it (bounded, so shutdown is noticed).
void Worker::ProgressLoop() {
  MutexLock lk(mu_);
  while (!stopping_) {
    for (int i = 0; i < 256; ++i)
      if (ucp_worker_progress(worker_) == 0) break;
    ReapClosesLocked();
    DropUnexpectedLocked();
    if (housekeeping_) housekeeping_();
    const ucs_status_t s = ucp_worker_arm(worker_);
    lk.Unlock();
    if (s == UCS_ERR_BUSY) {
      std::this_thread::yield();  // more events already: progress again
    } else {
      pollfd p{efd_, POLLIN, 0};
      (void)::poll(&p, 1, hurry_.load() > 0 ? 1 : kProgressPollMs);
    }
    lk.Lock();
  }
}

void Worker::CloseEndpointLocked(ucp_ep_h ep, bool force) {
  ucp_request_param_t p;
  std::memset(&p, 0, sizeof(p));
  if (force) {
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
  }
  ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
  if (UCS_PTR_IS_PTR(r)) closing_.push_back(r);
}

void Worker::ReapClosesLocked() {
  FreeCompleted(closing_, [](void* r) { return r; });
}

// Every tagged message this worker should receive is expected: a requester
// posts the receive for a chunk before it lets the owner send that chunk.
// A message that found no receive is therefore a late one of a failed
// transfer whose receives were cancelled (or garbage); it is received into
// scratch memory and dropped, so nothing accumulates in UCX's
// unexpected-message queue.
void Worker::DropUnexpectedLocked() {
  for (;;) {
    ucp_tag_recv_info_t info;
    ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, 0, 0, /*remove=*/1, &info);
    if (msg == nullptr) break;
    auto scratch = std::make_unique<char[]>(std::max<size_t>(info.length, 1));
    ucp_request_param_t p;
    std::memset(&p, 0, sizeof(p));
    ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(worker_, scratch.get(), info.length, msg, &p);
    if (UCS_PTR_IS_PTR(r)) dropping_.push_back({r, std::move(scratch)});
    DYAD_LOG_DEBUG("ucx: dropped an unexpected message (tag %llx, %zu bytes)",
                   static_cast<unsigned long long>(info.sender_tag), info.length);
  }
  FreeCompleted(dropping_, [](Dropping& d) { return d.req; });
}

Result<void*> Worker::StartRecv(void* buf, size_t len, uint64_t tag, const WakeFd* wake) {
  ucp_request_param_t p;
  std::memset(&p, 0, sizeof(p));
  p.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  if (wake != nullptr) wake->ForRecv(&p);
  MutexLock lk(mu_);
  ucs_status_ptr_t r = ucp_tag_recv_nbx(worker_, buf, len, tag, ~uint64_t{0}, &p);
  if (UCS_PTR_IS_ERR(r)) {
    const ucs_status_t s = UCS_PTR_STATUS(r);
    return UcxStatus(CodeForUcs(s), "ucp_tag_recv_nbx", s);
  }
  if (r == nullptr) return Status(DYAD_RC_UCXCOMM_FAIL, "ucp_tag_recv_nbx returned no request");
  return static_cast<void*>(r);
}

bool Worker::ProgressBriefly() {
  MutexLock lk(mu_);
  bool moved = false;
  for (int i = 0; i < kBriefRounds && ucp_worker_progress(worker_) != 0; ++i) moved = true;
  return moved;
}

Result<bool> Worker::Test(void** req, size_t* recv_len) {
  MutexLock lk(mu_);
  if (*req == nullptr) return true;
  bool done = false;
  Status st = CheckRequestLocked(req, recv_len, &done);
  if (!st.ok()) return st;
  return done;
}

// Whether `*req` finished; if so frees it and returns how it ended.
Status Worker::CheckRequestLocked(void** req, size_t* recv_len, bool* done) {
  *done = false;
  if (*req == nullptr) return Status::OK();  // only waiting for watch_fd
  ucp_tag_recv_info_t info;
  std::memset(&info, 0, sizeof(info));
  const ucs_status_t s =
      recv_len != nullptr ? ucp_tag_recv_request_test(*req, &info) : ucp_request_check_status(*req);
  if (s == UCS_INPROGRESS) return Status::OK();
  ucp_request_free(*req);
  *req = nullptr;
  *done = true;
  if (s != UCS_OK)
    return UcxStatus(CodeForUcs(s), recv_len != nullptr ? "ucx receive" : "ucx send", s);
  if (recv_len != nullptr) *recv_len = info.length;
  return Status::OK();
}

bool Worker::Cancel(void** req) {
  if (*req == nullptr) return true;
  MutexLock lk(mu_);
  ucp_request_cancel(worker_, *req);
  const Deadline d = Deadline::AfterMs(kDrainMs);
  while (ucp_request_check_status(*req) == UCS_INPROGRESS && !d.expired())
    ucp_worker_progress(worker_);
  const bool done = ucp_request_check_status(*req) != UCS_INPROGRESS;
  ucp_request_free(*req);
  *req = nullptr;
  return done;
}

}  // namespace dyad::ucx
