// Issue 26 ("Field-ready, round two") and issue 25 item 13, on two emulated
// nodes in the README's configuration (one managed directory: the
// cluster's default gives every node DYAD_PATH_PRODUCER equal to
// DYAD_PATH_CONSUMER):
//  * the byte budget holds there: copies of the other node's files are
//    evicted (without waiting for another consume), this node's own files
//    never, and a file larger than the budget is refused at its consume;
//  * a read waiting for a file that exists here but was never published
//    is listed by `dyad status` (text, --json, counters), logged by the
//    service, and announced once on stderr by the preload library;
//  * `dyad consume -v` of a prefetched copy says so;
//  * DYAD_PREFETCH is declared by a consume answered locally;
//  * a consume that cannot fit fails before any byte moves, with
//    DYAD_RC_NOSPACE (ENOSPC under the preload library);
//  * prefetching stops at a free-space floor.
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "integration/ops_util.h"
#include "kvs/embedded/change_feed.h"
#include "proto/protocol.h"

namespace dyad::it {
namespace {

size_t Occurrences(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

class FieldReadyBase : public TwoNodeTest {
 protected:
  void SetUp() override {
    lib_ = std::string(DYAD_BUILD_BIN_DIR) + "/libdyad_wrapper.so";
    TwoNodeTest::SetUp();
  }
  // `dyad ARGS...` on a node, with the node's environment plus `env`.
  emu::RunResult Dyad(int node, std::vector<std::string> args, const Env& env = {},
                      int64_t timeout_ms = 60000) {
    args.insert(args.begin(), dyad_);
    auto r = cluster().RunOnNode(node, args, timeout_ms, env);
    EXPECT_TRUE(r.ok()) << Str(r.status());
    return r.ok() ? *r : emu::RunResult{};
  }
  void Publish(int node, const std::string& name, uint64_t size) {
    WriteFileOn(node, name, size);
    auto r = Dyad(node, {"produce", PathOn(node, name)});
    ASSERT_TRUE(r.status.success()) << r.output;
  }
  std::string StatusJson(int node) { return Dyad(node, {"status", "--json"}).output; }
  // Declares a prefetch of `pattern` on B and waits until B follows its
  // namespace, so that what B places from then on carries revocable stamps
  // (issue 28). Call through ASSERT_NO_FATAL_FAILURE.
  void PrefetchAndFollow(const std::string& pattern) {
    auto decl = Dyad(kB, {"prefetch", pattern});
    ASSERT_TRUE(decl.status.success()) << decl.output;
    ASSERT_TRUE(Eventually(20000, [&] { return Counter(kB, "records.followed") >= 1; }))
        << StatusJson(kB);
  }
  // Polls `pred` every 100 ms for up to `ms`.
  template <typename Pred>
  bool Eventually(int64_t ms, Pred pred) {
    return testutil::Eventually(pred, ms, 100);
  }
  size_t CopiesOn(int node, const std::vector<std::string>& names) {
    size_t n = 0;
    for (const std::string& f : names) n += Exists(PathOn(node, f)) ? 1 : 0;
    return n;
  }
  std::string lib_;
};

class FieldReady : public FieldReadyBase {
 protected:
  emu::ClusterOptions Options() override {
    emu::ClusterOptions o;
    o.node_service_args[kB] = {"--cache-bytes", "1048576", "--wait-log", "2"};
    return o;
  }
};

TEST_F(FieldReady, BudgetHoldsWithOneManagedDirectory) {
  // B's own product, in the same directory as the copies: never evicted.
  Publish(kB, "own.bin", 700000);
  std::vector<std::string> names;
  for (int i = 0; i < 8; ++i) {
    names.push_back("copies/f" + std::to_string(i));
    Publish(kA, names.back(), 512 * 1024);
  }
  for (const std::string& f : names) {
    auto r = Dyad(kB, {"consume", PathOn(kB, f)});
    ASSERT_TRUE(r.status.success()) << r.output;
  }
  // No further consume: the service's timer brings the copies back under
  // the budget once the grace period of the last ones is over.
  EXPECT_TRUE(Eventually(15000, [&] { return Counter(kB, "node_cache.bytes") <= 1048576; }))
      << StatusJson(kB);
  EXPECT_GE(Counter(kB, "node_cache.evictions"), 6u) << StatusJson(kB);
  EXPECT_LE(CopiesOn(kB, names), 2u);
  EXPECT_EQ(Counter(kB, "node_cache.pinned_bytes"), 0u);
  EXPECT_TRUE(Exists(PathOn(kB, "own.bin"))) << "the node's own product was evicted";
  EXPECT_EQ(CopiesOn(kA, names), names.size()) << "the owner's files were touched";
  // An evicted copy comes back, intact, on its next consume.
  auto again = Dyad(kB, {"consume", PathOn(kB, names[0])});
  EXPECT_TRUE(again.status.success()) << again.output;
  EXPECT_EQ(ReadText(PathOn(kB, names[0])), ReadText(PathOn(kA, names[0])));
}

TEST_F(FieldReady, BudgetBelowFileSizeIsRefusedAtConsume) {
  Publish(kA, "huge.bin", 3 * 1024 * 1024);
  auto r = Dyad(kB, {"consume", PathOn(kB, "huge.bin")});
  EXPECT_FALSE(r.status.success()) << r.output;
  EXPECT_NE(r.output.find("DYAD_RC_NOSPACE"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("cache budget"), std::string::npos) << r.output;
  EXPECT_FALSE(Exists(PathOn(kB, "huge.bin")));
  EXPECT_EQ(Counter(kB, "bytes.in"), 0u);
}

TEST_F(FieldReady, WaitingConsumeIsListedInStatus) {
  // Written into B's managed directory by a plain redirection: never published.
  WriteFileOn(kB, "unpublished.txt", 100);
  const std::string out = work_ + "/waiting.out";
  auto waiting = cluster().SpawnOnNode(kB, {dyad_, "consume", PathOn(kB, "unpublished.txt")},
                                       {{"DYAD_CONSUME_TIMEOUT", "60"}}, out);
  ASSERT_TRUE(waiting.ok()) << Str(waiting.status());
  std::string json;
  ASSERT_TRUE(Eventually(15000, [&] {
    json = StatusJson(kB);
    return json.find("\"unpublished.txt\"") != std::string::npos;
  })) << json;
  EXPECT_NE(json.find("\"kind\": \"consume\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"pid\": " + std::to_string(waiting->pid())), std::string::npos) << json;
  EXPECT_NE(json.find("\"unpublished_local_file\": \"" + PathOn(kB, "unpublished.txt") + "\""),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"waits.publication\": 1"), std::string::npos) << json;
  EXPECT_NE(json.find("\"waits.publication.unpublished_local\": 1"), std::string::npos) << json;
  const std::string text = Dyad(kB, {"status"}).output;
  EXPECT_NE(text.find("waiting for publication:"), std::string::npos) << text;
  EXPECT_NE(text.find("exists on this node but was never published"), std::string::npos) << text;
  const std::string metrics = Dyad(kB, {"status", "--prometheus"}).output;
  EXPECT_NE(metrics.find("waits_publication"), std::string::npos) << metrics;
  // The service logs the long wait (info; --wait-log 2 on B), once.
  EXPECT_TRUE(Eventually(15000, [&] {
    return cluster().ServiceLogTail(kB, 1 << 20).find("has waited") != std::string::npos;
  })) << cluster().ServiceLogTail(kB);
  const std::string log = cluster().ServiceLogTail(kB, 1 << 20);
  EXPECT_NE(log.find("unpublished.txt' exists on this node but was never published"),
            std::string::npos)
      << log;
  waiting->Kill();
  // The wait ends with its requester.
  EXPECT_TRUE(Eventually(15000, [&] { return Counter(kB, "waits.publication") == 0; }));
}

TEST_F(FieldReady, PreloadPrintsWaitNotice) {
  if (!Exists(lib_)) GTEST_SKIP() << "libdyad_wrapper.so not built in " << DYAD_BUILD_BIN_DIR;
  WriteFileOn(kB, "redirected.txt", 100);
  const Env env = {{"LD_PRELOAD", lib_}, {"DYAD_CONSUME_TIMEOUT", "4"}, {"DYAD_WAIT_NOTICE", "1"}};
  auto r = cluster().RunOnNode(kB, {"cat", PathOn(kB, "redirected.txt")}, 60000, env);
  ASSERT_TRUE(r.ok()) << Str(r.status());
  EXPECT_FALSE(r->status.success()) << "the read should time out: " << r->output;
  EXPECT_EQ(Occurrences(r->output, "has waited"), 1u) << r->output;
  EXPECT_NE(r->output.find("redirected.txt' has waited 1 s"), std::string::npos) << r->output;
  EXPECT_NE(r->output.find("never published"), std::string::npos) << r->output;
  // Off with 0, and by default when stderr is no terminal.
  for (const char* v : {"0", ""}) {
    Env quiet = {{"LD_PRELOAD", lib_}, {"DYAD_CONSUME_TIMEOUT", "2"}};
    if (*v != '\0') quiet["DYAD_WAIT_NOTICE"] = v;
    auto q = cluster().RunOnNode(kB, {"cat", PathOn(kB, "redirected.txt")}, 60000, quiet);
    ASSERT_TRUE(q.ok()) << Str(q.status());
    EXPECT_EQ(q->output.find("has waited"), std::string::npos) << v << ": " << q->output;
  }
}

TEST_F(FieldReady, ConsumeVerboseSaysPrefetched) {
  ASSERT_NO_FATAL_FAILURE(PrefetchAndFollow("pf/"));
  Publish(kA, "pf/a.bin", 200000);
  const std::string copy = PathOn(kB, "pf/a.bin");
  ASSERT_TRUE(Eventually(20000, [&] { return Exists(copy); })) << StatusJson(kB);
  // Prefetched into the one managed directory: complete here, no request.
  const uint64_t requests = Counter(kB, "requests.consume");
  auto r = Dyad(kB, {"consume", "-v", copy});
  ASSERT_TRUE(r.status.success()) << r.output;
  EXPECT_NE(r.output.find("already complete locally (no request)"), std::string::npos) << r.output;
  EXPECT_EQ(Counter(kB, "requests.consume"), requests);
  // Without its stamp (as after a gap in the feed) the service answers,
  // and says the copy was prefetched.
  ASSERT_EQ(::removexattr(copy.c_str(), "user.dyad.version"), 0) << std::strerror(errno);
  r = Dyad(kB, {"consume", "-v", copy});
  ASSERT_TRUE(r.status.success()) << r.output;
  EXPECT_NE(r.output.find("prefetched"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("same directory or shared storage"), std::string::npos) << r.output;
  // The service stamped it again: the next consume needs no request.
  auto again = Dyad(kB, {"consume", "-v", copy});
  EXPECT_NE(again.output.find("already complete locally (no request)"), std::string::npos)
      << again.output;
  EXPECT_EQ(Counter(kB, "requests.consume"), requests + 1);
}

// Issues 28 and 24: when the root restarts, B's record feed has a gap: the
// stamps of B's copies in its one managed directory come off (on its pool,
// not its loop), so none is taken as current without asking the service
// until B has listed the namespace again, and B keeps serving meanwhile.
TEST_F(FieldReady, ARootRestartTakesTheStampsOffTheCopies) {
  ASSERT_NO_FATAL_FAILURE(PrefetchAndFollow("gap/"));
  const std::vector<std::string> names = {"gap/a.bin", "gap/b.bin", "gap/c.bin"};
  for (const std::string& n : names) Publish(kA, n, 5000);
  auto stamps = [&] {
    size_t n = 0;
    for (const std::string& f : names)
      n += ::getxattr(PathOn(kB, f).c_str(), "user.dyad.version", nullptr, 0) > 0 ? 1 : 0;
    return n;
  };
  ASSERT_TRUE(Eventually(20000, [&] { return CopiesOn(kB, names) == names.size(); }))
      << StatusJson(kB);
  ASSERT_EQ(stamps(), names.size());
  ASSERT_TRUE(cluster().RestartService(kA).ok());
  EXPECT_TRUE(Eventually(20000, [&] { return stamps() == 0; })) << StatusJson(kB);
  EXPECT_TRUE(CopiesOn(kB, names) == names.size());  // the copies stay, unstamped
  // The restarted root's store is empty: a new publication reaches B.
  Publish(kA, "gap/a.bin", 6000);
  auto r = Dyad(kB, {"consume", PathOn(kB, "gap/a.bin")});
  ASSERT_TRUE(r.status.success()) << r.output;
  struct stat st {};
  ASSERT_EQ(::stat(PathOn(kB, "gap/a.bin").c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 6000);
}

// Consistency: only a running service withdraws the revocable stamps it
// gave, so a service that starts again (its index of copies empty) first
// makes the stamps an earlier run left on copies in its producer directory
// plain ones; a later version of such a file is then fetched, the old copy
// never taken as current without asking.
TEST_F(FieldReady, ARestartedServiceLeavesNoStampItCannotWithdraw) {
  ASSERT_NO_FATAL_FAILURE(PrefetchAndFollow("again/"));
  Publish(kA, "again/f.bin", 3000);
  const std::string copy = PathOn(kB, "again/f.bin");
  auto revocable = [&] {
    char s[64];
    const ssize_t n = ::getxattr(copy.c_str(), "user.dyad.version", s, sizeof s);
    return n > 0 && IsRevocableStamp(std::string_view(s, static_cast<size_t>(n)));
  };
  ASSERT_TRUE(Eventually(20000, [&] { return Exists(copy) && revocable(); })) << StatusJson(kB);
  ASSERT_TRUE(cluster().RestartService(kB).ok());
  EXPECT_FALSE(revocable());
  EXPECT_GT(::getxattr(copy.c_str(), "user.dyad.version", nullptr, 0), 0);  // names its version
  Publish(kA, "again/f.bin", 5000);
  auto r = Dyad(kB, {"consume", copy});
  ASSERT_TRUE(r.status.success()) << r.output;
  struct stat st {};
  ASSERT_EQ(::stat(copy.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 5000);
}

// Nodes set up as docs/deployment.md does, with DYAD_KVS_NAMESPACE unset:
// every file in the primary namespace ("").
class PrimaryNamespace : public FieldReadyBase {
 protected:
  emu::ClusterOptions Options() override {
    emu::ClusterOptions o;
    o.kvs_namespace = "";
    return o;
  }
};

// Issue 28: a prefetch whose watch fell behind the root's ring of changes
// (ChangeFeedLimits::ring_entries) is told to resync and lists the
// namespace again, so every file still arrives. The primary namespace is
// named "", which the prefetcher once also used for "no resync": the
// files its watch skipped were never prefetched.
TEST_F(PrimaryNamespace, PrefetchListsAgainAfterItsWatchFellBehind) {
  auto decl = Dyad(kB, {"prefetch", "behind/"});
  ASSERT_TRUE(decl.status.success()) << decl.output;
  const size_t n = ChangeFeedLimits{}.ring_entries + 500;
  std::vector<ManifestEntry> files;
  for (size_t i = 0; i < n; ++i)
    files.push_back({"behind/d" + std::to_string(i / 1000) + "/f" + std::to_string(i), 1});
  // B's watch is held still (its service stopped) while A publishes more
  // than the ring holds; running again, it is behind the ring.
  const pid_t b = cluster().ServicePid(kB);
  ASSERT_EQ(::kill(b, SIGSTOP), 0);
  struct Resume {
    pid_t pid;
    ~Resume() { ::kill(pid, SIGCONT); }
  } resume{b};
  Produce(files);
  ASSERT_EQ(::kill(b, SIGCONT), 0);
  EXPECT_TRUE(Eventually(120000, [&] { return Counter(kB, "prefetch.fetched") >= n; }))
      << Counter(kB, "prefetch.fetched") << " of " << n << " prefetched\n"
      << StatusJson(kB);
  EXPECT_EQ(CopiesOn(kB, {files.front().name, files.back().name}), 2u);
}

// Issue 28: an unmodified reader under the preload library opens a copy
// prefetched into the one managed directory without asking the service,
// and reads the producer's bytes; a copy a local program rewrote since is
// asked about again.
TEST_F(FieldReady, PreloadReadsAPrefetchedCopyWithoutARequest) {
  ASSERT_NO_FATAL_FAILURE(PrefetchAndFollow("pl/"));
  Publish(kA, "pl/a.bin", 70000);
  const std::string copy = PathOn(kB, "pl/a.bin");
  ASSERT_TRUE(Eventually(20000, [&] { return Exists(copy); })) << StatusJson(kB);
  const uint64_t requests = Counter(kB, "requests.consume");
  const Env env = {{"LD_PRELOAD", lib_}};
  auto r = cluster().RunOnNode(kB, {"cat", copy}, 60000, env);
  ASSERT_TRUE(r.ok()) << Str(r.status());
  ASSERT_TRUE(r->status.success()) << r->output;
  EXPECT_EQ(r->output, ReadAll(PathOn(kA, "pl/a.bin")));
  EXPECT_EQ(Counter(kB, "requests.consume"), requests);
  // Rewritten here (its content time moves): no longer taken from its stamp.
  struct timespec later[2] = {{0, UTIME_OMIT}, {0, 0}};
  later[1].tv_sec = ::time(nullptr) + 100;
  ASSERT_EQ(::utimensat(AT_FDCWD, copy.c_str(), later, 0), 0);
  r = cluster().RunOnNode(kB, {"cat", copy}, 60000, env);
  ASSERT_TRUE(r.ok()) << Str(r.status());
  EXPECT_EQ(Counter(kB, "requests.consume"), requests + 1);
}

// A program under the preload library with DYAD_ASYNC_PUBLISH exits with
// its publications still unanswered: the library waits for them at exit and
// reports a refused one on stderr.
TEST_F(FieldReady, PreloadReportsAFailedAsynchronousPublicationAtExit) {
  const std::string src = cluster().node(kA).dir + "/src.bin";  // not a managed file
  {
    std::ofstream out(src, std::ios::binary);
    out << std::string(1000, 's');
  }
  const Env env = {{"LD_PRELOAD", lib_},
                   {"DYAD_ASYNC_PUBLISH", "1"},
                   {"DYAD_KVS_NAMESPACE", "dyad.services"}};  // refused by every service
  auto r = cluster().RunOnNode(kA, {"cp", src, PathOn(kA, "copy.bin")}, 60000, env);
  ASSERT_TRUE(r.ok()) << Str(r.status());
  EXPECT_NE(r->output.find("asynchronous publication"), std::string::npos) << r->output;
  EXPECT_NE(r->output.find("copy.bin"), std::string::npos) << r->output;
}

TEST_F(FieldReady, PrefetchDeclaredOnLocalHit) {
  // A consumer directory of its own on B, with a copy already in it.
  const std::string cons = cluster().node(kB).dir + "/cons";
  ASSERT_EQ(::mkdir(cons.c_str(), 0755), 0);
  Publish(kA, "first.bin", 1000);
  auto fetched = Dyad(kB, {"consume", cons + "/first.bin"}, {{"DYAD_PATH_CONSUMER", cons}});
  ASSERT_TRUE(fetched.status.success()) << fetched.output;
  // The first consume with DYAD_PREFETCH is answered locally (level 1) ...
  auto hit = Dyad(kB, {"consume", "-v", cons + "/first.bin"},
                  {{"DYAD_PATH_CONSUMER", cons}, {"DYAD_PREFETCH", "later/"}});
  ASSERT_TRUE(hit.status.success()) << hit.output;
  EXPECT_NE(hit.output.find("already complete locally"), std::string::npos) << hit.output;
  // ... and still declared the pattern: later publications come unasked.
  Publish(kA, "later/x.bin", 5000);
  EXPECT_TRUE(Eventually(20000, [&] { return Exists(cons + "/later/x.bin"); })) << StatusJson(kB);
}

TEST_F(FieldReady, DiskFullFailsBeforeTransferWithEnospc) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  if (!Exists(lib_)) GTEST_SKIP() << "libdyad_wrapper.so not built in " << DYAD_BUILD_BIN_DIR;
  // B owns a 5 MiB file; A consumes it into a consumer directory of its
  // own on a 2 MiB file system (A has no budget).
  Publish(kB, "big/five.bin", 5 * 1024 * 1024);
  const std::string cons = cluster().node(kA).dir + "/small";
  ASSERT_EQ(::mkdir(cons.c_str(), 0755), 0);
  SmallTmpfs small(cons, "2m");
  ASSERT_TRUE(small.mounted) << "mount tmpfs on " << cons << ": " << std::strerror(errno);
  const uint64_t before = Counter(kA, "bytes.in");
  // The API: a clear code and message, nothing moved.
  auto r = Dyad(kA, {"consume", cons + "/big/five.bin"}, {{"DYAD_PATH_CONSUMER", cons}});
  EXPECT_FALSE(r.status.success()) << r.output;
  EXPECT_NE(r.output.find("DYAD_RC_NOSPACE"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("bytes free"), std::string::npos) << r.output;
  // The preload library: ENOSPC.
  auto cat = cluster().RunOnNode(kA, {"cat", cons + "/big/five.bin"}, 60000,
                                 {{"LD_PRELOAD", lib_}, {"DYAD_PATH_CONSUMER", cons}});
  ASSERT_TRUE(cat.ok()) << Str(cat.status());
  EXPECT_FALSE(cat->status.success());
  EXPECT_NE(cat->output.find("No space left on device"), std::string::npos) << cat->output;
  EXPECT_EQ(Counter(kA, "bytes.in"), before) << "bytes were transferred before failing";
  EXPECT_FALSE(Exists(cons + "/big/five.bin"));
  EXPECT_TRUE(PartFiles(cons).empty());
}

class Hardening2 : public FieldReadyBase {};

TEST_F(Hardening2, PrefetchKeepsFreeSpaceFloor) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  // No budget (the default): B prefetches into a consumer directory of its
  // own on an 8 MiB file system; 40 files of 256 KiB would fill it.
  const std::string cons = cluster().node(kB).dir + "/cons";
  ASSERT_EQ(::mkdir(cons.c_str(), 0755), 0);
  SmallTmpfs small(cons, "8m");
  ASSERT_TRUE(small.mounted) << "mount tmpfs on " << cons << ": " << std::strerror(errno);
  const Env env = {{"DYAD_PATH_CONSUMER", cons}};
  auto decl = Dyad(kB, {"prefetch", "many/"}, env);
  ASSERT_TRUE(decl.status.success()) << decl.output;
  std::vector<std::string> names;
  for (int i = 0; i < 40; ++i) {
    names.push_back("many/f" + std::to_string(i));
    Publish(kA, names.back(), 256 * 1024);
  }
  // Every publication is handled (fetched, or refused by the floor).
  ASSERT_TRUE(Eventually(30000, [&] {
    return Counter(kB, "prefetch.fetched") + Counter(kB, "prefetch.failed") >= names.size();
  })) << StatusJson(kB);
  struct statvfs vfs;
  ASSERT_EQ(::statvfs(cons.c_str(), &vfs), 0);
  const uint64_t total = static_cast<uint64_t>(vfs.f_blocks) * vfs.f_frsize;
  const uint64_t avail = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  EXPECT_GE(avail, total / 10) << "prefetch went below the 10% floor";
  EXPECT_GT(Counter(kB, "prefetch.fetched"), 10u);
  // A consume of a file the floor kept out still works.
  size_t missing = names.size();
  for (size_t i = 0; i < names.size(); ++i)
    if (!Exists(cons + "/" + names[i])) missing = i;
  ASSERT_LT(missing, names.size()) << "nothing was held back by the floor";
  auto r = Dyad(kB, {"consume", cons + "/" + names[missing]}, env);
  EXPECT_TRUE(r.status.success()) << r.output;
  EXPECT_TRUE(PartFiles(cons).empty());
}

}  // namespace
}  // namespace dyad::it
