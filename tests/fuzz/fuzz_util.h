// fuzz_util.h: helpers shared by the libFuzzer targets of tests/fuzz.
//
// FedChannel turns the fuzzer's bytes into what a hostile peer would send:
// one end of a socketpair gets the bytes and is then shut down for writing,
// the other end is the Channel under test. Nothing blocks: once the bytes
// are consumed the Channel sees the peer close.
#pragma once

#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "common/net.h"
#include "common/seal.h"

namespace dyad::fuzz {

// Aborts (a finding) when a property the code promises does not hold.
inline void Check(bool ok) {
  if (!ok) std::abort();
}

class FedChannel {
 public:
  FedChannel(std::string_view bytes, Trust trust) {
    int fds[2];
    Check(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
    // Room for any input the fuzzer is allowed (-max_len) in one go.
    const int room = 1 << 20;
    ::setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &room, sizeof room);
    ::setsockopt(fds[0], SOL_SOCKET, SO_RCVBUF, &room, sizeof room);
    peer_.reset(fds[1]);
    channel_ = std::make_unique<Channel>(UniqueFd(fds[0]), trust);
    Feed(bytes);
    ::shutdown(peer_.get(), SHUT_WR);
  }
  Channel& channel() { return *channel_; }
  int peer() const { return peer_.get(); }

 private:
  void Feed(std::string_view bytes) {
    while (!bytes.empty()) {
      const ssize_t n =
          ::send(peer_.get(), bytes.data(), bytes.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n <= 0) return;  // the buffer is full: the rest is simply not sent
      bytes.remove_prefix(static_cast<size_t>(n));
    }
  }
  UniqueFd peer_;
  std::unique_ptr<Channel> channel_;
};

// Both directions' record ciphers from fixed keys, so a harness can seal
// what the reader will open.
struct FixedCiphers {
  std::unique_ptr<RecordCipher> send, recv;
  explicit FixedCiphers(LinkProtection level) {
    unsigned char key[kSealKeySize];
    for (size_t i = 0; i < sizeof key; ++i) key[i] = static_cast<unsigned char>(i * 7 + 1);
    auto s = RecordCipher::Create(key, level, true);
    auto r = RecordCipher::Create(key, level, false);
    Check(s.ok() && r.ok());
    send = std::move(*s);
    recv = std::move(*r);
  }
};

}  // namespace dyad::fuzz
