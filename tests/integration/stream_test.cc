// stream_test.cc: the C++ streams (dyad/stream/dyad_stream_api.hpp) between
// two emulated nodes.
//
// Producers and consumers are the helper programs built with the streams
// (tests/stream_helpers): dyad_stream_worker (libstdc++ descriptor-adopting
// path), dyad_stream_worker_portable (the same program with the portable
// separate-descriptor path) and dyad_stream_upstream_example (a program
// written for upstream DYAD). Each runs inside a node with that node's
// environment, so it talks to that node's dyad-service exactly as a user's
// program would. Every wait is bounded; the fixture tears the cluster down
// even when an assertion fails.
#include <dyad/core/dyad_ctx.h>
#include <stdlib.h>
#include <sys/file.h>
#include <dyad/stream/dyad_stream_api.hpp>

#include <atomic>
#include <optional>

#include "client/client.h"
#include "integration_util.h"
#include "util.h"

namespace dyad::it {
namespace {

// The text stream_worker writes for `n` lines.
std::string Lines(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += "line " + std::to_string(i) + " of the stream test\n";
  return s;
}

class StreamTest : public TwoNodeTest {
 protected:
  void SetUp() override {
    worker_ = emu::FindSiblingProgram("dyad_stream_worker", DYAD_BUILD_BIN_DIR);
    portable_ = emu::FindSiblingProgram("dyad_stream_worker_portable", DYAD_BUILD_BIN_DIR);
    example_ = emu::FindSiblingProgram("dyad_stream_upstream_example", DYAD_BUILD_BIN_DIR);
    ASSERT_FALSE(worker_.empty() || portable_.empty() || example_.empty())
        << "stream helper programs not built in " << DYAD_BUILD_BIN_DIR
        << " (targets dyad_stream_worker, dyad_stream_worker_portable, "
           "dyad_stream_upstream_example)";
    TwoNodeTest::SetUp();
  }

  // Runs a helper on a node to completion and expects success.
  void RunOk(int node, const std::vector<std::string>& argv, const Env& env = {},
             int64_t timeout_ms = 60000) {
    auto r = cluster().RunOnNode(node, argv, timeout_ms, env);
    ASSERT_TRUE(r.ok()) << Str(r.status());
    ASSERT_FALSE(r->timed_out) << argv[1] << " timed out:\n" << r->output;
    ASSERT_TRUE(r->status.success()) << argv[1] << " " << r->status.ToString() << ":\n"
                                     << r->output;
    EXPECT_NE(r->output.find("ok"), std::string::npos) << r->output;
  }

  std::string worker_, portable_, example_;
};

TEST_F(StreamTest, ConsumerStartedFirstBlocksUntilProducerCloses) {
  const int n = 100000;  // about 3.5 MB: more than any stream buffer
  const std::string out = work_ + "/reader.out";
  auto reader = cluster().SpawnOnNode(
      kB, {worker_, "read", PathOn(kB, "s/first.txt"), std::to_string(n)}, {}, out);
  ASSERT_TRUE(reader.ok()) << Str(reader.status());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  ASSERT_FALSE(reader->Exited()) << "the reader did not wait for the producer:\n" << ReadAll(out);
  EXPECT_FALSE(Exists(PathOn(kB, "s/first.txt")));

  ::mkdir(PathOn(kA, "s").c_str(), 0755);
  RunOk(kA, {worker_, "write", PathOn(kA, "s/first.txt"), std::to_string(n)});

  auto st = reader->Wait(Deadline::AfterMs(60000));
  ASSERT_TRUE(st.ok()) << "reader still running after the producer closed:\n" << ReadAll(out);
  EXPECT_TRUE(st->success()) << st->ToString() << ":\n" << ReadAll(out);
  EXPECT_NE(ReadAll(out).find("ok read " + std::to_string(n)), std::string::npos) << ReadAll(out);
  // Published only after close: the consumer's copy is the whole file.
  EXPECT_EQ(ReadAll(PathOn(kB, "s/first.txt")), Lines(n));
  EXPECT_TRUE(PartFiles(dmd(kB)).empty());
}

TEST_F(StreamTest, DestructionWithoutClosePublishes) {
  RunOk(kA, {worker_, "write", PathOn(kA, "dtor.txt"), "1000", "--no-close"});
  RunOk(kB, {worker_, "read", PathOn(kB, "dtor.txt"), "1000"});
  EXPECT_EQ(ReadAll(PathOn(kB, "dtor.txt")), Lines(1000));
}

TEST_F(StreamTest, WideStreamsRoundTripUtf8) {
  RunOk(kA, {worker_, "wwrite", PathOn(kA, "wide.txt"), "50"});
  RunOk(kB, {worker_, "wread", PathOn(kB, "wide.txt"), "50"});
  // The bytes on disk are UTF-8 (the imbued locale survived open()).
  const std::string bytes = ReadAll(PathOn(kB, "wide.txt"));
  EXPECT_EQ(bytes.rfind("Gr\xc3\xbc\xc3\x9f"
                        "e \xe4\xb8\x96\xe7\x95\x8c \xe2\x9c\x93 0\n",
                        0),
            0u)
      << bytes.substr(0, 40);
}

TEST_F(StreamTest, FstreamReadWriteThenRead) {
  RunOk(kA, {worker_, "frw", PathOn(kA, "rw.txt"), "300"});
  RunOk(kB, {worker_, "fread", PathOn(kB, "rw.txt"), "300"});
  EXPECT_EQ(ReadAll(PathOn(kB, "rw.txt")), Lines(300));
}

TEST_F(StreamTest, WriterHoldsExclusiveLockUntilClose) {
  for (const std::string& prog : {worker_, portable_}) {
    const std::string name = prog == worker_ ? "lock-adopt.txt" : "lock-portable.txt";
    RunOk(kA, {prog, "lock", PathOn(kA, name)});
    RunOk(kB, {prog, "read", PathOn(kB, name), "1"});
  }
}

TEST_F(StreamTest, WriterTruncatesOnlyUnderTheLockInBothPaths) {
  RunOk(kA, {worker_, "truncwait", PathOn(kA, "tw-adopt.txt")});
  RunOk(kA, {portable_, "truncwait", PathOn(kA, "tw-portable.txt")});
  // What was published is the new version.
  auto c = cluster().RunOnNode(
      kB, {dyad_, "consume", PathOn(kB, "tw-portable.txt"), "--timeout", "30"}, 60000);
  ASSERT_TRUE(c.ok()) << Str(c.status());
  ASSERT_TRUE(c->status.success()) << c->output;
  EXPECT_EQ(ReadAll(PathOn(kB, "tw-portable.txt")), "new version\n");
}

// The order of the system calls of a producer, as strace sees it: lock
// before truncating, fsync before the first word to the service (publish).
TEST_F(StreamTest, ProducerLocksThenTruncatesAndSyncsBeforePublishing) {
  const std::string strace = emu::FindSiblingProgram("strace", "");
  if (strace.empty()) GTEST_SKIP() << "strace not installed";
  for (const std::string& prog : {worker_, portable_}) {
    const std::string name = prog == worker_ ? "trace-adopt.txt" : "trace-portable.txt";
    const std::string trace = work_ + "/" + name + ".strace";
    RunOk(kA, {strace, "-f", "-qq", "-o", trace, "-e",
               "trace=openat,flock,ftruncate,fsync,fdatasync,connect", prog, "write",
               PathOn(kA, name), "5000"});
    std::vector<std::string> lines;
    {
      std::ifstream in(trace);
      for (std::string l; std::getline(in, l);) lines.push_back(l);
    }
    auto first = [&](const std::string& a, const std::string& b, size_t from) {
      for (size_t i = from; i < lines.size(); ++i)
        if (lines[i].find(a) != std::string::npos && lines[i].find(b) != std::string::npos)
          return i;
      return lines.size();
    };
    const std::string all = ReadAll(trace);
    const size_t open = first("openat(", PathOn(kA, name), 0);
    ASSERT_LT(open, lines.size()) << all;
    const size_t lock = first("flock(", "LOCK_EX", open);
    const size_t trunc = first("ftruncate(", "", open);
    const size_t sync = first("fsync(", "= 0", open);
    const size_t publish = first("connect(", cluster().node(kA).socket, open);
    EXPECT_LT(lock, trunc) << name << "\n" << all;
    EXPECT_LT(trunc, lines.size()) << name << "\n" << all;
    EXPECT_LT(sync, publish) << name << "\n" << all;
    EXPECT_LT(publish, lines.size()) << name << "\n" << all;
  }
}

TEST_F(StreamTest, BothLockingPathsInterchange) {
  auto mode = cluster().RunOnNode(kA, {worker_, "mode"}, 10000);
  ASSERT_TRUE(mode.ok());
  RecordProperty("stream_locking", mode->output);
  auto pmode = cluster().RunOnNode(kA, {portable_, "mode"}, 10000);
  ASSERT_TRUE(pmode.ok());
  EXPECT_NE(pmode->output.find("portable"), std::string::npos);
  // Written through one path, read through the other, in both directions.
  RunOk(kA, {portable_, "write", PathOn(kA, "p1.txt"), "2000"});
  RunOk(kB, {worker_, "read", PathOn(kB, "p1.txt"), "2000"});
  RunOk(kA, {worker_, "frw", PathOn(kA, "p2.txt"), "200"});
  RunOk(kB, {portable_, "fread", PathOn(kB, "p2.txt"), "200"});
  RunOk(kA, {portable_, "wwrite", PathOn(kA, "p3.txt"), "20"});
  RunOk(kB, {portable_, "wread", PathOn(kB, "p3.txt"), "20"});
}

TEST_F(StreamTest, UpstreamProgramRunsUnchanged) {
  RunOk(kA, {example_, "produce", PathOn(kA, "upstream.txt")});
  RunOk(kB, {example_, "consume", PathOn(kB, "upstream.txt")});
  EXPECT_EQ(ReadAll(PathOn(kB, "upstream.txt")), "hello dyad 42\n");
}

// A program written for the streams, run with the preload library as well
// (a job script that sets LD_PRELOAD for every step): the library holds the
// producer's lock on a descriptor of its own, and the stream's own lock on
// the same file used to wait for it until the lock bound, once per file.
TEST_F(StreamTest, StreamsRunUnderThePreloadLibrary) {
  const std::string wrap = std::string(DYAD_BUILD_BIN_DIR) + "/libdyad_wrapper.so";
  const Env env = {{"LD_PRELOAD", wrap}, {"DYAD_RPC_TIMEOUT", "30"}};
  for (const std::string& prog : {worker_, portable_}) {
    const std::string name = prog == worker_ ? "pre-adopt.txt" : "pre-portable.txt";
    // Bounded well below the 30 s lock bound: a writer waiting for itself fails.
    RunOk(kA, {prog, "write", PathOn(kA, name), "1000"}, env, 15000);
    RunOk(kB, {prog, "read", PathOn(kB, name), "1000"}, env, 15000);
    EXPECT_EQ(ReadAll(PathOn(kB, name)), Lines(1000));
  }
  RunOk(kA, {example_, "produce", PathOn(kA, "pre-upstream.txt")}, env, 15000);
  RunOk(kB, {example_, "consume", PathOn(kB, "pre-upstream.txt")}, env, 15000);
  EXPECT_EQ(ReadAll(PathOn(kB, "pre-upstream.txt")), "hello dyad 42\n");
}

TEST_F(StreamTest, FailedConsumeLeavesInputStreamClosed) {
  auto r = cluster().RunOnNode(kB, {worker_, "read", PathOn(kB, "never.txt"), "1"}, 30000,
                               {{"DYAD_CONSUME_TIMEOUT", "0.5"}});
  ASSERT_TRUE(r.ok()) << Str(r.status());
  ASSERT_FALSE(r->timed_out) << r->output;
  EXPECT_EQ(r->status.ShellCode(), 1) << r->output;
  EXPECT_NE(r->output.find("FAIL: open"), std::string::npos) << r->output;
  EXPECT_FALSE(Exists(PathOn(kB, "never.txt")));
}

TEST_F(StreamTest, PathsOutsideManagedDirectoryAreNotPublished) {
  const std::string outside = work_ + "/plain.txt";
  auto r = cluster().RunOnNode(kA, {worker_, "write", outside, "10"}, 30000);
  ASSERT_TRUE(r.ok() && r->status.success()) << (r.ok() ? r->output : Str(r.status()));
  EXPECT_EQ(ReadAll(outside), Lines(10));
  // Not published under any name: a consumer of that name times out.
  auto c = cluster().RunOnNode(kB, {worker_, "read", PathOn(kB, "plain.txt"), "10"}, 30000,
                               {{"DYAD_CONSUME_TIMEOUT", "0.5"}});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->status.ShellCode(), 1) << c->output;
}

// --- in this process, without a service -----------------------------------

// One set of defaults for every language: dyad_params must match the C
// API's environment defaults, or C++ and C programs compute other keys.
TEST(StreamCoreTest, ParamsDefaultsAreTheCApiDefaults) {
  const dyad_params p;
  const ClientConfig c;
  EXPECT_EQ(p.m_key_depth, c.key_depth);
  EXPECT_EQ(p.m_key_bins, c.key_bins);
  EXPECT_EQ(p.m_service_mux, c.service_mux);
  EXPECT_EQ(p.m_key_depth, 3u);
  EXPECT_EQ(p.m_key_bins, 1024u);
  EXPECT_EQ(p.m_dtl_mode, DYAD_DTL_FLUX_RPC);
  EXPECT_EQ(p.m_debug, c.debug);
  EXPECT_EQ(p.m_shared_storage, c.shared_storage);
  EXPECT_EQ(p.m_async_publish, c.async_publish);
  EXPECT_EQ(p.m_fsync_write, c.fsync_write);
  EXPECT_TRUE(p.m_kvs_namespace.empty());
  EXPECT_TRUE(p.m_prod_managed_path.empty() && p.m_cons_managed_path.empty());
}

TEST(StreamCoreTest, OpenModesMapToOpenFlagsWithoutTruncation) {
  using std::ios;
  bool trunc = false;
  EXPECT_EQ(stream_detail::open_flags_for_mode(ios::out, &trunc), O_WRONLY | O_CREAT | O_CLOEXEC);
  EXPECT_TRUE(trunc);
  EXPECT_EQ(stream_detail::open_flags_for_mode(ios::out | ios::app, &trunc),
            O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC);
  EXPECT_FALSE(trunc);
  EXPECT_EQ(stream_detail::open_flags_for_mode(ios::in | ios::out | ios::binary, &trunc),
            O_RDWR | O_CLOEXEC);
  EXPECT_FALSE(trunc);
  EXPECT_EQ(stream_detail::open_flags_for_mode(ios::in | ios::out | ios::trunc | ios::ate, &trunc),
            O_RDWR | O_CREAT | O_CLOEXEC);
  EXPECT_TRUE(trunc);
  EXPECT_EQ(stream_detail::open_flags_for_mode(ios::in, &trunc), O_RDONLY | O_CLOEXEC);
  EXPECT_EQ(stream_detail::open_flags_for_mode(ios::trunc, &trunc), -1);  // std refuses it too
  EXPECT_EQ(stream_detail::open_flags_for_mode(ios::in | ios::trunc, &trunc), -1);
}

// Sets the variables of one test and restores them after.
class ScopedEnv {
 public:
  ScopedEnv(std::initializer_list<std::pair<const char*, std::string>> vars) {
    for (const auto& [k, v] : vars) {
      const char* old = ::getenv(k);
      saved_.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
      ::setenv(k, v.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v)
        ::setenv(k.c_str(), v->c_str(), 1);
      else
        ::unsetenv(k.c_str());
    }
  }

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

class StreamLocalTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = testutil::MakeTempDir("dyad-stream-test-");
    ASSERT_FALSE(base_.empty());
    dmd_ = base_ + "/dmd";
    outside_ = base_ + "/outside";
    ASSERT_EQ(::mkdir(dmd_.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir(outside_.c_str(), 0755), 0);
  }
  void TearDown() override {
    dyad_finalize();
    if (!base_.empty()) {
      EXPECT_TRUE(emu::RemoveTree(base_).ok()) << base_;
    }
  }
  // DYAD on, with `dmd_` as producer directory and no service to talk to:
  // opening and locking work, publishing fails with DYAD_RC_NOSERVICE.
  void InitNoService(dyad_stream_core* core) {
    dyad_params p;
    p.m_prod_managed_path = dmd_;
    p.m_reinit = true;
    core->init(p);
    ASSERT_TRUE(core->chk_initialized());
  }
  std::string base_, dmd_, outside_;  // dmd_ and outside_ are below base_
};

TEST_F(StreamLocalTest, CoreReportsRolesAndManagedPaths) {
  ScopedEnv env({{"DYAD_SERVICE_SOCKET", dmd_ + "/no.sock"}});
  dyad_stream_core core;
  InitNoService(&core);
  EXPECT_TRUE(core.is_dyad_producer());
  EXPECT_FALSE(core.is_dyad_consumer());
  EXPECT_TRUE(core.cmp_canonical_path_prefix(true, (dmd_ + "/x/y.dat").c_str()));
  EXPECT_FALSE(core.cmp_canonical_path_prefix(true, "/etc/passwd"));
  EXPECT_FALSE(core.cmp_canonical_path_prefix(false, (dmd_ + "/x/y.dat").c_str()));
  // Consuming outside the consumer directory is not DYAD's business.
  EXPECT_TRUE(core.open_sync((dmd_ + "/x/y.dat").c_str()));
  core.finalize();
  EXPECT_FALSE(core.chk_initialized());
  EXPECT_EQ(dyad_ctx_get(), nullptr);
}

// The writer locks before it truncates: a reader holding the shared lock
// (as dyad-service does while serving the previous version) keeps the old
// content intact until it lets go, and the open waits for it.
TEST_F(StreamLocalTest, WriterTruncatesOnlyUnderItsLock) {
  ScopedEnv env({{"DYAD_SERVICE_SOCKET", dmd_ + "/no.sock"}, {"DYAD_RPC_TIMEOUT", "20"}});
  dyad_stream_core core;
  InitNoService(&core);
  const std::string path = dmd_ + "/v.txt";
  { std::ofstream(path) << "old version\n"; }
  UniqueFd reader(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(reader.valid());
  ASSERT_EQ(::flock(reader.get(), LOCK_SH), 0);
  std::atomic<bool> opened{false};
  std::thread writer([&] {
    ofstream_dyad ofs(core);
    ofs.open(path);
    opened = ofs.is_open();
    ofs << "new version\n";
    ofs.close();  // no service: not published, failbit
    EXPECT_TRUE(ofs.fail());
    EXPECT_EQ(ofs.core().last_rc(), DYAD_RC_NOSERVICE) << ofs.core().last_error();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(opened.load());
  EXPECT_EQ(ReadAll(path), "old version\n");
  ::flock(reader.get(), LOCK_UN);
  writer.join();
  EXPECT_TRUE(opened.load());
  EXPECT_EQ(ReadAll(path), "new version\n");
}

// The lock wait is bounded (DYAD_RPC_TIMEOUT): the open fails, the file is
// untouched.
TEST_F(StreamLocalTest, LockWaitIsBounded) {
  ScopedEnv env({{"DYAD_SERVICE_SOCKET", dmd_ + "/no.sock"}, {"DYAD_RPC_TIMEOUT", "0.3"}});
  dyad_stream_core core;
  InitNoService(&core);
  const std::string path = dmd_ + "/held.txt";
  { std::ofstream(path) << "kept\n"; }
  UniqueFd holder(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_EQ(::flock(holder.get(), LOCK_SH), 0);
  const Deadline limit = Deadline::AfterMs(5000);
  ofstream_dyad ofs(core);
  ofs.open(path);
  EXPECT_FALSE(ofs.is_open());
  EXPECT_TRUE(ofs.fail());
  EXPECT_FALSE(limit.expired());
  EXPECT_EQ(ReadAll(path), "kept\n");
}

// Streams behave as std::fstream where DYAD has nothing to do, and the
// forwarding surface compiles for each kind.
TEST_F(StreamLocalTest, OutsideManagedPathsBehaveAsStdStreams) {
  ScopedEnv env({{"DYAD_SERVICE_SOCKET", dmd_ + "/no.sock"}});
  dyad_stream_core core;
  InitNoService(&core);
  const std::string plain = outside_ + "/p.txt";
  {
    ofstream_dyad ofs(core);
    ofs.open(plain);
    ofs << 42 << ' ' << std::hex << 255 << std::endl;
    ofs.close();
    EXPECT_TRUE(ofs.good());  // nothing to publish, nothing failed
  }
  {
    ifstream_dyad ifs(core);
    ifs.open(plain);
    int a = 0;
    std::string b;
    ifs >> a >> b;
    EXPECT_EQ(a, 42);
    EXPECT_EQ(b, "ff");
  }
  {
    wfstream_dyad fs(core);
    fs.open(plain, std::ios::in | std::ios::out | std::ios::trunc);
    fs << L"abc" << std::endl;
    fs.seekg(0);
    std::wstring w;
    getline(fs, w);
    EXPECT_EQ(w, L"abc");
  }
}

}  // namespace
}  // namespace dyad::it
