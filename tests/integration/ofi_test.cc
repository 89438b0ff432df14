// ofi_test.cc: two emulated nodes whose services move files with the
// libfabric transport (`dyad-service -m OFI`, clients DYAD_DTL_MODE=OFI):
// over the tcp provider (tcp;ofi_rxm) between the nodes' network
// namespaces (loopback without them), and over the shm provider between
// the two services, which share this host (network namespaces do not
// separate shared memory or process ids).
//
// Checked: a file many times larger than the registered buffer pool
// arrives intact (chunks pipelined through one buffer); many files, small
// (inside the reply) and medium (RMA reads), arrive intact over cached
// address-vector entries; a producer service killed mid-transfer (slowed
// or at full speed) gives the consumer a clear error in bounded time and
// no partial file, and the consumer's service survives and fetches from
// the restarted producer (a new peer); a consumer service killed
// mid-transfer leaves the producer's service running; `dyad status` says
// which provider was chosen and why; DYAD_DTL_MODE=MARGO from a client
// routes its fetch through the ofi transport.
// Skipped when the build has no libfabric, or a provider is missing here.
#include <dirent.h>
#include <signal.h>
#include <sys/stat.h>

#include <cstdlib>
#include <regex>

#include "integration/integration_util.h"

namespace dyad::it {
namespace {

class OfiTest : public TwoNodeTest {
 protected:
  virtual std::string Provider() const { return "tcp"; }

  emu::ClusterOptions Options() override {
    emu::ClusterOptions o;
    o.mode = "OFI";
    o.service_env["FI_PROVIDER"] = Provider();
    // One registered receive and one send buffer of 2 x 1 MiB per service,
    // so the larger files below take many trips through the same memory.
    o.service_env["DYAD_OFI_POOL_BUFFERS"] = "1";
    o.extra_service_args = {"--chunk-size", "1048576"};
    // The metadata root on B keeps records alive while A is down.
    o.root_node = kB;
    return o;
  }

  void SetUp() override {
    TwoNodeTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    for (int i = 0; i < 2; ++i) {
      auto status = cluster_->ServiceStatus(i);
      ASSERT_TRUE(status.ok()) << Str(status.status());
      ASSERT_EQ(status->info["transport"], "ofi") << "node " << i;
      const std::string d = status->info["transport.details"];
      if (d.find("provider ") != std::string::npos) continue;
      // The service could not open its endpoint: skip only when libfabric
      // here has no such provider.
      emu::SpawnOptions so;
      so.argv = {"fi_info", "-p", Provider(), "-t", "FI_EP_RDM", "-c", "FI_RMA"};
      auto probe = emu::RunCapture(so, 20000);
      if (probe.ok() && !probe->timed_out && !probe->status.success())
        GTEST_SKIP() << "libfabric provider " << Provider()
                     << " is not available here: " << probe->output;
      FAIL() << "node " << i << " could not start the ofi transport: " << d << "\n"
             << cluster_->ServiceLogTail(i);
    }
  }

  std::string Details(int i) {
    auto status = cluster_->ServiceStatus(i);
    EXPECT_TRUE(status.ok()) << Str(status.status());
    return status.ok() ? status->info["transport.details"] : std::string();
  }
};

// libfabric is opened by the first OFI transport, not when a program
// starts: Debian's pulls in the PSM libraries, whose constructors pin the
// process to one CPU and sleep 200 ms, which every `dyad` command paid.
TEST_F(OfiTest, OnlyAnOfiTransportOpensLibfabric) {
  for (int i = 0; i < 2; ++i) {
    const std::string maps =
        testutil::ReadAll("/proc/" + std::to_string(cluster().ServicePid(i)) + "/maps");
    EXPECT_NE(maps.find("libfabric.so"), std::string::npos) << "node " << i;
  }
  for (const char* program : {"dyad", "dyad-service"}) {
    emu::SpawnOptions so;
    so.argv = {emu::FindSiblingProgram(program, DYAD_BUILD_BIN_DIR), "--help"};
    so.env["LD_DEBUG"] = "libs";
    auto run = emu::RunCapture(so, 20000);
    ASSERT_TRUE(run.ok()) << Str(run.status());
    ASSERT_TRUE(run->status.success()) << program << ": " << run->output;
    EXPECT_NE(run->output.find("calling init"), std::string::npos) << run->output;
    EXPECT_EQ(run->output.find("libfabric"), std::string::npos) << program << ": " << run->output;
    EXPECT_EQ(run->output.find("libpsm"), std::string::npos) << program << ": " << run->output;
  }
}

TEST_F(OfiTest, FileLargerThanTheBufferPoolArrivesIntact) {
  // 48 MiB + 3 through one 2 MiB buffer of 1 MiB slots: 49 reads.
  const std::vector<ManifestEntry> files = {{"big/pooled.bin", 48 * 1048576 + 3}};
  Produce(files);
  ConsumeOk(files);
  EXPECT_EQ(Counter(kA, "transfers.out"), 1u);
  EXPECT_EQ(Counter(kA, "bytes.out"), 48 * kMiB + 3);
}

TEST_F(OfiTest, SmallAndMediumFilesArriveIntact) {
  std::vector<ManifestEntry> files;
  for (int i = 0; i < 60; ++i) {
    int64_t size = (i * 40009) % 700000;  // inline up to 64 KiB, RMA reads above
    if (i % 13 == 0) size = 0;
    files.push_back({"mixed/f" + std::to_string(i) + ".dat", size});
  }
  Produce(files);
  ConsumeOk(files);
  EXPECT_NE(Details(kB).find("peers cached 1"), std::string::npos) << Details(kB);
}

TEST_F(OfiTest, ProducerServiceKilledMidTransferGivesAnErrorNotAHang) {
  const std::string name = "big/sender-crash.bin";
  InterruptibleTransfer t = StartInterruptibleTransfer(name, 1024 * kMiB);
  if (t.state == TransferState::kTooFast)
    GTEST_SKIP() << "the transfer finished before it could be interrupted (no bandwidth limit)";
  ASSERT_EQ(t.state, TransferState::kInProgress) << Output(t.files);
  const bool limited = t.limited;
  ASSERT_NO_FATAL_FAILURE(KillOwnerAndExpectCleanFailure(t, name));
  std::this_thread::sleep_for(std::chrono::seconds(1));
  ASSERT_TRUE(cluster().ServiceRunning(kB)) << "the consumer's service died with its peer";
  ASSERT_TRUE(cluster().LimitBandwidth(kA, "").ok() || !limited);
  ASSERT_TRUE(cluster().StartService(kA).ok());
  const std::vector<ManifestEntry> again = {{"after-restart.dat", 3 * 1048576 + 5}};
  Produce(again);
  ConsumeOk(again);
}

TEST_F(OfiTest, ProducerKilledAtFullSpeedNeverTakesTheConsumerServiceDown) {
  KillProducerAtFullSpeed(3);
}

TEST_F(OfiTest, ConsumerServiceKilledMidTransferLeavesTheProducerServiceRunning) {
  KillConsumerMidTransfer();
}

// The service opened its endpoint at launch and says what it uses and why.
TEST_F(OfiTest, StatusNamesTheProviderAndWhy) {
  for (int i = 0; i < 2; ++i) {
    const std::string d = Details(i);
    for (const char* want : {"provider tcp;ofi_rxm", "FI_PROVIDER=tcp", "RMA read yes",
                             "completions by CQ wait fd", "1 receive of at most 1"})
      EXPECT_NE(d.find(want), std::string::npos) << want << " in: " << d;
    // Inside a network namespace the endpoint is on the node's own link.
    if (cluster().uses_netns()) {
      EXPECT_NE(d.find("domain eth0"), std::string::npos) << d;
    }
  }
}

TEST_F(OfiTest, RestartedProducerServiceIsANewPeer) {
  const std::vector<ManifestEntry> before = {{"before.dat", 2 * 1048576 + 1}};
  Produce(before);
  ConsumeOk(before);
  ASSERT_TRUE(cluster().StopService(kA).ok());
  ASSERT_TRUE(cluster().StartService(kA).ok());
  const std::vector<ManifestEntry> after = {{"after.dat", 5 * 1048576 + 9}};
  Produce(after);
  ConsumeOk(after);
  const std::vector<ManifestEntry> back = {{"back.dat", 1048576 + 3}};
  Produce(back, {}, {}, kB);
  ConsumeOk(back, {}, {}, kA);
}

// Over shm. A SIGKILLed service cannot unlink its shared-memory region, so
// the regions of dead processes created during the test are removed after it.
class OfiSharedMemoryTest : public OfiTest {
 protected:
  std::string Provider() const override { return "shm"; }
  void SetUp() override {
    started_ = ::time(nullptr);
    // libfabric 1.17's shm takes a spinlock in the target's shared region;
    // a peer killed while holding it leaves the owner spinning forever.
    peer_death_may_wedge_transport_ = true;
    OfiTest::SetUp();
  }
  void TearDown() override {
    OfiTest::TearDown();
    RemoveDeadShmRegions();
  }
  // libfabric's shm regions are /dev/shm/<pid>:<uid>:<index>.
  void RemoveDeadShmRegions() {
    DIR* d = ::opendir("/dev/shm");
    if (d == nullptr) return;
    const std::regex name("([0-9]+):[0-9]+:[0-9]+");
    while (dirent* e = ::readdir(d)) {
      std::cmatch m;
      if (!std::regex_match(e->d_name, m, name)) continue;
      const std::string path = std::string("/dev/shm/") + e->d_name;
      struct stat st;
      const pid_t pid = static_cast<pid_t>(std::atol(m[1].str().c_str()));
      if (::stat(path.c_str(), &st) == 0 && st.st_mtime >= started_ && ::kill(pid, 0) != 0 &&
          errno == ESRCH)
        ::unlink(path.c_str());
    }
    ::closedir(d);
  }
  time_t started_ = 0;
};

TEST_F(OfiSharedMemoryTest, FilesMoveThroughSharedMemory) {
  std::vector<ManifestEntry> files = {{"big/pooled.bin", 48 * 1048576 + 3}};
  for (int i = 0; i < 30; ++i)
    files.push_back({"mixed/f" + std::to_string(i), (i * 40009) % 700000});
  Produce(files);
  ConsumeOk(files);
  const std::string d = Details(kB);
  EXPECT_NE(d.find("provider shm"), std::string::npos) << d;
  EXPECT_NE(d.find("polled while transfers run"), std::string::npos) << d;
}

TEST_F(OfiSharedMemoryTest, ProducerKilledMidTransferNeverTakesTheConsumerServiceDown) {
  KillProducerAtFullSpeed(2);
}

TEST_F(OfiSharedMemoryTest, ConsumerServiceKilledMidTransferLeavesTheProducerServiceRunning) {
  KillConsumerMidTransfer();
}

// Services on the default transport (tcp); a client asking for MARGO gets
// its fetch done by the ofi transport, which these services cannot open
// (an unknown provider): the error proves the routing, and says why.
class OfiByClientModeTest : public TwoNodeTest {
 protected:
  emu::ClusterOptions Options() override {
    emu::ClusterOptions o;
    o.service_env["DYAD_OFI_PROVIDER"] = "no-such-provider";
    return o;
  }
};

TEST_F(OfiByClientModeTest, MargoModeUsesTheOfiTransport) {
  const std::vector<ManifestEntry> files = {{"m.dat", 300000}};
  Produce(files);
  auto r = Consume(files, {}, {{"DYAD_DTL_MODE", "MARGO"}, {"DYAD_CONSUME_TIMEOUT", "20"}});
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].rc, DYAD_RC_MARGO_BAD_PROTO) << r[0].message;
  EXPECT_NE(r[0].message.find("no-such-provider"), std::string::npos) << r[0].message;
  EXPECT_TRUE(PartFiles(dmd(kB)).empty());
  ConsumeOk(files, {}, {{"DYAD_DTL_MODE", "TCP"}});
}

}  // namespace
}  // namespace dyad::it
