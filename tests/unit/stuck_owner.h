// stuck_owner.h: an address registered as dyad-service rank N where a new
// session never comes about, the ways a real owner fails to:
//  * kNoChallenge: connections are accepted but the handshake's challenge
//    never comes (a hung or SIGSTOPped service: the kernel still completes
//    TCP handshakes on its listening socket);
//  * kBlackHole: a listening socket whose accept queue is full and never
//    drained: the kernel drops further SYNs, so a connect never completes;
//  * kWrongSecret: the real handshake, with another cluster secret.
// Its membership record goes into the cluster's store so that real services
// dial it as any owner. Stop() (or the destructor) ends every connection
// and joins every thread, also when a test fails.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "proto/auth.h"
#include "proto/protocol.h"
#include "unit/service_pair.h"

namespace dyad {
namespace testing_services {

class StuckOwner {
 public:
  enum class Mode { kNoChallenge, kBlackHole, kWrongSecret };
  static constexpr uint64_t kIncarnation = 0x57c4;

  StuckOwner(uint32_t rank, Mode mode) : rank_(rank), mode_(mode) {}
  ~StuckOwner() { Stop(); }

  // Listens on loopback and registers as `rank_` in the store at `root`.
  Status Start(const std::string& root) {
    Result<SocketAddress> bound = ListenOnLoopback(&listen_, mode_ == Mode::kBlackHole ? 0 : 64);
    DYAD_RETURN_IF_ERROR(bound.status());
    address = bound->ToString();
    if (mode_ == Mode::kBlackHole) DYAD_RETURN_IF_ERROR(FillBacklog(*bound));
    DYAD_RETURN_IF_ERROR(RegisterRank(root, rank_, kIncarnation, address, "stuck-owner"));
    if (mode_ != Mode::kBlackHole) threads_.emplace_back([this] { AcceptLoop(); });
    return Status::OK();
  }

  void Stop() {
    stop_ = true;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& fd : conns_) ::shutdown(fd.get(), SHUT_RDWR);
    }
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
    conns_.clear();
    fillers_.clear();
  }

  // Connections accepted so far.
  int accepted() {
    std::lock_guard<std::mutex> lk(mu_);
    return static_cast<int>(conns_.size());
  }
  // Of those, the ones the requester has not closed. A requester waiting
  // for the challenge sends nothing: anything readable is its hang-up.
  int open() {
    std::lock_guard<std::mutex> lk(mu_);
    if (mode_ != Mode::kNoChallenge) return -1;
    int n = 0;
    for (auto& fd : conns_) {
      pollfd p{fd.get(), POLLIN | POLLRDHUP, 0};
      if (::poll(&p, 1, 0) == 0) ++n;
    }
    return n;
  }

  std::string address;

 private:
  // Two connections of our own: the first fills the queue of a backlog-0
  // socket, the second's SYNs are dropped already.
  Status FillBacklog(const SocketAddress& addr) {
    for (int i = 0; i < 2; ++i) {
      bool connected = false;
      Result<UniqueFd> fd = ConnectStart(addr, &connected);
      DYAD_RETURN_IF_ERROR(fd.status());
      if (i == 0 && !connected) {
        pollfd p{fd->get(), POLLOUT, 0};
        if (::poll(&p, 1, 2000) != 1) return Status(DYAD_RC_SYSFAIL, "filler did not connect");
      }
      fillers_.push_back(std::move(*fd));
    }
    return Status::OK();
  }

  void AcceptLoop() {
    std::vector<std::thread> serving;
    while (!stop_) {
      Result<UniqueFd> fd = Accept(listen_.get(), Deadline::AfterMs(100));
      if (!fd.ok()) continue;
      std::lock_guard<std::mutex> lk(mu_);
      conns_.push_back(std::move(*fd));
      if (mode_ == Mode::kWrongSecret) {
        const int raw = conns_.back().get();
        serving.emplace_back([this, raw] {
          Channel ch(UniqueFd(::dup(raw)), Trust::kUnauthenticated);
          PeerIdentity peer;
          (void)Authenticator("another-secret")
              .Accept(ch, PeerIdentity{rank_, kIncarnation}, Deadline::AfterMs(3000), &peer);
        });
      }
    }
    for (std::thread& t : serving) t.join();
  }

  const uint32_t rank_;
  const Mode mode_;
  UniqueFd listen_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<UniqueFd> conns_;  // accepted; closed only by Stop (no reuse of numbers)
  std::vector<UniqueFd> fillers_;
  std::vector<std::thread> threads_;
};

}  // namespace testing_services
}  // namespace dyad
