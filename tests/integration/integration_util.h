// integration_util.h: the fixture every integration test builds on.
//
// TwoNodeTest starts an emulated two-node cluster (tools/emu): node A (index 0)
// and node B (index 1), each with its own dyad-service, directory and (as
// root) network namespace. Producers and consumers are separate processes
// run inside a node: the hidden worker roles of the demo program
// (`dyad-demo --role produce|consume`), which use only the public C API and
// report one result line per file. The cluster is torn down after each test,
// also when an assertion fails; every wait is bounded.
//
// Threading: tests drive the fixture from the gtest main thread only.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "common/time.h"
#include "dyad/common/dyad_rc.h"
#include "emu/cluster.h"
#include "emu/pattern.h"
#include "emu/worker.h"
#include "util.h"

#ifndef DYAD_BUILD_BIN_DIR
#define DYAD_BUILD_BIN_DIR ""
#endif

namespace dyad::it {

using emu::EmuCluster;
using emu::FileResult;
using emu::ManifestEntry;
using Env = std::map<std::string, std::string>;
using testutil::Eventually;
using testutil::MakeTempDir;
using testutil::ReadAll;
using testutil::ReadText;
using testutil::TempDir;

constexpr int kA = 0;
constexpr int kB = 1;
constexpr uint64_t kMiB = 1ull << 20;

// A small tmpfs mounted over a directory for a test's duration (root only:
// `mounted` says whether it worked); unmounted however the test ends.
// Freezes a process (SIGSTOP) until Thaw() or the end of the scope, also
// when the test fails.
struct Frozen {
  explicit Frozen(pid_t p) : pid(p), ok(p > 0 && ::kill(p, SIGSTOP) == 0) {}
  ~Frozen() { Thaw(); }
  Frozen(const Frozen&) = delete;
  Frozen& operator=(const Frozen&) = delete;
  bool Thaw() { return ok && ::kill(pid, SIGCONT) == 0; }
  const pid_t pid;
  const bool ok;
};

struct SmallTmpfs {
  std::string dir;
  bool mounted = false;
  SmallTmpfs(const std::string& d, const char* size) : dir(d) {
    const std::string opts = std::string("size=") + size;
    mounted = ::mount("tmpfs", dir.c_str(), "tmpfs", 0, opts.c_str()) == 0;
  }
  ~SmallTmpfs() {
    if (mounted) ::umount2(dir.c_str(), MNT_DETACH);
  }
};

// Formats a Status for assertion messages.
inline std::string Str(const Status& st) { return st.ToString(); }

// Every file below `dir` (relative paths), recursively, including hidden ones.
inline void ListTree(const std::string& dir, const std::string& rel,
                     std::vector<std::string>* out) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string path = dir + "/" + name;
    const std::string r = rel.empty() ? name : rel + "/" + name;
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) continue;
    if (S_ISDIR(st.st_mode)) {
      ListTree(path, r, out);
    } else {
      out->push_back(r);
    }
  }
  ::closedir(d);
}

// Names below `dir` that are DYAD temporaries (partially received files).
inline std::vector<std::string> PartFiles(const std::string& dir) {
  std::vector<std::string> all, parts;
  ListTree(dir, "", &all);
  for (const auto& f : all) {
    const size_t slash = f.rfind('/');
    const std::string base = slash == std::string::npos ? f : f.substr(slash + 1);
    if (base.rfind(".dyad-part", 0) == 0) parts.push_back(f);
  }
  return parts;
}

inline bool Exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// Creates a sparse file (cheap to make, full-size to move).
inline void MakeSparse(const std::string& path, uint64_t size) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  ASSERT_TRUE(fd.valid()) << path;
  ASSERT_EQ(::ftruncate(fd.get(), static_cast<off_t>(size)), 0);
  const char tail = 'T';
  ASSERT_EQ(::pwrite(fd.get(), &tail, 1, static_cast<off_t>(size - 1)), 1);
}

// True when process `pid` writes a file without a name (O_TMPFILE: its
// descriptor's link reads "<dir>/#<inode> (deleted)") below `dir` that
// holds data already: a placement in progress.
inline bool WritesUnnamedFileBelow(pid_t pid, const std::string& dir) {
  if (pid <= 0) return false;
  const std::string fds = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(fds.c_str());
  if (d == nullptr) return false;
  char real[PATH_MAX];
  const std::string root = ::realpath(dir.c_str(), real) != nullptr ? real : dir;
  bool found = false;
  while (dirent* e = ::readdir(d)) {
    const std::string fd = fds + "/" + e->d_name;
    char target[PATH_MAX];
    const ssize_t n = ::readlink(fd.c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    const std::string t(target, static_cast<size_t>(n));
    const std::string deleted = " (deleted)";
    if (t.rfind(root + "/", 0) != 0 || t.size() < deleted.size() ||
        t.compare(t.size() - deleted.size(), deleted.size(), deleted) != 0)
      continue;
    struct stat st;
    if (::stat(fd.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
      found = true;
      break;
    }
  }
  ::closedir(d);
  return found;
}

// Waits until a transfer in progress holds data below `dir`: a named
// temporary, or a file without a name written by `service` (its pid; 0:
// named temporaries only). False if `consumer` exits first or nothing
// shows up in time.
inline bool WaitForPartialTransfer(emu::Process& consumer, const std::string& dir,
                                   int64_t timeout_ms, pid_t service = 0) {
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  while (!deadline.expired()) {
    for (const auto& rel : PartFiles(dir)) {
      struct stat st;
      if (::stat((dir + "/" + rel).c_str(), &st) == 0 && st.st_size > 0) return true;
    }
    if (WritesUnnamedFileBelow(service, dir)) return true;
    if (consumer.Exited()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

class TwoNodeTest : public ::testing::Test {
 protected:
  // Tests that need another layout override this.
  virtual emu::ClusterOptions Options() { return {}; }
  // Tests that need more nodes override this (A and B stay nodes 0 and 1).
  virtual int NodeCount() const { return 2; }

  void SetUp() override {
    dyad_ = emu::FindSiblingProgram("dyad", DYAD_BUILD_BIN_DIR);
    ASSERT_FALSE(dyad_.empty()) << "the dyad command was not found in " << DYAD_BUILD_BIN_DIR;
    demo_ = emu::FindSiblingProgram("dyad-demo", DYAD_BUILD_BIN_DIR);
    ASSERT_FALSE(demo_.empty()) << "dyad-demo was not found in " << DYAD_BUILD_BIN_DIR;
    emu::ClusterOptions o = Options();
    if (o.bin_dir.empty()) o.bin_dir = DYAD_BUILD_BIN_DIR;
    auto c = EmuCluster::Start(NodeCount(), o);
    // A transport this build lacks (e.g. -m UCX without libucx-dev).
    if (!c.ok() && c.status().message().find("not compiled in") != std::string::npos)
      GTEST_SKIP() << "transport not built: " << c.status().message();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    cluster_ = std::move(*c);
    work_ = cluster_->base_dir() + "/work";
    ASSERT_EQ(::mkdir(work_.c_str(), 0755), 0);
    RecordProperty("network", cluster_->uses_netns() ? "namespaces" : "loopback");
  }

  void TearDown() override {
    if (cluster_ && HasFailure()) {
      for (int i = 0; i < cluster_->size(); ++i)
        std::fprintf(stderr, "node %d service log:\n%s\n", i, cluster_->ServiceLogTail(i).c_str());
    }
    if (cluster_) cluster_->Teardown();
  }

  EmuCluster& cluster() { return *cluster_; }
  const std::string& dmd(int node) { return cluster_->node(node).dmd; }
  std::string PathOn(int node, const std::string& name) { return dmd(node) + "/" + name; }

  // Writes `size` bytes of the name's pattern straight into a node's
  // managed directory (what a producer would have written).
  void WriteFileOn(int node, const std::string& name, uint64_t size) {
    const std::string path = PathOn(node, name);
    size_t pos = 0;
    while ((pos = name.find('/', pos)) != std::string::npos) {
      ::mkdir((dmd(node) + "/" + name.substr(0, pos)).c_str(), 0755);
      ++pos;
    }
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    ASSERT_TRUE(fd.valid()) << path << ": " << std::strerror(errno);
    ASSERT_TRUE(emu::WritePattern(fd.get(), emu::PatternSeed(name), size).ok());
  }

  // Files for a worker's manifest, and where its results go.
  struct WorkerFiles {
    std::string manifest, result, ready, output;
  };
  WorkerFiles NewWorkerFiles(const std::vector<ManifestEntry>& entries) {
    const std::string stem = work_ + "/w" + std::to_string(seq_++);
    WorkerFiles f{stem + ".manifest", stem + ".result", stem + ".ready", stem + ".out"};
    Status st = emu::WriteManifest(f.manifest, entries);
    EXPECT_TRUE(st.ok()) << Str(st);
    return f;
  }

  std::vector<std::string> WorkerArgv(const std::string& role, const WorkerFiles& f,
                                      const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {demo_,      "--role", role,      "--manifest", f.manifest,
                                     "--result", f.result, "--ready", f.ready};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return argv;
  }

  // Starts a worker on `node` without waiting for it.
  emu::Process StartWorker(int node, const std::string& role, const WorkerFiles& f,
                           const std::vector<std::string>& flags = {}, const Env& env = {}) {
    auto p = cluster_->SpawnOnNode(node, WorkerArgv(role, f, flags), env, f.output);
    EXPECT_TRUE(p.ok()) << Str(p.status());
    return p.ok() ? std::move(*p) : emu::Process();
  }

  // Waits (bounded) until a started worker has initialized DYAD.
  bool WaitWorkerReady(emu::Process& p, const WorkerFiles& f, int64_t timeout_ms = 10000) {
    const Deadline deadline = Deadline::AfterMs(timeout_ms);
    while (!Exists(f.ready)) {
      if (p.Exited() || deadline.expired()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  // Waits for a worker and returns its per-file results (empty on failure,
  // with the worker's output in the failure message).
  std::vector<FileResult> FinishWorker(emu::Process& p, const WorkerFiles& f,
                                       int64_t timeout_ms = 60000) {
    auto st = p.Wait(Deadline::AfterMs(timeout_ms));
    if (!st.ok()) {
      p.Kill();
      ADD_FAILURE() << "worker did not finish within " << timeout_ms << " ms\n" << Output(f);
      return {};
    }
    auto results = emu::ReadResults(f.result);
    if (!results.ok()) {
      ADD_FAILURE() << "worker (" << st->ToString()
                    << ") left no results: " << Str(results.status()) << "\n"
                    << Output(f);
      return {};
    }
    return *results;
  }

  std::string Output(const WorkerFiles& f) {
    std::ifstream in(f.output);
    std::stringstream ss;
    ss << in.rdbuf();
    return "--- worker output:\n" + ss.str();
  }

  // Set by transports whose provider can wedge on a peer killed mid-transfer
  // (see KillConsumerMidTransfer).
  bool peer_death_may_wedge_transport_ = false;

  // A consumer on B part-way through fetching a large file from A, for tests
  // that kill a service mid-transfer.
  enum class TransferState { kInProgress, kTooFast, kNotStarted };
  struct InterruptibleTransfer {
    WorkerFiles files;
    emu::Process consumer;
    bool limited = false;  // A's link is rate-limited (tc), so the transfer lasts
    TransferState state = TransferState::kNotStarted;
  };

  // Publishes a sparse `size`-byte file `name` on A and starts a consumer of
  // it on B; returns once part of it has arrived. kTooFast means it completed
  // before it could be interrupted (an unlimited loopback link): skip then.
  // With `limit_bandwidth` A's link is slowed to 400 Mbit/s (when tc works);
  // without it the transfer runs at full speed.
  InterruptibleTransfer StartInterruptibleTransfer(const std::string& name, uint64_t size,
                                                   bool limit_bandwidth = true) {
    InterruptibleTransfer t;
    const size_t slash = name.rfind('/');
    if (slash != std::string::npos) ::mkdir((dmd(kA) + "/" + name.substr(0, slash)).c_str(), 0755);
    MakeSparse(PathOn(kA, name), size);
    t.limited = limit_bandwidth && cluster().LimitBandwidth(kA, "400mbit").ok();
    Produce({{name, static_cast<int64_t>(size)}}, {"--no-write"});
    t.files = NewWorkerFiles({{name, static_cast<int64_t>(size)}});
    t.consumer = StartWorker(kB, "consume", t.files, {"--no-verify"});
    if (WaitForPartialTransfer(t.consumer, dmd(kB), 30000, cluster().ServicePid(kB)))
      t.state = TransferState::kInProgress;
    else if (!t.limited && t.consumer.Exited())
      t.state = TransferState::kTooFast;
    return t;
  }

  // Kills A's service while `t` is in progress and checks what B's consumer
  // must see: an error with a message within 15 s, no final file and no
  // partial one. The caller restarts A.
  void KillOwnerAndExpectCleanFailure(InterruptibleTransfer& t, const std::string& name) {
    ASSERT_TRUE(cluster().KillService(kA).ok());
    const uint64_t killed = MonoNs();
    auto r = FinishWorker(t.consumer, t.files, 90000);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_NE(r[0].rc, DYAD_RC_OK) << "consume succeeded although the owner died mid-transfer";
    EXPECT_FALSE(r[0].message.empty());
    EXPECT_LT(MonoNs() - killed, 15'000'000'000ull)
        << "the consumer noticed the dead owner too late";
    EXPECT_FALSE(Exists(PathOn(kB, name)));
    EXPECT_TRUE(PartFiles(dmd(kB)).empty()) << "a partial transfer was left behind";
  }

  // Kills the producer's service at full speed (no bandwidth limit) at
  // different points of a transfer: every time the consumer gets an error
  // and no partial file, its service keeps running, and the restarted
  // producer serves again.
  void KillProducerAtFullSpeed(int rounds) {
    for (int round = 0; round < rounds; ++round) {
      SCOPED_TRACE("round " + std::to_string(round));
      const std::string name = "big/full-speed-" + std::to_string(round) + ".bin";
      InterruptibleTransfer t = StartInterruptibleTransfer(name, 4096 * kMiB, false);
      if (t.state == TransferState::kTooFast)
        GTEST_SKIP() << "the transfer finished before it could be interrupted";
      ASSERT_EQ(t.state, TransferState::kInProgress) << Output(t.files);
      std::this_thread::sleep_for(std::chrono::milliseconds(40 * round));
      ASSERT_NO_FATAL_FAILURE(KillOwnerAndExpectCleanFailure(t, name));
      std::this_thread::sleep_for(std::chrono::seconds(1));
      ASSERT_TRUE(cluster().ServiceRunning(kB)) << "the consumer's service died with its peer";
      ASSERT_TRUE(cluster().StartService(kA).ok());
      ASSERT_EQ(::unlink(PathOn(kA, name).c_str()), 0);
    }
    const std::vector<ManifestEntry> again = {{"after-kills.dat", 3 * 1048576 + 5}};
    Produce(again);
    ConsumeOk(again);
  }

  // The consumer's service dies while it reads from the producer's: the
  // producer's service keeps running and serves the restarted consumer.
  // Every transport's kill tests run these two scenarios.
  void KillConsumerMidTransfer() {
    const std::string name = "big/consumer-dies.bin";
    InterruptibleTransfer t = StartInterruptibleTransfer(name, 4096 * kMiB, false);
    if (t.state == TransferState::kTooFast)
      GTEST_SKIP() << "the transfer finished before it could be interrupted";
    ASSERT_EQ(t.state, TransferState::kInProgress) << Output(t.files);
    ASSERT_TRUE(cluster().KillService(kB).ok());
    auto r = FinishWorker(t.consumer, t.files, 90000);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_NE(r[0].rc, DYAD_RC_OK);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    ASSERT_TRUE(cluster().ServiceRunning(kA)) << "the producer's service died with its peer";
    ASSERT_TRUE(cluster().StartService(kB).ok());
    // B is also the metadata root: restarting A registers it again there.
    const Status stop = cluster().StopService(kA);
    if (!stop.ok() && peer_death_may_wedge_transport_) {
      // A known provider limitation (docs/ofi.md): the stop is still
      // bounded, and the service says why it exited without waiting.
      EXPECT_NE(cluster().ServiceLogTail(kA).find("stuck inside the transport"), std::string::npos)
          << stop.ToString();
      RecordProperty("forced_stop", stop.ToString());
    } else {
      ASSERT_TRUE(stop.ok()) << stop.ToString();
    }
    ASSERT_TRUE(cluster().StartService(kA).ok());
    ASSERT_EQ(::unlink(PathOn(kA, name).c_str()), 0);
    const std::vector<ManifestEntry> again = {{"after-consumer-kills.dat", 3 * 1048576 + 5}};
    Produce(again);
    ConsumeOk(again);
  }

  // Runs a worker to completion.
  std::vector<FileResult> RunWorker(int node, const std::string& role,
                                    const std::vector<ManifestEntry>& entries,
                                    const std::vector<std::string>& flags = {}, const Env& env = {},
                                    int64_t timeout_ms = 60000) {
    WorkerFiles f = NewWorkerFiles(entries);
    emu::Process p = StartWorker(node, role, f, flags, env);
    if (!p.valid()) return {};
    return FinishWorker(p, f, timeout_ms);
  }

  // Produces on node A: writes (unless "--no-write" is among flags) and
  // publishes; expects success.
  void Produce(const std::vector<ManifestEntry>& entries,
               const std::vector<std::string>& flags = {}, const Env& env = {}, int node = kA) {
    auto r = RunWorker(node, "produce", entries, flags, env);
    ASSERT_EQ(r.size(), entries.size());
    for (const auto& x : r) ASSERT_EQ(x.rc, DYAD_RC_OK) << x.name << ": " << x.message;
  }

  std::vector<FileResult> Consume(const std::vector<ManifestEntry>& entries,
                                  const std::vector<std::string>& flags = {}, const Env& env = {},
                                  int node = kB, int64_t timeout_ms = 60000) {
    return RunWorker(node, "consume", entries, flags, env, timeout_ms);
  }

  // Consumes and expects every file complete and verified.
  void ConsumeOk(const std::vector<ManifestEntry>& entries,
                 const std::vector<std::string>& flags = {}, const Env& env = {}, int node = kB) {
    auto r = Consume(entries, flags, env, node);
    ASSERT_EQ(r.size(), entries.size());
    for (const auto& x : r) {
      EXPECT_EQ(x.rc, DYAD_RC_OK) << x.name << ": " << x.message;
      EXPECT_EQ(x.verified, 1) << x.name << ": " << x.message;
    }
  }

  uint64_t Counter(int node, const std::string& name) {
    auto v = cluster_->Counter(node, name);
    EXPECT_TRUE(v.ok()) << Str(v.status());
    return v.ok() ? *v : 0;
  }

  std::unique_ptr<EmuCluster> cluster_;
  std::string dyad_;  // the dyad command
  std::string demo_;  // dyad-demo, whose worker roles run on the nodes
  std::string work_;
  int seq_ = 0;
};

}  // namespace dyad::it
