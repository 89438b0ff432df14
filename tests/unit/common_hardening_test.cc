// Regression tests of the hardening of the common layer (issue 12), each
// named after the defect it pins, plus the properties the fixes rely on:
// frames bounded by the channel's trust, sealed records that catch
// tampering, and the handshake's negotiation.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>

#include "common/config.h"
#include "common/log.h"
#include "common/net.h"
#include "common/safety.h"
#include "common/seal.h"
#include "common/time.h"
#include "proto/auth.h"
#include "proto/protocol.h"
#include "util.h"

namespace dyad {
namespace {

constexpr int64_t kMaxMs = std::numeric_limits<int64_t>::max();

// --- defect 13: timeouts near INT64_MAX ms expired at once ------------------

TEST(Defect13, TimeoutNearInt64MaxMsDoesNotExpireAtOnce) {
  for (int64_t ms : {kMaxMs, kMaxMs - 1, kMaxMs / 2, kMaxMs / 1000000 + 1, int64_t{1} << 53}) {
    const Deadline d = Deadline::AfterMs(ms);
    EXPECT_FALSE(d.expired()) << ms;
    EXPECT_EQ(d.RemainingMs(), INT32_MAX) << ms;
  }
  // Still an ordinary deadline just below the threshold of saturation.
  const Deadline soon = Deadline::AfterMs(50);
  EXPECT_FALSE(soon.never());
  EXPECT_LE(soon.RemainingMs(), 50);
}

TEST(Defect13, HugeSecondsAndSumsSaturate) {
  EXPECT_FALSE(Deadline::AfterMs(SecondsToMsSaturating(1e300)).expired());
  EXPECT_FALSE(
      Deadline::AfterMs(SecondsToMsSaturating(std::numeric_limits<double>::infinity())).expired());
  EXPECT_EQ(SecondsToMsSaturating(1e300), kMaxMs);
  EXPECT_EQ(SecondsToMsSaturating(9.3e15), kMaxMs);
  EXPECT_EQ(SecondsToMsSaturating(2.5), 2500);
  EXPECT_EQ(SaturatingAddMs(kMaxMs - 5, 60000), kMaxMs);
  EXPECT_EQ(SaturatingAddMs(1, 2), 3);
  EXPECT_EQ(SaturatingAddMs(-1, 5), -1);
  // The environment parser: a huge DYAD_CONSUME_TIMEOUT is "practically
  // forever", never an overflowed (negative or tiny) value.
  setenv("DYAD_TEST_HUGE_TIMEOUT", "1e300", 1);
  Result<int64_t> ms = EnvTimeoutMs("DYAD_TEST_HUGE_TIMEOUT", 0);
  unsetenv("DYAD_TEST_HUGE_TIMEOUT");
  ASSERT_TRUE(ms.ok());
  EXPECT_EQ(*ms, kMaxMs);
  EXPECT_FALSE(Deadline::AfterMs(*ms).expired());
}

TEST(Defect13, MinWithAHugeDeadlineKeepsTheShorterOne) {
  const Deadline huge = Deadline::AfterMs(kMaxMs - 10);
  const Deadline d = huge.Min(100);
  EXPECT_FALSE(d.never());
  EXPECT_LE(d.RemainingMs(), 100);
  EXPECT_FALSE(Deadline::AfterMs(100).Min(kMaxMs).never());
}

// --- defect 12: a newline in a requested path forged a log line -------------

class TempLog {
 public:
  TempLog() {
    char tmpl[] = "/tmp/dyad-log-test.XXXXXX";
    const int fd = ::mkstemp(tmpl);
    if (fd >= 0) ::close(fd);
    path_ = tmpl;
    EXPECT_TRUE(LogSetInfoFile(path_));
    EXPECT_TRUE(LogSetErrorFile(path_));
  }
  ~TempLog() {
    LogSetInfoFile("");
    LogSetErrorFile("");
    ::unlink(path_.c_str());
  }
  std::string Read() const {
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  std::string path_;
};

TEST(Defect12, NewlineInALoggedPathCannotForgeALine) {
  TempLog log;
  const std::string upath = "x.dat\n2030-01-01T00:00:00.000 INFO dyad-service[rank 0]: forged";
  DYAD_LOG_WARN("refused fetch of '%s' from rank %u", upath.c_str(), 3u);
  DYAD_LOG_INFO("carriage\rreturn, escape \x1b[31mred\x1b[0m, tab\tand bell\a");
  const std::string text = log.Read();
  size_t lines = 0;
  for (char c : text) lines += c == '\n';
  EXPECT_EQ(lines, 2u) << text;
  EXPECT_EQ(text.find("\nforged"), std::string::npos);
  EXPECT_EQ(text.find("\n2030-01-01"), std::string::npos) << text;
  EXPECT_NE(text.find("x.dat\\n2030-01-01"), std::string::npos) << text;
  EXPECT_NE(text.find("carriage\\rreturn, escape \\x1b[31mred\\x1b[0m, tab\\tand bell\\x07"),
            std::string::npos)
      << text;
}

TEST(Defect12, EscapingKeepsPrintableAndNonAsciiBytes) {
  EXPECT_EQ(EscapeControlChars("plain/path with spaces.dat"), "plain/path with spaces.dat");
  EXPECT_EQ(EscapeControlChars("caf\xc3\xa9"), "caf\xc3\xa9");
  EXPECT_EQ(EscapeControlChars(std::string("a\0b\x7f", 4)), "a\\x00b\\x7f");
}

// --- frames bounded by trust (defect 1's reader) -----------------------------

struct Pair {
  Pair(Trust a_trust, Trust b_trust) {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a = std::make_unique<Channel>(UniqueFd(fds[0]), a_trust);
    b = std::make_unique<Channel>(UniqueFd(fds[1]), b_trust);
  }
  std::unique_ptr<Channel> a, b;
};

std::string Header(uint16_t type, uint32_t len) {
  char hdr[kFrameHeaderSize];
  EncodeFrameHeader(hdr, type, len);
  return std::string(hdr, sizeof hdr);
}

TEST(FrameLimits, UnauthenticatedChannelRefusesLargeFramesAtTheHeader) {
  Pair p(Trust::kUnauthenticated, Trust::kUnauthenticated);
  EXPECT_EQ(p.b->frame_limit(), kHandshakeFramePayload);
  const std::string hdr = Header(3, 16u << 20);
  ASSERT_TRUE(p.a->SendAll(hdr.data(), hdr.size(), Deadline::AfterMs(1000)).ok());
  uint16_t type = 0;
  std::string payload;
  Status st = p.b->RecvFrame(&type, &payload, Deadline::AfterMs(1000));
  EXPECT_EQ(st.code(), DYAD_RC_BADUNPACK) << st.ToString();
  EXPECT_NE(st.message().find("before authentication"), std::string::npos) << st.ToString();
  EXPECT_TRUE(p.b->broken());
  EXPECT_EQ(payload.capacity() < 4096, true) << "the announced size was allocated";
}

TEST(FrameLimits, BufferGrowsWithTheBytesThatArriveNotWithTheHeader) {
  Pair p(Trust::kAuthenticated, Trust::kAuthenticated);
  // Announces the largest frame, then sends only 10 bytes and stalls.
  const std::string hdr = Header(50, kMaxFramePayload);
  ASSERT_TRUE(p.a->SendAll(hdr.data(), hdr.size(), Deadline::AfterMs(1000)).ok());
  ASSERT_TRUE(p.a->SendAll("0123456789", 10, Deadline::AfterMs(1000)).ok());
  uint16_t type = 0;
  std::string payload;
  Status st = p.b->RecvFrame(&type, &payload, Deadline::AfterMs(200));
  EXPECT_EQ(st.code(), DYAD_RC_TIMEOUT) << st.ToString();
  EXPECT_LE(payload.capacity(), 128u << 10) << "the receive buffer followed the header";
}

TEST(FrameLimits, LargeFramesArriveWholeOnTrustedChannels) {
  Pair p(Trust::kLocalPeer, Trust::kLocalPeer);
  std::string big(3u << 20, 'x');
  for (size_t i = 0; i < big.size(); i += 4093) big[i] = static_cast<char>(i);
  std::thread sender([&] { EXPECT_TRUE(p.a->SendFrame(7, big, Deadline::AfterMs(5000)).ok()); });
  uint16_t type = 0;
  std::string payload = "previous contents";
  ASSERT_TRUE(p.b->RecvFrame(&type, &payload, Deadline::AfterMs(5000)).ok());
  sender.join();
  EXPECT_EQ(type, 7);
  EXPECT_EQ(payload, big);
}

// --- sealed records (defect 5's layer) ---------------------------------------

void ProtectPair(Pair& p, LinkProtection level) {
  unsigned char keys[2 * kSealKeySize];
  ASSERT_TRUE(RandomBytes(keys, sizeof keys).ok());
  auto a_send = RecordCipher::Create(keys, level, true);
  auto a_recv = RecordCipher::Create(keys + kSealKeySize, level, false);
  auto b_send = RecordCipher::Create(keys + kSealKeySize, level, true);
  auto b_recv = RecordCipher::Create(keys, level, false);
  ASSERT_TRUE(a_send.ok() && a_recv.ok() && b_send.ok() && b_recv.ok());
  p.a->Protect(level, std::move(*a_send), std::move(*a_recv));
  p.b->Protect(level, std::move(*b_send), std::move(*b_recv));
}

// Takes every byte waiting on `fd` (what a relay in the middle would see).
std::string Drain(int fd) {
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

class SealedRecords : public testing::TestWithParam<LinkProtection> {};

TEST_P(SealedRecords, RoundTripAndPlaintextVisibility) {
  Pair p(Trust::kAuthenticated, Trust::kAuthenticated);
  ProtectPair(p, GetParam());
  const std::string words = "the quick brown fox jumps over the lazy dog";
  ASSERT_TRUE(p.a->SendFrame(12, words, Deadline::AfterMs(1000)).ok());
  const std::string wire = Drain(p.b->fd());
  EXPECT_EQ(wire.size(), kFrameHeaderSize + words.size() + kSealTagSize);
  // Readable on the wire with integrity only, hidden when encrypted.
  EXPECT_EQ(wire.find(words) != std::string::npos, GetParam() == LinkProtection::kIntegrity);
  // The untouched record, delivered, opens to the original payload.
  ASSERT_TRUE(p.a->SendAll(wire.data(), wire.size(), Deadline::AfterMs(1000)).ok());
  uint16_t type = 0;
  std::string payload;
  ASSERT_TRUE(p.b->RecvFrame(&type, &payload, Deadline::AfterMs(1000)).ok());
  EXPECT_EQ(type, 12);
  EXPECT_EQ(payload, words);
}

TEST_P(SealedRecords, AnyFlippedByteFailsWithAuth) {
  const std::string msg(3000, 'm');
  // Try a byte in the header (type), in the payload and in the tag.
  for (size_t flip : {size_t{6}, kFrameHeaderSize + 1500, kFrameHeaderSize + msg.size() + 3}) {
    Pair p(Trust::kAuthenticated, Trust::kAuthenticated);
    ProtectPair(p, GetParam());
    ASSERT_TRUE(p.a->SendFrame(12, msg, Deadline::AfterMs(1000)).ok());
    std::string wire = Drain(p.b->fd());
    ASSERT_GT(wire.size(), flip);
    wire[flip] ^= 0x01;
    // Feed the altered bytes to b through the peer end of its socket.
    ASSERT_TRUE(p.a->SendAll(wire.data(), wire.size(), Deadline::AfterMs(1000)).ok());
    uint16_t type = 0;
    std::string payload;
    Status st = p.b->RecvFrame(&type, &payload, Deadline::AfterMs(1000));
    EXPECT_EQ(st.code(), DYAD_RC_AUTH) << "flip at " << flip << ": " << st.ToString();
    EXPECT_TRUE(p.b->broken());
  }
}

TEST_P(SealedRecords, ReplayedOrReorderedRecordsFail) {
  Pair p(Trust::kAuthenticated, Trust::kAuthenticated);
  ProtectPair(p, GetParam());
  ASSERT_TRUE(p.a->SendFrame(12, "first", Deadline::AfterMs(1000)).ok());
  const std::string first = Drain(p.b->fd());
  ASSERT_TRUE(p.a->SendFrame(12, "second", Deadline::AfterMs(1000)).ok());
  const std::string second = Drain(p.b->fd());
  // Deliver the second before the first: b expects record 0.
  ASSERT_TRUE(p.a->SendAll(second.data(), second.size(), Deadline::AfterMs(1000)).ok());
  uint16_t type = 0;
  std::string payload;
  EXPECT_EQ(p.b->RecvFrame(&type, &payload, Deadline::AfterMs(1000)).code(), DYAD_RC_AUTH);

  // Replay on a fresh pair: the same record twice.
  Pair q(Trust::kAuthenticated, Trust::kAuthenticated);
  ProtectPair(q, GetParam());
  ASSERT_TRUE(q.a->SendFrame(12, "once", Deadline::AfterMs(1000)).ok());
  const std::string once = Drain(q.b->fd());
  for (int i = 0; i < 2; ++i)
    ASSERT_TRUE(q.a->SendAll(once.data(), once.size(), Deadline::AfterMs(1000)).ok());
  ASSERT_TRUE(q.b->RecvFrame(&type, &payload, Deadline::AfterMs(1000)).ok());
  EXPECT_EQ(payload, "once");
  EXPECT_EQ(q.b->RecvFrame(&type, &payload, Deadline::AfterMs(1000)).code(), DYAD_RC_AUTH);
}

INSTANTIATE_TEST_SUITE_P(Levels, SealedRecords,
                         testing::Values(LinkProtection::kIntegrity, LinkProtection::kEncrypt),
                         [](const testing::TestParamInfo<LinkProtection>& i) {
                           return std::string(LinkProtectionName(i.param));
                         });

// --- the handshake ------------------------------------------------------------

struct HandshakeResult {
  Status server, client;
  PeerIdentity seen_by_server, seen_by_client;
};

HandshakeResult Handshake(Pair& p, const Authenticator& server, const Authenticator& client) {
  HandshakeResult r;
  std::thread t([&] {
    r.server = server.Accept(*p.a, PeerIdentity{0, 11}, Deadline::AfterMs(5000), &r.seen_by_server);
  });
  r.client = client.Connect(*p.b, PeerIdentity{4, 44}, Deadline::AfterMs(5000), &r.seen_by_client);
  t.join();
  return r;
}

AuthConfig SecretConfig(const std::string& secret, LinkProtection level) {
  AuthConfig c;
  c.secret = secret;
  c.protection = level;
  return c;
}

TEST(Handshake, SameSecretAuthenticatesAndSealsWithTheStrongerLevel) {
  Pair p(Trust::kUnauthenticated, Trust::kUnauthenticated);
  HandshakeResult r =
      Handshake(p, Authenticator(SecretConfig("s3cret", LinkProtection::kIntegrity)),
                Authenticator(SecretConfig("s3cret", LinkProtection::kEncrypt)));
  ASSERT_TRUE(r.server.ok()) << r.server.ToString();
  ASSERT_TRUE(r.client.ok()) << r.client.ToString();
  EXPECT_EQ(r.seen_by_server.rank, 4u);
  EXPECT_EQ(r.seen_by_server.incarnation, 44u);
  EXPECT_EQ(r.seen_by_client.rank, 0u);
  EXPECT_EQ(r.seen_by_client.incarnation, 11u);
  EXPECT_EQ(p.a->trust(), Trust::kAuthenticated);
  EXPECT_EQ(p.a->protection(), LinkProtection::kEncrypt);
  EXPECT_EQ(p.b->protection(), LinkProtection::kEncrypt);
  // The session works both ways with the derived keys.
  ASSERT_TRUE(p.b->SendFrame(50, "request", Deadline::AfterMs(1000)).ok());
  uint16_t type = 0;
  std::string payload;
  ASSERT_TRUE(p.a->RecvFrame(&type, &payload, Deadline::AfterMs(1000)).ok());
  EXPECT_EQ(payload, "request");
  ASSERT_TRUE(p.a->SendFrame(1, std::string(200000, 'r'), Deadline::AfterMs(1000)).ok());
  ASSERT_TRUE(p.b->RecvFrame(&type, &payload, Deadline::AfterMs(1000)).ok());
  EXPECT_EQ(payload.size(), 200000u);
}

TEST(Handshake, NoneOnBothEndsLeavesFramesInClear) {
  Pair p(Trust::kUnauthenticated, Trust::kUnauthenticated);
  HandshakeResult r = Handshake(p, Authenticator(SecretConfig("k", LinkProtection::kNone)),
                                Authenticator(SecretConfig("k", LinkProtection::kNone)));
  ASSERT_TRUE(r.server.ok() && r.client.ok()) << r.server.ToString() << r.client.ToString();
  EXPECT_EQ(p.a->protection(), LinkProtection::kNone);
  ASSERT_TRUE(p.b->SendFrame(50, "plain", Deadline::AfterMs(1000)).ok());
  EXPECT_NE(Drain(p.a->fd()).find("plain"), std::string::npos);
}

TEST(Handshake, WrongSecretIsRefusedOnBothSides) {
  Pair p(Trust::kUnauthenticated, Trust::kUnauthenticated);
  HandshakeResult r = Handshake(p, Authenticator("right"), Authenticator("wrong"));
  EXPECT_EQ(r.server.code(), DYAD_RC_AUTH) << r.server.ToString();
  EXPECT_EQ(r.client.code(), DYAD_RC_AUTH) << r.client.ToString();
  EXPECT_NE(p.a->trust(), Trust::kAuthenticated);
  EXPECT_NE(p.b->trust(), Trust::kAuthenticated);
}

TEST(Handshake, MismatchedCredentialSetsSayWhatEachSideWants) {
  Pair p(Trust::kUnauthenticated, Trust::kUnauthenticated);
  HandshakeResult r = Handshake(p, Authenticator("a-secret"), Authenticator(std::string()));
  EXPECT_EQ(r.server.code(), DYAD_RC_AUTH);
  EXPECT_NE(r.server.message().find("requires cluster secret"), std::string::npos)
      << r.server.ToString();
  // The client names the mismatch from the challenge (the refusal itself
  // says only "refused", issue 25 item 11).
  EXPECT_NE(r.client.message().find("requires none, the peer presents cluster secret"),
            std::string::npos)
      << r.client.ToString();
}

TEST(Handshake, WithoutCredentialsTheSessionIsStillSealed) {
  Pair p(Trust::kUnauthenticated, Trust::kUnauthenticated);
  HandshakeResult r = Handshake(p, Authenticator(std::string()), Authenticator(std::string()));
  ASSERT_TRUE(r.server.ok() && r.client.ok()) << r.server.ToString() << r.client.ToString();
  EXPECT_EQ(p.a->protection(), LinkProtection::kIntegrity);
}

TEST(Handshake, AnythingButTheHandshakeIsRefusedBeforeAuthentication) {
  Pair p(Trust::kUnauthenticated, Trust::kUnauthenticated);
  Status server;
  std::thread t([&] {
    server = Authenticator("s").Accept(*p.a, PeerIdentity{0, 1}, Deadline::AfterMs(2000), nullptr);
  });
  uint16_t type = 0;
  std::string payload;
  ASSERT_TRUE(p.b->RecvFrame(&type, &payload, Deadline::AfterMs(2000)).ok());
  EXPECT_EQ(type, static_cast<uint16_t>(MsgType::kChallenge));
  ASSERT_TRUE(
      p.b->SendFrame(static_cast<uint16_t>(MsgType::kFetch), "x", Deadline::AfterMs(2000)).ok());
  t.join();
  EXPECT_EQ(server.code(), DYAD_RC_AUTH) << server.ToString();
  EXPECT_TRUE(p.a->broken());
}

// --- issue 26 item 5: the socket directory's advice ------------------------

// A shared sticky directory (like /tmp) must never be advised to chmod 700:
// the advice is a private subdirectory. A plain directory of ours gets both.
TEST(Issue26Item5, SharedSocketDirectoryAdvisesAPrivateSubdirectoryNotChmod) {
  const testutil::TempDir tmp("dyad-sockdir-");
  ASSERT_TRUE(tmp.ok());
  const std::string& base = tmp.path();
  const std::string shared = base + "/shared";
  const std::string open = base + "/open";
  ASSERT_EQ(::mkdir(shared.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(shared.c_str(), 01777), 0);
  ASSERT_EQ(::mkdir(open.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(open.c_str(), 0750), 0);
  const Status s = PrepareSocketDirectory(shared);
  const Status o = PrepareSocketDirectory(open);
  const Status priv = PrepareSocketDirectory(base + "/private");  // created 0700
  ASSERT_EQ(s.code(), DYAD_RC_PERM) << s.ToString();
  EXPECT_NE(s.message().find("mode 1777"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().find("chmod"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("do not change its mode"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("--socket " + shared + "/dyad-"), std::string::npos) << s.message();
  ASSERT_EQ(o.code(), DYAD_RC_PERM) << o.ToString();
  EXPECT_NE(o.message().find("mode 0750"), std::string::npos) << o.message();
  EXPECT_NE(o.message().find("private subdirectory"), std::string::npos) << o.message();
  EXPECT_TRUE(priv.ok()) << priv.ToString();
}

}  // namespace
}  // namespace dyad
