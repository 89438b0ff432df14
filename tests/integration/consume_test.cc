// consume_test.cc: the consume paths between two emulated nodes: waiting for
// publication, the local fast paths, file shapes (empty, odd names, nested,
// sparse past 4 GiB), de-duplication, shared storage and timeouts.
#include <sys/stat.h>
#include <sys/statvfs.h>

#include "integration/integration_util.h"
#include "proto/protocol.h"

namespace dyad::it {
namespace {

using ConsumeTest = TwoNodeTest;

TEST_F(ConsumeTest, ConsumerStartedFirstBlocksUntilPublished) {
  const std::vector<ManifestEntry> files = {{"late/arrival.dat", 300000}};
  WorkerFiles cf = NewWorkerFiles(files);
  emu::Process consumer = StartWorker(kB, "consume", cf);
  ASSERT_TRUE(WaitWorkerReady(consumer, cf)) << Output(cf);
  // Nothing is published: the consumer must still be waiting.
  EXPECT_FALSE(consumer.Wait(Deadline::AfterMs(500)).ok())
      << "consume returned before the file was published\n"
      << Output(cf);
  EXPECT_FALSE(Exists(PathOn(kB, "late/arrival.dat")));

  auto produced = RunWorker(kA, "produce", files);
  ASSERT_EQ(produced.size(), 1u);
  ASSERT_EQ(produced[0].rc, DYAD_RC_OK) << produced[0].message;

  auto consumed = FinishWorker(consumer, cf, 30000);
  ASSERT_EQ(consumed.size(), 1u);
  EXPECT_EQ(consumed[0].rc, DYAD_RC_OK) << consumed[0].message;
  EXPECT_EQ(consumed[0].verified, 1) << consumed[0].message;
  EXPECT_GE(consumed[0].end_ns, produced[0].end_ns - produced[0].call_ns)
      << "consume returned before the producer published";
  EXPECT_EQ(Counter(kB, "transfers.in"), 1u);
}

TEST_F(ConsumeTest, ConsumerAfterProducerGetsFileAtOnce) {
  const std::vector<ManifestEntry> files = {{"ready.dat", 65536}};
  Produce(files);
  auto r = Consume(files);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].rc, DYAD_RC_OK) << r[0].message;
  EXPECT_EQ(r[0].verified, 1);
  // Generous: this only catches a consume that waits for something.
  EXPECT_LT(r[0].call_ns, 5'000'000'000ull);
}

TEST_F(ConsumeTest, FileCompleteLocallyCostsNoTransfer) {
  const std::vector<ManifestEntry> files = {{"again.dat", 200000}};
  Produce(files);
  ConsumeOk(files);
  const uint64_t transfers = Counter(kB, "transfers.in");
  const uint64_t bytes = Counter(kB, "bytes.in");
  EXPECT_EQ(transfers, 1u);
  ConsumeOk(files);
  ConsumeOk(files);
  EXPECT_EQ(Counter(kB, "transfers.in"), transfers);
  EXPECT_EQ(Counter(kB, "bytes.in"), bytes);
  EXPECT_EQ(Counter(kA, "transfers.out"), 1u);
}

TEST_F(ConsumeTest, PrivateConsumerDirectoryIsLevelOne) {
  // A consumer directory no producer writes to: a file present there is
  // complete, so the second consume sends no request at all.
  const std::string cons = cluster().node(kB).dir + "/cons";
  const Env env = {{"DYAD_PATH_CONSUMER", cons}};
  const std::vector<ManifestEntry> files = {{"private/level1.dat", 4096}};
  Produce(files);
  ConsumeOk(files, {}, env);
  ASSERT_TRUE(Exists(cons + "/private/level1.dat"));
  const uint64_t requests = Counter(kB, "requests.consume");
  const uint64_t transfers = Counter(kB, "transfers.in");
  ConsumeOk(files, {"--no-metadata"}, env);
  EXPECT_EQ(Counter(kB, "requests.consume"), requests) << "level 1 should not ask the service";
  EXPECT_EQ(Counter(kB, "transfers.in"), transfers);
}

TEST_F(ConsumeTest, PlacedCopyInTheOneManagedDirectoryIsLevelOne) {
  // Nodes as docs/deployment.md sets them up: one managed directory for
  // producers and consumers. The copy B's service placed there carries its
  // version stamp, so the second consume asks nobody.
  const std::string name = "shared/level1.dat";
  Produce({{name, 4096}});
  ConsumeOk({{name, 4096}});
  // The first consume in a namespace starts following it (asynchronously:
  // the store's watch and a listing, on the pool); a copy placed before
  // that gets its revocable stamp at its next consume through the service
  // once it is followed, at the latest.
  ASSERT_TRUE(Eventually([&] { return Counter(kB, "records.followed") == 1; }, 10000));
  ConsumeOk({{name, 4096}}, {"--no-metadata"});
  const uint64_t requests = Counter(kB, "requests.consume");
  ConsumeOk({{name, 4096}}, {"--no-metadata"});
  EXPECT_EQ(Counter(kB, "requests.consume"), requests) << "level 1 should not ask the service";
  // A republish between two consumes is never missed: A's notice makes B's
  // service remove its copy before the producer's call returns, so the next
  // consume asks the service and gets the new bytes (the worker verifies
  // them against the new size's pattern).
  for (int64_t size : {3000, 5000}) {
    ASSERT_EQ(::unlink(PathOn(kA, name).c_str()), 0);
    Produce({{name, size}});
    ConsumeOk({{name, size}}, {"--no-metadata"});
  }
  EXPECT_EQ(Counter(kB, "transfers.in"), 3u);
  EXPECT_EQ(Counter(kB, "requests.consume"), requests + 2);
}

// Consumers that start first and are woken together (their files
// published at once) all get their files: the requesting service does
// not open one connection to the owner per consume (the owner admits 16
// handshakes at a time from one peer and drops the oldest beyond), it
// dials a few at a time and shares the sessions.
TEST_F(ConsumeTest, ConsumersWokenTogetherAllGetTheirFiles) {
  constexpr int kConsumers = 64;
  std::vector<ManifestEntry> files;
  for (int i = 0; i < kConsumers; ++i)
    files.push_back({"burst/f" + std::to_string(i) + ".dat", 4096 + i});
  std::vector<emu::Process> consumers;
  for (const ManifestEntry& e : files) {
    auto p = cluster().SpawnOnNode(kB, {dyad_, "consume", "--timeout", "60", PathOn(kB, e.name)});
    ASSERT_TRUE(p.ok()) << Str(p.status());
    consumers.push_back(std::move(*p));
  }
  // Every consume waits for its file (listed by `dyad status`).
  ASSERT_TRUE(Eventually(
      [&] {
        auto st = cluster().ServiceStatus(kB);
        return st.ok() && st->waits.size() >= static_cast<size_t>(kConsumers);
      },
      20000));
  Produce(files);
  int failed = 0;
  for (auto& p : consumers) {
    auto st = p.Wait(Deadline::AfterMs(60000));
    ASSERT_TRUE(st.ok()) << "a consume did not end";
    failed += st->success() ? 0 : 1;
  }
  EXPECT_EQ(failed, 0) << "of " << kConsumers << " consumes woken together";
  for (const ManifestEntry& e : files) {
    struct stat st;
    ASSERT_EQ(::stat(PathOn(kB, e.name).c_str(), &st), 0) << e.name;
    EXPECT_EQ(st.st_size, e.size) << e.name;
  }
}

// The copy's temporary is created once the request to the owner is on its
// way: when it cannot be (a file stands where its directory should be),
// the consume fails saying so, the session whose reply went unread is not
// reused, and the same owner serves the next consumes at once.
TEST_F(ConsumeTest, CopyThatCannotBeCreatedFailsClearlyAndSpoilsNoSession) {
  const std::vector<ManifestEntry> files = {{"blocked/f.dat", 4096}, {"free/g.dat", 5000}};
  Produce(files);
  WriteFileOn(kB, "blocked", 16);  // a file, not a directory
  auto r = cluster().RunOnNode(
      kB, {dyad_, "consume", "--timeout", "10", PathOn(kB, "blocked/f.dat")}, 30000);
  ASSERT_TRUE(r.ok()) << Str(r.status());
  EXPECT_FALSE(r->status.success()) << r->output;
  EXPECT_NE(r->output.find("prepare 'blocked/f.dat' in consumer directory"), std::string::npos)
      << r->output;
  EXPECT_TRUE(PartFiles(dmd(kB)).empty());
  // The next consume from the same owner, right away, succeeds.
  ConsumeOk({files[1]});
  ASSERT_EQ(::unlink(PathOn(kB, "blocked").c_str()), 0);
  ConsumeOk({files[0]});
}

TEST_F(ConsumeTest, EmptyFileIsTransferredLikeAnyOther) {
  const std::vector<ManifestEntry> files = {{"empty.dat", 0}};
  Produce(files);
  ConsumeOk(files);
  struct stat st;
  ASSERT_EQ(::stat(PathOn(kB, "empty.dat").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(Counter(kB, "transfers.in"), 1u);
  // And an empty file already present is not fetched again.
  ConsumeOk(files);
  EXPECT_EQ(Counter(kB, "transfers.in"), 1u);
}

TEST_F(ConsumeTest, NamesWithSpacesAndNonAscii) {
  const std::vector<ManifestEntry> files = {
      {"with space/données finales.bin", 100000},
      {"ünïcödé 文件 ✓.dat", 5000},
      {"semi;colon'quote\"&percent%25.dat", 77},
  };
  Produce(files);
  ConsumeOk(files);
  for (const auto& f : files) EXPECT_TRUE(Exists(PathOn(kB, f.name))) << f.name;
}

TEST_F(ConsumeTest, NestedDirectoriesAreCreatedOnTheConsumerSide) {
  const std::vector<ManifestEntry> files = {{"run1/step/0007/deep/frame-0001.dat", 123456}};
  Produce(files);
  ASSERT_FALSE(Exists(dmd(kB) + "/run1"));
  ConsumeOk(files);
  struct stat st;
  ASSERT_EQ(::stat((dmd(kB) + "/run1/step/0007/deep").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
}

// Node directories on tmpfs when it has room: node-local storage is often
// tmpfs, and 4.5 GiB through a disk's dirty-page throttling would take most
// of the suite's time budget.
class SparseTest : public TwoNodeTest {
 protected:
  emu::ClusterOptions Options() override {
    emu::ClusterOptions o;
    struct statvfs vfs;
    if (::statvfs("/dev/shm", &vfs) == 0 &&
        static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize > (6ull << 30))
      o.tmp_parent = "/dev/shm";
    return o;
  }
};

TEST_F(SparseTest, SparseFileLargerThan4GiB) {
  const std::string name = "huge/sparse.bin";
  const uint64_t size = 4608 * kMiB;  // 4.5 GiB
  const std::vector<std::pair<uint64_t, char>> marks = {{0, 'a'},
                                                        {4095, 'b'},
                                                        {(1ull << 32) - 1, 'c'},
                                                        {1ull << 32, 'd'},
                                                        {(1ull << 32) + 1, 'e'},
                                                        {size - 1, 'z'}};
  {
    ::mkdir((dmd(kA) + "/huge").c_str(), 0755);
    UniqueFd fd(::open(PathOn(kA, name).c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    ASSERT_TRUE(fd.valid());
    ASSERT_EQ(::ftruncate(fd.get(), static_cast<off_t>(size)), 0);
    for (const auto& [off, c] : marks)
      ASSERT_EQ(::pwrite(fd.get(), &c, 1, static_cast<off_t>(off)), 1);
  }
  Produce({{name, static_cast<int64_t>(size)}}, {"--no-write"});
  auto r = Consume({{name, static_cast<int64_t>(size)}}, {"--no-verify"}, {}, kB, 180000);
  ASSERT_EQ(r.size(), 1u);
  ASSERT_EQ(r[0].rc, DYAD_RC_OK) << r[0].message;
  UniqueFd fd(::open(PathOn(kB, name).c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(fd.valid());
  struct stat st;
  ASSERT_EQ(::fstat(fd.get(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), size);
  for (const auto& [off, c] : marks) {
    char got = 0;
    ASSERT_EQ(::pread(fd.get(), &got, 1, static_cast<off_t>(off)), 1);
    EXPECT_EQ(got, c) << "at offset " << off;
  }
  // A byte between the marks is a hole on A, so zero on B.
  char zero = 1;
  ASSERT_EQ(::pread(fd.get(), &zero, 1, static_cast<off_t>(3ull << 30)), 1);
  EXPECT_EQ(zero, 0);
  EXPECT_EQ(Counter(kB, "bytes.in"), size);
  // The 4.5 GiB copies are not needed any more; free the space early.
  ::unlink(PathOn(kB, name).c_str());
  ::unlink(PathOn(kA, name).c_str());
}

TEST_F(ConsumeTest, ConcurrentConsumersOnOneNodeCauseOneTransfer) {
  constexpr int kConsumers = 8;
  const std::vector<ManifestEntry> files = {{"popular/one.bin", static_cast<int64_t>(32 * kMiB)}};
  std::vector<WorkerFiles> wf;
  std::vector<emu::Process> consumers;
  for (int i = 0; i < kConsumers; ++i) {
    wf.push_back(NewWorkerFiles(files));
    consumers.push_back(StartWorker(kB, "consume", wf.back()));
  }
  for (int i = 0; i < kConsumers; ++i)
    ASSERT_TRUE(WaitWorkerReady(consumers[i], wf[i])) << Output(wf[i]);
  Produce(files);
  for (int i = 0; i < kConsumers; ++i) {
    auto r = FinishWorker(consumers[i], wf[i], 60000);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].rc, DYAD_RC_OK) << "consumer " << i << ": " << r[0].message;
    EXPECT_EQ(r[0].verified, 1) << "consumer " << i << ": " << r[0].message;
  }
  EXPECT_EQ(Counter(kB, "transfers.in"), 1u);
  EXPECT_EQ(Counter(kB, "bytes.in"), 32 * kMiB);
  EXPECT_EQ(Counter(kA, "transfers.out"), 1u);
  EXPECT_EQ(Counter(kB, "consume.joined") + Counter(kB, "consume.local"),
            static_cast<uint64_t>(kConsumers - 1));
}

// Every node's managed directory is one shared directory (a parallel file
// system), and clients say so with DYAD_SHARED_STORAGE=1.
class SharedStorageTest : public TwoNodeTest {
 protected:
  emu::ClusterOptions Options() override {
    emu::ClusterOptions o;
    o.shared_storage = true;
    return o;
  }
};

TEST_F(SharedStorageTest, PublicationSynchronizesButMovesNoData) {
  ASSERT_EQ(dmd(kA), dmd(kB));
  const std::vector<ManifestEntry> files = {{"pfs/result.dat", 500000}};
  // Consumer first, so the consume really waits for the publication.
  WorkerFiles cf = NewWorkerFiles(files);
  emu::Process consumer = StartWorker(kB, "consume", cf);
  ASSERT_TRUE(WaitWorkerReady(consumer, cf)) << Output(cf);
  EXPECT_FALSE(consumer.Wait(Deadline::AfterMs(300)).ok()) << "consume did not wait\n"
                                                           << Output(cf);
  Produce(files);
  auto r = FinishWorker(consumer, cf, 30000);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].rc, DYAD_RC_OK) << r[0].message;
  EXPECT_EQ(r[0].verified, 1) << r[0].message;
  EXPECT_EQ(Counter(kB, "transfers.in"), 0u);
  EXPECT_EQ(Counter(kA, "transfers.out"), 0u);
  std::vector<std::string> all;
  ListTree(dmd(kB), "", &all);
  EXPECT_EQ(all, std::vector<std::string>{"pfs/result.dat"});
}

TEST_F(ConsumeTest, ConsumeTimeoutGivesTimeoutAndClearMessage) {
  const Env env = {{"DYAD_CONSUME_TIMEOUT", "1"}};
  const uint64_t t0 = MonoNs();
  auto r = Consume({{"never/published.dat", 10}}, {}, env, kB, 30000);
  const double elapsed_s = static_cast<double>(MonoNs() - t0) / 1e9;
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].rc, DYAD_RC_TIMEOUT) << dyad_rc_name(r[0].rc) << ": " << r[0].message;
  const double call_s = static_cast<double>(r[0].call_ns) / 1e9;
  EXPECT_GE(call_s, 0.9);
  EXPECT_LE(call_s, 3.0);
  EXPECT_LT(elapsed_s, 10.0);
  EXPECT_NE(r[0].message.find("published.dat"), std::string::npos)
      << "the message should name the file: " << r[0].message;
  EXPECT_FALSE(Exists(PathOn(kB, "never/published.dat")));
  EXPECT_TRUE(PartFiles(dmd(kB)).empty());
}

// Disabled: the consuming service answers from its node-local metadata
// cache, so a file re-published with new content is never looked up again
// and the consumer keeps the old copy. Enable once the service revalidates
// cached records (the record's version exists for this).
TEST_F(ConsumeTest, RepublishedFileIsFetchedAgain) {
  const std::string name = "versions/state.dat";
  Produce({{name, 1000}});
  ConsumeOk({{name, 1000}});
  // The producer rewrites the file (new size and mtime) and publishes again.
  ASSERT_EQ(::unlink(PathOn(kA, name).c_str()), 0);
  Produce({{name, 3000}});
  ConsumeOk({{name, 3000}});
  EXPECT_EQ(Counter(kB, "transfers.in"), 2u);
}

TEST_F(ConsumeTest, ConsumeOnTheProducingNodeMovesNothing) {
  const std::vector<ManifestEntry> files = {{"here/local.dat", 4096}};
  Produce(files);
  ConsumeOk(files, {}, {}, kA);
  EXPECT_EQ(Counter(kA, "transfers.in"), 0u);
  EXPECT_EQ(Counter(kA, "transfers.out"), 0u);
}

TEST_F(ConsumeTest, AsynchronousPublishIsConsumed) {
  const std::vector<ManifestEntry> files = {
      {"async/a.dat", 1000}, {"async/b.dat", 0}, {"async/c.dat", 70000}};
  WorkerFiles cf = NewWorkerFiles(files);
  emu::Process consumer = StartWorker(kB, "consume", cf);
  ASSERT_TRUE(WaitWorkerReady(consumer, cf)) << Output(cf);
  Produce(files, {}, {{"DYAD_ASYNC_PUBLISH", "1"}});
  auto r = FinishWorker(consumer, cf, 30000);
  ASSERT_EQ(r.size(), files.size());
  for (const auto& x : r) {
    EXPECT_EQ(x.rc, DYAD_RC_OK) << x.name << ": " << x.message;
    EXPECT_EQ(x.verified, 1) << x.name;
  }
}

// `dyad produce` reports each file's result, so DYAD_ASYNC_PUBLISH does not
// make it return before the service answered: a refused publication fails
// the command (it used to exit 0 with the refusal unread).
TEST_F(ConsumeTest, DyadProduceCommandReportsRefusalsWithAsyncPublishSet) {
  WriteFileOn(kA, "cli/refused.dat", 100);
  auto r =
      cluster().RunOnNode(kA, {dyad_, "produce", PathOn(kA, "cli/refused.dat")}, 60000,
                          {{"DYAD_ASYNC_PUBLISH", "1"}, {"DYAD_KVS_NAMESPACE", kMembersNamespace}});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->status.success()) << r->output;
  EXPECT_NE(r->output.find("DYAD_RC_PERM"), std::string::npos) << r->output;
}

// A publication names what a fetch would serve: a symlink leading out of
// the producer directory is refused when published (it used to be
// published with the size and time of its target, advertising them to the
// cluster, and only its fetch was refused), and so is a FIFO; a symlink
// that stays inside is published as its target is.
TEST_F(ConsumeTest, PublishingWhatLeadsOutOfTheProducerDirectoryIsRefused) {
  ::mkdir(PathOn(kA, "pub").c_str(), 0755);
  ASSERT_EQ(::symlink("/etc/passwd", PathOn(kA, "pub/out-abs").c_str()), 0);
  ASSERT_EQ(::symlink("../../outside", PathOn(kA, "pub/out-rel").c_str()), 0);
  testutil::WriteFile(PathOn(kA, "../outside"), "secret");
  ASSERT_EQ(::mkfifo(PathOn(kA, "pub/fifo").c_str(), 0644), 0);
  WriteFileOn(kA, "pub/target.dat", 777);
  ASSERT_EQ(::symlink("target.dat", PathOn(kA, "pub/in.dat").c_str()), 0);
  for (const char* name : {"pub/out-abs", "pub/out-rel"}) {
    auto r = cluster().RunOnNode(kA, {dyad_, "produce", PathOn(kA, name)}, 60000);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_FALSE(r->status.success()) << name << ": " << r->output;
    EXPECT_NE(r->output.find("DYAD_RC_PERM"), std::string::npos) << name << ": " << r->output;
    EXPECT_NE(r->output.find("escapes the managed directory"), std::string::npos) << r->output;
  }
  auto fifo = cluster().RunOnNode(kA, {dyad_, "produce", PathOn(kA, "pub/fifo")}, 60000);
  ASSERT_TRUE(fifo.ok()) << fifo.status().ToString();
  EXPECT_FALSE(fifo->status.success()) << fifo->output;
  // Nothing of them is listed anywhere; the symlink inside is served.
  auto in = cluster().RunOnNode(kA, {dyad_, "produce", PathOn(kA, "pub/in.dat")}, 60000);
  ASSERT_TRUE(in.ok()) << in.status().ToString();
  EXPECT_TRUE(in->status.success()) << in->output;
  auto ls = cluster().RunOnNode(kB, {dyad_, "ls", "pub"}, 60000);
  ASSERT_TRUE(ls.ok()) << ls.status().ToString();
  EXPECT_EQ(ls->output.find("out-"), std::string::npos) << ls->output;
  EXPECT_EQ(ls->output.find("fifo"), std::string::npos) << ls->output;
  EXPECT_NE(ls->output.find("in.dat"), std::string::npos) << ls->output;
  auto got = cluster().RunOnNode(kB, {dyad_, "consume", PathOn(kB, "pub/in.dat")}, 60000);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(got->status.success()) << got->output;
  EXPECT_EQ(testutil::ReadAll(PathOn(kB, "pub/in.dat")),
            testutil::ReadAll(PathOn(kA, "pub/target.dat")));
}

TEST_F(ConsumeTest, KilledWaitingConsumerLeavesTheServiceUsable) {
  const std::vector<ManifestEntry> files = {{"abandoned.dat", 5000}};
  std::vector<WorkerFiles> wf;
  std::vector<emu::Process> waiting;
  for (int i = 0; i < 4; ++i) {
    wf.push_back(NewWorkerFiles(files));
    waiting.push_back(StartWorker(kB, "consume", wf.back()));
  }
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(WaitWorkerReady(waiting[i], wf[i])) << Output(wf[i]);
  for (auto& p : waiting) p.Kill();
  // The service notices the vanished clients; a new consumer is served.
  WorkerFiles cf = NewWorkerFiles(files);
  emu::Process consumer = StartWorker(kB, "consume", cf);
  ASSERT_TRUE(WaitWorkerReady(consumer, cf)) << Output(cf);
  Produce(files);
  auto r = FinishWorker(consumer, cf, 30000);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].rc, DYAD_RC_OK) << r[0].message;
  EXPECT_EQ(r[0].verified, 1);
  EXPECT_EQ(Counter(kB, "transfers.in"), 1u);
}

TEST_F(ConsumeTest, MetadataRootRestartWhileConsumerWaits) {
  // The root (node A) restarts while B's consumer waits; records published
  // after the restart still reach the waiting consumer.
  const std::vector<ManifestEntry> files = {{"after-root-restart.dat", 4321}};
  WorkerFiles cf = NewWorkerFiles(files);
  emu::Process consumer = StartWorker(kB, "consume", cf);
  ASSERT_TRUE(WaitWorkerReady(consumer, cf)) << Output(cf);
  EXPECT_FALSE(consumer.Wait(Deadline::AfterMs(300)).ok());
  ASSERT_TRUE(cluster().RestartService(kA).ok());
  Produce(files);
  auto r = FinishWorker(consumer, cf, 60000);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].rc, DYAD_RC_OK) << r[0].message;
  EXPECT_EQ(r[0].verified, 1);
}

TEST_F(ConsumeTest, FollowedRecordsAcrossARootRestartAreTheNewOnes) {
  // B follows the namespace from its first consume (DYAD_FOLLOW_RECORDS).
  // The root (node A) restarts with an empty store, and the producer
  // publishes new contents under the same names: B's consumes return the
  // new bytes, never its copies of the old ones.
  const std::vector<ManifestEntry> before = {{"followed-1.dat", 1000}, {"followed-2.dat", 2000}};
  Produce(before);
  ConsumeOk(before);
  ASSERT_TRUE(cluster().RestartService(kA).ok());
  const std::vector<ManifestEntry> after = {{"followed-1.dat", 3000}, {"followed-2.dat", 5000}};
  Produce(after);
  ConsumeOk(after);
  // Published after B follows: B learns the record without a lookup, fed
  // by the store's watch, or listed when B's feed, which follows the root's
  // restart on its own time, resyncs after this publication. Looked at
  // before the consume, which would have looked the record up.
  const std::vector<ManifestEntry> later = {{"followed-3.dat", 700}};
  Produce(later);
  // (Each counter is shown once it happened.)
  auto learned = [&] {
    auto fed = cluster().Counter(kB, "records.fed");
    auto seeded = cluster().Counter(kB, "records.seeded");
    return (fed.ok() ? *fed : 0) + (seeded.ok() ? *seeded : 0);
  };
  EXPECT_TRUE(Eventually([&] { return learned() >= 1; }, 10000, 50))
      << "B learned no record from its feed: " << learned();
  ConsumeOk(later);
}

}  // namespace
}  // namespace dyad::it
