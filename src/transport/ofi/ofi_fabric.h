// ofi_fabric.h: the libfabric objects of one "ofi" transport (one per
// service): fabric, domain, one reliable-datagram endpoint with its
// completion queue (CQ) and address vector (AV), opened once and kept until
// the transport goes away.
//
// Completions. The CQ is opened with an fd wait object when the provider
// has one (tcp;ofi_rxm, verbs;ofi_rxm, ...): a progress thread sleeps in
// poll(2) on that fd (after fi_trywait says it may) and on an eventfd that
// stops it, and on each wake reads the CQ, which is also what moves data
// for providers with manual progress (the owner's side of a read is served
// only then). Providers without a wait object (shm in libfabric 1.17) get
// FI_WAIT_NONE: the thread then reads the CQ only while transfers are
// active (BeginActivity/EndActivity), yielding between empty reads, and
// sleeps on a condition variable otherwise. A completed operation's
// on_done callback runs on the thread that read it, under the fabric's
// lock: it must be short and must not call back into the fabric. Nothing
// here waits on a peer for a transfer: a read the provider refuses as busy
// (EAGAIN) is retried by its transfer once the progress thread has moved
// the provider along (TryRead signals the transfer's event fd).
//
// Address vector. A peer endpoint is inserted once per (address, instance):
// the instance is a random number each fabric draws when it opens, so a
// restarted service is a new entry even if its address is reused. An entry
// is removed after a transfer with it failed, once no transfer holds it
// (a broken connection must not be reused), and unused entries are dropped
// beyond kMaxPeers.
//
// Threading: thread-safe. Every call on the domain's objects is serialized
// by one mutex (the domain is opened FI_THREAD_DOMAIN).
#pragma once

#include <rdma/fabric.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "common/time.h"
#include "transport/ofi/ofi_provider.h"

struct fid_fabric;
struct fid_domain;
struct fid_ep;
struct fid_cq;
struct fid_av;
struct fid_mr;

namespace dyad {

// An operation libfabric completes: its fi_context2 is the op context
// libfabric hands back in the completion.
struct OfiOp {
  enum State : int { kIdle = 0, kPending = 1, kDone = 2 };
  fi_context2 context;  // must stay the first member
  void (*on_done)(OfiOp* op) = nullptr;
  void* owner = nullptr;
  int err = 0;       // 0, or the fabric errno of a failed operation (set before kDone)
  int prov_err = 0;  // the provider's own code for it
  std::atomic<int> state{kIdle};
};

// The dyad_rc_t for a fabric errno (either sign): CONNLOST when the peer or
// the way to it is gone, TIMEOUT, else BADFETCH.
dyad_rc_t OfiFabricErrorCode(int err);

class OfiFabric {
 public:
  static constexpr size_t kMaxPeers = 1024;

  // Opens everything for `provider`; DYAD_RC_MARGOINIT_FAIL names the step
  // that failed.
  static Result<std::shared_ptr<OfiFabric>> Open(OfiProvider provider);
  ~OfiFabric();
  OfiFabric(const OfiFabric&) = delete;
  OfiFabric& operator=(const OfiFabric&) = delete;

  // Stops the progress thread and closes the endpoint (outstanding
  // operations are flushed without their callbacks). Idempotent; called
  // before the memory that operations point into is freed.
  void Stop();

  const OfiChoice& choice() const { return choice_; }
  // This endpoint's name as the provider gives it (any length).
  const std::string& address() const { return address_; }
  uint64_t instance() const { return instance_; }
  // No CQ wait object: completions are polled while transfers are active.
  bool polled() const { return cq_fd_ < 0; }
  std::string Details();

  // Memory registered for this endpoint, honouring the provider's MR mode.
  struct Registration {
    fid_mr* mr = nullptr;
    void* desc = nullptr;      // local descriptor for FI_MR_LOCAL providers
    uint64_t key = 0;          // remote key
    uint64_t remote_base = 0;  // what a peer names the first byte with
  };
  // `access` is FI_READ (a local read target) and/or FI_REMOTE_READ.
  Result<Registration> Register(void* addr, size_t len, uint64_t access);
  void Deregister(Registration* r);

  // A peer's AV entry, inserted on first use; pair with ReleasePeer.
  Result<fi_addr_t> AcquirePeer(const std::string& address, uint64_t instance);
  // `failed`: the transfer failed at the fabric level (the entry goes).
  void ReleasePeer(const std::string& address, uint64_t instance, fi_addr_t addr, bool failed);

  // Starts an RMA read of `len` bytes at (remote_addr, key) on `peer` into
  // `local`, completing `op`; never waits. OK(false): the provider is busy
  // (EAGAIN: its queue is full or a connection to the peer is being set
  // up); `notify_fd` (an event fd) is signalled after the next round of
  // progress (at most kBusyRetryMs away), when the read is worth trying
  // again.
  Result<bool> TryRead(OfiOp* op, void* local, size_t len, void* desc, fi_addr_t peer,
                       uint64_t remote_addr, uint64_t key, int notify_fd);
  // Forgets `notify_fd` (before it is closed).
  void CancelBusyNotify(int notify_fd);
  // How long a read the provider refused as busy waits for its retry.
  static constexpr int kBusyRetryMs = 10;

  // A transfer starts/ends: in polled mode the CQ is read while any runs.
  void BeginActivity();
  void EndActivity();

 private:
  explicit OfiFabric(OfiProvider provider);
  Status OpenObjects() REQUIRES(mu_);
  Status OpenCq() REQUIRES(mu_);
  Status ReadAddress() REQUIRES(mu_);
  void CloseObjects();
  void ProgressLoop();
  int DrainLocked() REQUIRES(mu_);  // reads the CQ empty; returns completions seen
  void CompleteLocked(OfiOp* op, int err, int prov_err) REQUIRES(mu_);
  void SignalBusyLocked() REQUIRES(mu_);
  void RemovePeerLocked(fi_addr_t addr) REQUIRES(mu_);
  void TrimPeersLocked() REQUIRES(mu_);

  OfiInfoPtr info_;
  const OfiChoice choice_;
  std::string address_;
  uint64_t instance_ = 0;

  Mutex mu_;  // every libfabric call below, and the state after it
  fid_fabric* fabric_ GUARDED_BY(mu_) = nullptr;
  fid_domain* domain_ GUARDED_BY(mu_) = nullptr;
  fid_ep* ep_ GUARDED_BY(mu_) = nullptr;
  fid_cq* cq_ GUARDED_BY(mu_) = nullptr;
  fid_av* av_ GUARDED_BY(mu_) = nullptr;
  int cq_fd_ = -1;  // the CQ's wait fd (owned by libfabric); -1 in polled mode
  UniqueFd wake_fd_;
  bool stopping_ GUARDED_BY(mu_) = false;
  bool stopped_ GUARDED_BY(mu_) = false;
  int active_ GUARDED_BY(mu_) = 0;
  std::condition_variable active_cv_;
  std::thread progress_;
  std::vector<int> busy_fds_ GUARDED_BY(mu_);  // transfers whose read was refused as busy
  std::chrono::steady_clock::time_point busy_since_ GUARDED_BY(mu_);  // the first of them
  uint64_t next_key_ GUARDED_BY(mu_) = 1;  // requested keys when the provider does not choose them

  struct Peer {
    fi_addr_t addr = FI_ADDR_UNSPEC;
    int users = 0;
  };
  std::map<std::string, Peer> peers_ GUARDED_BY(mu_);       // by address bytes + instance
  std::map<fi_addr_t, int> retired_peers_ GUARDED_BY(mu_);  // failed, removed at last release
  uint64_t reads_ GUARDED_BY(mu_) = 0;
  uint64_t read_errors_ GUARDED_BY(mu_) = 0;
  uint64_t eagain_ GUARDED_BY(mu_) = 0;
};

}  // namespace dyad
