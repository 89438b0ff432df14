#include "transport/ucx/ucx_transport.h"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
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
constexpr uint8_t kArgsVersion = 3;
// How long teardown paths wait for UCX to finish cancelled operations.
constexpr int64_t kDrainMs = 1000;
// Segment size asked of UCX's tcp transport (see Engine::TuneTcp).
constexpr const char* kTcpSegment = "512k";
// Rest of a receive buffer after a failed transfer whose owner is known to
// have stopped sending (see BufferLease::OwnerStopped).
constexpr int64_t kShortQuarantineMs = 1000;
// How long a waiting caller drives the worker itself before sleeping.
constexpr int kSpinUs = 500;
// The progress thread re-checks for shutdown at least this often.
constexpr int kProgressPollMs = 100;
// A slot larger than this in an offer is a bug or a hostile peer.
constexpr uint64_t kMaxSlotBytes = 1ull << 32;
constexpr uint64_t kMaxSlots = 1024;
// Bounds on what a peer may send: a worker address and a packed remote key.
constexpr size_t kMaxAddressBytes = 64u << 10;
constexpr size_t kMaxRkeyBytes = 4u << 10;
// Same-host requesters whose buffers an owner keeps mapped (least recently
// used idle ones are unmapped beyond this), and addresses remembered as not
// mappable (forgotten all at once beyond this).
constexpr size_t kMaxDirectPeers = 64;
// A requester's mapped buffers are unmapped after this long without a
// transfer (a requester that died or restarted would otherwise keep its
// shared memory alive through our mapping).
constexpr int64_t kDirectIdleMs = 30000;
constexpr size_t kMaxUnmappable = 1024;
// Keys (buffers) mapped per requester: its pools hold at most 2 x 1024
// buffers (DYAD_UCX_POOL_BUFFERS, plus those resting after failures).
constexpr size_t kMaxKeysPerPeer = 2 * 1024;
// A chunk's tag: the requester's transfer id (40 bits) and the chunk index
// modulo 2^24 (at most kSlots chunks are outstanding, so indexes cannot
// collide). Ids are unique per process and random across processes, so a
// late message of a failed transfer never matches a later receive.
constexpr int kIndexBits = 24;
constexpr uint64_t kTransferIdMask = (uint64_t{1} << (64 - kIndexBits)) - 1;

// A registered buffer is 2 x chunk_size bytes (as with the two put slots
// before), cut into kSlots slots, one message each.
size_t SlotBytes(size_t chunk_size) {
  const size_t chunk = chunk_size > 0 ? chunk_size : kDefaultChunk;
  return std::max<size_t>(4096, 2 * chunk / UcxTransport::kSlots);
}

uint64_t ChunkTag(uint64_t transfer_id, uint64_t index) {
  return (transfer_id << kIndexBits) | (index & ((uint64_t{1} << kIndexBits) - 1));
}

uint64_t NextTransferId() {
  static std::atomic<uint64_t> next{[] {
    std::random_device rd;
    return (uint64_t{rd()} << 32) ^ rd();
  }()};
  return next.fetch_add(1) & kTransferIdMask;
}

Deadline IdleDeadline(int64_t idle_ms) {
  return idle_ms > 0 ? Deadline::AfterMs(idle_ms) : Deadline::Never();
}

// What a UCX print routine writes, as a string ("" when it cannot be had).
template <typename Fn>
std::string CaptureUcxInfo(Fn&& print) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = ::open_memstream(&buf, &len);
  if (f == nullptr) return "";
  print(f);
  std::fclose(f);
  std::string out(buf != nullptr ? buf : "", len);
  std::free(buf);
  return out;
}

// Whether [lo, hi) lies inside one shared (MAP_SHARED) mapping of this
// process, per /proc/self/maps.
bool InOneSharedMapping(uintptr_t lo, uintptr_t hi) {
  FILE* f = std::fopen("/proc/self/maps", "re");
  if (f == nullptr) return false;
  bool ok = false;
  char line[512];
  while (std::fgets(line, sizeof(line), f) != nullptr) {
    unsigned long start = 0, end = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%lx-%lx %7s", &start, &end, perms) != 3) continue;
    if (start <= lo && hi <= end) {
      ok = perms[0] == 'r' && perms[1] == 'w' && perms[3] == 's';
      break;
    }
  }
  std::fclose(f);
  return ok;
}

// Identifies this host and the namespaces that UCX's shared memory needs to
// be common to both sides (System V IPC, the pid namespace POSIX segments
// are attached through, the mount namespace of /dev/shm). Two services with
// the same value can map each other's memory. "" when unknown: never equal.
const std::string& LocalHostId() {
  static const std::string id = [] {
    std::string boot;
    if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "re")) {
      char line[64] = {};
      if (std::fgets(line, sizeof(line), f) != nullptr) boot = line;
      std::fclose(f);
    }
    while (!boot.empty() && (boot.back() == '\n' || boot.back() == ' ')) boot.pop_back();
    if (boot.empty()) return std::string();
    std::string out = boot;
    for (const char* ns : {"ipc", "pid", "mnt"}) {
      char target[128] = {};
      const std::string link = std::string("/proc/self/ns/") + ns;
      const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
      if (n <= 0) return std::string();
      out += '/';
      out.append(target, static_cast<size_t>(n));
    }
    return out;
  }();
  return id;
}

// $DYAD_UCX_SHM: "off" (or 0/no/false) keeps same-host transfers on UCX
// messages; anything else (default "auto") lets them use shared memory.
bool ShmDirectAllowed() {
  const char* v = std::getenv("DYAD_UCX_SHM");
  if (v == nullptr) return true;
  const std::string s(v);
  return !(s == "off" || s == "0" || s == "no" || s == "false");
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

  // Creates the context, worker and progress thread (from Warm, or on first
  // use). A failed start is retried by the next call (nothing is left
  // half-built).
  Status Start() {
    std::lock_guard<std::mutex> start_lock(start_mu_);
    if (started_) return Status::OK();
    ucp_config_t* config = nullptr;
    ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
    if (s != UCS_OK) return UcxStatus(DYAD_RC_UCXINIT_FAIL, "ucp_config_read", s);
    bool eager_only = TuneTcp(config);
    ucp_params_t params;
    std::memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_WAKEUP;
    s = ucp_init(&params, config, &context_);
    if (s == UCS_OK && !eager_only && std::getenv("UCX_RNDV_THRESH") == nullptr &&
        !HasRmaNetwork(context_)) {
      // UCX_TLS allowed RMA transports, but this host has no RMA network
      // (no InfiniBand/RoCE device): messages to other hosts go over tcp,
      // where rendezvous means emulated puts (see TuneTcp). Start again
      // with every message eager.
      ucp_cleanup(context_);
      context_ = nullptr;
      s = ucp_config_modify(config, "RNDV_THRESH", "inf");
      if (s == UCS_OK) s = ucp_init(&params, config, &context_);
      eager_only = true;
    }
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
    shm_capable_ = HasMappableMemory(context_);
    eager_only_ = eager_only;
    stopping_ = false;
    progress_ = std::thread([this] { ProgressLoop(); });
    started_ = true;
    DYAD_LOG_DEBUG(
        "ucx: worker up (address %zu bytes, slot %zu bytes, %d buffers per pool, shared memory %s, "
        "messages %s)",
        address_.size(), slot_bytes_, pool_buffers_, shm_capable_ ? "yes" : "no",
        eager_only ? "all eager (no RMA network)" : "eager and rendezvous");
    return Status::OK();
  }

  const std::string& address() const { return address_; }

  // Whether this context has a shared-memory transport whose remote keys
  // can be mapped into another process (System V, POSIX or XPMEM), so
  // that a same-host peer's registered buffer can be written directly.
  bool shm_capable() const { return shm_capable_; }

  // See UcxTransport::Details.
  std::string Details() {
    std::lock_guard<std::mutex> start_lock(start_mu_);
    if (!started_) return "not started";
    std::string d = std::string("same-host direct path ") +
                    (!shm_capable_        ? "unavailable (no shared memory in UCX_TLS)"
                     : ShmDirectAllowed() ? "on"
                                          : "off (DYAD_UCX_SHM)");
    d += eager_only_ ? "; messages all eager (no RMA network)"
                     : "; messages eager, large ones by rendezvous RMA";
    std::lock_guard<std::mutex> pool_lock(pool_mu_);
    d += "; buffers mapped: " + std::to_string(pools_[kRecvPool].size()) + " receive, " +
         std::to_string(pools_[kSendPool].size()) + " send of " +
         std::to_string(kSlots * slot_bytes_) + " bytes (at most " +
         std::to_string(pool_buffers_) + " each)";
    return d;
  }

  // The transport name of every resource (device) the context found, from
  // the "resource N : md M dev D flags -- tcp/eth0" lines of its info.
  static std::vector<std::string> ResourceTransports(ucp_context_h context) {
    const std::string info =
        CaptureUcxInfo([&](FILE* f) { ucp_context_print_info(context, f); });
    std::vector<std::string> out;
    for (size_t pos = 0; (pos = info.find("resource", pos)) != std::string::npos;) {
      size_t eol = info.find('\n', pos);
      if (eol == std::string::npos) eol = info.size();
      const std::string line = info.substr(pos, eol - pos);
      pos = eol;
      const size_t sp = line.find_last_of(' ');
      const std::string dev = sp == std::string::npos ? line : line.substr(sp + 1);
      out.push_back(dev.substr(0, dev.find('/')));
    }
    return out;
  }

  static bool HasMappableMemory(ucp_context_h context) {
    for (const std::string& tl : ResourceTransports(context)) {
      if (tl == "sysv" || tl == "posix" || tl == "xpmem") return true;
    }
    return false;
  }

  // Over TCP, UCX emulates puts with active messages of at most one
  // segment each, and every segment is acknowledged. The default 8 KiB
  // segment cuts file throughput to a fraction of plain TCP on this path;
  // 512 KiB segments recover most of it (docs/ucx.md has the figures).
  // Buffers of that size are taken per connection only while data is in
  // flight. A value the user set in the environment always wins.
  // ucp_config_modify passes names it does not know to the transports'
  // tables without their prefix, hence "TX_SEG_SIZE" (in UCX 1.13 only the
  // tcp transport has these two fields).
  // Returns whether it made every message eager.
  static bool TuneTcp(ucp_config_t* config) {
    for (const char* name : {"TX_SEG_SIZE", "RX_SEG_SIZE"}) {
      const std::string env = std::string("UCX_TCP_") + name;
      if (std::getenv(env.c_str()) != nullptr) continue;
      const ucs_status_t s = ucp_config_modify(config, name, kTcpSegment);
      if (s != UCS_OK)
        DYAD_LOG_DEBUG("ucx: cannot set %s: %s", name, ucs_status_string(s));
    }
    // Without native RMA, UCX 1.13's rendezvous protocol falls back to
    // emulated puts, whose acknowledgements abort the receiving process
    // when the sender died meanwhile (see "Tagged messages" below). Eager
    // messages of any size need nothing back from the receiver.
    if (std::getenv("UCX_RNDV_THRESH") == nullptr && !HasNativeRma(std::getenv("UCX_TLS"))) {
      const ucs_status_t s = ucp_config_modify(config, "RNDV_THRESH", "inf");
      if (s == UCS_OK) return true;
      DYAD_LOG_DEBUG("ucx: cannot set RNDV_THRESH: %s", ucs_status_string(s));
    }
    return false;
  }

  // Whether the context found a network device with native RMA (any
  // transport other than tcp and the same-host ones: InfiniBand/RoCE rc,
  // dc, ud, ...). Messages between hosts use only such transports or tcp
  // (the same-host ones cannot serve endpoints with peer error handling).
  static bool HasRmaNetwork(ucp_context_h context) {
    for (const std::string& tl : ResourceTransports(context)) {
      bool local = tl.empty();
      for (const char* name : {"self", "tcp", "sysv", "posix", "xpmem", "cma", "knem", "cuda",
                               "rocm", "gdr"}) {
        if (tl.compare(0, std::strlen(name), name) == 0) local = true;
      }
      if (!local) return true;
    }
    return false;
  }

  // Whether the UCX_TLS value may select a transport with native RMA (an
  // InfiniBand or RoCE transport, or shared memory with a cross-memory
  // copy mechanism). Unset or "all" means any transport, so yes.
  static bool HasNativeRma(const char* tls) {
    if (tls == nullptr || *tls == '\0') return true;
    std::string list(tls);
    if (!list.empty() && list[0] == '^') return true;  // an exclusion list
    size_t start = 0;
    while (start <= list.size()) {
      size_t end = list.find(',', start);
      if (end == std::string::npos) end = list.size();
      const std::string t = list.substr(start, end - start);
      for (const char* rma : {"all", "rc", "dc", "ud", "ib", "mlx", "sm", "shm", "cma", "knem",
                              "xpmem", "gdr", "cuda", "rocm"}) {
        if (t.compare(0, std::strlen(rma), rma) == 0) return true;
      }
      start = end + 1;
    }
    return false;
  }

  // ---- Registered buffer pools.

  struct Buffer {
    char* base = nullptr;
    size_t len = 0;
    ucp_mem_h memh = nullptr;
    std::string rkey;
    bool ucx_allocated = false;  // allocated by ucp_mem_map (not mmap)
    bool in_use = false;
    // A buffer given back after a failed transfer is not reused before this
    // time: the owner of that transfer may still have one put in flight.
    std::chrono::steady_clock::time_point usable_at{};
  };

  // Takes a buffer of kSlots slots from a pool, mapping and registering a new one
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
        Result<std::unique_ptr<Buffer>> made = MapBuffer(kind, kSlots * slot_bytes_);
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

  // Maps one buffer per pool ahead of the first transfer, with its pages
  // touched, so the first fetch finds them ready (see UcxTransport::Warm).
  Status Preallocate() {
    for (PoolKind kind : {kRecvPool, kSendPool}) {
      std::lock_guard<std::mutex> lk(pool_mu_);
      if (!pools_[kind].empty()) continue;
      Result<std::unique_ptr<Buffer>> made = MapBuffer(kind, kSlots * slot_bytes_);
      if (!made.ok()) return made.status();
      std::memset((*made)->base, 0, (*made)->len);
      pools_[kind].push_back(std::move(made).value());
    }
    return Status::OK();
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

  // ---- Same-host direct path (see Push).
  //
  // When owner and requester share a host, the owner maps the requester's
  // receive buffer (UCX allocated it from shared memory; its remote key
  // names the segment) and reads file chunks straight into it: a one-sided
  // write with no UCX message at all, and one copy fewer than any message.
  // The endpoint used to unpack the keys has no peer error handling (UCX
  // 1.13's shared-memory transports offer none) and carries no traffic, so
  // a peer's death cannot reach UCX; the fetch session reports it.

  struct DirectPeer {
    ucp_ep_h ep = nullptr;                     // shared-memory lanes only
    struct MappedKey {
      ucp_rkey_h rk = nullptr;
      // [lo, hi): the range ucp_rkey_ptr gave that was checked to lie in
      // one shared mapping of this process (empty until first checked).
      uintptr_t lo = 0, hi = 0;
    };
    std::map<std::string, MappedKey> rkeys;    // by packed key, mapped
    int users = 0;                             // transfers writing through it
    std::chrono::steady_clock::time_point last_used{};
  };

  // One of a same-host requester's receive buffers, mapped here.
  struct DirectMapping {
    std::shared_ptr<DirectPeer> peer;
    char* ptr = nullptr;  // the buffer's first byte, in this process
  };

  // Maps [base, base + len) of the requester at worker `address`, described
  // by the packed remote key `rkey`. Fails (NOTSUP) when there is no
  // shared-memory path to it; that is remembered. Pair every success with
  // UnmapPeerBuffer.
  Result<DirectMapping> MapPeerBuffer(const std::string& address, const std::string& rkey,
                                      uint64_t base, uint64_t len) {
    std::lock_guard<std::mutex> lk(mu_);
    if (unmappable_.count(address) != 0)
      return Status(DYAD_RC_NOTSUP, "no shared-memory path to the requester");
    auto not_mappable = [&](const Status& st) {
      if (unmappable_.size() >= kMaxUnmappable) unmappable_.clear();
      unmappable_.insert(address);
      return st;
    };
    std::shared_ptr<DirectPeer>& entry = direct_[address];
    if (!entry) {
      Result<ucp_ep_h> ep = SharedMemoryEndpointLocked(address);
      if (!ep.ok()) {
        direct_.erase(address);
        return not_mappable(ep.status());
      }
      entry = std::make_shared<DirectPeer>();
      entry->ep = *ep;
      entry->last_used = std::chrono::steady_clock::now();
      TrimDirectPeersLocked();  // never the newest entry
    }
    const std::shared_ptr<DirectPeer> peer = direct_.at(address);
    auto it = peer->rkeys.find(rkey);
    if (it == peer->rkeys.end()) {
      if (peer->rkeys.size() >= kMaxKeysPerPeer)
        return Status(DYAD_RC_NOTSUP, "the requester offered more buffers than it can have");
      ucp_rkey_h rk = nullptr;
      const ucs_status_t s = ucp_ep_rkey_unpack(peer->ep, rkey.data(), &rk);
      if (s != UCS_OK) return UcxStatus(DYAD_RC_UCXRKEY_UNPACK_FAILED, "ucp_ep_rkey_unpack", s);
      it = peer->rkeys.emplace(rkey, DirectPeer::MappedKey{rk, 0, 0}).first;
    }
    DirectPeer::MappedKey& mk = it->second;
    void* first = nullptr;
    ucs_status_t s = ucp_rkey_ptr(mk.rk, base, &first);
    if (s != UCS_OK) {
      // The requester's buffers are not in shared memory (its UCX has no
      // shared-memory transport): messages it is.
      return not_mappable(UcxStatus(DYAD_RC_NOTSUP, "ucp_rkey_ptr", s));
    }
    // ucp_rkey_ptr only translates the address: make sure the whole range
    // lies in one shared mapping here, so a wrong offer can never make us
    // write into our own memory (checked once per key and range).
    const uintptr_t lo = reinterpret_cast<uintptr_t>(first);
    if (len == 0 || lo + len < lo)
      return Status(DYAD_RC_BADUNPACK, "requester buffer range is invalid");
    if (!(mk.lo <= lo && lo + len <= mk.hi)) {
      if (!InOneSharedMapping(lo, lo + len))
        return Status(DYAD_RC_BADUNPACK,
                      "requester buffer does not map to one shared memory segment here");
      mk.lo = lo;
      mk.hi = lo + len;
    }
    ++peer->users;
    peer->last_used = std::chrono::steady_clock::now();
    return DirectMapping{peer, static_cast<char*>(first)};
  }

  // Ends a transfer's use of a mapping. After a failure the requester's
  // mappings are dropped (it may have died or restarted): they are
  // unmapped once no transfer writes through them.
  void UnmapPeerBuffer(const std::string& address, DirectMapping* m, bool failed) {
    if (!m->peer) return;
    std::lock_guard<std::mutex> lk(mu_);
    --m->peer->users;
    m->peer->last_used = std::chrono::steady_clock::now();
    if (failed) {
      auto it = direct_.find(address);
      if (it != direct_.end() && it->second == m->peer) {
        direct_.erase(it);
        retired_direct_.insert(m->peer);
      }
    }
    if (m->peer->users == 0 && retired_direct_.erase(m->peer) != 0)
      DestroyDirectPeerLocked(*m->peer);
    m->peer.reset();
    m->ptr = nullptr;
  }

  // ---- Tagged messages.
  //
  // Chunks move as tagged messages into the requester's pre-posted
  // receives. Over transports without native RMA (tcp) UCX 1.13 emulates a
  // put with active messages that the target acknowledges, and an
  // acknowledgement to a peer that died aborts the target's process
  // (ucs_fatal). An eager tagged message needs nothing back from the
  // receiver, so a dead sender only leaves a receive pending, which we
  // cancel.

  // Starts a send of `len` bytes at `buf`. Returns the request, or nullptr
  // when the send completed at once.
  Result<void*> StartSend(ucp_ep_h ep, const void* buf, size_t len, uint64_t tag) {
    ucp_request_param_t p;
    std::memset(&p, 0, sizeof(p));
    std::lock_guard<std::mutex> lk(mu_);
    if (failed_eps_.count(ep) != 0)
      return Status(DYAD_RC_CONNLOST, "ucx endpoint to the requester failed");
    ucs_status_ptr_t r = ucp_tag_send_nbx(ep, buf, len, tag, &p);
    if (UCS_PTR_IS_ERR(r)) {
      const ucs_status_t s = UCS_PTR_STATUS(r);
      return UcxStatus(CodeForUcs(s), "ucp_tag_send_nbx", s);
    }
    return static_cast<void*>(r);
  }

  // Posts a receive of at most `len` bytes into `buf` for exactly `tag`.
  Result<void*> StartRecv(void* buf, size_t len, uint64_t tag) {
    ucp_request_param_t p;
    std::memset(&p, 0, sizeof(p));
    p.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    std::lock_guard<std::mutex> lk(mu_);
    ucs_status_ptr_t r = ucp_tag_recv_nbx(worker_, buf, len, tag, ~uint64_t{0}, &p);
    if (UCS_PTR_IS_ERR(r)) {
      const ucs_status_t s = UCS_PTR_STATUS(r);
      return UcxStatus(CodeForUcs(s), "ucp_tag_recv_nbx", s);
    }
    if (r == nullptr) return Status(DYAD_RC_UCXCOMM_FAIL, "ucp_tag_recv_nbx returned no request");
    return static_cast<void*>(r);
  }

  // Waits (bounded) for the request `*req` (a receive when `recv_len` is not
  // null, which then gets the received length) and frees it. While waiting,
  // watches `watch_fd` when it is >= 0: if it becomes readable (the peer
  // reports an error or hung up), returns OK with *watch_ready set and the
  // request still pending. On a timeout or error the request stays pending
  // (*req unchanged) unless UCX completed it with that error. With *req
  // null, waits only for `watch_fd`.
  Status Wait(void** req, size_t* recv_len, Deadline deadline, int watch_fd, bool* watch_ready) {
    if (watch_ready != nullptr) *watch_ready = false;
    if (*req == nullptr && watch_fd < 0) return Status::OK();
    auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinUs);
    std::unique_lock<std::mutex> lk(mu_);
    // While this thread drives the worker, the progress thread stands aside
    // (see ProgressLoop): on a small machine two threads taking turns on one
    // worker were slower than one driving it.
    struct Driver {
      Engine* e;
      bool counted = false;
      void Set(bool on) {  // mu_ held
        if (on == counted) return;
        counted = on;
        e->drivers_ += on ? 1 : -1;
        if (!on && e->drivers_ == 0) e->drivers_cv_.notify_all();
      }
      ~Driver() { Set(false); }
    } driver{this};
    for (unsigned round = 0;; ++round) {
      // While the worker makes progress, keep driving it: over tcp each
      // call moves about one segment, so sleeping between calls (even for
      // a millisecond) caps the transfer at a few hundred MB/s.
      if (ucp_worker_progress(worker_) != 0)
        spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinUs);
      ucs_status_t s = UCS_INPROGRESS;
      ucp_tag_recv_info_t info;
      std::memset(&info, 0, sizeof(info));
      if (*req == nullptr) {
        // Only waiting for watch_fd.
      } else if (recv_len != nullptr) {
        s = ucp_tag_recv_request_test(*req, &info);
      } else {
        s = ucp_request_check_status(*req);
      }
      if (s != UCS_INPROGRESS) {
        ucp_request_free(*req);
        *req = nullptr;
        if (s != UCS_OK)
          return UcxStatus(CodeForUcs(s), recv_len != nullptr ? "ucx receive" : "ucx send", s);
        if (recv_len != nullptr) *recv_len = info.length;
        return Status::OK();
      }
      const bool spinning = std::chrono::steady_clock::now() < spin_until;
      if (watch_fd >= 0 && (!spinning || *req == nullptr || round % 32 == 0)) {
        pollfd pfd{watch_fd, POLLIN, 0};
        if (::poll(&pfd, 1, 0) > 0) {
          *watch_ready = true;
          return Status::OK();
        }
      }
      if (deadline.expired())
        return Status(DYAD_RC_TIMEOUT, recv_len != nullptr ? "ucx receive made no progress"
                                                           : "ucx send made no progress");
      // Progress it ourselves (letting the progress thread in between)
      // rather than pay a sleep and a wake-up per step. After kSpinUs
      // without progress, sleep until the progress thread reports
      // movement; the timeout only covers a lost wake-up.
      driver.Set(spinning);
      if (spinning) {
        lk.unlock();
        std::this_thread::yield();
        lk.lock();
      } else if (watch_fd >= 0) {
        lk.unlock();
        pollfd pfd{watch_fd, POLLIN, 0};
        (void)::poll(&pfd, 1, 1);
        lk.lock();
      } else {
        cv_.wait_for(lk, std::chrono::milliseconds(1));
      }
    }
  }

  // Waits (bounded) until `fd` is readable, driving the worker meanwhile:
  // over tcp, sends that did not fit the socket move only when the worker
  // is progressed, and the progress thread is not woken for them.
  Status WaitReadable(int fd, Deadline deadline) {
    void* none = nullptr;
    bool ready = false;
    return Wait(&none, nullptr, deadline, fd, &ready);
  }

  // Gives up on a pending request: cancels it and progresses (at most
  // kDrainMs) until UCX lets go of it. Returns true when it completed, so its
  // buffer is no longer touched; otherwise it is freed anyway (UCX releases
  // it when it completes) and the caller must not reuse the buffer soon.
  bool Cancel(void** req) {
    if (*req == nullptr) return true;
    std::lock_guard<std::mutex> lk(mu_);
    ucp_request_cancel(worker_, *req);
    const Deadline d = Deadline::AfterMs(kDrainMs);
    while (ucp_request_check_status(*req) == UCS_INPROGRESS && !d.expired())
      ucp_worker_progress(worker_);
    const bool done = ucp_request_check_status(*req) != UCS_INPROGRESS;
    ucp_request_free(*req);
    *req = nullptr;
    return done;
  }

 private:
  static void OnEndpointError(void* arg, ucp_ep_h ep, ucs_status_t status) {
    // Called from ucp_worker_progress, so mu_ is already held.
    auto* self = static_cast<Engine*>(arg);
    DYAD_LOG_DEBUG("ucx: endpoint error: %s", ucs_status_string(status));
    self->failed_eps_.insert(ep);
  }

  // Every tagged message this worker should receive is expected: a
  // requester posts the receive for a chunk before it lets the owner send
  // that chunk (its offer covers the first kSlots chunks, each credit the
  // next one). A message that found no receive is therefore a late one of
  // a failed transfer whose receives were cancelled (or garbage); it is
  // received into scratch memory and dropped, so nothing accumulates in
  // UCX's unexpected-message queue. Called with mu_ held.
  void DropUnexpectedLocked() {
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
    dropping_.erase(std::remove_if(dropping_.begin(), dropping_.end(),
                                   [](Dropping& d) {
                                     if (ucp_request_check_status(d.req) == UCS_INPROGRESS)
                                       return false;
                                     ucp_request_free(d.req);
                                     return true;
                                   }),
                    dropping_.end());
  }

  // An endpoint to `address` without peer error handling, accepted only if
  // UCX put every lane on shared memory (never tcp: a tcp endpoint without
  // error handling would take the process down when its peer dies).
  Result<ucp_ep_h> SharedMemoryEndpointLocked(const std::string& address) {
    ucp_ep_params_t p;
    std::memset(&p, 0, sizeof(p));
    p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    p.address = reinterpret_cast<const ucp_address_t*>(address.data());
    p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    ucp_ep_h ep = nullptr;
    const ucs_status_t s = ucp_ep_create(worker_, &p, &ep);
    if (s != UCS_OK) return UcxStatus(DYAD_RC_NOTSUP, "ucp_ep_create (shared memory)", s);
    const std::string info = CaptureUcxInfo([&](FILE* f) { ucp_ep_print_info(ep, f); });
    int lanes = 0;
    bool memory_only = true;
    for (size_t pos = 0; (pos = info.find("lane[", pos)) != std::string::npos; pos += 5) {
      const size_t eol = info.find('\n', pos);
      const std::string line = info.substr(pos, eol == std::string::npos ? eol : eol - pos);
      ++lanes;
      bool memory = false;
      for (const char* tl : {":sysv/", ":posix/", ":xpmem/", ":cma/", ":knem/", ":self/"}) {
        if (line.find(tl) != std::string::npos) memory = true;
      }
      memory_only = memory_only && memory;
    }
    if (lanes == 0 || !memory_only) {
      CloseQuietEndpointLocked(ep);
      return Status(DYAD_RC_NOTSUP, "the requester is not reachable through shared memory");
    }
    return ep;
  }

  // Closes an endpoint that never carried traffic (or only shared-memory
  // traffic that completed): a flush close, reaped like the others.
  void CloseQuietEndpointLocked(ucp_ep_h ep) {
    ucp_request_param_t p;
    std::memset(&p, 0, sizeof(p));
    ucs_status_ptr_t r = ucp_ep_close_nbx(ep, &p);
    if (UCS_PTR_IS_PTR(r)) closing_.push_back(r);
  }

  void DestroyDirectPeerLocked(DirectPeer& peer) {
    for (auto& [key, mk] : peer.rkeys) ucp_rkey_destroy(mk.rk);
    peer.rkeys.clear();
    if (peer.ep != nullptr) CloseQuietEndpointLocked(peer.ep);
    peer.ep = nullptr;
  }

  // Unmaps requesters idle for kDirectIdleMs, and keeps at most
  // kMaxDirectPeers mapped (the least recently used idle ones go first; a
  // restarted requester is a new address).
  void TrimDirectPeersLocked() {
    const auto idle_since =
        std::chrono::steady_clock::now() - std::chrono::milliseconds(kDirectIdleMs);
    for (auto it = direct_.begin(); it != direct_.end();) {
      if (it->second && it->second->users == 0 && it->second->last_used < idle_since) {
        DestroyDirectPeerLocked(*it->second);
        it = direct_.erase(it);
      } else {
        ++it;
      }
    }
    while (direct_.size() > kMaxDirectPeers) {
      auto victim = direct_.end();
      for (auto it = direct_.begin(); it != direct_.end(); ++it) {
        if (!it->second || it->second->users > 0) continue;
        if (victim == direct_.end() || it->second->last_used < victim->second->last_used)
          victim = it;
      }
      if (victim == direct_.end()) return;  // all busy
      DestroyDirectPeerLocked(*victim->second);
      direct_.erase(victim);
    }
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

  // Receive buffers are allocated by UCX, which takes them from shared
  // memory when it can (System V or POSIX segments), so that a same-host
  // owner can map them; send buffers are plain anonymous memory.
  Result<std::unique_ptr<Buffer>> MapBuffer(PoolKind kind, size_t len) {
    if (kind == kRecvPool && shm_capable_) {
      Result<std::unique_ptr<Buffer>> b = AllocateBuffer(len);
      if (b.ok()) return b;
      DYAD_LOG_DEBUG("ucx: %s; using anonymous memory", b.status().ToString().c_str());
    }
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

  Result<std::unique_ptr<Buffer>> AllocateBuffer(size_t len) {
    ucp_mem_map_params_t mp;
    std::memset(&mp, 0, sizeof(mp));
    mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_LENGTH | UCP_MEM_MAP_PARAM_FIELD_FLAGS;
    mp.length = len;
    mp.flags = UCP_MEM_MAP_ALLOCATE;
    std::lock_guard<std::mutex> lk(mu_);
    ucp_mem_h memh = nullptr;
    ucs_status_t s = ucp_mem_map(context_, &mp, &memh);
    if (s != UCS_OK) return UcxStatus(DYAD_RC_UCXMMAP_FAIL, "ucp_mem_map (allocate)", s);
    ucp_mem_attr_t attr;
    std::memset(&attr, 0, sizeof(attr));
    attr.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS | UCP_MEM_ATTR_FIELD_LENGTH;
    s = ucp_mem_query(memh, &attr);
    void* packed = nullptr;
    size_t packed_len = 0;
    if (s == UCS_OK && attr.length < len) s = UCS_ERR_NO_MEMORY;
    if (s == UCS_OK) s = ucp_rkey_pack(context_, memh, &packed, &packed_len);
    if (s != UCS_OK) {
      ucp_mem_unmap(context_, memh);
      return UcxStatus(DYAD_RC_UCXMMAP_FAIL, "ucp_mem_query/ucp_rkey_pack", s);
    }
    auto b = std::make_unique<Buffer>();
    b->base = static_cast<char*>(attr.address);
    b->len = len;
    b->memh = memh;
    b->ucx_allocated = true;
    b->rkey.assign(static_cast<const char*>(packed), packed_len);
    ucp_rkey_buffer_release(packed);
    return Result<std::unique_ptr<Buffer>>(std::move(b));
  }

  // Drives the worker: progresses while there is work, then arms the event
  // fd and sleeps on it (bounded, so shutdown is noticed).
  void ProgressLoop() {
    std::unique_lock<std::mutex> lk(mu_);
    while (!stopping_) {
      if (drivers_ > 0) {
        // A waiting transfer drives the worker; it lets us know when it
        // stops (the timeout re-checks for shutdown).
        drivers_cv_.wait_for(lk, std::chrono::milliseconds(kProgressPollMs));
        continue;
      }
      bool moved = false;
      for (int i = 0; i < 256 && ucp_worker_progress(worker_) != 0; ++i) moved = true;
      ReapClosesLocked();
      DropUnexpectedLocked();
      if (!direct_.empty()) TrimDirectPeersLocked();
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
      drivers_cv_.notify_all();
    }
    if (progress_.joinable()) progress_.join();
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& [addr, peer] : direct_) DestroyDirectPeerLocked(*peer);
      direct_.clear();
      for (auto& peer : retired_direct_) DestroyDirectPeerLocked(*peer);
      retired_direct_.clear();
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
      for (Dropping& d : dropping_) ucp_request_free(d.req);
      dropping_.clear();
    }
    for (auto& pool : pools_) {
      for (std::unique_ptr<Buffer>& b : pool) {
        if (b->memh != nullptr) ucp_mem_unmap(context_, b->memh);
        if (!b->ucx_allocated) ::munmap(b->base, b->len);
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
  bool shm_capable_ = false;
  bool eager_only_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::string address_;
  bool stopping_ = false;
  int drivers_ = 0;  // threads spinning in Wait (guarded by mu_)
  std::condition_variable drivers_cv_;
  std::thread progress_;
  std::map<std::string, ucp_ep_h> eps_;
  std::set<ucp_ep_h> failed_eps_;
  std::map<ucp_ep_h, int> ep_users_;  // transfers holding each endpoint
  std::set<ucp_ep_h> retired_;         // out of the cache, closed at last release
  std::vector<void*> closing_;
  struct Dropping {
    void* req;
    std::unique_ptr<char[]> scratch;
  };
  std::vector<Dropping> dropping_;  // receives of unexpected messages (see DropUnexpectedLocked)
  std::map<std::string, std::shared_ptr<DirectPeer>> direct_;  // by worker address
  std::set<std::shared_ptr<DirectPeer>> retired_direct_;       // unmapped at last release
  std::set<std::string> unmappable_;  // addresses without a shared-memory path

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
  // The owner is known to have stopped sending (it reported an error after
  // cancelling its sends, or its session is gone): only fragments already
  // on their way can still land, so a short rest is enough.
  void OwnerStopped() { quarantine_ms_ = kShortQuarantineMs; }

 private:
  UcxTransport::Engine* const engine_;
  UcxTransport::Engine::Buffer* const b_;
  int64_t quarantine_ms_;
  bool ok_ = false;
};

// The owner's side of a same-host transfer: chunk i is read from the file
// straight into slot i % slots of the requester's mapped buffer, then
// announced on the session as kChunk {i, length}; from chunk `slots` on,
// the slot is reused once the requester's kCredit {i - slots} says it has
// written the slot out. No UCX call is made.
Status PushDirect(Channel& session, const FileSource& src, char* target, uint64_t slot,
                  uint64_t slots, int64_t idle_ms, TransferStats* stats) {
  const uint64_t n_chunks = (src.size + slot - 1) / slot;
  uint16_t type = 0;
  std::string payload;
  for (uint64_t i = 0; i < n_chunks; ++i) {
    if (i >= slots) {
      DYAD_RETURN_IF_ERROR(session.RecvFrame(&type, &payload, IdleDeadline(idle_ms)));
      if (type == UcxTransport::kErrorFrame) return DecodeErrorFrame(payload, "requester");
      Decoder credit(payload);
      const uint64_t idx = credit.U64();
      if (type != UcxTransport::kCreditFrame || !credit.done() || idx != i - slots)
        return Status(DYAD_RC_BADUNPACK,
                      "unexpected frame instead of credit " + std::to_string(i - slots));
    }
    const uint64_t offset = i * slot;
    const size_t len = static_cast<size_t>(std::min(slot, src.size - offset));
    DYAD_RETURN_IF_ERROR(ReadFully(src.fd, target + (i % slots) * slot, len, offset));
    // The chunk's bytes are in place before the requester can learn of it.
    std::atomic_thread_fence(std::memory_order_release);
    Encoder e;
    e.U64(i).U64(len);
    DYAD_RETURN_IF_ERROR(
        session.SendFrame(UcxTransport::kChunkFrame, e.data(), IdleDeadline(idle_ms)));
    stats->bytes += len;
    stats->chunks += 1;
    stats->direct_bytes += len;
  }
  return Status::OK();
}

}  // namespace

UcxTransport::UcxTransport(const TransportOptions& options)
    : options_(options),
      engine_(std::make_shared<Engine>(SlotBytes(options.chunk_size), PoolBuffersFromEnv())) {}

UcxTransport::~UcxTransport() = default;


std::string UcxTransport::Details() const { return engine_->Details(); }

Status UcxTransport::Warm() {
  DYAD_RETURN_IF_ERROR(engine_->Start());
  return engine_->Preallocate();
}

Result<std::string> UcxTransport::PrepareRequest() {
  DYAD_RETURN_IF_ERROR(engine_->Start());
  Encoder e;
  e.U8(kArgsVersion).Str(engine_->address()).Str(LocalHostId());
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
  const std::string address = args.Str(kMaxAddressBytes);
  const std::string host_id = args.Str(4096);
  if (!args.done() || args_version != kArgsVersion || address.empty())
    return SendErrorAndFail(session,
                            Status(DYAD_RC_BADREQUEST, what + ": bad ucx transport arguments"));

  // The requester's offer: which tags, how many slots of what size.
  uint16_t type = 0;
  std::string payload;
  st = session.RecvFrame(&type, &payload, IdleDeadline(options_.idle_ms));
  if (!st.ok()) return FailSession(session, st.Annotate(what + ": waiting for the buffer offer"));
  if (type == kErrorFrame) return FailSession(session, DecodeErrorFrame(payload, "requester"));
  Decoder offer(payload);
  const uint8_t offer_version = offer.U8();
  const uint64_t transfer_id = offer.U64();
  const uint64_t remote_slot = offer.U64();
  const uint64_t remote_slots = offer.U64();
  const uint64_t remote_base = offer.U64();
  const std::string remote_rkey = offer.Str(kMaxRkeyBytes);
  if (type != kOfferFrame || !offer.done() || offer_version != kArgsVersion || remote_slot == 0 ||
      remote_slot > kMaxSlotBytes || remote_slots == 0 || remote_slots > kMaxSlots ||
      transfer_id > kTransferIdMask)
    return SendErrorAndFail(session, Status(DYAD_RC_BADUNPACK, what + ": bad buffer offer"));

  // Same host: write straight into the requester's buffer when it is in
  // shared memory we can map; otherwise (or when that fails) messages.
  if (!host_id.empty() && host_id == LocalHostId() && engine_->shm_capable() &&
      ShmDirectAllowed() && !remote_rkey.empty()) {
    Result<Engine::DirectMapping> m =
        engine_->MapPeerBuffer(address, remote_rkey, remote_base, remote_slot * remote_slots);
    if (m.ok()) {
      st = PushDirect(session, src, m->ptr, remote_slot, remote_slots, options_.idle_ms, stats);
      engine_->UnmapPeerBuffer(address, &*m, !st.ok());
      if (st.ok()) return st;
      return SendErrorAndFail(session, st.Annotate(what + progress()));
    }
    DYAD_LOG_DEBUG("ucx: same-host requester, no shared-memory path (%s); using messages",
                   m.status().ToString().c_str());
  }

  Result<ucp_ep_h> ep = engine_->Endpoint(address);
  if (!ep.ok()) return SendErrorAndFail(session, ep.status().Annotate(what));
  struct EndpointRef {
    Engine* engine;
    ucp_ep_h ep;
    bool held = true;
    void Release() {
      if (held) engine->ReleaseEndpoint(ep);
      held = false;
    }
    ~EndpointRef() { Release(); }
  } ep_ref{engine_.get(), *ep};
  Result<Engine::Buffer*> buf = engine_->Acquire(Engine::kSendPool, IdleDeadline(options_.idle_ms));
  if (!buf.ok()) return SendErrorAndFail(session, buf.status().Annotate(what));
  // A send buffer is only read by UCX; it rests only when a send of a failed
  // transfer could not be reclaimed (see below).
  BufferLease lease(engine_.get(), *buf, 2 * std::max<int64_t>(options_.idle_ms, 1000));

  const uint64_t chunk = std::min<uint64_t>(remote_slot, engine_->slot_bytes());
  const uint64_t n_chunks = (src.size + chunk - 1) / chunk;
  std::vector<void*> sends(kSlots, nullptr);  // per local slot

  auto wait_send = [&](void** req) -> Status {
    return engine_->Wait(req, nullptr, IdleDeadline(options_.idle_ms), -1, nullptr);
  };
  auto run = [&]() -> Status {
    for (uint64_t i = 0; i < n_chunks; ++i) {
      if (i >= remote_slots) {
        // The requester has written chunk i - slots out of the slot chunk i
        // lands in, and posted the receive for chunk i.
        DYAD_RETURN_IF_ERROR(engine_->WaitReadable(session.fd(), IdleDeadline(options_.idle_ms)));
        DYAD_RETURN_IF_ERROR(session.RecvFrame(&type, &payload, IdleDeadline(options_.idle_ms)));
        if (type == kErrorFrame) return DecodeErrorFrame(payload, "requester");
        Decoder credit(payload);
        const uint64_t idx = credit.U64();
        if (type != kCreditFrame || !credit.done() || idx != i - remote_slots)
          return Status(DYAD_RC_BADUNPACK, "unexpected frame instead of credit " +
                                               std::to_string(i - remote_slots));
      }
      const size_t local_slot = static_cast<size_t>(i % kSlots);
      // Our slot is free once its previous send completed.
      DYAD_RETURN_IF_ERROR(wait_send(&sends[local_slot]));
      const uint64_t offset = i * chunk;
      const size_t len = static_cast<size_t>(std::min(chunk, src.size - offset));
      char* local = (*buf)->base + local_slot * engine_->slot_bytes();
      DYAD_RETURN_IF_ERROR(ReadFully(src.fd, local, len, offset));
      Result<void*> r = engine_->StartSend(*ep, local, len, ChunkTag(transfer_id, i));
      if (!r.ok()) return r.status();
      sends[local_slot] = *r;
      stats->bytes += len;
      stats->chunks += 1;
    }
    for (void*& r : sends) DYAD_RETURN_IF_ERROR(wait_send(&r));
    return Status::OK();
  };

  st = run();
  if (st.ok()) {
    lease.MarkOk();
    return Status::OK();
  }
  // Sends still pending after a failure must not outlive this call: they
  // read our send buffer. The endpoint is retired (force-closed once its
  // last user lets go), the sends cancelled.
  engine_->Evict(address, *ep);
  ep_ref.Release();  // the last user force-closes it, failing its sends
  bool reclaimed = true;
  for (void*& r : sends) reclaimed = engine_->Cancel(&r) && reclaimed;
  if (reclaimed) lease.MarkOk();
  return SendErrorAndFail(session, st.Annotate(what + progress()));
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
  // A receive that cannot be reclaimed after a failure (one already taking
  // a message's fragments) may still land in this buffer; the owner stops
  // within its own idle bound, or at once when it reported its failure.
  BufferLease lease(engine_.get(), *buf,
                    2 * std::max<int64_t>(options_.idle_ms > 0 ? options_.idle_ms : 0, 1000));
  const uint64_t slot = engine_->slot_bytes();
  const uint64_t transfer_id = NextTransferId();
  std::vector<void*> recvs(kSlots, nullptr);
  auto post = [&](uint64_t i) -> Status {
    Result<void*> r = engine_->StartRecv((*buf)->base + (i % kSlots) * slot, slot,
                                         ChunkTag(transfer_id, i));
    if (!r.ok()) return r.status();
    recvs[i % kSlots] = *r;
    return Status::OK();
  };
  // Written into directly by a same-host owner (see PushDirect) rather
  // than by UCX messages.
  bool direct = false;
  // Gives up on every posted receive; the buffer is reusable at once when
  // UCX let go of all of them (and no same-host owner may still write it).
  auto fail = [&](const Status& s, bool tell_owner, bool owner_stopped = false) {
    if (owner_stopped) lease.OwnerStopped();
    bool reclaimed = true;
    for (void*& r : recvs) reclaimed = engine_->Cancel(&r) && reclaimed;
    if (reclaimed && !direct) lease.MarkOk();
    // Chunks the owner still sends find no receive and are dropped by the
    // progress thread (see Engine::DropUnexpectedLocked).
    return tell_owner ? SendErrorAndFail(session, s) : FailSession(session, s);
  };

  // The requester's side of PushDirect: chunk i (of our slot size) is in
  // slot i % kSlots when kChunk {i, length} arrives; write it out, then
  // hand the slot back with kCredit {i} if a later chunk will reuse it.
  auto pull_direct = [&](std::string payload) -> Status {
    const uint64_t n_chunks = (size + slot - 1) / slot;
    for (uint64_t i = 0; i < n_chunks; ++i) {
      uint16_t type = kChunkFrame;
      if (i > 0) {
        Status rs = session.RecvFrame(&type, &payload, IdleDeadline(options_.idle_ms));
        if (!rs.ok())
          return fail(rs.Annotate(what() + ": waiting for a chunk"), false,
                      rs.code() == DYAD_RC_CONNLOST);
      }
      if (type == kErrorFrame)
        return fail(DecodeErrorFrame(payload, "owner").Annotate(what()), false, true);
      Decoder d(payload);
      const uint64_t idx = d.U64();
      const uint64_t len = d.U64();
      const uint64_t want = std::min<uint64_t>(slot, size - i * slot);
      if (type != kChunkFrame || !d.done() || idx != i || len != want)
        return fail(Status(DYAD_RC_BADUNPACK, what() + ": unexpected frame for chunk " +
                                                  std::to_string(i)),
                    true);
      std::atomic_thread_fence(std::memory_order_acquire);
      Status ws = WriteFully(sink_fd, (*buf)->base + (i % kSlots) * slot, static_cast<size_t>(len));
      if (!ws.ok()) return fail(Status(DYAD_RC_BADFIO, what() + ": " + ws.message()), true);
      stats->bytes += len;
      stats->chunks += 1;
      stats->direct_bytes += len;
      if (i + kSlots < n_chunks) {
        Encoder e;
        e.U64(i);
        Status cs = session.SendFrame(kCreditFrame, e.data(), IdleDeadline(options_.idle_ms));
        if (!cs.ok()) return fail(cs.Annotate(what()), false);
      }
    }
    lease.MarkOk();
    return Status::OK();
  };

  // Until the first chunk arrives the chunk size is unknown (the owner may
  // use smaller slots): one receive per slot may cover every chunk.
  for (uint64_t i = 0; i < static_cast<uint64_t>(kSlots); ++i) {
    st = post(i);
    if (!st.ok()) return fail(st.Annotate(what()), true);
  }
  Encoder offer;
  offer.U8(kArgsVersion)
      .U64(transfer_id)
      .U64(slot)
      .U64(kSlots)
      .U64(reinterpret_cast<uintptr_t>((*buf)->base))
      // A key only for a buffer in shared memory: without one, the owner
      // sends messages and never tries to reach us through shared memory.
      .Str((*buf)->ucx_allocated && ShmDirectAllowed() ? (*buf)->rkey : std::string());
  st = session.SendFrame(kOfferFrame, offer.data(), IdleDeadline(options_.idle_ms));
  if (!st.ok()) return fail(st.Annotate(what()), false);

  uint64_t chunk = 0;     // learned from chunk 0
  uint64_t n_chunks = 1;  // likewise
  for (uint64_t i = 0; i < n_chunks; ++i) {
    size_t got = 0;
    bool session_ready = false;
    st = engine_->Wait(&recvs[i % kSlots], &got, IdleDeadline(options_.idle_ms), session.fd(),
                       &session_ready);
    if (!st.ok()) return fail(st.Annotate(what() + ": waiting for a chunk"), true);
    if (session_ready) {
      // The owner only ever sends an error here; or it hung up.
      uint16_t type = 0;
      std::string payload;
      st = session.RecvFrame(&type, &payload, Deadline::AfterMs(1000));
      if (!st.ok())
        return fail(st.Annotate(what() + ": waiting for a chunk"), false,
                    st.code() == DYAD_RC_CONNLOST);
      if (type == kErrorFrame)
        return fail(DecodeErrorFrame(payload, "owner").Annotate(what()), false, true);
      if (type == kChunkFrame && i == 0) {
        // A same-host owner writes into the buffer itself: the receives
        // will never match (their tags are this transfer's).
        direct = true;
        for (void*& r : recvs) {
          if (!engine_->Cancel(&r))
            return fail(Status(DYAD_RC_UCXCOMM_FAIL, what() + ": a receive could not be cancelled"),
                        true);
        }
        return pull_direct(payload);
      }
      return fail(Status(DYAD_RC_BADUNPACK, what() + ": unexpected frame during the transfer"),
                  true);
    }
    if (i == 0) {
      chunk = got;
      if (chunk == 0 || chunk > slot || chunk > size)
        return fail(Status(DYAD_RC_BADUNPACK, what() + ": bad first chunk"), true);
      n_chunks = (size + chunk - 1) / chunk;
    }
    const uint64_t want = std::min<uint64_t>(chunk, size - i * chunk);
    if (got != want)
      return fail(Status(DYAD_RC_BADUNPACK, what() + ": chunk " + std::to_string(i) + " has " +
                                                std::to_string(got) + " bytes, expected " +
                                                std::to_string(want)),
                  true);
    st = WriteFully(sink_fd, (*buf)->base + (i % kSlots) * slot, static_cast<size_t>(got));
    if (!st.ok()) return fail(Status(DYAD_RC_BADFIO, what() + ": " + st.message()), true);
    stats->bytes += got;
    stats->chunks += 1;
    if (i + kSlots < n_chunks) {
      st = post(i + kSlots);
      if (!st.ok()) return fail(st.Annotate(what()), true);
      Encoder e;
      e.U64(i);
      st = session.SendFrame(kCreditFrame, e.data(), IdleDeadline(options_.idle_ms));
      if (!st.ok()) return fail(st.Annotate(what()), false);
    }
  }
  // Receives posted for chunks that do not exist (a file of fewer chunks
  // than slots) are withdrawn; none can match, the tags are unique.
  for (void*& r : recvs) {
    if (r != nullptr && !engine_->Cancel(&r))
      return fail(Status(DYAD_RC_UCXCOMM_FAIL, what() + ": a spare receive could not be cancelled"),
                  true);
  }
  lease.MarkOk();
  return Status::OK();
}

DYAD_DEFINE_TRANSPORT_FACTORY(ucx, UcxTransport)

}  // namespace dyad
