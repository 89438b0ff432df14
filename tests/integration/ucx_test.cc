// ucx_test.cc: two emulated nodes whose services move files with the UCX
// transport (`dyad-service -m UCX`, UCX over TCP between the nodes' network
// namespaces, or over loopback without them).
//
// Checked: a file several times larger than the registered buffer pool
// arrives intact (chunks are pipelined through the pool); many small files
// arrive intact over cached endpoints; a producer service killed mid-transfer
// gives the consumer an error in bounded time and no partial file, and a
// restarted producer (a new UCX worker address) serves the file again.
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

  // UCX lists its network devices once, when a service first uses it, and
  // skips a device without carrier. A fresh veth pair gets its carrier up to
  // a second after it is set up (the kernel's link-watch delay), so the
  // first transfer could otherwise find only "lo" on one node and fail with
  // "Destination is unreachable".
  void WaitForCarrier() {
    const Deadline deadline = Deadline::AfterMs(10000);
    for (int i = 0; i < cluster_->size(); ++i) {
      for (;;) {
        const std::string cmd =
            "ip -n " + cluster_->node(i).netns + " -o link show eth0 2>&1";
        std::string out;
        if (FILE* f = ::popen(cmd.c_str(), "r")) {
          char buf[512];
          while (std::fgets(buf, sizeof(buf), f) != nullptr) out += buf;
          ::pclose(f);
        }
        if (out.find("LOWER_UP") != std::string::npos &&
            out.find("NO-CARRIER") == std::string::npos)
          break;
        ASSERT_FALSE(deadline.expired()) << "node " << i << " eth0 has no carrier: " << out;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }

  void SetUp() override {
    dyad_ = emu::FindSiblingProgram("dyad", DYAD_BUILD_BIN_DIR);
    ASSERT_FALSE(dyad_.empty()) << "the dyad command was not found in " << DYAD_BUILD_BIN_DIR;
    emu::ClusterOptions o = Options();
    if (o.bin_dir.empty()) o.bin_dir = DYAD_BUILD_BIN_DIR;
    auto c = EmuCluster::Start(2, o);
    if (!c.ok() && c.status().message().find("not compiled in") != std::string::npos)
      GTEST_SKIP() << "UCX transport not built: " << c.status().message();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cluster_ = std::move(*c);
    work_ = cluster_->base_dir() + "/work";
    ASSERT_EQ(::mkdir(work_.c_str(), 0755), 0);
    RecordProperty("network", cluster_->uses_netns() ? "namespaces" : "loopback");
    if (cluster_->uses_netns()) ASSERT_NO_FATAL_FAILURE(WaitForCarrier());
    for (int i = 0; i < 2; ++i) {
      auto status = cluster_->ServiceStatus(i);
      ASSERT_TRUE(status.ok()) << Str(status.status());
      ASSERT_EQ(status->info["transport"], "ucx") << "node " << i;
    }
  }
};

// Creates a sparse file with a marker at its end (cheap to make, full-size
// to move).
void MakeSparse(const std::string& path, uint64_t size) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  ASSERT_TRUE(fd.valid()) << path;
  ASSERT_EQ(::ftruncate(fd.get(), static_cast<off_t>(size)), 0);
  const char tail = 'T';
  ASSERT_EQ(::pwrite(fd.get(), &tail, 1, static_cast<off_t>(size - 1)), 1);
}

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

// Waits until a temporary of a transfer in progress holds data below `dir`.
bool WaitForPartialTransfer(emu::Process& consumer, const std::string& dir, int64_t timeout_ms) {
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  while (!deadline.expired()) {
    for (const auto& rel : PartFiles(dir)) {
      struct stat st;
      if (::stat((dir + "/" + rel).c_str(), &st) == 0 && st.st_size > 0) return true;
    }
    if (consumer.Exited()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

TEST_F(UcxTest, ProducerServiceKilledMidTransferGivesAnErrorNotAHang) {
  const std::string name = "big/sender-crash.bin";
  const uint64_t size = 1024 * kMiB;
  ::mkdir((dmd(kA) + "/big").c_str(), 0755);
  MakeSparse(PathOn(kA, name), size);
  const bool limited = cluster().LimitBandwidth(kA, "400mbit").ok();
  Produce({{name, static_cast<int64_t>(size)}}, {"--no-write"});

  WorkerFiles cf = NewWorkerFiles({{name, static_cast<int64_t>(size)}});
  emu::Process consumer = StartWorker(kB, "consume", cf, {"--no-verify"});
  if (!WaitForPartialTransfer(consumer, dmd(kB), 30000)) {
    if (!limited && consumer.Exited())
      GTEST_SKIP()
          << "the transfer finished before it could be interrupted (loopback, no bandwidth limit)";
    FAIL() << "no transfer in progress on node B\n" << Output(cf);
  }
  ASSERT_TRUE(cluster().KillService(kA).ok());
  const uint64_t killed = MonoNs();
  auto r = FinishWorker(consumer, cf, 90000);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].rc, DYAD_RC_OK) << "consume succeeded although the owner died mid-transfer";
  EXPECT_FALSE(r[0].message.empty());
  EXPECT_LT(MonoNs() - killed, 15'000'000'000ull) << "the consumer noticed the dead owner too late";
  EXPECT_FALSE(Exists(PathOn(kB, name)));
  EXPECT_TRUE(PartFiles(dmd(kB)).empty()) << "a partial transfer was left behind";

  // Known UCX 1.13 defect (docs/ucx.md, "Known weaknesses"): over TCP, UCX
  // emulates puts with active messages, and a put the consumer's worker
  // completes after the owner died makes UCX abort that process when it
  // acknowledges it. The consumer's error above is unaffected; whether its
  // service survived is reported here rather than asserted.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  if (!cluster().ServiceRunning(kB)) {
    RecordProperty("consumer_service_survived", "no");
    GTEST_SKIP() << "consumer got its error, but UCX 1.13 aborted the consumer's service "
                    "(software-emulated put acknowledged to a dead peer; see docs/ucx.md)";
  }
  RecordProperty("consumer_service_survived", "yes");
  ASSERT_TRUE(cluster().LimitBandwidth(kA, "").ok() || !limited);
  ASSERT_TRUE(cluster().StartService(kA).ok());
  const std::vector<ManifestEntry> again_files = {{"after-restart.dat", 3 * 1048576 + 5}};
  Produce(again_files);
  ConsumeOk(again_files);
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

}  // namespace
}  // namespace dyad::it
