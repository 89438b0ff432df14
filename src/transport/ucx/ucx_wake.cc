#include "transport/ucx/ucx_wake.h"
#include "common/thread_annotations.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <unordered_map>

namespace dyad::ucx {
namespace {

// The live wake fds by id. A leaf lock: callbacks take it with the worker's
// mutex held, nothing takes the worker's with it held.
struct Registry {
  Mutex mu;
  std::unordered_map<uint64_t, int> fds GUARDED_BY(mu);
  uint64_t next_id GUARDED_BY(mu) = 1;
};

Registry& Wakes() {
  static Registry* r = new Registry();  // outlives every transfer and worker
  return *r;
}

}  // namespace

Result<std::unique_ptr<WakeFd>> WakeFd::Create() {
  const int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) return StatusFromErrno(errno, "ucx: eventfd for a transfer's completions");
  Registry& r = Wakes();
  MutexLock lk(r.mu);
  const uint64_t id = r.next_id++;
  r.fds[id] = fd;
  return std::unique_ptr<WakeFd>(new WakeFd(fd, id));
}

WakeFd::~WakeFd() {
  Registry& r = Wakes();
  {
    MutexLock lk(r.mu);
    r.fds.erase(id_);
  }
  ::close(fd_);
}

void WakeFd::Drain() const {
  uint64_t v = 0;
  while (::read(fd_, &v, sizeof v) < 0 && errno == EINTR) {
  }
}

void WakeFd::ForRecv(ucp_request_param_t* p) const {
  p->op_attr_mask |= UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p->cb.recv = &WakeFd::OnRecv;
  p->user_data = reinterpret_cast<void*>(static_cast<uintptr_t>(id_));
}

void WakeFd::ForSend(ucp_request_param_t* p) const {
  p->op_attr_mask |= UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  p->cb.send = &WakeFd::OnSend;
  p->user_data = reinterpret_cast<void*>(static_cast<uintptr_t>(id_));
}

void WakeFd::Signal(void* user_data) {
  SignalId(static_cast<uint64_t>(reinterpret_cast<uintptr_t>(user_data)));
}

void WakeFd::SignalId(uint64_t id) {
  Registry& r = Wakes();
  MutexLock lk(r.mu);
  auto it = r.fds.find(id);
  if (it == r.fds.end()) return;  // its transfer is gone
  const uint64_t one = 1;
  // EAGAIN (the counter is full) still leaves the fd readable.
  while (::write(it->second, &one, sizeof one) < 0 && errno == EINTR) {
  }
}

void WakeFd::OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                    void* user_data) {
  (void)request, (void)status, (void)info;
  Signal(user_data);
}

void WakeFd::OnSend(void* request, ucs_status_t status, void* user_data) {
  (void)request, (void)status;
  Signal(user_data);
}

}  // namespace dyad::ucx
