// ucx_wake.h: how a transfer learns, without waiting on the worker, that
// one of its UCX requests completed. Each transfer owns a WakeFd (an event
// fd); its requests carry the fd's id as their completion callback's user
// data, and the callback (run by whichever thread progresses the worker:
// the progress thread, or a transfer progressing it briefly) makes the fd
// readable. The transfer's coroutine waits for that fd or the session on
// its runtime's loop, holding no thread (ucx_transfer.h, Transfer::ForPeer).
//
// Ids, not pointers: a request given up after a failure may complete after
// its transfer is gone, and its callback must then find nothing to signal.
// Thread-safe.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdint>
#include <memory>

#include "common/status.h"

namespace dyad::ucx {

class WakeFd {
 public:
  // A registered, non-blocking event fd, or why there is none.
  static Result<std::unique_ptr<WakeFd>> Create();
  ~WakeFd();
  WakeFd(const WakeFd&) = delete;
  WakeFd& operator=(const WakeFd&) = delete;

  int fd() const { return fd_; }
  uint64_t id() const { return id_; }
  // Makes the wake fd of `id` readable, if it still exists.
  static void SignalId(uint64_t id);
  // Makes the fd unreadable again; call before looking at the requests, so
  // a completion after the look signals anew.
  void Drain() const;
  // Sets `p`'s completion callback (a tagged receive's, or a send's) to
  // signal this fd.
  void ForRecv(ucp_request_param_t* p) const;
  void ForSend(ucp_request_param_t* p) const;

 private:
  WakeFd(int fd, uint64_t id) : fd_(fd), id_(id) {}
  static void Signal(void* user_data);
  static void OnRecv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info,
                     void* user_data);
  static void OnSend(void* request, ucs_status_t status, void* user_data);

  const int fd_;
  const uint64_t id_;
};

}  // namespace dyad::ucx
