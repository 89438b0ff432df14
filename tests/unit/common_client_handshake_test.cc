// common_client_handshake_test.cc: the connecting side of the handshake in
// steps (ClientHandshake, proto/auth.h) never waits on the peer: a peer
// slow to send its challenge leaves Step returning at once, and the steps
// complete the same handshake Authenticator::Connect does.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <chrono>
#include <future>
#include <thread>

#include "common/time.h"
#include "proto/auth.h"

namespace dyad {
namespace {

struct Pair {
  std::unique_ptr<Channel> client, server;
};

Pair SocketPair() {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  return Pair{std::make_unique<Channel>(UniqueFd(fds[0]), Trust::kUnauthenticated),
              std::make_unique<Channel>(UniqueFd(fds[1]), Trust::kUnauthenticated)};
}

// Drives `hs` as a parked fetch would: a step, then a wait for readability.
bool Drive(ClientHandshake& hs, Channel& ch, Deadline deadline, int* waits) {
  while (!hs.Step(ch, deadline)) {
    ++*waits;
    pollfd p{ch.fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(deadline.RemainingMs(1000))) == 0 && deadline.expired())
      hs.Expired(ch);
  }
  return hs.status().ok();
}

TEST(ClientHandshake, StepsNeverWaitAndAuthenticate) {
  Pair p = SocketPair();
  Authenticator auth("step-secret");
  auto server = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a slow owner
    PeerIdentity seen;
    Status st = auth.Accept(*p.server, PeerIdentity{3, 33}, Deadline::AfterMs(5000), &seen);
    return st.ok() && seen.rank == 8 && seen.incarnation == 88;
  });
  ClientHandshake hs(auth, PeerIdentity{8, 88});
  const uint64_t t0 = MonoNs();
  EXPECT_FALSE(hs.Step(*p.client, Deadline::AfterMs(5000)));
  EXPECT_LT(MonoNs() - t0, 100000000u) << "the first step waited for the challenge";
  int waits = 0;
  ASSERT_TRUE(Drive(hs, *p.client, Deadline::AfterMs(5000), &waits)) << hs.status().ToString();
  EXPECT_GE(waits, 1);
  EXPECT_TRUE(server.get());
  EXPECT_EQ(hs.peer().rank, 3u);
  EXPECT_EQ(hs.peer().incarnation, 33u);
  EXPECT_EQ(p.client->trust(), Trust::kAuthenticated);
  // The session works: a sealed frame each way.
  ASSERT_TRUE(p.client->SendFrame(7, "ping", Deadline::AfterMs(2000)).ok());
  uint16_t type = 0;
  std::string payload;
  ASSERT_TRUE(p.server->RecvFrame(&type, &payload, Deadline::AfterMs(2000)).ok());
  EXPECT_EQ(payload, "ping");
}

TEST(ClientHandshake, SilentPeerExpiresWithTimeout) {
  Pair p = SocketPair();  // the server end never speaks
  Authenticator auth("step-secret");
  ClientHandshake hs(auth, PeerIdentity{8, 88});
  int waits = 0;
  EXPECT_FALSE(Drive(hs, *p.client, Deadline::AfterMs(200), &waits));
  EXPECT_EQ(hs.status().code(), DYAD_RC_TIMEOUT) << hs.status().ToString();
  EXPECT_NE(hs.status().message().find("challenge"), std::string::npos);
  EXPECT_TRUE(p.client->broken());
  EXPECT_EQ(p.client->trust(), Trust::kUnauthenticated);
}

TEST(ClientHandshake, WrongSecretIsRefused) {
  Pair p = SocketPair();
  Authenticator theirs("their-secret"), ours("our-secret");
  auto server = std::async(std::launch::async, [&] {
    PeerIdentity seen;
    return ours.Accept(*p.server, PeerIdentity{3, 33}, Deadline::AfterMs(5000), &seen).code();
  });
  ClientHandshake hs(theirs, PeerIdentity{8, 88});
  int waits = 0;
  EXPECT_FALSE(Drive(hs, *p.client, Deadline::AfterMs(5000), &waits));
  EXPECT_EQ(hs.status().code(), DYAD_RC_AUTH) << hs.status().ToString();
  EXPECT_EQ(server.get(), DYAD_RC_AUTH);
  EXPECT_EQ(p.client->trust(), Trust::kUnauthenticated);
}

}  // namespace
}  // namespace dyad
