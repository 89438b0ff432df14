#include "transport/ucx/ucx_direct.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <mutex>

#include "common/thread_annotations.h"
#include "transport/ucx/ucx_config.h"

namespace dyad::ucx {
namespace {

using Clock = std::chrono::steady_clock;

// Same-host requesters whose buffers an owner keeps mapped (least recently
// used idle ones are unmapped beyond this), and addresses remembered as not
// mappable (forgotten all at once beyond this).
constexpr size_t kMaxDirectPeers = 64;
constexpr size_t kMaxUnmappable = 1024;
// A requester's mapped buffers are unmapped after this long without a
// transfer (a requester that died or restarted would otherwise keep its
// shared memory alive through our mapping).
constexpr int64_t kDirectIdleMs = 30000;
// Keys (buffers) mapped per requester: its pools hold at most 2 x 1024
// buffers (DYAD_UCX_POOL_BUFFERS, plus those resting after failures).
constexpr size_t kMaxKeysPerPeer = 2 * 1024;

// Whether [lo, hi) lies inside one shared (MAP_SHARED) read-write mapping
// of this process, per /proc/self/maps.
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

// Whether every lane `ucp_ep_print_info` lists for `ep` is shared memory.
bool AllLanesSharedMemory(ucp_ep_h ep) {
  const std::string info = CaptureUcxInfo([&](FILE* f) { ucp_ep_print_info(ep, f); });
  int lanes = 0;
  for (size_t pos = 0; (pos = info.find("lane[", pos)) != std::string::npos; pos += 5) {
    const size_t eol = info.find('\n', pos);
    const std::string line = info.substr(pos, eol == std::string::npos ? eol : eol - pos);
    ++lanes;
    bool memory = false;
    for (const char* tl : {":sysv/", ":posix/", ":xpmem/", ":cma/", ":knem/", ":self/"}) {
      if (line.find(tl) != std::string::npos) memory = true;
    }
    if (!memory) return false;
  }
  return lanes > 0;
}

}  // namespace

struct DirectPeers::MappedKey {
  ucp_rkey_h rk = nullptr;
  // [lo, hi): the range ucp_rkey_ptr gave that was checked to lie in one
  // shared mapping of this process (empty until first checked).
  uintptr_t lo = 0, hi = 0;
};

struct DirectPeers::Peer {
  ucp_ep_h ep = nullptr;                  // shared-memory lanes only
  std::map<std::string, MappedKey> keys;  // by packed key, unpacked
  int users = 0;                          // transfers writing through it
  Clock::time_point last_used{};
};

void DirectPeers::Mapping::Done(bool ok) {
  if (!peer_) return;
  MutexLock lk(owner_->worker_.mu());
  owner_->ReleaseLocked(address_, peer_, !ok);
  peer_.reset();
  ptr_ = nullptr;
}

DirectPeers::~DirectPeers() { Clear(); }

Result<DirectPeers::Mapping> DirectPeers::Map(const std::string& address, const std::string& rkey,
                                              uint64_t base, uint64_t len) {
  MutexLock lk(worker_.mu());
  Result<std::shared_ptr<Peer>> peer = PeerLocked(address);
  if (!peer.ok()) return peer.status();
  Result<MappedKey*> key = KeyLocked(**peer, rkey);
  if (!key.ok()) return key.status();
  MappedKey& mk = **key;
  void* first = nullptr;
  const ucs_status_t s = ucp_rkey_ptr(mk.rk, base, &first);
  if (s != UCS_OK) {
    // The requester's buffers are not in shared memory (its UCX has no
    // shared-memory transport): messages it is.
    return NotMappableLocked(address, UcxStatus(DYAD_RC_NOTSUP, "ucp_rkey_ptr", s));
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
  ++(*peer)->users;
  (*peer)->last_used = Clock::now();
  return Mapping(this, address, *peer, static_cast<char*>(first));
}

// The requester's entry, created (with its shared-memory endpoint) on first use.
Result<std::shared_ptr<DirectPeers::Peer>> DirectPeers::PeerLocked(const std::string& address) {
  if (unmappable_.count(address) != 0)
    return Status(DYAD_RC_NOTSUP, "no shared-memory path to the requester");
  auto it = peers_.find(address);
  if (it != peers_.end()) return it->second;
  Result<ucp_ep_h> ep = SharedMemoryEndpointLocked(address);
  if (!ep.ok()) return NotMappableLocked(address, ep.status());
  auto peer = std::make_shared<Peer>();
  peer->ep = *ep;
  peer->last_used = Clock::now();
  peers_[address] = peer;
  TrimLocked(peer.get());
  return peer;
}

// The unpacked key `rkey` of `peer`, unpacked on first use.
Result<DirectPeers::MappedKey*> DirectPeers::KeyLocked(Peer& peer, const std::string& rkey) {
  auto it = peer.keys.find(rkey);
  if (it != peer.keys.end()) return &it->second;
  if (peer.keys.size() >= kMaxKeysPerPeer)
    return Status(DYAD_RC_NOTSUP, "the requester offered more buffers than it can have");
  ucp_rkey_h rk = nullptr;
  const ucs_status_t s = ucp_ep_rkey_unpack(peer.ep, rkey.data(), &rk);
  if (s != UCS_OK) return UcxStatus(DYAD_RC_UCXRKEY_UNPACK_FAILED, "ucp_ep_rkey_unpack", s);
  return &peer.keys.emplace(rkey, MappedKey{rk, 0, 0}).first->second;
}

Status DirectPeers::NotMappableLocked(const std::string& address, const Status& st) {
  if (unmappable_.size() >= kMaxUnmappable) unmappable_.clear();
  unmappable_.insert(address);
  return st;
}

// An endpoint to `address` without peer error handling (UCX 1.13's
// shared-memory transports offer none), accepted only if UCX put every lane
// on shared memory: never tcp, where an endpoint without error handling
// would take the process down when its peer dies. It carries no traffic,
// so a peer's death cannot reach UCX; the fetch session reports it.
Result<ucp_ep_h> DirectPeers::SharedMemoryEndpointLocked(const std::string& address) {
  ucp_ep_params_t p;
  std::memset(&p, 0, sizeof(p));
  p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  p.address = reinterpret_cast<const ucp_address_t*>(address.data());
  p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
  ucp_ep_h ep = nullptr;
  const ucs_status_t s = ucp_ep_create(worker_.handle(), &p, &ep);
  if (s != UCS_OK) return UcxStatus(DYAD_RC_NOTSUP, "ucp_ep_create (shared memory)", s);
  if (!AllLanesSharedMemory(ep)) {
    worker_.CloseEndpointLocked(ep, /*force=*/false);
    return Status(DYAD_RC_NOTSUP, "the requester is not reachable through shared memory");
  }
  return ep;
}

void DirectPeers::ReleaseLocked(const std::string& address, const std::shared_ptr<Peer>& peer,
                                bool failed) {
  --peer->users;
  peer->last_used = Clock::now();
  if (failed) {
    auto it = peers_.find(address);
    if (it != peers_.end() && it->second == peer) {
      peers_.erase(it);
      retired_.insert(peer);
    }
  }
  if (peer->users == 0 && retired_.erase(peer) != 0) DestroyLocked(*peer);
}

// The endpoint only ever carried shared-memory traffic that completed: a
// flush close.
void DirectPeers::DestroyLocked(Peer& peer) {
  for (auto& [key, mk] : peer.keys) ucp_rkey_destroy(mk.rk);
  peer.keys.clear();
  if (peer.ep != nullptr) worker_.CloseEndpointLocked(peer.ep, /*force=*/false);
  peer.ep = nullptr;
}

// Unmaps requesters idle for kDirectIdleMs, and keeps at most
// kMaxDirectPeers mapped (the least recently used idle ones go first; a
// restarted requester is a new address), never `keep`.
void DirectPeers::TrimLocked(const Peer* keep) {
  if (peers_.empty()) return;
  const auto idle_since = Clock::now() - std::chrono::milliseconds(kDirectIdleMs);
  for (auto it = peers_.begin(); it != peers_.end();) {
    if (it->second->users == 0 && it->second->last_used < idle_since) {
      DestroyLocked(*it->second);
      it = peers_.erase(it);
    } else {
      ++it;
    }
  }
  while (peers_.size() > kMaxDirectPeers) {
    auto victim = peers_.end();
    for (auto it = peers_.begin(); it != peers_.end(); ++it) {
      if (it->second->users > 0 || it->second.get() == keep) continue;
      if (victim == peers_.end() || it->second->last_used < victim->second->last_used) victim = it;
    }
    if (victim == peers_.end()) return;  // all busy (or kept)
    DestroyLocked(*victim->second);
    peers_.erase(victim);
  }
}

void DirectPeers::Clear() {
  MutexLock lk(worker_.mu());
  for (auto& [address, peer] : peers_) DestroyLocked(*peer);
  peers_.clear();
  for (const std::shared_ptr<Peer>& peer : retired_) DestroyLocked(*peer);
  retired_.clear();
}

}  // namespace dyad::ucx
