#include "transport/ucx/ucx_transport.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "common/log.h"
#include "common/time.h"
#include "common/wire.h"

namespace dyad {
namespace {

// Used when options.chunk_size is 0 (a misconfiguration, not a reason to fail).
constexpr size_t kDefaultChunk = 4u << 20;
// Version byte of PrepareRequest's transport_args and of kOffer.
constexpr uint8_t kArgsVersion = 1;
// How long teardown paths wait for UCX to finish cancelled operations.
constexpr int64_t kDrainMs = 1000;
// Segment size asked of UCX's tcp transport (see Engine::TuneTcp).
constexpr const char* kTcpSegment = "512k";
// How long a waiting caller drives the worker itself before sleeping.
constexpr int kSpinUs = 500;
// Rest of a receive buffer after a failed transfer whose owner is known to
// have stopped putting (see BufferLease::OwnerStopped).
constexpr int64_t kShortQuarantineMs = 1000;
// The progress thread re-checks for shutdown at least this often.
constexpr int kProgressPollMs = 100;
// A slot larger than this in an offer is a bug or a hostile peer.
constexpr uint64_t kMaxSlotBytes = 1ull << 32;

Deadline IdleDeadline(int64_t idle_ms) {
  return idle_ms > 0 ? Deadline::AfterMs(idle_ms) : Deadline::Never();
}

Status UcxStatus(dyad_rc_t code, const std::string& what, ucs_status_t s) {
  return Status(code, what + ": " + ucs_status_string(s));
}

// Errors that mean the peer (or the path to it) is gone.
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

int PoolBuffersFromEnv() {
  const char* env = std::getenv("DYAD_UCX_POOL_BUFFERS");
  if (env == nullptr || *env == '\0') return UcxTransport::kDefaultPoolBuffers;
  char* end = nullptr;
  const long v = std::strtol(env, &end, 10);
  if (end == env || *end != '\0' || v < 1 || v > 1024) {
    DYAD_LOG_WARN("ignoring DYAD_UCX_POOL_BUFFERS='%s' (want 1..1024)", env);
    return UcxTransport::kDefaultPoolBuffers;
  }
  return static_cast<int>(v);
}

// After a failure the session is out of step with the protocol, so it can
// never be reused; shutting it down makes the peer fail at once.
Status FailSession(Channel& ch, const Status& st) {
  ch.MarkBroken();
  ::shutdown(ch.fd(), SHUT_RDWR);
  return st;
}

// Tells the peer why we stop (best effort: the session may be gone), then
// fails the session.
Status SendErrorAndFail(Channel& ch, const Status& st) {
  Encoder e;
  e.I32(static_cast<int32_t>(st.code())).Str(st.message());
  (void)ch.SendFrame(UcxTransport::kErrorFrame, e.data(), Deadline::AfterMs(100));
  return FailSession(ch, st);
}

// Reads exactly `len` bytes of `fd` at `offset`; a short file is an error.
Status ReadFully(int fd, char* out, size_t len, uint64_t offset) {
  for (size_t got = 0; got < len;) {
    const ssize_t r = ::pread(fd, out + got, len - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return StatusFromErrno(errno, "read source", DYAD_RC_BADFIO);
    if (r == 0)
      return Status(DYAD_RC_BADFIO, "source ended at byte " + std::to_string(offset + got) +
                                        " (it shrank during the transfer)");
    got += static_cast<size_t>(r);
  }
  return Status::OK();
}

Status DecodeErrorFrame(const std::string& payload, const char* who) {
  Decoder d(payload);
  const int32_t code = d.I32();
  std::string msg = d.Str();
  if (!d.done() || code == DYAD_RC_OK)
    return Status(DYAD_RC_BADUNPACK, std::string("malformed error frame from ") + who);
  return Status(static_cast<dyad_rc_t>(code), std::string(who) + " failed: " + msg);
}

}  // namespace

// ---------------------------------------------------------------------------
// Engine: the UCX context, worker, progress thread, registered pools and
// endpoint cache of one transport. Shared (shared_ptr) with the
// MemoryRegions it hands out so they may outlive the transport object.
//
// Locking: mu_ guards every UCX call and the endpoint cache; pool_mu_
// guards the pools. Order: pool_mu_ before mu_, never the reverse.
class UcxTransport::Engine {
 public:
  enum PoolKind { kRecvPool = 0, kSendPool = 1 };

  Engine(size_t slot_bytes, int pool_buffers)
      : slot_bytes_(slot_bytes), pool_buffers_(pool_buffers) {}
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  ~Engine() { Shutdown(); }

  size_t slot_bytes() const { return slot_bytes_; }

  // Creates the context, worker and progress thread on first use. A failed
  // start is retried by the next call (nothing is left half-built).
  Status Start() {
    std::lock_guard<std::mutex> start_lock(start_mu_);
    if (started_) return Status::OK();
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) return UcxStatus(DYAD_RC_UCXINIT_FAIL, "ucp_config_read", s);
    TuneTcp(config);
    ucp_params_t params;
    std::memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    s = ucp_init(&params, config, &context_);
    ucp_config_release(config);
    if (s != UCS_OK) {
      context_ = nullptr;
      return UcxStatus(DYAD_RC_UCXINIT_FAIL, "ucp_init", s);
    }
    ucp_worker_params_t wparams;
    std::memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    // mu_ serializes every call; the library need not lock again.
    wparams.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    s = ucp_worker_create(context_, &wparams, &worker_);
    if (s != UCS_OK) {
      worker_ = nullptr;
      DestroyUcx();
      return UcxStatus(DYAD_RC_UCXINIT_FAIL, "ucp_worker_create", s);
    }
    s = ucp_worker_get_efd(worker_, &efd_);
    if (s != UCS_OK) {
      DestroyUcx();
      return UcxStatus(DYAD_RC_UCXINIT_FAIL, "ucp_worker_get_efd", s);
    }
    ucp_address_t* addr = nullptr;
    size_t addr_len = 0;
    s = ucp_worker_get_address(worker_, &addr, &addr_len);
    if (s != UCS_OK) {
      DestroyUcx();
      return UcxStatus(DYAD_RC_UCXINIT_FAIL, "ucp_worker_get_address", s);
    }
    address_.assign(reinterpret_cast<const char*>(addr), addr_len);
    ucp_worker_release_address(worker_, addr);
    stopping_ = false;
    progress_ = std::thread([this] { ProgressLoop(); });
    started_ = true;
    DYAD_LOG_DEBUG("ucx: worker up (address %zu bytes, slot %zu bytes, %d buffers per pool)",
                   address_.size(), slot_bytes_, pool_buffers_);
    return Status::OK();
  }

  const std::string& address() const { return address_; }

  // Over TCP, UCX emulates puts with active messages of at most one
  // segment each, and every segment is acknowledged. The default 8 KiB
  // segment cuts file throughput to a fraction of plain TCP on this path;
  // 512 KiB segments recover most of it (docs/ucx.md has the figures).
  // Buffers of that size are taken per connection only while data is in
  // flight. A value the user set in the environment always wins.
  // ucp_config_modify passes names it does not know to the transports'
  // tables without their prefix, hence "TX_SEG_SIZE" (in UCX 1.13 only the
  // tcp transport has these two fields).
  static void TuneTcp(ucp_config_t* config) {
    for (const char* name : {"TX_SEG_SIZE", "RX_SEG_SIZE"}) {
      const std::string env = std::string("UCX_TCP_") + name;
      if (std::getenv(env.c_str()) != nullptr) continue;
      const ucs_status_t s = ucp_config_modify(config, name, kTcpSegment);
      if (s != UCS_OK)
        DYAD_LOG_DEBUG("ucx: cannot set %s: %s", name, ucs_status_string(s));
    }
  }

  // ---- Registered buffer pools.

  struct Buffer {
    char* base = nullptr;
    size_t len = 0;
    ucp_mem_h memh = nullptr;
    std::string rkey;
    bool in_use = false;
    // A buffer given back after a failed transfer is not reused before this
    // time: the owner of that transfer may still have one put in flight.
    std::chrono::steady_clock::time_point usable_at{};
  };

  // Takes a buffer of 2 slots from a pool, mapping and registering a new one
  // while the pool has fewer than pool_buffers_. Waits (bounded) for one to
  // come back otherwise.
  Result<Buffer*> Acquire(PoolKind kind, Deadline deadline) {
    std::unique_lock<std::mutex> lk(pool_mu_);
    std::vector<std::unique_ptr<Buffer>>& pool = pools_[kind];
    for (;;) {
      const auto now = std::chrono::steady_clock::now();
      auto wake = std::chrono::steady_clock::time_point::max();
      int resting = 0;
      for (std::unique_ptr<Buffer>& b : pool) {
        if (b->in_use) continue;
        if (b->usable_at <= now) {
          b->in_use = true;
          return b.get();
        }
        wake = std::min(wake, b->usable_at);
        ++resting;
      }
      // Buffers resting after a failure do not count against the pool (so
      // failures cannot starve later transfers), up to twice its size.
      const int limit = pool_buffers_ + std::min(resting, pool_buffers_);
      if (static_cast<int>(pool.size()) < limit) {
        Result<std::unique_ptr<Buffer>> made = MapBuffer(2 * slot_bytes_);
        if (!made.ok()) return made.status();
        pool.push_back(std::move(made).value());
        pool.back()->in_use = true;
        return pool.back().get();
      }
      if (deadline.expired())
        return Status(DYAD_RC_TIMEOUT, std::string("all ") + std::to_string(pool_buffers_) +
                                           " registered " +
                                           (kind == kRecvPool ? "receive" : "send") +
                                           " buffers stayed busy (DYAD_UCX_POOL_BUFFERS)");
      auto until = now + std::chrono::milliseconds(deadline.RemainingMs(1000));
      pool_cv_.wait_until(lk, std::min(until, wake));
    }
  }

  void Release(Buffer* b, int64_t quarantine_ms) {
    {
      std::lock_guard<std::mutex> lk(pool_mu_);
      b->in_use = false;
      b->usable_at = std::chrono::steady_clock::now() +
                     std::chrono::milliseconds(std::max<int64_t>(0, quarantine_ms));
    }
    pool_cv_.notify_all();
  }

  // ---- Registration of caller memory (Transport::Register).

  Status MapRegion(void* addr, size_t len, ucp_mem_h* memh, std::string* rkey) {
    ucp_mem_map_params_t p;
    std::memset(&p, 0, sizeof(p));
    p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    p.address = addr;
    p.length = len;
    std::lock_guard<std::mutex> lk(mu_);
    ucs_status_t s = ucp_mem_map(context_, &p, memh);
    if (s != UCS_OK) return UcxStatus(DYAD_RC_UCXMMAP_FAIL, "ucp_mem_map", s);
    void* packed = nullptr;
    size_t packed_len = 0;
    s = ucp_rkey_pack(context_, *memh, &packed, &packed_len);
    if (s != UCS_OK) {
      ucp_mem_unmap(context_, *memh);
      *memh = nullptr;
      return UcxStatus(DYAD_RC_UCXRKEY_PACK_FAILED, "ucp_rkey_pack", s);
    }
    rkey->assign(static_cast<const char*>(packed), packed_len);
    ucp_rkey_buffer_release(packed);
    return Status::OK();
  }

  void UnmapRegion(ucp_mem_h memh) {
    std::lock_guard<std::mutex> lk(mu_);
    if (memh != nullptr && context_ != nullptr) ucp_mem_unmap(context_, memh);
  }

  // ---- Endpoints and remote keys.

  // A cached endpoint to the worker at `address`, created on first use.
  // Every successful call must be paired with ReleaseEndpoint: an endpoint
  // is closed only when no transfer uses it any more, so a handle another
  // thread still holds never dangles.
  Result<ucp_ep_h> Endpoint(const std::string& address) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = eps_.find(address);
    if (it != eps_.end()) {
      if (failed_eps_.count(it->second) == 0) {
        ++ep_users_[it->second];
        return it->second;
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
    p.err_handler.cb = &Engine::OnEndpointError;
    p.err_handler.arg = this;
    ucp_ep_h ep = nullptr;
    ucs_status_t s = ucp_ep_create(worker_, &p, &ep);
    if (s != UCS_OK) return UcxStatus(DYAD_RC_UCXEP_FAIL, "ucp_ep_create", s);
    eps_[address] = ep;
    ++ep_users_[ep];
    return ep;
  }

  void ReleaseEndpoint(ucp_ep_h ep) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = ep_users_.find(ep);
    if (it == ep_users_.end() || --it->second > 0) return;
    ep_users_.erase(it);
    if (retired_.erase(ep) != 0) CloseEndpointLocked(ep);
  }

  // Drops `ep` from the cache (if it is still the entry for `address`); it
  // is force-closed, which also fails whatever it still has outstanding,
  // when its last user releases it.
  void Evict(const std::string& address, ucp_ep_h ep) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = eps_.find(address);
    if (it == eps_.end() || it->second != ep) return;
    eps_.erase(it);
    RetireLocked(ep);
  }

  Result<ucp_rkey_h> UnpackRkey(ucp_ep_h ep, const std::string& packed) {
    std::lock_guard<std::mutex> lk(mu_);
    ucp_rkey_h rkey = nullptr;
    ucs_status_t s = ucp_ep_rkey_unpack(ep, packed.data(), &rkey);
    if (s != UCS_OK) return UcxStatus(DYAD_RC_UCXRKEY_UNPACK_FAILED, "ucp_ep_rkey_unpack", s);
    return rkey;
  }

  void DestroyRkey(ucp_rkey_h rkey) {
    std::lock_guard<std::mutex> lk(mu_);
    ucp_rkey_destroy(rkey);
  }

  // ---- Puts.

  // One chunk on its way: the put and the endpoint flush behind it. When
  // the flush completes the bytes are in the remote memory.
  struct InFlight {
    void* put = nullptr;
    void* flush = nullptr;
    bool active = false;
  };

  Status StartPut(ucp_ep_h ep, const void* local, size_t len, uint64_t remote, ucp_rkey_h rkey,
                  InFlight* op) {
    ucp_request_param_t p;
    std::memset(&p, 0, sizeof(p));
    std::lock_guard<std::mutex> lk(mu_);
    ucs_status_ptr_t put = ucp_put_nbx(ep, local, len, remote, rkey, &p);
    if (UCS_PTR_IS_ERR(put)) {
      const ucs_status_t s = UCS_PTR_STATUS(put);
      return UcxStatus(CodeForUcs(s), "ucp_put_nbx", s);
    }
    ucs_status_ptr_t flush = ucp_ep_flush_nbx(ep, &p);
    if (UCS_PTR_IS_ERR(flush)) {
      const ucs_status_t s = UCS_PTR_STATUS(flush);
      if (put != nullptr) DrainLocked(put);
      return UcxStatus(CodeForUcs(s), "ucp_ep_flush_nbx", s);
    }
    op->put = put;
    op->flush = flush;
    op->active = true;
    return Status::OK();
  }

  // Waits for a put and its flush. On failure or timeout the caller must
  // call Abort (the requests are still owned by UCX then).
  Status WaitPut(InFlight* op, Deadline deadline) {
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinUs);
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      ucp_worker_progress(worker_);
      ucs_status_t s = UCS_OK;
      bool pending = false;
      for (void* r : {op->put, op->flush}) {
        if (r == nullptr) continue;
        const ucs_status_t rs = ucp_request_check_status(r);
        if (rs == UCS_INPROGRESS) {
          pending = true;
        } else if (rs != UCS_OK && s == UCS_OK) {
          s = rs;
        }
      }
      if (!pending) {
        FreeLocked(op);
        if (s != UCS_OK) return UcxStatus(CodeForUcs(s), "ucx put", s);
        return Status::OK();
      }
      if (s != UCS_OK) return UcxStatus(CodeForUcs(s), "ucx put", s);
      if (deadline.expired()) return Status(DYAD_RC_TIMEOUT, "ucx put made no progress");
      // The put is usually moving: keep progressing it ourselves (letting
      // the progress thread in between) rather than pay a sleep and wake-up
      // per step. Past the spin budget, sleep until the progress thread
      // reports movement; the timeout only covers a lost wake-up.
      if (std::chrono::steady_clock::now() < spin_until) {
        lk.unlock();
        std::this_thread::yield();
        lk.lock();
      } else {
        cv_.wait_for(lk, std::chrono::milliseconds(1));
      }
    }
  }

  // Gives up on an in-flight put: the endpoint is retired (force-closed once
  // its last user lets go), the requests are drained (bounded) and freed.
  void Abort(const std::string& address, ucp_ep_h ep, InFlight* op) {
    if (!op->active) return;
    Evict(address, ep);
    std::lock_guard<std::mutex> lk(mu_);
    if (op->put != nullptr) DrainLocked(op->put);
    if (op->flush != nullptr) DrainLocked(op->flush);
    op->put = op->flush = nullptr;
    op->active = false;
  }

 private:
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    // Called from ucp_worker_progress, so mu_ is already held.
    auto* self = static_cast<Engine*>(arg);
    DYAD_LOG_DEBUG("ucx: endpoint error: %s", ucs_status_string(status));
    self->failed_eps_.insert(ep);
  }

  void FreeLocked(InFlight* op) {
    if (op->put != nullptr) ucp_request_free(op->put);
    if (op->flush != nullptr) ucp_request_free(op->flush);
    op->put = op->flush = nullptr;
    op->active = false;
  }

  // Progresses until `req` completes (at most kDrainMs), then frees it.
  void DrainLocked(void* req) {
    const Deadline d = Deadline::AfterMs(kDrainMs);
    while (ucp_request_check_status(req) == UCS_INPROGRESS && !d.expired())
      ucp_worker_progress(worker_);
    ucp_request_free(req);
  }

  void RetireLocked(ucp_ep_h ep) {
    if (ep_users_.count(ep) != 0) {
      retired_.insert(ep);
    } else {
      CloseEndpointLocked(ep);
    }
  }

  void CloseEndpointLocked(ucp_ep_h ep) {
    failed_eps_.erase(ep);
    ucp_request_param_t p;
    std::memset(&p, 0, sizeof(p));
    p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (UCS_PTR_IS_PTR(r)) closing_.push_back(r);
  }

  void ReapClosesLocked() {
    closing_.erase(std::remove_if(closing_.begin(), closing_.end(),
                                  [](void* r) {
                                    if (ucp_request_check_status(r) == UCS_INPROGRESS)
                                      return false;
                                    ucp_request_free(r);
                                    return true;
                                  }),
                   closing_.end());
  }

  Result<std::unique_ptr<Buffer>> MapBuffer(size_t len) {
    void* p = ::mmap(nullptr, len, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return StatusFromErrno(errno, "mmap ucx transfer buffer");
    auto b = std::make_unique<Buffer>();
    b->base = static_cast<char*>(p);
    b->len = len;
    Status st = MapRegion(p, len, &b->memh, &b->rkey);
    if (!st.ok()) {
      ::munmap(p, len);
      return st;
    }
    return Result<std::unique_ptr<Buffer>>(std::move(b));
  }

  // Drives the worker: progresses while there is work, then arms the event
  // fd and sleeps on it (bounded, so shutdown is noticed).
  void ProgressLoop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stopping_) {
      bool moved = false;
      for (int i = 0; i < 256 && ucp_worker_progress(worker_) != 0; ++i) moved = true;
      ReapClosesLocked();
      if (moved) cv_.notify_all();
      const ucs_status_t s = ucp_worker_arm(worker_);
      lk.unlock();
      if (s == UCS_ERR_BUSY) {
        std::this_thread::yield();  // more events already: progress again
      } else {
        pollfd p{efd_, POLLIN, 0};
        (void)::poll(&p, 1, kProgressPollMs);
      }
      lk.lock();
    }
  }

  void Shutdown() {
    if (!started_) return;
    {
      std::lock_guard<std::mutex> lk(mu_);
      stopping_ = true;
      ucp_worker_signal(worker_);
    }
    if (progress_.joinable()) progress_.join();
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& [addr, ep] : eps_) CloseEndpointLocked(ep);
      for (ucp_ep_h ep : retired_) CloseEndpointLocked(ep);
      eps_.clear();
      retired_.clear();
      ep_users_.clear();
      const Deadline d = Deadline::AfterMs(kDrainMs);
      while (!closing_.empty() && !d.expired()) {
        ucp_worker_progress(worker_);
        ReapClosesLocked();
      }
      // Requests still not done are abandoned with the worker.
      closing_.clear();
    }
    for (auto& pool : pools_) {
      for (std::unique_ptr<Buffer>& b : pool) {
        if (b->memh != nullptr) ucp_mem_unmap(context_, b->memh);
        ::munmap(b->base, b->len);
      }
      pool.clear();
    }
    DestroyUcx();
    started_ = false;
  }

  void DestroyUcx() {
    if (worker_ != nullptr) ucp_worker_destroy(worker_);
    worker_ = nullptr;
    if (context_ != nullptr) ucp_cleanup(context_);
    context_ = nullptr;
    efd_ = -1;
  }

  const size_t slot_bytes_;
  const int pool_buffers_;

  std::mutex start_mu_;
  bool started_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::string address_;
  bool stopping_ = false;
  std::thread progress_;
  std::map<std::string, ucp_ep_h> eps_;
  std::set<ucp_ep_h> failed_eps_;
  std::map<ucp_ep_h, int> ep_users_;  // transfers holding each endpoint
  std::set<ucp_ep_h> retired_;         // out of the cache, closed at last release
  std::vector<void*> closing_;

  std::mutex pool_mu_;
  std::condition_variable pool_cv_;
  std::vector<std::unique_ptr<Buffer>> pools_[2];
};

namespace {

// Caller memory registered with the transport's UCX context.
class UcxMemoryRegion final : public MemoryRegion {
 public:
  UcxMemoryRegion(std::shared_ptr<UcxTransport::Engine> engine, void* addr, size_t len,
                  ucp_mem_h memh, std::string rkey)
      : engine_(std::move(engine)), addr_(addr), len_(len), memh_(memh), rkey_(std::move(rkey)) {}
  ~UcxMemoryRegion() override { engine_->UnmapRegion(memh_); }
  UcxMemoryRegion(const UcxMemoryRegion&) = delete;
  UcxMemoryRegion& operator=(const UcxMemoryRegion&) = delete;

  void* addr() const override { return addr_; }
  size_t length() const override { return len_; }
  std::string PackedKey() const override { return rkey_; }

 private:
  std::shared_ptr<UcxTransport::Engine> engine_;
  void* const addr_;
  const size_t len_;
  ucp_mem_h const memh_;
  const std::string rkey_;
};

// Returns a pool buffer when the transfer ends; after a failure the buffer
// rests for `quarantine_ms` first (see Engine::Buffer::usable_at).
class BufferLease {
 public:
  BufferLease(UcxTransport::Engine* engine, UcxTransport::Engine::Buffer* b, int64_t quarantine_ms)
      : engine_(engine), b_(b), quarantine_ms_(quarantine_ms) {}
  BufferLease(const BufferLease&) = delete;
  BufferLease& operator=(const BufferLease&) = delete;
  ~BufferLease() { engine_->Release(b_, ok_ ? 0 : quarantine_ms_); }
  void MarkOk() { ok_ = true; }
  // The owner is known to have stopped putting (it reported an error after
  // cancelling its put, or its session is gone): only puts already on their
  // way can still land, so a short rest is enough.
  void OwnerStopped() { quarantine_ms_ = kShortQuarantineMs; }

 private:
  UcxTransport::Engine* const engine_;
  UcxTransport::Engine::Buffer* const b_;
  int64_t quarantine_ms_;
  bool ok_ = false;
};

}  // namespace

UcxTransport::UcxTransport(const TransportOptions& options)
    : options_(options),
      engine_(std::make_shared<Engine>(options.chunk_size > 0 ? options.chunk_size : kDefaultChunk,
                                       PoolBuffersFromEnv())) {}

UcxTransport::~UcxTransport() = default;

TransportCaps UcxTransport::caps() const {
  TransportCaps c;
  c.rma_put = true;
  c.needs_registration = true;
  return c;
}

Result<std::string> UcxTransport::PrepareRequest() {
  DYAD_RETURN_IF_ERROR(engine_->Start());
  Encoder e;
  e.U8(kArgsVersion).Str(engine_->address());
  return e.Take();
}

Result<std::unique_ptr<MemoryRegion>> UcxTransport::Register(void* addr, size_t len) {
  if (addr == nullptr || len == 0)
    return Status(DYAD_RC_BADBUF, "ucx register: empty memory range");
  DYAD_RETURN_IF_ERROR(engine_->Start());
  ucp_mem_h memh = nullptr;
  std::string rkey;
  DYAD_RETURN_IF_ERROR(engine_->MapRegion(addr, len, &memh, &rkey));
  return Result<std::unique_ptr<MemoryRegion>>(
      std::make_unique<UcxMemoryRegion>(engine_, addr, len, memh, std::move(rkey)));
}

Status UcxTransport::Push(Channel& session, const FileSource& src, const std::string& request_args,
                          TransferStats* stats) {
  TransferStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  *stats = TransferStats();
  if (src.size == 0) return Status::OK();
  const std::string what = "ucx push of '" + src.path + "'";
  auto progress = [&] {
    return " (sent " + std::to_string(stats->bytes) + " of " + std::to_string(src.size) +
           " bytes)";
  };
  // The requester waits for chunks the FetchReply promised, so every
  // failure is reported to it.
  if (src.fd < 0)
    return SendErrorAndFail(session, Status(DYAD_RC_BADFIO, what + ": no open file descriptor"));
  if (src.size <= kInlineMaxBytes) {
    std::string data(static_cast<size_t>(src.size), '\0');
    Status rs = ReadFully(src.fd, data.data(), data.size(), 0);
    if (!rs.ok()) return SendErrorAndFail(session, rs.Annotate(what));
    Status ss = session.SendFrame(kInlineFrame, data, IdleDeadline(options_.idle_ms));
    if (!ss.ok()) return FailSession(session, ss.Annotate(what));
    stats->bytes = src.size;
    stats->chunks = 1;
    return Status::OK();
  }
  Status st = engine_->Start();
  if (!st.ok()) return SendErrorAndFail(session, st.Annotate(what));
  Decoder args(request_args);
  const uint8_t args_version = args.U8();
  const std::string address = args.Str(64u << 10);
  if (!args.done() || args_version != kArgsVersion || address.empty())
    return SendErrorAndFail(session,
                            Status(DYAD_RC_BADREQUEST, what + ": bad ucx transport arguments"));

  // The requester's offer: where to put, in slots of what size.
  uint16_t type = 0;
  std::string payload;
  st = session.RecvFrame(&type, &payload, IdleDeadline(options_.idle_ms));
  if (!st.ok()) return FailSession(session, st.Annotate(what + ": waiting for the buffer offer"));
  if (type == kErrorFrame) return FailSession(session, DecodeErrorFrame(payload, "requester"));
  Decoder offer(payload);
  const uint8_t offer_version = offer.U8();
  const uint64_t remote_base = offer.U64();
  const uint64_t remote_slot = offer.U64();
  const std::string packed_rkey = offer.Str(64u << 10);
  if (type != kOfferFrame || !offer.done() || offer_version != kArgsVersion || remote_base == 0 ||
      remote_slot == 0 || remote_slot > kMaxSlotBytes || packed_rkey.empty())
    return SendErrorAndFail(session, Status(DYAD_RC_BADUNPACK, what + ": bad buffer offer"));

  Result<ucp_ep_h> ep = engine_->Endpoint(address);
  if (!ep.ok()) return SendErrorAndFail(session, ep.status().Annotate(what));
  // Released last, after the rkey unpacked on it is destroyed.
  struct EndpointRef {
    Engine* engine;
    ucp_ep_h ep;
    ~EndpointRef() { engine->ReleaseEndpoint(ep); }
  } ep_ref{engine_.get(), *ep};
  Result<ucp_rkey_h> rkey = engine_->UnpackRkey(*ep, packed_rkey);
  if (!rkey.ok()) {
    engine_->Evict(address, *ep);
    return SendErrorAndFail(session, rkey.status().Annotate(what));
  }
  Result<Engine::Buffer*> buf = engine_->Acquire(Engine::kSendPool, IdleDeadline(options_.idle_ms));
  if (!buf.ok()) {
    engine_->DestroyRkey(*rkey);
    return SendErrorAndFail(session, buf.status().Annotate(what));
  }
  // Send buffers are never exposed to a peer, so no quarantine is needed.
  BufferLease lease(engine_.get(), *buf, 0);
  lease.MarkOk();

  const uint64_t chunk = std::min<uint64_t>(remote_slot, engine_->slot_bytes());
  const uint64_t n_chunks = (src.size + chunk - 1) / chunk;
  Engine::InFlight op;
  uint64_t in_flight_index = 0;
  uint64_t in_flight_len = 0;

  // Waits for the put of chunk `in_flight_index` and tells the requester.
  auto finish_in_flight = [&]() -> Status {
    DYAD_RETURN_IF_ERROR(engine_->WaitPut(&op, IdleDeadline(options_.idle_ms)));
    Encoder e;
    e.U64(in_flight_index).U64(in_flight_len).Bool(in_flight_index + 2 < n_chunks);
    DYAD_RETURN_IF_ERROR(
        session.SendFrame(kChunkFrame, e.data(), IdleDeadline(options_.idle_ms)));
    stats->bytes += in_flight_len;
    stats->chunks += 1;
    return Status::OK();
  };

  auto run = [&]() -> Status {
    for (uint64_t i = 0; i < n_chunks; ++i) {
      const uint64_t slot = i % 2;
      if (i >= 2) {
        // The requester must have written chunk i - 2 out of this slot.
        DYAD_RETURN_IF_ERROR(session.RecvFrame(&type, &payload, IdleDeadline(options_.idle_ms)));
        if (type == kErrorFrame) return DecodeErrorFrame(payload, "requester");
        Decoder credit(payload);
        const uint64_t idx = credit.U64();
        if (type != kCreditFrame || !credit.done() || idx != i - 2)
          return Status(DYAD_RC_BADUNPACK, "unexpected frame instead of credit " +
                                               std::to_string(i - 2));
      }
      // Read chunk i while chunk i - 1 is on the wire.
      const uint64_t offset = i * chunk;
      const size_t len = static_cast<size_t>(std::min(chunk, src.size - offset));
      char* local = (*buf)->base + slot * engine_->slot_bytes();
      DYAD_RETURN_IF_ERROR(ReadFully(src.fd, local, len, offset));
      if (op.active) DYAD_RETURN_IF_ERROR(finish_in_flight());
      DYAD_RETURN_IF_ERROR(engine_->StartPut(*ep, local, len, remote_base + slot * remote_slot,
                                             *rkey, &op));
      in_flight_index = i;
      in_flight_len = len;
    }
    if (op.active) DYAD_RETURN_IF_ERROR(finish_in_flight());
    return Status::OK();
  };

  st = run();
  // A put still in flight after a failure must not outlive this call: it
  // reads from our send buffer and writes into the requester's memory.
  if (!st.ok()) engine_->Abort(address, *ep, &op);
  engine_->DestroyRkey(*rkey);
  if (!st.ok()) return SendErrorAndFail(session, st.Annotate(what + progress()));
  return Status::OK();
}

Status UcxTransport::Pull(Channel& session, uint64_t size, const std::string& reply_args,
                          int sink_fd, TransferStats* stats) {
  (void)reply_args;
  TransferStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  *stats = TransferStats();
  if (size == 0) return Status::OK();
  auto what = [&] {
    return "ucx pull (received " + std::to_string(stats->bytes) + " of " + std::to_string(size) +
           " bytes)";
  };
  if (sink_fd < 0)
    return SendErrorAndFail(session, Status(DYAD_RC_BADFIO, "ucx pull: no sink file descriptor"));
  if (size <= kInlineMaxBytes) {
    // The data frame follows the FetchReply at once: spin for it rather
    // than pay a sleeping thread's wake-up (as the tcp transport does).
    (void)session.SpinFor(POLLIN);
    uint16_t type = 0;
    std::string payload;
    Status rs = session.RecvFrame(&type, &payload, IdleDeadline(options_.idle_ms));
    if (!rs.ok()) return FailSession(session, rs.Annotate(what() + ": waiting for the data"));
    if (type == kErrorFrame)
      return FailSession(session, DecodeErrorFrame(payload, "owner").Annotate(what()));
    if (type != kInlineFrame || payload.size() != size)
      return SendErrorAndFail(session,
                              Status(DYAD_RC_BADUNPACK, what() + ": unexpected inline frame"));
    Status ws = WriteFully(sink_fd, payload.data(), payload.size());
    if (!ws.ok())
      return SendErrorAndFail(session, Status(DYAD_RC_BADFIO, what() + ": " + ws.message()));
    stats->bytes = size;
    stats->chunks = 1;
    return Status::OK();
  }
  Status st = engine_->Start();
  if (!st.ok()) return SendErrorAndFail(session, st.Annotate("ucx pull"));
  Result<Engine::Buffer*> buf = engine_->Acquire(Engine::kRecvPool, IdleDeadline(options_.idle_ms));
  if (!buf.ok()) return SendErrorAndFail(session, buf.status().Annotate("ucx pull"));
  // After a failure the owner may still land one put in this buffer before
  // it notices; its own puts are bounded by its idle bound.
  BufferLease lease(engine_.get(), *buf,
                    2 * std::max<int64_t>(options_.idle_ms > 0 ? options_.idle_ms : 0, 1000));
  const uint64_t slot = engine_->slot_bytes();

  Encoder offer;
  offer.U8(kArgsVersion)
      .U64(reinterpret_cast<uint64_t>((*buf)->base))
      .U64(slot)
      .Str((*buf)->rkey);
  st = session.SendFrame(kOfferFrame, offer.data(), IdleDeadline(options_.idle_ms));
  if (!st.ok()) return FailSession(session, st.Annotate(what()));

  for (uint64_t i = 0; stats->bytes < size; ++i) {
    uint16_t type = 0;
    std::string payload;
    st = session.RecvFrame(&type, &payload, IdleDeadline(options_.idle_ms));
    if (!st.ok()) {
      if (st.code() == DYAD_RC_CONNLOST) lease.OwnerStopped();
      return FailSession(session, st.Annotate(what() + ": waiting for a chunk"));
    }
    if (type == kErrorFrame) {
      lease.OwnerStopped();
      return FailSession(session, DecodeErrorFrame(payload, "owner").Annotate(what()));
    }
    Decoder d(payload);
    const uint64_t idx = d.U64();
    const uint64_t len = d.U64();
    const bool credit_wanted = d.Bool();
    if (type != kChunkFrame || !d.done() || idx != i || len == 0 || len > slot ||
        len > size - stats->bytes)
      return SendErrorAndFail(session,
                              Status(DYAD_RC_BADUNPACK, what() + ": unexpected chunk frame"));
    st = WriteFully(sink_fd, (*buf)->base + (i % 2) * slot, static_cast<size_t>(len));
    if (!st.ok())
      return SendErrorAndFail(session, Status(DYAD_RC_BADFIO, what() + ": " + st.message()));
    stats->bytes += len;
    stats->chunks += 1;
    if (credit_wanted) {
      Encoder e;
      e.U64(i);
      st = session.SendFrame(kCreditFrame, e.data(), IdleDeadline(options_.idle_ms));
      if (!st.ok()) return FailSession(session, st.Annotate(what()));
    }
  }
  lease.MarkOk();
  return Status::OK();
}

}  // namespace dyad
