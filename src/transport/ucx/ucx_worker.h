// ucx_worker.h: the UCX context and worker of one transport instance, the
// thread that drives the worker, and the request calls every transfer makes
// on it (tagged receives; testing, without waiting, and cancelling sends
// and receives; brief progress).
//
// Threading: every UCX call of the transport is made under mu() (the worker
// runs in UCS_THREAD_MODE_SERIALIZED), by this class or by the parts that
// share the worker (endpoints, direct path, pools). The progress thread
// drives the worker and sleeps on its event fd; a transfer also progresses
// it briefly after each of its waits (ProgressBriefly), and never waits on
// it.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "common/time.h"
#include "transport/ucx/ucx_wake.h"

namespace dyad::ucx {

// How long teardown paths wait for UCX to finish cancelled operations.
constexpr int64_t kDrainMs = 1000;

Status UcxStatus(dyad_rc_t code, const std::string& what, ucs_status_t s);
// DYAD_RC_CONNLOST for errors that mean the peer (or the path to it) is
// gone, DYAD_RC_TIMEOUT for a UCX timeout, else DYAD_RC_UCXCOMM_FAIL.
dyad_rc_t CodeForUcs(ucs_status_t s);

class Worker {
 public:
  Worker() = default;
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Creates the context, worker and progress thread (from Warm, or on first
  // use). A failed start is retried by the next call (nothing is left
  // half-built).
  Status Start();
  bool started();

  // Valid once Start() succeeded, until destruction.
  const std::string& address() const { return address_; }
  bool shm_capable() const { return shm_capable_; }
  bool eager_only() const { return eager_only_; }
  ucp_context_h context() const { return context_; }
  ucp_worker_h handle() const REQUIRES(mu_) { return worker_; }  // used with mu() held
  Mutex& mu() RETURN_CAPABILITY(mu_) { return mu_; }

  // Run by the progress thread each round with mu() held; set before Start.
  void SetHousekeeping(std::function<void()> fn) { housekeeping_ = std::move(fn); }

  // Closes `ep` (forced: fails whatever it has outstanding); the close
  // request is reaped by the progress thread. mu() held.
  void CloseEndpointLocked(ucp_ep_h ep, bool force) REQUIRES(mu_);

  // Posts a receive of at most `len` bytes into `buf` for exactly `tag`;
  // its completion makes `wake` readable when given.
  Result<void*> StartRecv(void* buf, size_t len, uint64_t tag, const WakeFd* wake = nullptr);

  // Drives the worker while it moves, a bounded number of rounds, without
  // ever waiting. True if it moved.
  bool ProgressBriefly();
  // Whether the request `*req` finished (a receive when `recv_len` is not
  // null, which then gets the received length), without waiting: true once
  // it did (it is then freed, and an error says it failed), false while it
  // is pending. A null `*req` counts as finished.
  Result<bool> Test(void** req, size_t* recv_len);
  // While some transfer sends messages (Hurry(+1) .. Hurry(-1)), the
  // progress thread sleeps at most a millisecond between rounds: over tcp,
  // sends that did not fit the socket move only when the worker is
  // progressed, and its event fd does not say when they could.
  void Hurry(int delta) { hurry_.fetch_add(delta); }

  // Gives up on a pending request: cancels it and progresses (at most
  // kDrainMs) until UCX lets go of it. Returns true when it completed, so
  // its buffer is no longer touched; otherwise it is freed anyway (UCX
  // releases it when it completes) and the caller must not reuse the
  // buffer soon.
  bool Cancel(void** req);

  // Teardown, in this order: StopProgress(); close every endpoint;
  // DrainCloses(); release registered memory; destruction.
  void StopProgress();
  void DrainCloses();

 private:
  Status CreateContext(bool* eager_only);
  Status CreateWorker() REQUIRES(mu_);
  void DestroyUcx() REQUIRES(mu_);
  void ProgressLoop();
  void ReapClosesLocked() REQUIRES(mu_);
  void DropUnexpectedLocked() REQUIRES(mu_);
  Status CheckRequestLocked(void** req, size_t* recv_len, bool* done) REQUIRES(mu_);

  Mutex start_mu_;
  bool started_ GUARDED_BY(start_mu_) = false;
  bool shm_capable_ = false;
  bool eager_only_ = false;

  Mutex mu_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ GUARDED_BY(mu_) = nullptr;
  int efd_ = -1;
  std::string address_;
  bool stopping_ GUARDED_BY(mu_) = false;
  std::atomic<int> hurry_{0};
  std::thread progress_;
  std::function<void()> housekeeping_;
  std::vector<void*> closing_ GUARDED_BY(mu_);  // endpoint close requests not yet complete
  struct Dropping {
    void* req;
    std::unique_ptr<char[]> scratch;
  };
  std::vector<Dropping> dropping_ GUARDED_BY(mu_);  // receives of unexpected messages
};

}  // namespace dyad::ucx
