#include "service/peers.h"

#include "common/log.h"

namespace dyad {

namespace {
constexpr size_t kMaxIdleSessionsPerPeer = 8;
}

PeerDirectory::PeerDirectory(Kvs* kvs, const Authenticator* auth, PeerIdentity self,
                             int64_t rpc_timeout_ms)
    : kvs_(kvs), auth_(auth), self_(self), rpc_timeout_ms_(rpc_timeout_ms) {}

Result<ServiceRecord> PeerDirectory::Resolve(uint32_t rank, bool refresh) {
  if (!refresh) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = peers_.find(rank);
    if (it != peers_.end() && it->second.have_record) return it->second.record;
  }
  Result<std::optional<std::string>> v = kvs_->Get(kMembersNamespace, MemberKey(rank));
  if (!v.ok()) return v.status().Annotate("resolve service rank " + std::to_string(rank));
  if (!v->has_value())
    return Status(DYAD_RC_NOTFOUND, "no dyad-service with rank " + std::to_string(rank) +
                                        " is registered (is it running?)");
  ServiceRecord rec;
  if (!ServiceRecord::Decode(**v, &rec))
    return Status(DYAD_RC_BADMETADATA, "malformed membership record for rank " + std::to_string(rank));
  std::lock_guard<std::mutex> lk(mu_);
  Peer& p = peers_[rank];
  if (p.have_record && p.record.incarnation != rec.incarnation) p.idle.clear();
  p.have_record = true;
  p.record = rec;
  return rec;
}

Result<std::unique_ptr<Channel>> PeerDirectory::Acquire(uint32_t rank, Deadline deadline) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = peers_.find(rank);
    if (it != peers_.end()) {
      auto& idle = it->second.idle;
      while (!idle.empty()) {
        std::unique_ptr<Channel> ch = std::move(idle.back());
        idle.pop_back();
        if (!ch->broken() && !ch->PeerClosed()) return ch;
      }
    }
  }
  Result<ServiceRecord> rec = Resolve(rank, false);
  if (!rec.ok()) return rec.status();
  Result<SocketAddress> addr = ParseAddress(rec->address);
  if (!addr.ok()) return addr.status();
  Result<UniqueFd> fd = Connect(*addr, deadline.Min(rpc_timeout_ms_));
  if (!fd.ok())
    return fd.status().Annotate("connect to dyad-service rank " + std::to_string(rank) + " at " +
                                rec->address);
  auto ch = std::make_unique<Channel>(std::move(*fd), Trust::kUnauthenticated);
  PeerIdentity peer;
  Status st = auth_->Connect(*ch, self_, deadline.Min(rpc_timeout_ms_), &peer);
  if (!st.ok()) return st.Annotate("authenticate with rank " + std::to_string(rank));
  if (peer.rank != rank || peer.incarnation != rec->incarnation) {
    // The address now belongs to another service or a restarted one.
    Invalidate(rank);
    return Status(DYAD_RC_STALE, "service at " + rec->address + " is rank " +
                                     std::to_string(peer.rank) + " incarnation " +
                                     std::to_string(peer.incarnation) + ", expected rank " +
                                     std::to_string(rank) + " incarnation " +
                                     std::to_string(rec->incarnation));
  }
  return ch;
}

void PeerDirectory::Release(uint32_t rank, std::unique_ptr<Channel> ch) {
  if (!ch || ch->broken()) return;
  std::lock_guard<std::mutex> lk(mu_);
  Peer& p = peers_[rank];
  if (p.idle.size() < kMaxIdleSessionsPerPeer) p.idle.push_back(std::move(ch));
}

void PeerDirectory::Invalidate(uint32_t rank) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = peers_.find(rank);
  if (it == peers_.end()) return;
  it->second.have_record = false;
  it->second.idle.clear();
}

}  // namespace dyad
