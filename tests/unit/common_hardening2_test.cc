// Regression tests of issue 25 ("Hardening, round two") in the common
// layer: traces, secrets, `dyad info`'s redaction, the record layer's
// rekeying and thread check, refusals and the handshake's error causes,
// log escaping and log modes. Each is named after the item it pins; the
// service-level ones are in service_hardening2_test.cc, and the published
// test vectors of docs/security.md in PublishedTestVectors below.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>

#include "common/config.h"
#include "common/handshake.h"
#include "common/log.h"
#include "common/net.h"
#include "common/seal.h"
#include "common/trace.h"
#include "proto/auth.h"
#include "proto/auth_internal.h"
#include "proto/protocol.h"
#include "util.h"

namespace dyad {
namespace {

using testutil::ReadAll;
using testutil::TempDir;

void WriteText(const std::string& path, const std::string& text, mode_t mode) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  ASSERT_GE(fd, 0) << path;
  ASSERT_EQ(::write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  ::close(fd);
  ASSERT_EQ(::chmod(path.c_str(), mode), 0);
}

std::string Hex(const std::string& bytes) {
  static const char k[] = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : bytes) {
    out += k[c >> 4];
    out += k[c & 15];
  }
  return out;
}

std::string Unhex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

// Runs `body` in a forked child (tracing's state is per process and read
// once) and returns its exit status; the child's stderr goes to `err`.
int InChild(const std::string& err, const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) ::dup2(fd, 2);
    ::_exit(body());
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

// Item 6: the child enables tracing at `path` and writes one span;
// exit 0 when tracing was on, 1 when off.
int TraceOnce(const std::string& path) {
  ::setenv("DYAD_TRACE", path.c_str(), 1);
  if (!TraceEnabled()) return 1;
  { TraceSpan s("publish", "client"); }
  return 0;
}

TEST(Hardening2, TraceRefusesForeignFile) {
  TempDir d;
  ASSERT_FALSE(d.path().empty());
  ASSERT_EQ(::chmod(d.path().c_str(), 0777), 0);  // as /tmp: anyone may create here
  const std::string err = d.path() + "/stderr";
  const bool root = ::geteuid() == 0;

  // Another uid's pre-made 0666 file must not receive our trace.
  if (root) {
    const std::string foreign = d.path() + "/foreign.json";
    WriteText(foreign, "", 0666);
    ASSERT_EQ(::chown(foreign.c_str(), 65534, 65534), 0);
    EXPECT_EQ(InChild(err, [&] { return TraceOnce(foreign); }), 1);
    EXPECT_EQ(ReadAll(foreign), "") << "another user's file received the trace";
    EXPECT_NE(ReadAll(err).find("belongs to another user"), std::string::npos) << ReadAll(err);
  }

  // A symlink at the path is never followed: the victim's file is untouched.
  const std::string victim = d.path() + "/victim.txt";
  WriteText(victim, "precious\n", 0600);
  const std::string link = d.path() + "/link.json";
  ASSERT_EQ(::symlink(victim.c_str(), link.c_str()), 0);
  EXPECT_EQ(InChild(err, [&] { return TraceOnce(link); }), 1);
  EXPECT_EQ(ReadAll(victim), "precious\n");

  // Our own file that group or others may write is refused too.
  const std::string open_file = d.path() + "/open.json";
  WriteText(open_file, "[\n", 0622);
  EXPECT_EQ(InChild(err, [&] { return TraceOnce(open_file); }), 1);
  EXPECT_EQ(ReadAll(open_file), "[\n");
  EXPECT_NE(ReadAll(err).find("writable by group or others"), std::string::npos) << ReadAll(err);

  // A new trace is created 0600 even under umask 000, and never through the
  // old predictable temporary name (path.tmp.PID), here a symlink to the
  // victim planted by "someone else" just before.
  const std::string fresh = d.path() + "/fresh.json";
  EXPECT_EQ(InChild(err,
                    [&] {
                      ::umask(0);
                      const std::string tmp = fresh + ".tmp." + std::to_string(::getpid());
                      if (::symlink(victim.c_str(), tmp.c_str()) != 0) return 3;
                      return TraceOnce(fresh);
                    }),
            0)
      << ReadAll(err);
  struct stat st;
  ASSERT_EQ(::lstat(fresh.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(ReadAll(fresh).rfind("[\n", 0), 0u);
  EXPECT_NE(ReadAll(fresh).find("\"publish\""), std::string::npos);
  EXPECT_EQ(ReadAll(victim), "precious\n");

  // Our own private file is appended to, as before.
  EXPECT_EQ(InChild(err, [&] { return TraceOnce(fresh); }), 0) << ReadAll(err);
}

TEST(Hardening2, TraceKeysProcessesByHostAndPid) {
  // Equal pids of two nodes sharing one trace file stay two processes.
  EXPECT_NE(TraceProcessId("node1", 4242), TraceProcessId("node2", 4242));
  EXPECT_EQ(TraceProcessId("node1", 4242), TraceProcessId("node1", 4242));
  EXPECT_NE(TraceProcessId("node1", 4242), TraceProcessId("node1", 4243));
  EXPECT_NE(TraceProcessId("node1", 4242), 4242u);  // never a bare pid
  EXPECT_EQ(TraceProcessId("node1", 4242) & ((1u << 22) - 1), 4242u);
}

// --- item 7: weak secrets ----------------------------------------------------

TEST(Hardening2, ShortSecretRefused) {
  for (const std::string weak : {std::string("x"), std::string(1, '\0'), std::string("password"),
                                 std::string("0123456789abcdef"),     // 64 bits of hex
                                 std::string("correcthorsebattery"),  // 19 letters: < 128 bits
                                 std::string(40, 'a'),                // long, one character
                                 std::string("abababababababababababababababababab")}) {
    Status st = CheckSecretStrength(weak, "the test");
    EXPECT_EQ(st.code(), DYAD_RC_AUTH) << "accepted '" << weak << "'";
    EXPECT_NE(st.message().find("too weak"), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("dyad secret init"), std::string::npos) << st.ToString();
    if (weak.size() > 3) EXPECT_EQ(st.message().find(weak), std::string::npos) << st.ToString();
  }
  for (const std::string good : {std::string("0123456789abcdef0123456789abcdef"),  // 128 bits
                                 std::string("tH1s-is/a+Base64_secret=ab"),
                                 std::string("\x01\x02\x03\x04"
                                             "\x05\x06\x07\x08"
                                             "\x09\x0a\x0b\x0c"
                                             "\x0d\x0e\x0f\x10",
                                             16)})
    EXPECT_TRUE(CheckSecretStrength(good, "the test").ok()) << Hex(good);
  Result<std::string> made = NewClusterSecret();
  ASSERT_TRUE(made.ok());
  EXPECT_EQ(made->size(), 64u);
  EXPECT_TRUE(CheckSecretStrength(*made, "x").ok());
  EXPECT_GE(SecretStrengthBits(*made), 256.0);

  // Where a secret enters: the environment and a file.
  TempDir d;
  ::unsetenv("DYAD_SECRET_FILE");
  ::setenv("DYAD_SECRET", "password", 1);
  Result<std::string> env = LoadClusterSecret("");
  EXPECT_EQ(env.status().code(), DYAD_RC_AUTH);
  EXPECT_NE(env.status().message().find("DYAD_SECRET"), std::string::npos);
  const std::string file = d.path() + "/secret";
  WriteText(file, "hunter2\n", 0600);
  Result<std::string> f = LoadClusterSecret(file);
  EXPECT_EQ(f.status().code(), DYAD_RC_AUTH);
  EXPECT_EQ(f.status().message().find("hunter2"), std::string::npos);
  WriteText(file, *made + "\n", 0600);
  f = LoadClusterSecret(file);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(*f, *made);
}

TEST(Hardening2, SecretVariableRemovedOnceRead) {
  ::unsetenv("DYAD_SECRET_FILE");
  const std::string secret = "0123456789abcdef0123456789abcdef";
  ::setenv("DYAD_SECRET", secret.c_str(), 1);
  const char* value = std::getenv("DYAD_SECRET");
  ASSERT_NE(value, nullptr);
  Result<std::string> s = LoadClusterSecret("");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(*s, secret);
  EXPECT_EQ(std::getenv("DYAD_SECRET"), nullptr) << "DYAD_SECRET is still in the environment";
  // And its value is overwritten where it was stored (glibc keeps the
  // strings setenv made, so the old pointer still points at that memory).
  EXPECT_EQ(value[0], '\0');
}

// --- item 9: `dyad info` never prints secrets ---------------------------------

TEST(Hardening2, InfoHidesSecrets) {
  EXPECT_TRUE(ConfigValueIsSecret("DYAD_SECRET"));
  EXPECT_TRUE(ConfigValueIsSecret("DYAD_REDIS_PASSWORD"));
  EXPECT_FALSE(ConfigValueIsSecret("DYAD_SECRET_FILE"));
  EXPECT_FALSE(ConfigValueIsSecret("DYAD_KVS"));
  EXPECT_EQ(ConfigValueForDisplay("DYAD_SECRET", "hunter2"), "(set, hidden)");
  EXPECT_EQ(ConfigValueForDisplay("DYAD_REDIS_PASSWORD", "pw"), "(set, hidden)");
  EXPECT_EQ(ConfigValueForDisplay("DYAD_KVS", "redis://:pw@host:6379"), "redis://:***@host:6379");
  EXPECT_EQ(ConfigValueForDisplay("DYAD_KVS", "redis://dyad:s3cr3t@10.0.0.1:6379/2"),
            "redis://dyad:***@10.0.0.1:6379/2");
  EXPECT_EQ(ConfigValueForDisplay("DYAD_KVS", "redis://h:1?password=pw&db=2"),
            "redis://h:1?password=***&db=2");
  // Paths and plain values stay as they are.
  EXPECT_EQ(ConfigValueForDisplay("DYAD_KVS", "redis://h:1?password_file=/p/f"),
            "redis://h:1?password_file=/p/f");
  EXPECT_EQ(ConfigValueForDisplay("DYAD_KVS", "embedded://node0:7590"), "embedded://node0:7590");
  EXPECT_EQ(ConfigValueForDisplay("DYAD_PATH_PRODUCER", "/a@b:c"), "/a@b:c");
}

// --- item 10: rekeying, age, and the one-thread check -------------------------

std::unique_ptr<RecordCipher> Cipher(const unsigned char* key, bool sealing, SealLimits limits,
                                     LinkProtection mode = LinkProtection::kEncrypt) {
  Result<std::unique_ptr<RecordCipher>> c = RecordCipher::Create(key, mode, sealing, limits);
  EXPECT_TRUE(c.ok());
  return c.ok() ? std::move(*c) : nullptr;
}

TEST(Hardening2, SessionRekeysAfterVolume) {
  unsigned char key[kSealKeySize];
  for (size_t i = 0; i < kSealKeySize; ++i) key[i] = static_cast<unsigned char>(i);
  SealLimits by_records;
  by_records.records = 4;
  auto sealer = Cipher(key, true, by_records);
  auto opener = Cipher(key, false, by_records);
  auto never = Cipher(key, false, SealLimits{});  // an opener that never rekeys
  bool never_failed = false;
  for (int i = 0; i < 13; ++i) {
    std::string msg = "record " + std::to_string(i);
    std::string copy = msg;
    unsigned char tag[kSealTagSize];
    ASSERT_TRUE(sealer->Seal("aad", msg.data(), msg.data(), msg.size(), tag).ok());
    std::string other = msg;
    ASSERT_TRUE(opener->Open("aad", msg.data(), msg.size(), tag).ok()) << i;
    EXPECT_EQ(msg, copy);
    const bool ok = never->Open("aad", other.data(), other.size(), tag).ok();
    if (i < 4) EXPECT_TRUE(ok) << i;  // the first key's records
    never_failed |= !ok;
  }
  EXPECT_TRUE(never_failed) << "records past the limit were still under the first key";
  EXPECT_EQ(sealer->epoch(), 3u);
  EXPECT_EQ(opener->epoch(), 3u);

  // By bytes: 1 KiB limit, 600-byte records: a new key every 2 records.
  SealLimits by_bytes;
  by_bytes.bytes = 1024;
  auto s2 = Cipher(key, true, by_bytes, LinkProtection::kIntegrity);
  auto o2 = Cipher(key, false, by_bytes, LinkProtection::kIntegrity);
  std::string big(597, 'x');
  for (int i = 0; i < 6; ++i) {
    unsigned char tag[kSealTagSize];
    ASSERT_TRUE(s2->Seal("hdr", big.data(), nullptr, big.size(), tag).ok());
    // Opened piece by piece, as a streaming receiver does.
    ASSERT_TRUE(o2->OpenBegin("hdr").ok());
    ASSERT_TRUE(o2->OpenUpdate(big.data(), 300).ok());
    ASSERT_TRUE(o2->OpenUpdate(big.data() + 300, big.size() - 300).ok());
    ASSERT_TRUE(o2->OpenFinish(tag).ok()) << i;
  }
  EXPECT_EQ(s2->epoch(), 3u);
  EXPECT_EQ(o2->epoch(), 3u);

  // The default limits are bounded.
  EXPECT_LE(SealLimits{}.records, uint64_t{1} << 24);
  EXPECT_LE(SealLimits{}.bytes, uint64_t{1} << 36);
}

TEST(Hardening2, SessionRetiredAfterAge) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  Channel a(UniqueFd(fds[0]), Trust::kUnauthenticated);
  Channel b(UniqueFd(fds[1]), Trust::kUnauthenticated);
  EXPECT_FALSE(a.Retired());
  std::thread t([&] {
    (void)Authenticator(std::string(40, 'k') + "0123456789abcdef")
        .Accept(a, PeerIdentity{0, 1}, Deadline::AfterMs(5000), nullptr);
  });
  ASSERT_TRUE(Authenticator(std::string(40, 'k') + "0123456789abcdef")
                  .Connect(b, PeerIdentity{1, 2}, Deadline::AfterMs(5000), nullptr)
                  .ok());
  t.join();
  EXPECT_FALSE(b.Retired());
  b.AgeForTest(kMaxSessionAgeMs - 60000);
  EXPECT_FALSE(b.Retired());
  b.AgeForTest(120000);
  EXPECT_TRUE(b.Retired());
}

std::atomic<int> g_hook_calls{0};
std::atomic<bool> g_hook_release{false};
std::atomic<bool> g_hook_second_done{false};
void HoldFirstCall() {
  if (g_hook_calls.fetch_add(1) != 0) return;  // only the first call waits
  for (int i = 0; i < 5000 && !g_hook_release.load(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST(Hardening2, CipherRefusesConcurrentUse) {
  unsigned char key[kSealKeySize] = {1, 2, 3};
  auto sealer = Cipher(key, true, SealLimits{});
  seal_testing::SetInsideHook(&HoldFirstCall);
  std::string a(1000, 'a'), b(1000, 'b');
  unsigned char ta[kSealTagSize], tb[kSealTagSize];
  Status first;
  std::thread t([&] { first = sealer->Seal("x", a.data(), a.data(), a.size(), ta); });
  for (int i = 0; i < 5000 && g_hook_calls.load() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(g_hook_calls.load(), 1) << "the first Seal never entered the cipher";
  // The first call is inside the cipher: a second one is refused...
  Status second = sealer->Seal("x", b.data(), b.data(), b.size(), tb);
  g_hook_release = true;
  t.join();
  seal_testing::SetInsideHook(nullptr);
  EXPECT_EQ(second.code(), DYAD_RC_SYSFAIL) << second.ToString();
  EXPECT_NE(second.message().find("two threads"), std::string::npos) << second.ToString();
  // ...and so is the call it overlapped, and everything after: the
  // session may have reused a nonce and must close.
  EXPECT_EQ(first.code(), DYAD_RC_SYSFAIL) << first.ToString();
  EXPECT_FALSE(sealer->Seal("x", a.data(), a.data(), a.size(), ta).ok());
  // One thread at a time (calls in turn, from different threads) is fine.
  auto fine = Cipher(key, true, SealLimits{});
  for (int i = 0; i < 3; ++i) {
    Status st;
    std::thread u([&] { st = fine->Seal("x", a.data(), a.data(), a.size(), ta); });
    u.join();
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
}

// --- item 11: refusals say "refused"; errors name their real cause -----------

struct SocketPair {
  SocketPair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a = std::make_unique<Channel>(UniqueFd(fds[0]), Trust::kUnauthenticated);
    b = std::make_unique<Channel>(UniqueFd(fds[1]), Trust::kUnauthenticated);
  }
  std::unique_ptr<Channel> a, b;
};

const std::string kSecretA = "0123456789abcdef0123456789abcdef";
const std::string kSecretB = "fedcba9876543210fedcba9876543210";

// The accepting side's outcome when the client's handshake passes through
// `relay`, which may alter the challenge (to the client) or the answer (to
// the server). The client's own outcome goes to `*client_status`.
Status RelayedHandshake(const std::string& server_secret, const std::string& client_secret,
                        const std::function<void(std::string*)>& alter_challenge,
                        const std::function<void(std::string*)>& alter_answer,
                        Status* client_status) {
  SocketPair s, c;  // server <-> relay, relay <-> client
  Authenticator server(server_secret), client(client_secret);
  const Deadline d = Deadline::AfterMs(5000);
  Result<std::unique_ptr<Authenticator::PendingAccept>> pending =
      server.AcceptBegin(*s.a, PeerIdentity{0, 1}, d);
  if (!pending.ok()) return pending.status();
  uint16_t type = 0;
  std::string payload;
  if (Status st = s.b->RecvFrame(&type, &payload, d); !st.ok()) return st;
  alter_challenge(&payload);
  if (Status st = c.a->SendFrame(type, payload, d); !st.ok()) return st;
  ClientHandshake hs(client, PeerIdentity{7, 2});
  if (hs.Step(*c.b, d)) {  // ended before answering (a challenge it could not read)
    *client_status = hs.status();
    return Status(DYAD_RC_SYSFAIL, "the client ended before answering: " + hs.status().ToString());
  }
  if (Status st = c.a->RecvFrame(&type, &payload, d); !st.ok()) return st;
  alter_answer(&payload);
  if (Status st = s.b->SendFrame(type, payload, d); !st.ok()) return st;
  const Status server_st = server.AcceptFinish(**pending, *s.a, d, nullptr);
  std::string reply;  // the server's verdict, relayed back
  if (s.b->RecvFrame(&type, &reply, d).ok()) (void)c.a->SendFrame(type, reply, d);
  bool done = false;
  for (int i = 0; i < 5000 && !(done = hs.Step(*c.b, d)); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  *client_status = done ? hs.status() : Status(DYAD_RC_TIMEOUT, "the client never ended");
  return server_st;
}

TEST(Hardening2, RefusalSaysOnlyRefused) {
  auto same = [](std::string*) {};
  Status client;
  Status server = RelayedHandshake(kSecretA, kSecretB, same, same, &client);
  // The service's own log says why...
  EXPECT_EQ(server.code(), DYAD_RC_AUTH);
  EXPECT_NE(server.message().find("wrong cluster secret"), std::string::npos) << server.ToString();
  // ...the peer learns only that it was refused.
  EXPECT_EQ(client.code(), DYAD_RC_AUTH);
  EXPECT_NE(client.message().find("says only 'refused'"), std::string::npos) << client.ToString();
  for (const char* leak : {"uid", "wrong cluster secret", "munge", "socket"})
    EXPECT_EQ(client.message().find(leak), std::string::npos) << leak << ": " << client.ToString();

  // What the wire carries: a reply with exactly "refused".
  SocketPair p;
  Authenticator server_auth(kSecretA), client_auth(kSecretB);
  std::thread t([&] {
    (void)server_auth.Accept(*p.a, PeerIdentity{0, 1}, Deadline::AfterMs(5000), nullptr);
  });
  uint16_t type = 0;
  std::string challenge, reply;
  ASSERT_TRUE(p.b->RecvFrame(&type, &challenge, Deadline::AfterMs(5000)).ok());
  ChallengeMsg ch;
  bool older = false;
  ASSERT_TRUE(ChallengeMsg::Decode(challenge, &ch, &older));
  AuthenticateMsg m;
  m.hello = ch.hello;  // any well-formed hello
  m.hello.credentials = kCredSecret;
  m.mac.assign(kHandshakeMacSize, 'x');
  ASSERT_TRUE(p.b->SendFrame(static_cast<uint16_t>(MsgType::kAuthenticate), m.Encode(),
                             Deadline::AfterMs(5000))
                  .ok());
  ASSERT_TRUE(p.b->RecvFrame(&type, &reply, Deadline::AfterMs(5000)).ok());
  t.join();
  Status verdict;
  std::string body;
  ASSERT_TRUE(DecodeReply(reply, &verdict, &body));
  EXPECT_EQ(verdict.code(), DYAD_RC_AUTH);
  EXPECT_EQ(verdict.message(), "refused");
}

TEST(Hardening2, TamperedHandshakeIsNotWrongSecret) {
  auto same = [](std::string*) {};
  auto flip_last = [](std::string* p) { p->back() ^= 1; };  // the challenge's X25519 key
  auto flip_nonce = [](std::string* p) { (*p)[10] ^= 1; };  // the client's nonce
  Status client;
  Status st = RelayedHandshake(kSecretA, kSecretA, flip_last, same, &client);
  EXPECT_EQ(st.code(), DYAD_RC_AUTH);
  EXPECT_NE(st.message().find("altered in transit"), std::string::npos) << st.ToString();
  EXPECT_EQ(st.message().find("wrong cluster secret"), std::string::npos) << st.ToString();
  st = RelayedHandshake(kSecretA, kSecretA, same, flip_nonce, &client);
  EXPECT_EQ(st.code(), DYAD_RC_AUTH);
  EXPECT_NE(st.message().find("altered in transit"), std::string::npos) << st.ToString();
  EXPECT_EQ(st.message().find("wrong cluster secret"), std::string::npos) << st.ToString();
  // Untouched and the same secret: it works through the relay.
  st = RelayedHandshake(kSecretA, kSecretA, same, same, &client);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(client.ok()) << client.ToString();
}

// --- item 12: logs escape C1 controls and bidirectional controls -------------

TEST(Hardening2, LogEscapesC1AndBidi) {
  // C1 CSI (U+009B) as UTF-8, and as a lone byte (CSI to an 8-bit terminal).
  EXPECT_EQ(EscapeControlChars("a\xc2\x9b"
                               "31mred"),
            "a\\u009b31mred");
  EXPECT_EQ(EscapeControlChars("a\x9b"
                               "31m"),
            "a\\x9b31m");
  EXPECT_EQ(EscapeControlChars("\xc2\x85next line"), "\\u0085next line");
  // Bidirectional overrides, embeddings, isolates and marks.
  EXPECT_EQ(EscapeControlChars("file\xe2\x80\xae"
                               "txt.exe"),
            "file\\u202etxt.exe");
  for (const char* cp : {"\xe2\x80\xaa", "\xe2\x80\xab", "\xe2\x80\xac", "\xe2\x80\xad",
                         "\xe2\x81\xa6", "\xe2\x81\xa7", "\xe2\x81\xa8", "\xe2\x81\xa9",
                         "\xe2\x80\x8e", "\xe2\x80\x8f", "\xe2\x80\xa8", "\xe2\x80\xa9"})
    EXPECT_EQ(EscapeControlChars(cp).rfind("\\u", 0), 0u) << Hex(cp);
  // Every C0 control and DEL, still.
  for (int c = 0; c < 0x20; ++c)
    EXPECT_EQ(EscapeControlChars(std::string(1, static_cast<char>(c)))[0], '\\') << c;
  EXPECT_EQ(EscapeControlChars("\x7f"), "\\x7f");
  // Printable UTF-8 (accents, CJK, emoji) is kept; broken UTF-8 is escaped.
  EXPECT_EQ(EscapeControlChars("caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80"),
            "caf\xc3\xa9 \xe6\x97\xa5 \xf0\x9f\x98\x80");
  EXPECT_EQ(EscapeControlChars("\xc3"), "\\xc3");
  EXPECT_EQ(EscapeControlChars("\xc0\xaf"), "\\xc0\\xaf");           // overlong '/'
  EXPECT_EQ(EscapeControlChars("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate

  // In a log line.
  TempDir d;
  const std::string log = d.path() + "/log";
  ASSERT_TRUE(LogSetInfoFile(log));
  DYAD_LOG_INFO("refused '%s'",
                "evil\xe2\x80\xae\xc2\x9b"
                "2J");
  ASSERT_TRUE(LogSetInfoFile(""));
  const std::string text = ReadAll(log);
  EXPECT_NE(text.find("evil\\u202e\\u009b2J"), std::string::npos) << text;
  EXPECT_EQ(text.find("\xe2\x80\xae"), std::string::npos);
  EXPECT_EQ(text.find("\xc2\x9b"), std::string::npos);
}

// --- item 13 (logs; the ready file: service_hardening2_test.cc) ---------------

TEST(Hardening2, LogFilesArePrivate) {
  TempDir d;
  const std::string log = d.path() + "/info.log";
  const mode_t old = ::umask(0);
  const bool opened = LogSetInfoFile(log);
  ::umask(old);
  ASSERT_TRUE(opened);
  DYAD_LOG_INFO("hello");
  ASSERT_TRUE(LogSetInfoFile(""));
  struct stat st;
  ASSERT_EQ(::stat(log.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << std::oct << (st.st_mode & 0777);
  // An existing 0644 log of ours is narrowed when opened.
  const std::string wide = d.path() + "/wide.log";
  WriteText(wide, "old\n", 0644);
  ASSERT_TRUE(LogSetErrorFile(wide));
  ASSERT_TRUE(LogSetErrorFile(""));
  ASSERT_EQ(::stat(wide.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << std::oct << (st.st_mode & 0777);
  // The operator may ask for another mode (DYAD_SERVICE_FILE_MODE).
  Result<unsigned> m = ParseFileMode("0640");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(*m, 0640u);
  EXPECT_FALSE(ParseFileMode("999").ok());
  EXPECT_FALSE(ParseFileMode("").ok());
  LogSetFileMode(0640);
  const std::string group = d.path() + "/group.log";
  ASSERT_TRUE(LogSetInfoFile(group));
  ASSERT_TRUE(LogSetInfoFile(""));
  LogSetFileMode(0600);
  ASSERT_EQ(::stat(group.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u & ~old);
}

// --- docs/security.md: test vectors of the handshake and the record layer ----
//
// Inputs and expected outputs another implementation can check itself
// against. The values printed here are the ones published; this test keeps
// them true.

TEST(Hardening2, PublishedTestVectors) {
  using namespace auth_internal;
  const std::string secret = "000102030405060708090a0b0c0d0e0f";
  // The challenge: label, then the server's Hello.
  ChallengeMsg challenge;
  challenge.hello.nonce = std::string(kHandshakeNonceSize, '\x11');
  challenge.hello.rank = 0;
  challenge.hello.incarnation = 0x0102030405060708ull;
  challenge.hello.credentials = kCredSecret;
  challenge.hello.protection = 1;
  challenge.hello.public_key = std::string(kHandshakeKeySize, '\x22');
  Hello client;
  client.nonce = std::string(kHandshakeNonceSize, '\x33');
  client.rank = 1;
  client.incarnation = 0x1112131415161718ull;
  client.credentials = kCredSecret;
  client.protection = 2;
  client.public_key = std::string(kHandshakeKeySize, '\x44');
  const std::string challenge_payload = challenge.Encode();
  const std::string transcript = HandshakeTranscript(challenge_payload, client);
  std::string client_mac, server_mac, unused;
  AuthConfig cfg;
  cfg.secret = secret;
  ASSERT_TRUE(MakeProofs(cfg, "client", transcript, &unused, &client_mac).ok());
  ASSERT_TRUE(MakeProofs(cfg, "server", transcript, &unused, &server_mac).ok());
  Secret dh, okm;
  dh.bytes = std::string(32, '\x55');
  ASSERT_TRUE(DeriveSessionKeys(dh, secret, transcript, &okm).ok());
  const std::string check = SecretCheck(secret, challenge.hello.nonce);

  // A record: key = first 32 bytes of the session keys (client to server),
  // record 0, associated data = the 12-byte frame header.
  const auto* c2s = reinterpret_cast<const unsigned char*>(okm.bytes.data());
  const std::string aad = Unhex(
      "4459414401003200"
      "05000000");
  std::string integ = "hello", enc = "hello";
  unsigned char tag_i[kSealTagSize], tag_e[kSealTagSize];
  auto si = Cipher(c2s, true, SealLimits{}, LinkProtection::kIntegrity);
  auto se = Cipher(c2s, true, SealLimits{}, LinkProtection::kEncrypt);
  ASSERT_TRUE(si->Seal(aad, integ.data(), nullptr, integ.size(), tag_i).ok());
  ASSERT_TRUE(se->Seal(aad, enc.data(), enc.data(), enc.size(), tag_e).ok());
  unsigned char next[kSealKeySize];
  ASSERT_TRUE(NextRecordKey(c2s, 1, next).ok());

  const std::string got_challenge = Hex(challenge_payload);
  std::printf(
      "challenge payload: %s\nclient hello: %s\ntranscript: %s\nclient mac: %s\n"
      "server mac: %s\nsecret check: %s\nsession keys: %s\nrecord tag (integrity): "
      "%s\nrecord (encrypt): %s tag %s\nnext key (epoch 1): %s\n",
      got_challenge.c_str(), Hex(client.Encode()).c_str(), Hex(transcript).c_str(),
      Hex(client_mac).c_str(), Hex(server_mac).c_str(), Hex(check).c_str(), Hex(okm.bytes).c_str(),
      Hex(std::string(reinterpret_cast<char*>(tag_i), 16)).c_str(), Hex(enc).c_str(),
      Hex(std::string(reinterpret_cast<char*>(tag_e), 16)).c_str(),
      Hex(std::string(reinterpret_cast<char*>(next), 32)).c_str());
  // The values docs/security.md publishes ("Test vectors").
  EXPECT_EQ(got_challenge,
            "10000000647961642d68616e647368616b652d3220000000111111111111111111111111111111111111"
            "11111111111111111111111111110000000008070605040302010101200000002222222222222222222222"
            "222222222222222222222222222222222222222222");
  EXPECT_EQ(Hex(client.Encode()),
            "2000000033333333333333333333333333333333333333333333333333333333333333330100000018171"
            "61514131211010220000000444444444444444444444444444444444444444444444444444444444444444"
            "4");
  EXPECT_EQ(Hex(transcript), "31bc98617968194a57abe2633301dfde679011ad43fe4fd802b8f19495223ae6");
  EXPECT_EQ(Hex(client_mac), "3bf12afe96b46e1d6a3a34457f6289729b0f98af8e337232a38c839c1ea38a2e");
  EXPECT_EQ(Hex(server_mac), "0bd20d9df94cb13fa9a5ca74bdb1b0d98ae498e52e1532ed2b1c00ce81c6006f");
  EXPECT_EQ(Hex(check), "00e9f518e0864e64f2c77d6a97da1d0df1e1da8d0cd87a61efde732f58584d88");
  EXPECT_EQ(Hex(okm.bytes),
            "f0af0ad22ce7d05b3ab847b6a3687fbb0b9dc2cb502db02597461b5729e87178"
            "545cfb06cfc9372c767432186ef614cd2df344ef2ee60e3955ce385f45e7a022");
  EXPECT_EQ(Hex(std::string(reinterpret_cast<char*>(tag_i), 16)),
            "aaaee4966a4c08be4838a3b34bf97e64");
  EXPECT_EQ(Hex(enc), "244cee1af3");
  EXPECT_EQ(Hex(std::string(reinterpret_cast<char*>(tag_e), 16)),
            "1905df2518ae0e8fa059c5f8a3fc4924");
  EXPECT_EQ(Hex(std::string(reinterpret_cast<char*>(next), 32)),
            "b6dcb5602e4cc608de4a8747bbce08aef0dbb87fee0bcc9c2b753888398a1fc6");
}

// A client of another user meets a service run by root: the service would
// refuse it (AdmitLocalClient) and close, and the client often learned of
// it as a broken pipe ("did the service stop?"). The client now says so
// itself, before it sends anything. Run as root (the tests are); the
// client side runs in a child that becomes `nobody`.
TEST(LocalTrust, AClientOfAnotherUserIsToldARootServiceServesRootOnly) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another user";
  TempDir dir("dyad-trust.");
  ASSERT_TRUE(dir.ok());
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  const std::string sock = dir.path() + "/service.sock";
  Result<SocketAddress> addr = ParseAddress("unix:" + sock);
  ASSERT_TRUE(addr.ok());
  Result<UniqueFd> listener = Listen(*addr);
  ASSERT_TRUE(listener.ok()) << listener.status().ToString();
  ASSERT_EQ(::chmod(sock.c_str(), 0666), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    Result<UniqueFd> fd = Connect(*addr, Deadline::AfterMs(5000));
    if (!fd.ok()) ::_exit(4);
    Channel ch(std::move(*fd), Trust::kUnauthenticated);
    const Status st = TrustLocalService(ch);
    const bool told = st.code() == DYAD_RC_PERM &&
                      st.message().find("serves root's clients only") != std::string::npos;
    ::_exit(told ? 0 : 5);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "3: could not become nobody, 4: no connection, "
                                       "5: not told why";
}

}  // namespace
}  // namespace dyad
