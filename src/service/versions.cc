#include "service/versions.h"

#include "common/log.h"
#include "common/net.h"
#include "service/peer_rpc.h"

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

// The notices of one publication, one receiver after the other.
class VersionNotices::SendOp final : public Resumable {
 public:
  SendOp(VersionNotices* v, Addressed to, std::string upath)
      : v_(v), to_(std::move(to)), upath_(std::move(upath)) {}

  bool Step(Wait* wait) override {
    while (next_ < to_.size()) {
      if (!rpc_)
        rpc_ = std::make_unique<PeerRpcOp>(v_->peers_, to_[next_].first, MsgType::kSupersede,
                                           to_[next_].second, v_->rpc_timeout_ms_);
      if (!rpc_->Step(wait)) return false;
      if (!rpc_->status().ok())
        DYAD_LOG_WARN("cannot tell rank %u that '%s' has a new version: %s", to_[next_].first,
                      upath_.c_str(), rpc_->status().ToString().c_str());
      rpc_.reset();
      ++next_;
    }
    return true;
  }
  void Expired() override {
    if (rpc_) rpc_->Expired();
  }
  bool NextStepBlocks() const override {
    return rpc_ ? rpc_->NextStepBlocks()
                : next_ < to_.size() && !v_->peers_->Known(to_[next_].first);
  }
  // The requester went away or the service stops: the rest are not sent.
  void Abandon(const Status& why) override {
    if (rpc_) rpc_->Abandon(why);
    rpc_.reset();
    next_ = to_.size();
  }

 private:
  VersionNotices* const v_;
  const Addressed to_;
  const std::string upath_;
  size_t next_ = 0;
  std::unique_ptr<PeerRpcOp> rpc_;
};

std::shared_ptr<Resumable> VersionNotices::Sending(Addressed to, std::string upath) {
  return std::make_shared<SendOp>(this, std::move(to), std::move(upath));
}

}  // namespace dyad
