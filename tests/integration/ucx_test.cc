// ucx_test.cc: two emulated nodes whose services move files with the UCX
// transport (`dyad-service -m UCX`, UCX over TCP between the nodes' network
// namespaces, or over loopback without them).
//
// With UCX_TLS=shm,tcp the services (one host) use the same-host direct
// path instead: the producer's service writes chunks into the consumer
// service's shared buffer; the same failures are checked there.
//
// Checked: a file several times larger than the registered buffer pool
// arrives intact (chunks are pipelined through the pool); many small files
// arrive intact over cached endpoints; a producer service killed mid-transfer
// gives the consumer an error in bounded time and no partial file, the
// consumer's service survives (also at full speed, killed at several points
// of a transfer), a consumer service killed mid-transfer leaves the
// producer's service running, and a restarted producer (a new UCX worker
// address) serves the file again.
// Skipped when the build has no UCX.
#include <sys/stat.h>

#include "integration/integration_util.h"

namespace dyad::it {
namespace {

class UcxTest : public TwoNodeTest {
 protected:
  emu::ClusterOptions Options() override {
    emu::ClusterOptions o;
    o.mode = "UCX";
    o.service_env["UCX_TLS"] = "tcp";
    o.service_env["UCX_WARN_UNUSED_ENV_VARS"] = "n";
    // One registered receive and one send buffer of 2 x 1 MiB per service,
    // so the larger files below take many trips through the same memory.
    o.service_env["DYAD_UCX_POOL_BUFFERS"] = "1";
    o.extra_service_args = {"--chunk-size", "1048576"};
    // The metadata root on B keeps records alive while A is down.
    o.root_node = kB;
    return o;
  }

  // (The emulator starts services only once every node's eth0 has carrier:
  // UCX lists its network devices once, when the service starts.)
  void SetUp() override {
    TwoNodeTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    for (int i = 0; i < 2; ++i) {
      auto status = cluster_->ServiceStatus(i);
      ASSERT_TRUE(status.ok()) << Str(status.status());
      ASSERT_EQ(status->info["transport"], "ucx") << "node " << i;
    }
  }

  // The transport's line in `dyad status` on node i.
  std::string Details(int i) {
    auto status = cluster_->ServiceStatus(i);
    EXPECT_TRUE(status.ok()) << Str(status.status());
    return status.ok() ? status->info["transport.details"] : std::string();
  }
};

TEST_F(UcxTest, FileLargerThanTheBufferPoolArrivesIntact) {
  // 48 MiB + 3 through a 2 MiB receive buffer: 49 chunks, both slots reused.
  const std::vector<ManifestEntry> files = {{"big/pooled.bin", 48 * 1048576 + 3}};
  Produce(files);
  ConsumeOk(files);
  EXPECT_EQ(Counter(kA, "transfers.out"), 1u);
  EXPECT_EQ(Counter(kA, "bytes.out"), 48 * kMiB + 3);
}

TEST_F(UcxTest, ManySmallFilesArriveIntact) {
  std::vector<ManifestEntry> files;
  for (int i = 0; i < 120; ++i) {
    int64_t size = (i * 7919) % 9000;
    if (i % 13 == 0) size = 0;
    files.push_back({"small/f" + std::to_string(i) + ".dat", size});
  }
  Produce(files);
  ConsumeOk(files);
}

TEST_F(UcxTest, ProducerServiceKilledMidTransferGivesAnErrorNotAHang) {
  const std::string name = "big/sender-crash.bin";
  InterruptibleTransfer t = StartInterruptibleTransfer(name, 1024 * kMiB);
  if (t.state == TransferState::kTooFast)
    GTEST_SKIP()
        << "the transfer finished before it could be interrupted (loopback, no bandwidth limit)";
  ASSERT_EQ(t.state, TransferState::kInProgress) << "no transfer in progress on node B\n"
                                                 << Output(t.files);
  const bool limited = t.limited;
  ASSERT_NO_FATAL_FAILURE(KillOwnerAndExpectCleanFailure(t, name));

  // The consumer's service must survive its peer's death. (Over UCX_TLS=tcp,
  // UCX 1.13 emulates puts with active messages and aborts the process that
  // acknowledges one to a dead peer; the transport therefore moves chunks as
  // eager tagged messages, which the receiver never acknowledges.)
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ASSERT_TRUE(cluster().ServiceRunning(kB)) << "the consumer's service died with its peer";
  RecordProperty("consumer_service_survived", "yes");
  ASSERT_TRUE(cluster().LimitBandwidth(kA, "").ok() || !limited);
  ASSERT_TRUE(cluster().StartService(kA).ok());
  const std::vector<ManifestEntry> again_files = {{"after-restart.dat", 3 * 1048576 + 5}};
  Produce(again_files);
  ConsumeOk(again_files);
}

// Chunks are in flight in both directions' socket buffers when the
// producer dies at full speed.
TEST_F(UcxTest, ProducerKilledAtFullSpeedNeverTakesTheConsumerServiceDown) {
  KillProducerAtFullSpeed(5);
}

TEST_F(UcxTest, ConsumerServiceKilledMidTransferLeavesTheProducerServiceRunning) {
  KillConsumerMidTransfer();
}

// The service started UCX at launch and says how it moves data: with
// UCX_TLS=tcp there is no shared memory and no RMA network here.
TEST_F(UcxTest, StatusDescribesTheTransport) {
  for (int i = 0; i < 2; ++i) {
    const std::string d = Details(i);
    EXPECT_NE(d.find("direct path unavailable"), std::string::npos) << d;
    EXPECT_NE(d.find("messages all eager"), std::string::npos) << d;
    EXPECT_NE(d.find("buffers mapped: 1 receive, 1 send"), std::string::npos) << d;
  }
}

// A producer service that restarts has a new UCX worker (a new address);
// the consumer's service must serve and fetch with it as with a new peer.
TEST_F(UcxTest, RestartedProducerServiceIsANewPeer) {
  const std::vector<ManifestEntry> before = {{"before.dat", 2 * 1048576 + 1}};
  Produce(before);
  ConsumeOk(before);
  ASSERT_TRUE(cluster().StopService(kA).ok());
  ASSERT_TRUE(cluster().StartService(kA).ok());
  const std::vector<ManifestEntry> after = {{"after.dat", 5 * 1048576 + 9}};
  Produce(after);
  ConsumeOk(after);
  // And the other direction, so the restarted service also requests.
  const std::vector<ManifestEntry> back = {{"back.dat", 1048576 + 3}};
  Produce(back, {}, {}, kB);
  ConsumeOk(back, {}, {}, kA);
}

// Both emulated nodes are on this host (network namespaces share memory),
// and UCX may use shared memory: the producer's service writes each chunk
// straight into the consumer service's registered buffer (the same-host
// direct path), counted in bytes.out.direct. Failures of either side are
// reported by the fetch session, never by UCX.
class UcxSharedMemoryTest : public UcxTest {
 protected:
  emu::ClusterOptions Options() override {
    emu::ClusterOptions o = UcxTest::Options();
    o.service_env["UCX_TLS"] = "shm,tcp";
    return o;
  }
};

TEST_F(UcxSharedMemoryTest, FilesMoveThroughSharedMemory) {
  std::vector<ManifestEntry> files = {{"big/pooled.bin", 48 * 1048576 + 3}};
  for (int i = 0; i < 40; ++i)
    files.push_back({"mixed/f" + std::to_string(i), (i * 40009) % 700000});
  Produce(files);
  ConsumeOk(files);
  uint64_t total = 0;
  uint64_t beyond_inline = 0;  // files above 64 KiB travel outside the session
  for (const ManifestEntry& f : files) {
    total += static_cast<uint64_t>(f.size);
    if (f.size > 64 * 1024) beyond_inline += static_cast<uint64_t>(f.size);
  }
  EXPECT_EQ(Counter(kA, "bytes.out"), total);
  EXPECT_EQ(Counter(kA, "bytes.out.direct"), beyond_inline);
  EXPECT_NE(Details(kA).find("direct path on"), std::string::npos) << Details(kA);
}

TEST_F(UcxSharedMemoryTest, ProducerKilledMidTransferNeverTakesTheConsumerServiceDown) {
  KillProducerAtFullSpeed(3);
}

TEST_F(UcxSharedMemoryTest, ConsumerServiceKilledMidTransferLeavesTheProducerServiceRunning) {
  KillConsumerMidTransfer();
}

// DYAD_UCX_SHM=off keeps same-host transfers on UCX messages (over tcp).
class UcxSharedMemoryOffTest : public UcxTest {
 protected:
  emu::ClusterOptions Options() override {
    emu::ClusterOptions o = UcxTest::Options();
    o.service_env["UCX_TLS"] = "shm,tcp";
    o.service_env["DYAD_UCX_SHM"] = "off";
    return o;
  }
};

TEST_F(UcxSharedMemoryOffTest, SwitchedOffMeansMessages) {
  const std::vector<ManifestEntry> files = {{"big/messages.bin", 5 * 1048576 + 1}};
  Produce(files);
  ConsumeOk(files);
  EXPECT_EQ(Counter(kA, "bytes.out"), 5 * kMiB + 1);
  EXPECT_EQ(Counter(kA, "bytes.out.direct"), 0u);
  EXPECT_NE(Details(kA).find("direct path off (DYAD_UCX_SHM)"), std::string::npos) << Details(kA);
}

}  // namespace
}  // namespace dyad::it
