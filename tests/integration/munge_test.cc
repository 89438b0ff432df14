// MUNGE as a credential between services (issue 12): each emulated node
// gets its own munged, started by the test with a key of the test's own in
// the test's own directory (as every node of a MUNGE site runs munged with
// the cluster's shared key). Services authenticate with MUNGE alone or on
// top of the cluster secret; a peer whose munged has another key, or that
// presents only the secret, is refused.
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "emu/process.h"
#include "integration/integration_util.h"
#include "proto/auth.h"
#include "proto/munge/munge.h"
#include "util.h"

namespace dyad::it {
namespace {

std::string MungedBinary() {
  for (const char* p : {"/usr/sbin/munged", "/sbin/munged"})
    if (::access(p, X_OK) == 0) return p;
  return emu::FindProgram("munged");
}

// A munged of the test's own: own key file, socket, log, pid and seed
// files, all in `dir`. Stopped (and waited for) on destruction.
class TestMunged {
 public:
  static Result<std::unique_ptr<TestMunged>> Start(const std::string& dir, const std::string& name,
                                                   const std::string& key_file) {
    std::unique_ptr<TestMunged> m(new TestMunged());
    m->socket_ = dir + "/" + name + ".socket";
    m->log_ = dir + "/" + name + ".log";
    emu::SpawnOptions o;
    o.argv = {MungedBinary(),
              "--foreground",
              "--socket=" + m->socket_,
              "--key-file=" + key_file,
              "--log-file=" + m->log_,
              "--pid-file=" + dir + "/" + name + ".pid",
              "--seed-file=" + dir + "/" + name + ".seed",
              "--num-threads=2"};
    o.stdout_path = dir + "/" + name + ".out";
    o.stderr_path = o.stdout_path;
    auto p = emu::Process::Spawn(o);
    if (!p.ok()) return p.status();
    m->process_ = std::move(*p);
    // Ready once its socket exists; bounded, and a dying munged is reported.
    const Deadline deadline = Deadline::AfterMs(10000);
    while (!Exists(m->socket_)) {
      if (m->process_.Exited() || deadline.expired()) {
        std::ifstream in(o.stdout_path);
        std::stringstream ss;
        ss << in.rdbuf();
        return Status(DYAD_RC_SYSFAIL, "munged did not start: " + ss.str());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return m;
  }
  ~TestMunged() {
    if (process_.valid()) process_.Stop(5000);
  }
  const std::string& socket() const { return socket_; }

 private:
  TestMunged() = default;
  emu::Process process_;
  std::string socket_, log_;
};

// A MUNGE key: random bytes, readable by the owner only (munged insists).
Status WriteKey(const std::string& path) {
  unsigned char key[1024];
  DYAD_RETURN_IF_ERROR(RandomBytes(key, sizeof key));
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.valid()) return StatusFromErrno(errno, "create " + path);
  return WriteFully(fd.get(), key, sizeof key);
}

class MungeTest : public TwoNodeTest {
 protected:
  virtual bool WithSecret() const { return false; }

  emu::ClusterOptions Options() override {
    emu::ClusterOptions o;
    o.use_secret = WithSecret();
    for (int i = 0; i < 2; ++i)
      o.node_service_args[i] = {"--munge", "--munge-socket", munged_[i]->socket()};
    return o;
  }

  void SetUp() override {
    if (!MungeCompiledIn()) GTEST_SKIP() << "built without MUNGE";
    if (MungedBinary().empty()) GTEST_SKIP() << "munged is not installed";
    dir_ = testutil::MakeTempDir("dyad-munge-test.");
    ASSERT_FALSE(dir_.empty());
    // munged wants every directory above its socket searchable by all.
    ASSERT_EQ(::chmod(dir_.c_str(), 0755), 0);
    ASSERT_TRUE(WriteKey(dir_ + "/cluster.key").ok());
    for (int i = 0; i < 2; ++i) {
      auto m = TestMunged::Start(dir_, "node" + std::to_string(i), dir_ + "/cluster.key");
      ASSERT_TRUE(m.ok()) << Str(m.status());
      munged_[i] = std::move(*m);
    }
    TwoNodeTest::SetUp();
  }

  void TearDown() override {
    TwoNodeTest::TearDown();
    for (auto& m : munged_) m.reset();
    if (!dir_.empty()) (void)emu::RemoveTree(dir_);
  }

  // A connection to A's service from inside node B's network.
  Channel ConnectToA() {
    auto fd = cluster().ConnectFrom(kB, cluster().node(kA).address(), Deadline::AfterMs(5000));
    EXPECT_TRUE(fd.ok()) << Str(fd.status());
    return Channel(fd.ok() ? std::move(*fd) : UniqueFd(), Trust::kUnauthenticated);
  }

  std::string Info(int node, const std::string& key) {
    auto st = cluster().ServiceStatus(node);
    EXPECT_TRUE(st.ok()) << Str(st.status());
    return st.ok() ? st->info[key] : std::string();
  }

  std::string dir_;
  std::unique_ptr<TestMunged> munged_[2];
};

TEST_F(MungeTest, ServicesAuthenticateWithMungeAlone) {
  EXPECT_EQ(Info(kA, "credentials"), "MUNGE");
  EXPECT_EQ(Info(kB, "credentials"), "MUNGE");
  const std::vector<ManifestEntry> files = {{"munge/one.dat", 2 * kMiB + 3}, {"munge/empty", 0}};
  Produce(files);
  ConsumeOk(files);
}

TEST_F(MungeTest, PeersWithAnotherMungeKeyOrWithoutMungeAreRefused) {
  // A third munged with a key of its own: its credentials mean nothing here.
  ASSERT_TRUE(WriteKey(dir_ + "/foreign.key").ok());
  auto foreign = TestMunged::Start(dir_, "foreign", dir_ + "/foreign.key");
  ASSERT_TRUE(foreign.ok()) << Str(foreign.status());
  auto svc = OpenMungeService((*foreign)->socket());
  ASSERT_TRUE(svc.ok()) << Str(svc.status());
  AuthConfig cfg;
  cfg.munge = *svc;
  {
    Channel ch = ConnectToA();
    Status st =
        Authenticator(cfg).Connect(ch, PeerIdentity{5, 55}, Deadline::AfterMs(10000), nullptr);
    EXPECT_EQ(st.code(), DYAD_RC_AUTH) << Str(st);
    // The peer is told only that it is refused (issue 25, item 11): no
    // uid, no munged socket; the service's own log says why.
    EXPECT_NE(st.message().find("says only 'refused'"), std::string::npos) << Str(st);
    EXPECT_EQ(st.message().find("uid"), std::string::npos) << Str(st);
    EXPECT_EQ(st.message().find(munged_[kA]->socket()), std::string::npos) << Str(st);
    bool logged = false;
    for (int i = 0; i < 200 && !logged; ++i) {
      logged = cluster().ServiceLogTail(kA, 1 << 20).find("MUNGE credential refused") !=
               std::string::npos;
      if (!logged) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    EXPECT_TRUE(logged) << cluster().ServiceLogTail(kA, 1 << 20);
  }
  // Someone holding a secret (any) but no MUNGE credential.
  {
    Channel ch = ConnectToA();
    Status st = Authenticator(std::string("a-secret"))
                    .Connect(ch, PeerIdentity{5, 56}, Deadline::AfterMs(10000), nullptr);
    EXPECT_EQ(st.code(), DYAD_RC_AUTH) << Str(st);
    EXPECT_NE(st.message().find("credential mismatch"), std::string::npos) << Str(st);
  }
  // The node's own munged (the cluster key): accepted.
  {
    auto own = OpenMungeService(munged_[kB]->socket());
    ASSERT_TRUE(own.ok()) << Str(own.status());
    AuthConfig good;
    good.munge = *own;
    Channel ch = ConnectToA();
    Status st =
        Authenticator(good).Connect(ch, PeerIdentity{5, 57}, Deadline::AfterMs(10000), nullptr);
    EXPECT_TRUE(st.ok()) << Str(st);
    EXPECT_EQ(ch.protection(), LinkProtection::kIntegrity);
  }
  const std::vector<ManifestEntry> files = {{"after/refusals.dat", 4096}};
  Produce(files);
  ConsumeOk(files);
}

class MungeWithSecretTest : public MungeTest {
 protected:
  bool WithSecret() const override { return true; }
};

TEST_F(MungeWithSecretTest, MungeOnTopOfTheSecretNeedsBoth) {
  EXPECT_EQ(Info(kA, "credentials"), "cluster secret + MUNGE");
  const std::vector<ManifestEntry> files = {{"both/one.dat", kMiB}};
  Produce(files);
  ConsumeOk(files);
  // The secret alone is not enough.
  Channel ch = ConnectToA();
  Status st = Authenticator(cluster().secret())
                  .Connect(ch, PeerIdentity{5, 58}, Deadline::AfterMs(10000), nullptr);
  EXPECT_EQ(st.code(), DYAD_RC_AUTH) << Str(st);
}

}  // namespace
}  // namespace dyad::it
