// Regression tests of issue 12 against real dyad-service processes, each
// named after the defect it pins: memory before authentication (1), socket
// directory squatting and an unchecked service socket (4), forged log lines
// (12), and services without a credential listening beyond loopback (14).
#include <fcntl.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/wire.h"
#include "emu/netns.h"
#include "integration/integration_util.h"
#include "proto/auth.h"
#include "proto/protocol.h"
#include "util.h"

namespace dyad::it {
namespace {

using emu::RunResult;

constexpr uint32_t kNobody = 65534;

// Resident memory of a process in KiB (0 if unreadable).
uint64_t RssKiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10);
  }
  return 0;
}

// The highest RSS seen over `ms` milliseconds.
uint64_t PeakRssOver(pid_t pid, int64_t ms) {
  uint64_t peak = RssKiB(pid);
  const Deadline end = Deadline::AfterMs(ms);
  while (!end.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    peak = std::max(peak, RssKiB(pid));
  }
  return peak;
}

std::string FrameHeader(uint16_t type, uint32_t len) {
  char hdr[kFrameHeaderSize];
  EncodeFrameHeader(hdr, type, len);
  return std::string(hdr, sizeof hdr);
}

class HardeningTest : public TwoNodeTest {};

// Issue 12, defect 1: a peer that read the challenge and sent a header
// announcing 16 MiB made the service reserve 16 MiB before any byte came,
// and hold it for the handshake deadline (48 such peers: 9 MB -> 796 MB).
TEST_F(HardeningTest, Defect1_PeersAnnouncingHugeFramesDoNotInflateTheService) {
  const pid_t pid = cluster().ServicePid(kA);
  ASSERT_GT(pid, 0);
  const std::string a = cluster().node(kA).address();
  const uint64_t before = RssKiB(pid);
  ASSERT_GT(before, 0u);

  // 100 unauthenticated peers, each announcing the largest frame.
  constexpr int kPeers = 100;
  std::vector<UniqueFd> hostile;
  const std::string announce =
      FrameHeader(static_cast<uint16_t>(MsgType::kAuthenticate), kMaxFramePayload);
  for (int i = 0; i < kPeers; ++i) {
    auto fd = cluster().ConnectFrom(kB, a, Deadline::AfterMs(5000));
    ASSERT_TRUE(fd.ok()) << Str(fd.status());
    ASSERT_TRUE(WriteFully(fd->get(), announce.data(), announce.size()).ok());
    hostile.push_back(std::move(*fd));
  }
  const uint64_t unauth_peak = PeakRssOver(pid, 1500);
  EXPECT_LT(unauth_peak - std::min(unauth_peak, before), 32u * 1024)
      << "service RSS went from " << before << " KiB to " << unauth_peak << " KiB with " << kPeers
      << " unauthenticated peers announcing " << kMaxFramePayload << "-byte frames";

  // Authenticated peers may send large frames, but memory still follows
  // the bytes that arrive: announce the maximum, send nothing.
  std::vector<Channel> authed;
  for (int i = 0; i < 20; ++i) {
    auto fd = cluster().ConnectFrom(kB, a, Deadline::AfterMs(5000));
    ASSERT_TRUE(fd.ok()) << Str(fd.status());
    Channel ch(std::move(*fd), Trust::kUnauthenticated);
    Status st = Authenticator(cluster().secret())
                    .Connect(ch, PeerIdentity{7, 700 + static_cast<uint64_t>(i)},
                             Deadline::AfterMs(5000), nullptr);
    ASSERT_TRUE(st.ok()) << Str(st);
    const std::string big =
        FrameHeader(static_cast<uint16_t>(MsgType::kFetch), kMaxFramePayload + kSealTagSize);
    ASSERT_TRUE(ch.SendAll(big.data(), big.size(), Deadline::AfterMs(5000)).ok());
    authed.push_back(std::move(ch));
  }
  const uint64_t authed_peak = PeakRssOver(pid, 400);
  EXPECT_LT(authed_peak - std::min(authed_peak, before), 32u * 1024)
      << "service RSS went from " << before << " KiB to " << authed_peak
      << " KiB with 20 authenticated peers announcing the largest frame";

  // And the node still serves real work meanwhile.
  ASSERT_TRUE(cluster().ServiceRunning(kA));
  const std::vector<ManifestEntry> files = {{"during/flood.dat", 3 * kMiB}};
  Produce(files);
  ConsumeOk(files);
}

// Issue 12, defect 12: a newline in a requested path forged a line in the
// service's log.
TEST_F(HardeningTest, Defect12_NewlineInARequestedPathCannotForgeALogLine) {
  auto fd = cluster().ConnectFrom(kB, cluster().node(kA).address(), Deadline::AfterMs(5000));
  ASSERT_TRUE(fd.ok()) << Str(fd.status());
  Channel ch(std::move(*fd), Trust::kUnauthenticated);
  ASSERT_TRUE(Authenticator(cluster().secret())
                  .Connect(ch, PeerIdentity{9, 9}, Deadline::AfterMs(5000), nullptr)
                  .ok());
  const std::string forged = "FORGED-LINE ERROR dyad-service[rank 0]: all files deleted";
  FetchRequest req;
  req.upath = "../escape\n" + forged;  // refused, and logged with the path
  req.transport = "tcp";
  Encoder e;
  req.EncodeTo(e);
  std::string body;
  Status st = CallRpc(ch, MsgType::kFetch, e.data(), &body, Deadline::AfterMs(5000));
  EXPECT_FALSE(st.ok());
  const std::string log = ReadText(cluster().node(kA).service_log);
  ASSERT_NE(log.find("FORGED-LINE"), std::string::npos) << "the refusal was not logged:\n" << log;
  EXPECT_EQ(log.find("\nFORGED-LINE"), std::string::npos) << "a log line was forged:\n" << log;
  EXPECT_NE(log.find("escape\\nFORGED-LINE"), std::string::npos) << log;
}

// --- single services started by hand ----------------------------------------

class StartupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    service_ = emu::FindSiblingProgram("dyad-service", DYAD_BUILD_BIN_DIR);
    dyad_ = emu::FindSiblingProgram("dyad", DYAD_BUILD_BIN_DIR);
    ASSERT_FALSE(service_.empty());
    ASSERT_FALSE(dyad_.empty());
    base_ = testutil::MakeTempDir("dyad-startup-test.");
    ASSERT_FALSE(base_.empty());
    ASSERT_EQ(::chmod(base_.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir((base_ + "/dmd").c_str(), 0755), 0);
    // The services below have a credential unless a test says otherwise:
    // no service listens without one, even on loopback (issue 25, item 8).
    secret_file_ = base_ + "/secret";
    const int fd = ::open(secret_file_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    const std::string secret = "0123456789abcdef0123456789abcdef0123456789abcdef\n";
    ASSERT_EQ(::write(fd, secret.data(), secret.size()), static_cast<ssize_t>(secret.size()));
    ::close(fd);
  }
  void TearDown() override {
    if (!netns_.empty()) (void)emu::DeleteNetns(netns_);
    if (!base_.empty()) (void)emu::RemoveTree(base_);
  }

  std::vector<std::string> ServiceArgv(const std::string& listen, const std::string& socket_dir,
                                       const std::vector<std::string>& extra = {},
                                       bool with_secret = true) {
    std::vector<std::string> argv = {service_,
                                     "-r",
                                     "0",
                                     "-k",
                                     "memory",
                                     "-l",
                                     listen,
                                     "-s",
                                     socket_dir + "/service.sock",
                                     "--ready-file",
                                     base_ + "/ready"};
    if (with_secret) {
      argv.push_back("--secret-file");
      argv.push_back(secret_file_);
    }
    argv.insert(argv.end(), extra.begin(), extra.end());
    argv.push_back(base_ + "/dmd");
    return argv;
  }

  // Runs a service that is expected to refuse to start.
  RunResult ExpectRefusal(const std::vector<std::string>& argv, const std::string& netns = "") {
    emu::SpawnOptions o;
    o.argv = argv;
    o.netns = netns;
    auto r = emu::RunCapture(o, 15000);
    EXPECT_TRUE(r.ok()) << Str(r.status());
    if (!r.ok()) return {};
    EXPECT_FALSE(r->timed_out) << "the service started:\n" << r->output;
    EXPECT_FALSE(r->status.success()) << r->output;
    return *r;
  }

  // Starts a service expected to come up; returns it running (or invalid).
  emu::Process ExpectStart(const std::vector<std::string>& argv, const std::string& netns = "") {
    ::unlink((base_ + "/ready").c_str());
    emu::SpawnOptions o;
    o.argv = argv;
    o.netns = netns;
    o.stdout_path = base_ + "/service.out";
    o.stderr_path = o.stdout_path;
    auto p = emu::Process::Spawn(o);
    EXPECT_TRUE(p.ok()) << Str(p.status());
    if (!p.ok()) return emu::Process();
    const Deadline deadline = Deadline::AfterMs(15000);
    while (!Exists(base_ + "/ready")) {
      if (p->Exited() || deadline.expired()) {
        ADD_FAILURE() << "the service did not start:\n" << ReadText(base_ + "/service.out");
        return emu::Process();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return std::move(*p);
  }

  std::string service_, dyad_, base_, netns_, secret_file_;
};

// Issue 12, defect 4 (service side): the service accepted an existing
// /tmp/dyad-<uid> owned by another user with mode 0777, whose owner could
// then replace the socket.
TEST_F(StartupTest, Defect4_SocketDirectoryOfAnotherUserOrOpenToOthersIsRefused) {
  const std::string dir = base_ + "/sockets";
  ASSERT_EQ(::mkdir(dir.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  ASSERT_EQ(::chown(dir.c_str(), kNobody, kNobody), 0);
  RunResult r = ExpectRefusal(ServiceArgv("127.0.0.1:0", dir));
  EXPECT_NE(r.output.find("belongs to uid 65534"), std::string::npos) << r.output;

  // Ours, but open to others.
  ASSERT_EQ(::chown(dir.c_str(), ::geteuid(), ::getegid()), 0);
  r = ExpectRefusal(ServiceArgv("127.0.0.1:0", dir));
  EXPECT_NE(r.output.find("mode 0777"), std::string::npos) << r.output;

  // A symlink to a private directory is refused too.
  const std::string real = base_ + "/private";
  ASSERT_EQ(::mkdir(real.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(real.c_str(), (base_ + "/link").c_str()), 0);
  r = ExpectRefusal(ServiceArgv("127.0.0.1:0", base_ + "/link"));
  EXPECT_NE(r.output.find("symlink"), std::string::npos) << r.output;

  // Ours and 0700: the service starts; a missing directory is created 0700.
  ASSERT_EQ(::chmod(dir.c_str(), 0700), 0);
  emu::Process p = ExpectStart(ServiceArgv("127.0.0.1:0", dir));
  ASSERT_TRUE(p.valid());
  EXPECT_TRUE(p.Stop().success());
  const std::string fresh = base_ + "/fresh";
  p = ExpectStart(ServiceArgv("127.0.0.1:0", fresh));
  ASSERT_TRUE(p.valid());
  struct stat st;
  ASSERT_EQ(::stat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  EXPECT_TRUE(p.Stop().success());
}

// A process of uid `uid` listening on `socket_path` that answers every
// request with success, as a squatter would ("consume: done, local copy").
// Everything is prepared before fork; the child uses system calls only.
pid_t StartSquatter(const std::string& socket_path, uid_t uid) {
  ConsumeReply fake;
  fake.record.upath = "victim.dat";
  fake.local = true;
  Encoder body;
  fake.EncodeTo(body);
  const std::string consume_reply = EncodeReply(Status::OK(), body.data());
  const std::string ok_reply = EncodeReply(Status::OK());
  const std::string consume_frame = FrameHeader(static_cast<uint16_t>(MsgType::kReply),
                                                static_cast<uint32_t>(consume_reply.size())) +
                                    consume_reply;
  const std::string ok_frame =
      FrameHeader(static_cast<uint16_t>(MsgType::kReply), static_cast<uint32_t>(ok_reply.size())) +
      ok_reply;
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, socket_path.c_str(), sizeof sa.sun_path - 1);
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  if (::setgroups(0, nullptr) != 0 || ::setgid(uid) != 0 || ::setuid(uid) != 0) ::_exit(3);
  const int l = ::socket(AF_UNIX, SOCK_STREAM, 0);
  if (l < 0 || ::bind(l, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(l, 8) != 0)
    ::_exit(4);
  for (;;) {
    const int c = ::accept(l, nullptr, nullptr);
    if (c < 0) continue;
    char hdr[kFrameHeaderSize];
    // One request per connection is enough for the client's call.
    while (::read(c, hdr, sizeof hdr) == static_cast<ssize_t>(sizeof hdr)) {
      uint32_t len = 0;
      uint16_t type = 0;
      std::memcpy(&type, hdr + 6, 2);
      std::memcpy(&len, hdr + 8, 4);
      char sink[4096];
      while (len > 0) {
        const ssize_t n = ::read(c, sink, len < sizeof sink ? len : sizeof sink);
        if (n <= 0) break;
        len -= static_cast<uint32_t>(n);
      }
      const std::string& reply =
          type == static_cast<uint16_t>(MsgType::kConsume) ? consume_frame : ok_frame;
      if (::write(c, reply.data(), reply.size()) < 0) break;
    }
    ::close(c);
  }
}

// Issue 12, defect 4 (client side): another user who replaced the socket
// made the victim's `dyad consume` report success for a file that never
// arrived; the client never checked who was listening.
TEST_F(StartupTest, Defect4_ClientRefusesAServiceSocketOfAnotherUser) {
  const std::string dir = base_ + "/squatted";
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0);
  ASSERT_EQ(::chown(dir.c_str(), kNobody, kNobody), 0);
  const std::string sock = dir + "/service.sock";
  const pid_t squatter = StartSquatter(sock, kNobody);
  ASSERT_GT(squatter, 0);
  struct Reap {
    pid_t pid;
    ~Reap() {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
  } reap{squatter};
  (void)testutil::Eventually([&] { return Exists(sock); }, 5000, 5);
  ASSERT_TRUE(Exists(sock)) << "the squatter did not start";

  emu::SpawnOptions o;
  o.argv = {dyad_, "consume", base_ + "/dmd/victim.dat"};
  o.env = {{"DYAD_SERVICE_SOCKET", sock}, {"DYAD_PATH_CONSUMER", base_ + "/dmd"}};
  auto r = emu::RunCapture(o, 20000);
  ASSERT_TRUE(r.ok()) << Str(r.status());
  EXPECT_FALSE(r->status.success()) << "consume trusted another user's socket:\n" << r->output;
  EXPECT_NE(r->output.find("uid 65534"), std::string::npos) << r->output;
  EXPECT_NE(r->output.find("DYAD_RC_PERM"), std::string::npos) << r->output;
}

// Issue 12, defect 14: a service started without a secret let anyone who
// reached its port fetch files and write the metadata store, and its
// warning mentioned only fetching.
TEST_F(StartupTest, Defect14_ServiceWithoutCredentialRefusesToListenBeyondLoopback) {
  if (!emu::NetnsAvailable())
    GTEST_SKIP() << "needs a network namespace to listen on 0.0.0.0 without touching the host: "
                 << emu::NetnsUnavailableReason();
  netns_ = std::string(emu::kNetnsPrefix) + std::to_string(::getpid()) + "-startup";
  ASSERT_TRUE(emu::CreateNetns(netns_).ok());
  ASSERT_TRUE(emu::Ip({"-n", netns_, "link", "set", "lo", "up"}).ok());
  const std::string dir = base_ + "/run";

  RunResult r = ExpectRefusal(ServiceArgv("0.0.0.0:0", dir, {}, false), netns_);
  EXPECT_NE(r.output.find("--insecure"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("any file of the producer directory, published or not"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("metadata store"), std::string::npos) << r.output;

  // Told --insecure it starts, and its warning names both risks.
  emu::Process p = ExpectStart(ServiceArgv("0.0.0.0:0", dir, {"--insecure"}, false), netns_);
  ASSERT_TRUE(p.valid());
  EXPECT_TRUE(p.Stop().success());
  const std::string out = ReadText(base_ + "/service.out");
  EXPECT_NE(out.find("WARN"), std::string::npos) << out;
  EXPECT_NE(out.find("metadata store"), std::string::npos) << out;
}

// Issue 25, item 8: on loopback too, a service without a credential let
// every local uid fetch any file of the producer directory (a root-owned
// 0600 file was read by `nobody`). It refuses to start, saying so, unless
// --insecure; with a secret it starts.
TEST_F(StartupTest, Hardening2_NoCredentialRefusedOnLoopback) {
  const std::string dir = base_ + "/run";
  RunResult r = ExpectRefusal(ServiceArgv("127.0.0.1:0", dir, {}, false));
  EXPECT_NE(r.output.find("any process of any user on this host"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("published or not"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("dyad secret init"), std::string::npos) << r.output;
  emu::Process p = ExpectStart(ServiceArgv("127.0.0.1:0", dir, {"--insecure"}, false));
  ASSERT_TRUE(p.valid());
  EXPECT_TRUE(p.Stop().success());
  EXPECT_NE(ReadText(base_ + "/service.out").find("running --insecure"), std::string::npos);
  p = ExpectStart(ServiceArgv("127.0.0.1:0", dir));
  ASSERT_TRUE(p.valid());
  EXPECT_TRUE(p.Stop().success());
}

// Issue 25, items 7 and 9: a weak secret is refused at start with a clear
// message that never quotes it; `dyad info` shows that secrets are set,
// never their values (nor a password inside a store URL); `dyad secret
// init` writes a good one, mode 600.
TEST_F(StartupTest, Hardening2_ShortSecretRefusedAndInfoHidesSecrets) {
  const std::string weak = base_ + "/weak";
  {
    const int fd = ::open(weak.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, "password\n", 9), 9);
    ::close(fd);
  }
  RunResult r =
      ExpectRefusal(ServiceArgv("127.0.0.1:0", base_ + "/run", {"--secret-file", weak}, false));
  EXPECT_NE(r.output.find("too weak"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("password"), std::string::npos) << r.output;

  const std::string made = base_ + "/made";
  emu::SpawnOptions o;
  o.argv = {dyad_, "secret", "init", made};
  auto init = emu::RunCapture(o, 15000);
  ASSERT_TRUE(init.ok() && init->status.success()) << (init.ok() ? init->output : "");
  struct stat st;
  ASSERT_EQ(::stat(made.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(ReadText(made).size(), 65u);
  init = emu::RunCapture(o, 15000);  // never overwrites
  ASSERT_TRUE(init.ok());
  EXPECT_FALSE(init->status.success());
  o.argv = {dyad_, "secret", "check", made};
  init = emu::RunCapture(o, 15000);
  ASSERT_TRUE(init.ok() && init->status.success()) << (init.ok() ? init->output : "");
  emu::Process p =
      ExpectStart(ServiceArgv("127.0.0.1:0", base_ + "/run", {"--secret-file", made}, false));
  ASSERT_TRUE(p.valid());
  EXPECT_TRUE(p.Stop().success());

  for (const char* format : {"", "--json"}) {
    emu::SpawnOptions i;
    i.argv = {dyad_, "info"};
    if (*format) i.argv.push_back(format);
    i.env = {{"DYAD_SECRET", "hunter2-the-cluster-secret"},
             {"DYAD_KVS", "redis://:pw-in-url@redis-host:6379"},
             {"DYAD_REDIS_PASSWORD", "redis-password-value"}};
    auto info = emu::RunCapture(i, 15000);
    ASSERT_TRUE(info.ok() && info->status.success()) << (info.ok() ? info->output : "");
    for (const char* leak : {"hunter2", "pw-in-url", "redis-password-value"})
      EXPECT_EQ(info->output.find(leak), std::string::npos) << leak << " in\n" << info->output;
    EXPECT_NE(info->output.find("(set, hidden)"), std::string::npos) << info->output;
    EXPECT_NE(info->output.find("redis://:***@redis-host:6379"), std::string::npos);
  }
}

}  // namespace
}  // namespace dyad::it
