#include "service/versions.h"

#include "common/log.h"
#include "common/net.h"

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

size_t VersionNotices::Send(const std::set<uint32_t>& ranks, const SupersedeNotice& notice) {
  Encoder e;
  notice.EncodeTo(e);
  size_t accepted = 0;
  for (uint32_t rank : ranks) {
    if (rank == self_) continue;
    Status st = SendOne(rank, e.data());
    if (st.ok()) {
      ++accepted;
      continue;
    }
    DYAD_LOG_WARN("cannot tell rank %u that '%s' has a new version: %s", rank,
                  notice.record.upath.c_str(), st.ToString().c_str());
  }
  return accepted;
}

Status VersionNotices::SendOne(uint32_t rank, const std::string& payload) {
  const Deadline deadline = Deadline::AfterMs(rpc_timeout_ms_);
  Result<std::unique_ptr<Channel>> ch = peers_->Acquire(rank, deadline);
  if (!ch.ok()) return ch.status();
  std::string body;
  Status st = CallRpc(**ch, MsgType::kSupersede, payload, &body, deadline);
  if (!(*ch)->broken()) peers_->Release(rank, std::move(*ch));
  return st;
}

}  // namespace dyad
