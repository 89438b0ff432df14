#include "transport/ofi/ofi_fabric.h"

#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <sys/eventfd.h>

#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "common/log.h"

namespace dyad {
namespace {

// Bounds an endpoint name we accept from libfabric (and from peers).
constexpr size_t kMaxAddressBytes = 64u << 10;

std::string PeerKey(const std::string& address, uint64_t instance) {
  std::string key = address;
  key.append(reinterpret_cast<const char*>(&instance), sizeof(instance));
  return key;
}

uint64_t RandomInstance() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (uint64_t{rd()} << 32) ^ rd();
  return v;
}

void CloseFid(fid* f) {
  if (f == nullptr) return;
  const int rc = fi_close(f);
  if (rc != 0) DYAD_LOG_DEBUG("ofi: fi_close: %s", fi_strerror(-rc));
}

}  // namespace

OfiFabric::OfiFabric(OfiProvider provider)
    : info_(std::move(provider.info)), choice_(std::move(provider.choice)) {}

OfiFabric::~OfiFabric() {
  Stop();
  CloseObjects();
}

Result<std::shared_ptr<OfiFabric>> OfiFabric::Open(OfiProvider provider) {
  std::shared_ptr<OfiFabric> f(new OfiFabric(std::move(provider)));
  f->instance_ = RandomInstance();
  f->wake_fd_ = UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!f->wake_fd_.valid()) return StatusFromErrno(errno, "eventfd", DYAD_RC_MARGOINIT_FAIL);
  {
    MutexLock lk(f->mu_);  // (no other thread yet: libfabric objects are used under mu_)
    DYAD_RETURN_IF_ERROR(f->OpenObjects());
  }
  OfiFabric* raw = f.get();
  f->progress_ = std::thread([raw] { raw->ProgressLoop(); });
  DYAD_LOG_DEBUG("ofi: endpoint up: %s; address %zu bytes; completions %s",
                 f->choice_.Describe().c_str(), f->address_.size(),
                 f->polled() ? "polled" : "by wait fd");
  return f;
}

Status OfiFabric::OpenObjects() {
  auto failed = [&](const char* what, int rc) {
    return Status(DYAD_RC_MARGOINIT_FAIL, "ofi (" + choice_.provider + " on " + choice_.domain +
                                              "): " + OfiError(what, rc));
  };
  int rc = fi_fabric(info_->fabric_attr, &fabric_, nullptr);
  if (rc != 0) return failed("fi_fabric", rc);
  rc = fi_domain(fabric_, info_.get(), &domain_, nullptr);
  if (rc != 0) return failed("fi_domain", rc);
  rc = fi_endpoint(domain_, info_.get(), &ep_, nullptr);
  if (rc != 0) return failed("fi_endpoint", rc);
  DYAD_RETURN_IF_ERROR(OpenCq());
  fi_av_attr av_attr;
  std::memset(&av_attr, 0, sizeof(av_attr));
  av_attr.type = info_->domain_attr->av_type;
  rc = fi_av_open(domain_, &av_attr, &av_, nullptr);
  if (rc != 0) return failed("fi_av_open", rc);
  // shm requires both directions bound; reads complete on the transmit side.
  rc = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV);
  if (rc != 0) return failed("fi_ep_bind (cq)", rc);
  rc = fi_ep_bind(ep_, &av_->fid, 0);
  if (rc != 0) return failed("fi_ep_bind (av)", rc);
  rc = fi_enable(ep_);
  if (rc != 0) return failed("fi_enable", rc);
  return ReadAddress();
}

// An fd wait object when the provider has one; FI_WAIT_NONE (polled while
// transfers are active) otherwise.
Status OfiFabric::OpenCq() {
  fi_cq_attr attr;
  std::memset(&attr, 0, sizeof(attr));
  attr.format = FI_CQ_FORMAT_CONTEXT;
  attr.wait_obj = FI_WAIT_FD;
  int rc = fi_cq_open(domain_, &attr, &cq_, nullptr);
  if (rc == 0) {
    int fd = -1;
    rc = fi_control(&cq_->fid, FI_GETWAIT, &fd);
    if (rc == 0 && fd >= 0) {
      cq_fd_ = fd;
      return Status::OK();
    }
    CloseFid(&cq_->fid);
    cq_ = nullptr;
  }
  DYAD_LOG_DEBUG("ofi: %s has no CQ wait fd (%s); polling while transfers run",
                 choice_.provider.c_str(), fi_strerror(-rc));
  attr.wait_obj = FI_WAIT_NONE;
  rc = fi_cq_open(domain_, &attr, &cq_, nullptr);
  if (rc != 0)
    return Status(DYAD_RC_MARGOINIT_FAIL,
                  "ofi (" + choice_.provider + "): " + OfiError("fi_cq_open", rc));
  return Status::OK();
}

Status OfiFabric::ReadAddress() {
  size_t len = 0;
  int rc = fi_getname(&ep_->fid, nullptr, &len);
  if ((rc != 0 && rc != -FI_ETOOSMALL) || len == 0 || len > kMaxAddressBytes)
    return Status(DYAD_RC_MARGOINIT_FAIL,
                  "ofi: cannot size the endpoint name (" + OfiError("fi_getname", rc) + ")");
  std::string addr(len, '\0');
  rc = fi_getname(&ep_->fid, addr.data(), &len);
  if (rc != 0 || len == 0 || len > addr.size())
    return Status(DYAD_RC_MARGOINIT_FAIL, "ofi: " + OfiError("fi_getname", rc));
  addr.resize(len);
  address_ = std::move(addr);
  return Status::OK();
}

void OfiFabric::CloseObjects() {
  MutexLock lk(mu_);
  if (ep_ != nullptr) CloseFid(&ep_->fid);
  if (av_ != nullptr) CloseFid(&av_->fid);
  if (cq_ != nullptr) CloseFid(&cq_->fid);
  if (domain_ != nullptr) CloseFid(&domain_->fid);
  if (fabric_ != nullptr) CloseFid(&fabric_->fid);
  ep_ = nullptr;
  av_ = nullptr;
  cq_ = nullptr;
  domain_ = nullptr;
  fabric_ = nullptr;
  peers_.clear();
  retired_peers_.clear();
}

Result<OfiFabric::Registration> OfiFabric::Register(void* addr, size_t len, uint64_t access) {
  MutexLock lk(mu_);
  if (stopping_) return Status(DYAD_RC_CANCELLED, "ofi transport is shutting down");
  Registration r;
  // A key we choose must be unique in the domain; providers with
  // FI_MR_PROV_KEY ignore it and choose their own.
  int rc = fi_mr_reg(domain_, addr, len, access, 0, next_key_++, 0, &r.mr, nullptr);
  if (rc == 0 && (choice_.mr_mode & FI_MR_ENDPOINT) != 0) {
    rc = fi_mr_bind(r.mr, &ep_->fid, 0);
    if (rc == 0) rc = fi_mr_enable(r.mr);
    if (rc != 0) CloseFid(&r.mr->fid);
  }
  if (rc != 0)
    return Status(DYAD_RC_MARGOINIT_FAIL, "ofi: registering " + std::to_string(len) +
                                              " bytes: " + OfiError("fi_mr_reg", rc));
  r.desc = fi_mr_desc(r.mr);
  r.key = fi_mr_key(r.mr);
  if (r.key == FI_KEY_NOTAVAIL) {
    CloseFid(&r.mr->fid);
    return Status(DYAD_RC_MARGOINIT_FAIL, "ofi: the provider gave a key larger than 64 bits");
  }
  r.remote_base = (choice_.mr_mode & FI_MR_VIRT_ADDR) != 0 ? reinterpret_cast<uintptr_t>(addr) : 0;
  return r;
}

void OfiFabric::Deregister(Registration* r) {
  if (r->mr == nullptr) return;
  MutexLock lk(mu_);
  CloseFid(&r->mr->fid);
  r->mr = nullptr;
}

Result<fi_addr_t> OfiFabric::AcquirePeer(const std::string& address, uint64_t instance) {
  // The AV reads as many bytes as its address format has: never hand it
  // fewer, and a string address must end inside the buffer.
  const bool text = choice_.addr_format == FI_ADDR_STR;
  if (address.empty() || address.size() > kMaxAddressBytes ||
      (text ? address.back() != '\0' : address.size() != address_.size()))
    return Status(DYAD_RC_BADUNPACK, "ofi: the peer's endpoint name (" +
                                         std::to_string(address.size()) +
                                         " bytes) does not fit this provider's address format");
  MutexLock lk(mu_);
  if (stopping_) return Status(DYAD_RC_CANCELLED, "ofi transport is shutting down");
  const std::string key = PeerKey(address, instance);
  auto it = peers_.find(key);
  if (it != peers_.end()) {
    ++it->second.users;
    return it->second.addr;
  }
  // Another incarnation at the same address is a service that restarted.
  for (auto p = peers_.begin(); p != peers_.end();) {
    if (p->first.size() == key.size() && p->first.compare(0, address.size(), address) == 0) {
      retired_peers_[p->second.addr] += p->second.users;
      if (p->second.users == 0) RemovePeerLocked(p->second.addr);
      p = peers_.erase(p);
    } else {
      ++p;
    }
  }
  TrimPeersLocked();
  fi_addr_t addr = FI_ADDR_UNSPEC;
  const int n = fi_av_insert(av_, address.data(), 1, &addr, 0, nullptr);
  if (n != 1)
    return Status(DYAD_RC_BADFETCH, "ofi: cannot add the peer to the address vector (" +
                                        OfiError("fi_av_insert", n < 0 ? n : -FI_EINVAL) + ")");
  peers_[key] = Peer{addr, 1};
  return addr;
}

void OfiFabric::ReleasePeer(const std::string& address, uint64_t instance, fi_addr_t addr,
                            bool failed) {
  MutexLock lk(mu_);
  auto it = peers_.find(PeerKey(address, instance));
  if (it != peers_.end() && it->second.addr == addr) {
    --it->second.users;
    if (!failed) return;
    // The connection behind it may be broken: the next transfer inserts
    // the peer afresh (libfabric keeps an entry while any insertion of it
    // remains, so it is removed once its last user lets go).
    retired_peers_[addr] += it->second.users;
    peers_.erase(it);
  } else {
    // Retired meanwhile: failed in another transfer, or an older incarnation.
    auto r = retired_peers_.find(addr);
    if (r == retired_peers_.end()) return;
    --r->second;
  }
  if (retired_peers_[addr] <= 0) RemovePeerLocked(addr);
}

void OfiFabric::RemovePeerLocked(fi_addr_t addr) {
  retired_peers_.erase(addr);
  if (av_ == nullptr) return;
  fi_addr_t a = addr;
  const int rc = fi_av_remove(av_, &a, 1, 0);
  if (rc != 0) DYAD_LOG_DEBUG("ofi: fi_av_remove: %s", fi_strerror(-rc));
}

// Unused entries go once the table is full (the oldest peers first would
// need an LRU; peers beyond kMaxPeers are rare enough to start afresh).
void OfiFabric::TrimPeersLocked() {
  if (peers_.size() < kMaxPeers) return;
  for (auto it = peers_.begin(); it != peers_.end();) {
    if (it->second.users == 0) {
      RemovePeerLocked(it->second.addr);
      it = peers_.erase(it);
    } else {
      ++it;
    }
  }
}

std::string OfiFabric::Details() {
  MutexLock lk(mu_);
  return choice_.Describe() + "; completions " +
         (polled() ? "polled while transfers run (the provider has no CQ wait object)"
                   : "by CQ wait fd") +
         "; address " + std::to_string(address_.size()) + " bytes; peers cached " +
         std::to_string(peers_.size()) + "; reads " + std::to_string(reads_) + " (" +
         std::to_string(read_errors_) + " failed, " + std::to_string(eagain_) + " busy retries)";
}

}  // namespace dyad
