#include "service/versions.h"

#include "common/log.h"
#include "common/net.h"
#include "service/peer_rpc.h"
#include "service/peer_waits.h"

namespace dyad {

VersionNotices::VersionNotices(uint32_t self_rank, PeerDirectory* peers, int64_t rpc_timeout_ms,
                               size_t capacity)
    : self_(self_rank), peers_(peers), rpc_timeout_ms_(rpc_timeout_ms), capacity_(capacity) {}

void VersionNotices::NoteReader(const std::string& upath, uint32_t rank) {
  std::lock_guard<std::mutex> lk(mu_);
  auto [it, inserted] = readers_.try_emplace(upath);
  it->second.insert(rank);
  if (!inserted) return;
  order_.push_back(upath);
  if (readers_.size() <= capacity_) return;
  while (readers_.size() > capacity_ / 2 && !order_.empty()) {
    readers_.erase(order_.front());  // a key taken already is skipped here
    order_.pop_front();
  }
}

std::vector<uint32_t> VersionNotices::TakeReaders(const std::string& upath) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = readers_.find(upath);
  if (it == readers_.end()) return {};
  std::vector<uint32_t> out(it->second.begin(), it->second.end());
  readers_.erase(it);  // its slot in order_ is skipped lazily
  return out;
}

void VersionNotices::Address(const std::set<uint32_t>& ranks, const SupersedeNotice& notice,
                             Addressed* to) const {
  Encoder e;
  notice.EncodeTo(e);
  for (uint32_t rank : ranks)
    if (rank != self_) to->emplace_back(rank, e.data());
}

Task<void> VersionNotices::Send(Addressed to, std::string upath, PeerWaits& waits) {
  // One receiver after the other; the Stop (the requester went away, the
  // service stops) leaves the rest unsent.
  for (const auto& [rank, notice] : to) {
    Result<std::string> r =
        co_await PeerRpc(*peers_, rank, MsgType::kSupersede, notice, rpc_timeout_ms_, waits);
    if (waits.stopped()) co_return;
    if (!r.ok())
      DYAD_LOG_WARN("cannot tell rank %u that '%s' has a new version: %s", rank, upath.c_str(),
                    r.status().ToString().c_str());
  }
}

}  // namespace dyad
