// security_test.cc: a service serves only regular files inside its producer
// directory, only to peers holding the cluster secret, and survives
// malformed and truncated input. The requests are crafted by hand with the
// wire protocol, from inside node B's network, as a hostile peer would.
#include <sys/socket.h>
#include <sys/stat.h>

#include "common/wire.h"
#include "integration/integration_util.h"
#include "proto/auth.h"
#include "proto/protocol.h"

namespace dyad::it {
namespace {

class SecurityTest : public TwoNodeTest {
 protected:
  // A TCP connection from node B to node A's service.
  Channel ConnectToA() {
    auto fd = cluster().ConnectFrom(kB, cluster().node(kA).address(), Deadline::AfterMs(5000));
    EXPECT_TRUE(fd.ok()) << Str(fd.status());
    return Channel(fd.ok() ? std::move(*fd) : UniqueFd(), Trust::kUnauthenticated);
  }

  // Connects and authenticates with `secret`.
  Status Authenticate(Channel& ch, const std::string& secret) {
    Authenticator auth(secret);
    PeerIdentity peer;
    return auth.Connect(ch, PeerIdentity{kB, 4242}, Deadline::AfterMs(5000), &peer);
  }

  // Sends one fetch of `upath` on an authenticated connection; returns the
  // reply's status (the bytes of an accepted fetch are not read).
  Status Fetch(const std::string& upath) {
    Channel ch = ConnectToA();
    DYAD_RETURN_IF_ERROR(Authenticate(ch, cluster().secret()));
    FetchRequest req;
    req.upath = upath;
    req.transport = "tcp";
    Encoder e;
    req.EncodeTo(e);
    std::string body;
    return CallRpc(ch, MsgType::kFetch, e.data(), &body, Deadline::AfterMs(10000));
  }

  // After hostile input: the service still runs and still moves files.
  void ExpectServiceStillServes() {
    ASSERT_TRUE(cluster().ServiceRunning(kA)) << "node A's service died";
    const std::vector<ManifestEntry> files = {{"after/attack.dat", 12345}};
    Produce(files);
    ConsumeOk(files);
  }
};

bool IsRefusal(const Status& st) {
  return st.code() == DYAD_RC_PERM || st.code() == DYAD_RC_BADREQUEST;
}

TEST_F(SecurityTest, PathsEscapingTheProducerDirectoryAreRefused) {
  // Something worth stealing just outside A's directory.
  WriteFileOn(kA, "inside.dat", 10);
  ASSERT_EQ(::symlink("/etc/passwd", PathOn(kA, "escape-abs").c_str()), 0);
  ASSERT_EQ(::symlink("../../secret", PathOn(kA, "escape-rel").c_str()), 0);
  ::mkdir(PathOn(kA, "sub").c_str(), 0755);
  ASSERT_EQ(::symlink("../../log/service.log", PathOn(kA, "sub/escape-deep").c_str()), 0);
  const uint64_t refused_before = Counter(kA, "fetch.refused");

  const std::vector<std::string> attacks = {
      "../secret",  "../../secret", "/etc/passwd",     "sub/../../secret",
      "escape-abs", "escape-rel",   "sub/escape-deep", std::string("inside.dat\0x", 12)};
  for (const std::string& upath : attacks) {
    Status st = Fetch(upath);
    EXPECT_FALSE(st.ok()) << "fetch of '" << upath << "' was accepted";
    EXPECT_TRUE(IsRefusal(st) || st.code() == DYAD_RC_BADFETCH || st.code() == DYAD_RC_NOTFOUND)
        << "'" << upath << "': " << Str(st);
    if (upath.find("..") != std::string::npos || upath[0] == '/' || upath.rfind("escape", 0) == 0) {
      EXPECT_TRUE(IsRefusal(st)) << "'" << upath << "': " << Str(st);
    }
  }
  EXPECT_GE(Counter(kA, "fetch.refused"), refused_before + attacks.size());
  // Not a regular file: the directory itself and a subdirectory.
  EXPECT_FALSE(Fetch("sub").ok());
  ExpectServiceStillServes();
}

TEST_F(SecurityTest, WrongSecretIsRefused) {
  Channel ch = ConnectToA();
  Status st = Authenticate(ch, "definitely-not-the-cluster-secret");
  EXPECT_EQ(st.code(), DYAD_RC_AUTH) << Str(st);
  // The connection is of no further use to the impostor.
  FetchRequest req;
  req.upath = "after/attack.dat";
  req.transport = "tcp";
  Encoder e;
  req.EncodeTo(e);
  std::string body;
  EXPECT_FALSE(CallRpc(ch, MsgType::kFetch, e.data(), &body, Deadline::AfterMs(5000)).ok());
  ExpectServiceStillServes();
}

TEST_F(SecurityTest, RequestWithoutHandshakeIsRefused) {
  Channel ch = ConnectToA();
  // Skip the handshake: answer the challenge with a fetch.
  uint16_t type = 0;
  std::string payload;
  ASSERT_TRUE(ch.RecvFrame(&type, &payload, Deadline::AfterMs(5000)).ok());
  EXPECT_EQ(type, static_cast<uint16_t>(MsgType::kChallenge));
  WriteFileOn(kA, "unauth.dat", 100);
  FetchRequest req;
  req.upath = "unauth.dat";
  req.transport = "tcp";
  Encoder e;
  req.EncodeTo(e);
  ASSERT_TRUE(
      ch.SendFrame(static_cast<uint16_t>(MsgType::kFetch), e.data(), Deadline::AfterMs(5000)).ok());
  // Either an error reply or a closed connection, never file data.
  Status st = ch.RecvFrame(&type, &payload, Deadline::AfterMs(10000));
  if (st.ok()) {
    ASSERT_EQ(type, static_cast<uint16_t>(MsgType::kReply));
    Status reply;
    std::string body;
    ASSERT_TRUE(DecodeReply(payload, &reply, &body));
    EXPECT_FALSE(reply.ok()) << "an unauthenticated fetch was answered with success";
  } else {
    EXPECT_TRUE(st.code() == DYAD_RC_CONNLOST) << Str(st);
  }
  ExpectServiceStillServes();
}

TEST_F(SecurityTest, MalformedAndTruncatedFramesDoNotHurtTheService) {
  // 1. Garbage instead of a frame, before authentication.
  {
    Channel ch = ConnectToA();
    const std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_TRUE(ch.SendAll(junk.data(), junk.size(), Deadline::AfterMs(5000)).ok());
    // Read whatever comes back until the service closes or 10 s pass.
    char buf[4096];
    const Deadline d = Deadline::AfterMs(10000);
    Status last;
    while (true) {
      auto n = ch.RecvSome(buf, sizeof buf, d);
      if (!n.ok()) {
        last = n.status();
        break;
      }
    }
    EXPECT_EQ(last.code(), DYAD_RC_CONNLOST)
        << "the service kept a garbage connection open: " << Str(last);
  }
  // 2. After authentication: a fetch whose payload does not decode.
  {
    Channel ch = ConnectToA();
    ASSERT_TRUE(Authenticate(ch, cluster().secret()).ok());
    std::string body;
    Status st = CallRpc(ch, MsgType::kFetch, std::string("\xff\xff\xff\x7f garbage", 12), &body,
                        Deadline::AfterMs(5000));
    EXPECT_EQ(st.code(), DYAD_RC_BADUNPACK) << Str(st);
  }
  // 3. After authentication: a frame header with a bad magic.
  {
    Channel ch = ConnectToA();
    ASSERT_TRUE(Authenticate(ch, cluster().secret()).ok());
    const char bad[12] = {'N', 'O', 'P', 'E', 1, 0, 50, 0, 0, 0, 0, 0};
    ASSERT_TRUE(ch.SendAll(bad, sizeof bad, Deadline::AfterMs(5000)).ok());
    uint16_t type = 0;
    std::string payload;
    Status st = ch.RecvFrame(&type, &payload, Deadline::AfterMs(10000));
    if (st.ok()) {
      Status reply;
      std::string body;
      ASSERT_TRUE(DecodeReply(payload, &reply, &body));
      EXPECT_FALSE(reply.ok());
    } else {
      EXPECT_EQ(st.code(), DYAD_RC_CONNLOST) << Str(st);
    }
  }
  // 4. After authentication: a frame announcing more than the size limit.
  {
    Channel ch = ConnectToA();
    ASSERT_TRUE(Authenticate(ch, cluster().secret()).ok());
    char hdr[12];
    EncodeFrameHeader(hdr, static_cast<uint16_t>(MsgType::kFetch), 0xFFFFFFF0u);
    ASSERT_TRUE(ch.SendAll(hdr, sizeof hdr, Deadline::AfterMs(5000)).ok());
    uint16_t rtype = 0;
    std::string payload;
    Status st = ch.RecvFrame(&rtype, &payload, Deadline::AfterMs(10000));
    EXPECT_TRUE(st.ok() || st.code() == DYAD_RC_CONNLOST) << Str(st);
  }
  // 5. After authentication: a truncated frame (header promises 1000 bytes,
  //    10 arrive, then the peer stops sending).
  {
    Channel ch = ConnectToA();
    ASSERT_TRUE(Authenticate(ch, cluster().secret()).ok());
    char frame[22];
    EncodeFrameHeader(frame, static_cast<uint16_t>(MsgType::kFetch), 1000);
    std::memset(frame + 12, 'x', 10);
    ASSERT_TRUE(ch.SendAll(frame, sizeof frame, Deadline::AfterMs(5000)).ok());
    ::shutdown(ch.fd(), SHUT_WR);
    char buf[256];
    auto n = ch.RecvSome(buf, sizeof buf, Deadline::AfterMs(10000));
    EXPECT_FALSE(n.ok());
    EXPECT_EQ(n.status().code(), DYAD_RC_CONNLOST) << Str(n.status());
  }
  // 6. A truncated frame from a peer that then just goes away.
  {
    Channel ch = ConnectToA();
    ASSERT_TRUE(Authenticate(ch, cluster().secret()).ok());
    const char half[5] = {'D', 'Y', 'A', 'D', 1};
    ASSERT_TRUE(ch.SendAll(half, sizeof half, Deadline::AfterMs(5000)).ok());
  }
  ExpectServiceStillServes();
  EXPECT_TRUE(cluster().ServiceRunning(kA));
}

TEST_F(SecurityTest, MalformedLocalRequestsGetAnErrorReply) {
  // The Unix socket side: a consume whose payload does not decode.
  auto addr = ParseAddress("unix:" + cluster().node(kB).socket);
  ASSERT_TRUE(addr.ok());
  auto fd = Connect(*addr, Deadline::AfterMs(5000));
  ASSERT_TRUE(fd.ok()) << Str(fd.status());
  Channel ch(std::move(*fd), Trust::kUnauthenticated);
  ASSERT_TRUE(TrustLocalService(ch).ok());
  std::string body;
  Status st = CallRpc(ch, MsgType::kConsume, "\x01\x02\x03", &body, Deadline::AfterMs(5000));
  EXPECT_EQ(st.code(), DYAD_RC_BADUNPACK) << Str(st);
  // An unknown message type.
  Channel ch2(
      [&] {
        auto f = Connect(*addr, Deadline::AfterMs(5000));
        return f.ok() ? std::move(*f) : UniqueFd();
      }(),
      Trust::kUnauthenticated);
  ASSERT_TRUE(TrustLocalService(ch2).ok());
  st = CallRpc(ch2, static_cast<MsgType>(999), "", &body, Deadline::AfterMs(5000));
  EXPECT_FALSE(st.ok());
  ASSERT_TRUE(cluster().ServiceRunning(kB));
  const std::vector<ManifestEntry> files = {{"after/local-attack.dat", 999}};
  Produce(files);
  ConsumeOk(files);
}

}  // namespace
}  // namespace dyad::it
