#include "service/transfers.h"

#include <fcntl.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <memory>

#include "common/net.h"
#include "common/time.h"

namespace dyad {

TransferRegistry::Entry& TransferRegistry::Entry::operator=(Entry&& o) noexcept {
  if (this != &o) {
    Reset();
    registry_ = o.registry_;
    it_ = o.it_;
    o.registry_ = nullptr;
  }
  return *this;
}

void TransferRegistry::Entry::Reset() {
  if (registry_ == nullptr) return;
  std::lock_guard<std::mutex> lk(registry_->mu_);
  registry_->items_.erase(it_);
  registry_ = nullptr;
}

TransferRegistry::Entry TransferRegistry::Begin(bool outgoing, const std::string& upath,
                                                uint32_t peer_rank, const std::string& transport,
                                                uint64_t bytes_total, Probe probe) {
  Entry::Item item;
  item.info.outgoing = outgoing;
  item.info.upath = upath;
  item.info.peer_rank = peer_rank;
  item.info.transport = transport;
  item.info.bytes_total = bytes_total;
  item.started_mono_ns = MonoNs();
  item.probe = std::move(probe);
  Entry e;
  std::lock_guard<std::mutex> lk(mu_);
  e.it_ = items_.insert(items_.end(), std::move(item));
  e.registry_ = this;
  return e;
}

std::vector<TransferInfo> TransferRegistry::Snapshot() const {
  std::vector<TransferInfo> out;
  const uint64_t now = MonoNs();
  std::lock_guard<std::mutex> lk(mu_);
  out.reserve(items_.size());
  for (const Entry::Item& item : items_) {
    TransferInfo t = item.info;
    t.elapsed_ns = now - item.started_mono_ns;
    t.bytes_done = item.probe ? item.probe() : TransferInfo::kUnknownBytes;
    out.push_back(std::move(t));
  }
  return out;
}

size_t TransferRegistry::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return items_.size();
}

TransferRegistry::Probe SinkProgress(int sink_fd) {
  if (sink_fd < 0) return nullptr;
  // No duplicate of the descriptor (a fcntl and a close per transfer): the
  // entry holding this probe is removed before the sink closes (header).
  return [sink_fd]() -> uint64_t {
    struct stat st;
    if (::fstat(sink_fd, &st) != 0) return TransferInfo::kUnknownBytes;
    return static_cast<uint64_t>(st.st_size);
  };
}

namespace {
bool BytesAcked(int fd, uint64_t* out) {
  tcp_info info{};
  socklen_t len = sizeof info;
  if (::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;
  // Kernels older than 4.1 return a shorter structure without the field.
  if (len < offsetof(tcp_info, tcpi_bytes_acked) + sizeof info.tcpi_bytes_acked) return false;
  *out = info.tcpi_bytes_acked;
  return true;
}
}  // namespace

TransferRegistry::Probe SessionProgress(int fd, uint64_t total) {
  uint64_t base = 0;
  if (!BytesAcked(fd, &base)) return nullptr;
  return [fd, base, total]() -> uint64_t {
    uint64_t now = 0;
    if (!BytesAcked(fd, &now)) return TransferInfo::kUnknownBytes;
    return std::min<uint64_t>(now - base, total);
  };
}

}  // namespace dyad
