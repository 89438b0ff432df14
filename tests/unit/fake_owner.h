// fake_owner.h: a peer that answers as dyad-service rank N (real handshake,
// real sockets) but serves fetches the way a test needs: never answering
// them (a hung owner), trickling the answer a few KiB at a time, or sending
// only the reply (the file's size) and then nothing (an owner that hangs
// once the transfer began, whatever the transport). Its
// membership record goes into the cluster's store so that real services
// fetch from it as from any owner. Stop() (or the destructor) ends every
// connection and joins every thread, also when a test fails.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
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

class FakeOwner {
 public:
  enum class Mode { kSilent, kTrickle, kReplyThenSilent };
  static constexpr uint64_t kIncarnation = 0x5eed;
  static constexpr uint64_t kVersion = 1234567890123ull;
  static constexpr size_t kPiece = 8u << 10;
  static constexpr int kPieceGapMs = 30;

  FakeOwner(uint32_t rank, Mode mode, LinkProtection protection, std::string content = {})
      : rank_(rank), mode_(mode), protection_(protection), content_(std::move(content)) {}
  ~FakeOwner() { Stop(); }

  // Listens on loopback and registers as `rank_` in the store at `root`.
  Status Start(const std::string& root) {
    Result<SocketAddress> bound = ListenOnLoopback(&listen_);
    DYAD_RETURN_IF_ERROR(bound.status());
    address = bound->ToString();
    DYAD_RETURN_IF_ERROR(RegisterRank(root, rank_, kIncarnation, address, "fake-owner"));
    threads_.emplace_back([this] { AcceptLoop(); });
    return Status::OK();
  }

  void Stop() {
    stop_ = true;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& ch : conns_) ::shutdown(ch->fd(), SHUT_RDWR);
    }
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
    conns_.clear();  // closed only now: no descriptor number is reused meanwhile
  }

  std::string address;
  std::atomic<int> fetches{0};     // fetch requests received
  std::atomic<int> active{0};      // fetches being answered now
  std::atomic<int> max_active{0};  // most answered at once
  std::atomic<int> hung_up{0};     // connections the requester closed

 private:
  void AcceptLoop() {
    while (!stop_) {
      Result<UniqueFd> fd = Accept(listen_.get(), Deadline::AfterMs(100));
      if (!fd.ok()) continue;
      std::lock_guard<std::mutex> lk(mu_);
      conns_.push_back(std::make_unique<Channel>(std::move(*fd), Trust::kUnauthenticated));
      Channel* ch = conns_.back().get();
      if (stop_) ::shutdown(ch->fd(), SHUT_RDWR);
      threads_serving_.emplace_back([this, ch] { Serve(*ch); });
    }
    for (std::thread& t : threads_serving_) t.join();
  }

  void Serve(Channel& ch) {
    AuthConfig cfg;
    cfg.secret = "test-secret-0123456789abcdef0123";
    cfg.protection = protection_;
    Authenticator auth(cfg);
    PeerIdentity peer;
    if (!auth.Accept(ch, PeerIdentity{rank_, kIncarnation}, Deadline::AfterMs(5000), &peer).ok())
      return;
    while (!stop_) {
      uint16_t type = 0;
      std::string payload;
      Status st = ch.RecvFrame(&type, &payload, Deadline::AfterMs(100));
      if (st.code() == DYAD_RC_TIMEOUT) continue;
      if (!st.ok()) {
        ++hung_up;
        return;
      }
      if (type != static_cast<uint16_t>(MsgType::kFetch)) continue;
      ++fetches;
      if (mode_ == Mode::kSilent) continue;  // never answers; notices a hang-up
      if (mode_ == Mode::kReplyThenSilent) {
        SendFetchReply(ch, Deadline::AfterMs(1000));
        continue;  // then nothing: the requester's transfer waits for bytes
      }
      const int now = ++active;
      int seen = max_active.load();
      while (now > seen && !max_active.compare_exchange_weak(seen, now)) {
      }
      Trickle(ch);
      --active;
    }
  }

  // The FetchReply for a file of content_.size() bytes.
  void SendFetchReply(Channel& ch, Deadline d) {
    FetchReply fr;
    fr.size = content_.size();
    fr.version = kVersion;
    Encoder e;
    fr.EncodeTo(e);
    (void)ch.SendFrame(static_cast<uint16_t>(MsgType::kReply), EncodeReply(Status::OK(), e.data()),
                       d);
  }

  // The whole answer (reply, bytes, verdict) as the session carries it,
  // sent kPiece bytes every kPieceGapMs.
  void Trickle(Channel& ch) {
    std::string wire;
    ch.CaptureSends(&wire);
    const Deadline d = Deadline::AfterMs(1000);
    SendFetchReply(ch, d);
    if (protection_ == LinkProtection::kNone) {
      wire += content_;
    } else {
      for (size_t off = 0; off < content_.size(); off += 32u << 10)
        (void)ch.SendFrame(static_cast<uint16_t>(MsgType::kFileData),
                           std::string_view(content_).substr(off, 32u << 10), d);
    }
    (void)ch.SendFrame(static_cast<uint16_t>(MsgType::kReply), EncodeReply(Status::OK()), d);
    ch.CaptureSends(nullptr);
    for (size_t off = 0; off < wire.size() && !stop_; off += kPiece) {
      if (off > 0) std::this_thread::sleep_for(std::chrono::milliseconds(kPieceGapMs));
      const size_t n = std::min(kPiece, wire.size() - off);
      if (!ch.SendAll(wire.data() + off, n, Deadline::AfterMs(2000)).ok()) return;
    }
  }

  const uint32_t rank_;
  const Mode mode_;
  const LinkProtection protection_;
  const std::string content_;
  UniqueFd listen_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::vector<std::unique_ptr<Channel>> conns_;
  std::vector<std::thread> threads_;          // the accept loop
  std::vector<std::thread> threads_serving_;  // one per connection (joined by the loop)
};

}  // namespace testing_services
}  // namespace dyad
