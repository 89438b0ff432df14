// failure_test.cc: producer-side and service failures reach the consumer as
// errors in bounded time, never leave a partial file behind, and a later
// consume succeeds once the cause is gone.
#include <sys/stat.h>

#include "integration/integration_util.h"

namespace dyad::it {
namespace {

using FailureTest = TwoNodeTest;

TEST_F(FailureTest, FileDeletedAfterPublishThenRepublished) {
  const std::string name = "victim/gone.dat";
  Produce({{name, 65536}});
  ASSERT_EQ(::unlink(PathOn(kA, name).c_str()), 0);

  auto r = Consume({{name, 65536}}, {}, {}, kB, 60000);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].rc, DYAD_RC_OK) << "consumed a file that no longer exists";
  EXPECT_FALSE(r[0].message.empty());
  EXPECT_LT(r[0].call_ns, 30'000'000'000ull);
  EXPECT_FALSE(Exists(PathOn(kB, name)));
  EXPECT_TRUE(PartFiles(dmd(kB)).empty());
  EXPECT_GE(Counter(kA, "fetch.refused") + Counter(kA, "errors"), 1u);

  // The producer writes it again (different content and size) and
  // publishes again: a later consume gets the new file.
  WriteFileOn(kA, name, 100000);
  Produce({{name, 100000}}, {"--no-write"});
  ConsumeOk({{name, 100000}});
}

TEST_F(FailureTest, ConsumerServiceKilledMidTransferLeavesNoPartialFile) {
  const std::string name = "big/receiver-crash.bin";
  const uint64_t size = 1024 * kMiB;
  InterruptibleTransfer t = StartInterruptibleTransfer(name, size);
  if (t.state == TransferState::kTooFast)
    GTEST_SKIP()
        << "the transfer finished before it could be interrupted (loopback, no bandwidth limit)";
  ASSERT_EQ(t.state, TransferState::kInProgress) << "no transfer in progress on node B\n"
                                                 << Output(t.files);
  emu::Process& consumer = t.consumer;
  const WorkerFiles& cf = t.files;
  const bool limited = t.limited;
  ASSERT_TRUE(cluster().KillService(kB).ok());
  const uint64_t killed = MonoNs();
  auto r = FinishWorker(consumer, cf, 60000);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].rc, DYAD_RC_OK);
  EXPECT_LT(MonoNs() - killed, 15'000'000'000ull)
      << "the consumer noticed the dead service too late";
  EXPECT_FALSE(Exists(PathOn(kB, name)));

  // The restarted service removes the dead transfer's temporary, and the
  // consume succeeds.
  ASSERT_TRUE(cluster().LimitBandwidth(kA, "").ok() || !limited);
  ASSERT_TRUE(cluster().StartService(kB).ok());
  EXPECT_TRUE(PartFiles(dmd(kB)).empty());
  auto again = Consume({{name, static_cast<int64_t>(size)}}, {"--no-verify"}, {}, kB, 120000);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].rc, DYAD_RC_OK) << again[0].message;
  EXPECT_EQ(again[0].size, size);
  ::unlink(PathOn(kB, name).c_str());
}

// The metadata root lives on node B, so the records survive node A's crash.
class ProducerCrashTest : public TwoNodeTest {
 protected:
  emu::ClusterOptions Options() override {
    emu::ClusterOptions o;
    o.root_node = kB;
    return o;
  }
};

TEST_F(ProducerCrashTest, ProducerServiceKilledMidTransfer) {
  const std::string name = "big/sender-crash.bin";
  const uint64_t size = 1024 * kMiB;
  InterruptibleTransfer t = StartInterruptibleTransfer(name, size);
  if (t.state == TransferState::kTooFast)
    GTEST_SKIP()
        << "the transfer finished before it could be interrupted (loopback, no bandwidth limit)";
  ASSERT_EQ(t.state, TransferState::kInProgress) << "no transfer in progress on node B\n"
                                                 << Output(t.files);
  const bool limited = t.limited;
  ASSERT_NO_FATAL_FAILURE(KillOwnerAndExpectCleanFailure(t, name));

  // Owner back (same address, new incarnation): the file is still published
  // and unchanged, so a later consume succeeds.
  ASSERT_TRUE(cluster().LimitBandwidth(kA, "").ok() || !limited);
  ASSERT_TRUE(cluster().StartService(kA).ok());
  auto again = Consume({{name, static_cast<int64_t>(size)}}, {"--no-verify"}, {}, kB, 120000);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].rc, DYAD_RC_OK) << again[0].message;
  EXPECT_EQ(again[0].size, size);
  ::unlink(PathOn(kB, name).c_str());
}

TEST_F(ProducerCrashTest, OwnerDownGivesErrorNotHang) {
  // The owner is down before the consume starts: a clear error, bounded.
  const std::vector<ManifestEntry> files = {{"orphan.dat", 1000}};
  Produce(files);
  ASSERT_TRUE(cluster().KillService(kA).ok());
  auto r = Consume(files, {}, {}, kB, 90000);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].rc, DYAD_RC_OK);
  EXPECT_FALSE(r[0].message.empty());
  EXPECT_LT(r[0].call_ns, 70'000'000'000ull);
  EXPECT_FALSE(Exists(PathOn(kB, "orphan.dat")));
  ASSERT_TRUE(cluster().StartService(kA).ok());
  ConsumeOk(files);
}

TEST_F(FailureTest, ConsumerServiceStoppedWhileConsumerWaits) {
  const std::vector<ManifestEntry> files = {{"never-comes.dat", 10}};
  WorkerFiles cf = NewWorkerFiles(files);
  emu::Process consumer = StartWorker(kB, "consume", cf);
  ASSERT_TRUE(WaitWorkerReady(consumer, cf)) << Output(cf);
  EXPECT_FALSE(consumer.Wait(Deadline::AfterMs(300)).ok());
  const uint64_t t0 = MonoNs();
  Status stop = cluster().StopService(kB, 10000);
  EXPECT_TRUE(stop.ok()) << Str(stop);
  auto r = FinishWorker(consumer, cf, 30000);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].rc, DYAD_RC_OK);
  EXPECT_FALSE(r[0].message.empty());
  EXPECT_LT(MonoNs() - t0, 15'000'000'000ull);
}

// Disabled: the service replaces the store's timeout message (which names
// the unreachable root) with a generic "not published within" one, so the
// consumer cannot tell a missing file from a dead metadata store. Enable once
// the service keeps the detail.
TEST_F(FailureTest, UnreachableMetadataRootIsNamedWhenTheWaitTimesOut) {
  ASSERT_TRUE(cluster().KillService(kA).ok());
  const uint64_t t0 = MonoNs();
  auto r = Consume({{"root-down.dat", 10}}, {}, {{"DYAD_CONSUME_TIMEOUT", "2"}}, kB, 60000);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].rc, DYAD_RC_OK);
  EXPECT_LT(MonoNs() - t0, 20'000'000'000ull) << "consume with a 2 s timeout took too long";
  EXPECT_FALSE(r[0].message.empty());
  EXPECT_NE(r[0].message.find("unreachable"), std::string::npos)
      << "the message should say the metadata store is unreachable: " << r[0].message;
}

}  // namespace
}  // namespace dyad::it
