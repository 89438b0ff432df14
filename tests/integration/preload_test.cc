// preload_test.cc: unmodified programs exchange files through DYAD with
// nothing but LD_PRELOAD=libdyad_wrapper.so and the node's DYAD_* variables.
//
// Node A (producer) and node B (consumer) of an emulated cluster run real
// programs (cp, cat, dd, tar, sha256sum, python3) and the small programs of
// tests/preload_helpers. Expected bytes are computed by this test from the
// sources, never taken from the programs under test. Every program runs
// with a bounded timeout and DYAD_CONSUME_TIMEOUT, and the fixture tears the
// cluster down (processes, namespaces, directories) also on failure.
//
// Threading: gtest main thread only.
#include <sys/file.h>
#include <sys/stat.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "integration_util.h"

namespace dyad::it {
namespace {

uint64_t Fnv(const std::string& data) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : data) h = (h ^ c) * 1099511628211ull;
  return h;
}

void WriteAll(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(gen() & 0xff);
  return s;
}

std::string TextLines(size_t lines, const std::string& tag) {
  std::string s;
  for (size_t i = 0; i < lines; ++i) s += tag + " line " + std::to_string(i) + "\n";
  return s;
}

// "<path> <size> <fnv>" as dyad-preload-helper read-threads prints it.
std::string HelperLine(const std::string& path, const std::string& data) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), " %zu %016" PRIx64, data.size(), Fnv(data));
  return path + buf;
}

class PreloadTest : public TwoNodeTest {
 protected:
  void SetUp() override {
    lib_ = std::string(DYAD_BUILD_BIN_DIR) + "/libdyad_wrapper.so";
    helper_ = std::string(DYAD_BUILD_BIN_DIR) + "/dyad-preload-helper";
    if (!Exists(lib_)) GTEST_SKIP() << "libdyad_wrapper.so not built in " << DYAD_BUILD_BIN_DIR;
    TwoNodeTest::SetUp();
  }

  Env PreloadEnv(const Env& extra = {}) {
    Env env = {{"LD_PRELOAD", lib_}, {"DYAD_CONSUME_TIMEOUT", "30"}};
    if (list_) env["DYAD_PRELOAD_LIST"] = "1";  // the listing tests turn listings on
    for (const auto& [k, v] : extra) env[k] = v;
    return env;
  }

  // Runs argv on `node` under the library; expects success, returns output.
  std::string RunOk(int node, const std::vector<std::string>& argv, const Env& extra = {},
                    int64_t timeout_ms = 60000) {
    auto r = cluster().RunOnNode(node, argv, timeout_ms, PreloadEnv(extra));
    EXPECT_TRUE(r.ok()) << Str(r.status());
    if (!r.ok()) return "";
    EXPECT_FALSE(r->timed_out) << argv[0] << " timed out:\n" << r->output;
    EXPECT_TRUE(r->status.success()) << argv[0] << ": " << r->status.ToString() << "\n"
                                     << r->output;
    return r->output;
  }

  // Starts argv on `node` under the library, output into a file.
  emu::Process Start(int node, const std::vector<std::string>& argv, const std::string& out,
                     const Env& extra = {}) {
    auto p = cluster().SpawnOnNode(node, argv, PreloadEnv(extra), out);
    EXPECT_TRUE(p.ok()) << Str(p.status());
    return p.ok() ? std::move(*p) : emu::Process();
  }

  // Waits (bounded) for a started program and expects success.
  void FinishOk(emu::Process& p, const std::string& out, int64_t timeout_ms = 60000) {
    ASSERT_TRUE(p.valid());
    auto st = p.Wait(Deadline::AfterMs(timeout_ms));
    if (!st.ok()) p.Kill();
    ASSERT_TRUE(st.ok()) << "did not finish in time\n" << ReadAll(out);
    EXPECT_TRUE(st->success()) << st->ToString() << "\n" << ReadAll(out);
  }

  // sha256sum's line for `data` under the name `path`, computed without
  // the library (in this process's namespace).
  std::string Sha256Of(const std::string& data, const std::string& path) {
    const std::string tmp = work_ + "/sha-input";
    WriteAll(tmp, data);
    emu::SpawnOptions o;
    o.argv = {"sha256sum", tmp};
    auto r = emu::RunCapture(o, 30000);
    EXPECT_TRUE(r.ok() && r->status.success());
    if (!r.ok()) return "";
    return r->output.substr(0, 64) + "  " + path + "\n";
  }

  // Names the service on `node` was asked about by consumes: each item of
  // a consume request (a look's request included) reads its record once,
  // from the service's metadata cache or from the store.
  uint64_t NamesAsked(int node) {
    return Counter(node, "cache.hits") + Counter(node, "cache.misses");
  }

  std::string lib_;
  std::string helper_;
  bool list_ = false;  // PreloadEnv sets DYAD_PRELOAD_LIST=1
};

// cp into A's managed directory; sha256sum and cat on B, started before
// the producer, block until cp's close publishes the file.
TEST_F(PreloadTest, CpProducesAndConsumerStartedFirstBlocksUntilClose) {
  const std::string data = RandomBytes(3 * kMiB + 17, 1);
  const std::string text = TextLines(20000, "cp");
  const std::string src = work_ + "/src.bin", src_txt = work_ + "/src.txt";
  WriteAll(src, data);
  WriteAll(src_txt, text);

  const std::string out = work_ + "/sha.out";
  emu::Process sha = Start(kB, {"sha256sum", PathOn(kB, "cp.bin")}, out);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  EXPECT_FALSE(sha.Exited()) << "consumer finished before anything was produced:\n" << ReadAll(out);
  RunOk(kA, {"cp", src, PathOn(kA, "cp.bin")});
  FinishOk(sha, out);
  EXPECT_EQ(ReadAll(out), Sha256Of(data, PathOn(kB, "cp.bin")));

  RunOk(kA, {"cp", src_txt, PathOn(kA, "cp.txt")});
  EXPECT_EQ(RunOk(kB, {"cat", PathOn(kB, "cp.txt")}), text);
  EXPECT_EQ(ReadAll(PathOn(kB, "cp.txt")), text);
  EXPECT_TRUE(PartFiles(dmd(kB)).empty());
}

// A program that looks before it opens: stat, `test -f`, cp (which stats
// its source first) and Python's os.path.getsize see a file published on
// another node (it is brought here at that look), and a name nobody
// published is missing at once, without waiting for a publication.
// Item 2 of the client's cost per consume: the read-only probe opens with
// the caller's own flags, so a FIFO in the consumer directory is opened as
// without DYAD (blocking until its writer comes) and passed through, with
// no request to the service (DYAD publishes regular files only).
TEST_F(PreloadTest, FifoInTheConsumerDirectoryIsPassedThrough) {
  const std::string fifo = PathOn(kB, "pipe");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const uint64_t before = Counter(kB, "requests.consume");
  const std::string out = work_ + "/fifo-writer.out";
  auto writer = cluster().SpawnOnNode(
      kB, {"sh", "-c", "sleep 0.3; printf fifo-data > '" + fifo + "'"}, {}, out);
  ASSERT_TRUE(writer.ok()) << Str(writer.status());
  EXPECT_EQ(RunOk(kB, {"cat", fifo}, {}, 20000), "fifo-data");
  auto st = writer->Wait(Deadline::AfterMs(20000));
  if (!st.ok()) writer->Kill();
  EXPECT_EQ(Counter(kB, "requests.consume"), before);
  ::unlink(fifo.c_str());
}

TEST_F(PreloadTest, LookingAtAPublishedFileBringsItHere) {
  const std::string data = RandomBytes(64 * 1024 + 3, 7);
  const std::string src = work_ + "/look.bin";
  WriteAll(src, data);
  RunOk(kA, {"cp", src, PathOn(kA, "look1.bin")});
  RunOk(kA, {"cp", src, PathOn(kA, "look2.bin")});
  RunOk(kA, {"cp", src, PathOn(kA, "look3.bin")});
  RunOk(kA, {"cp", src, PathOn(kA, "look4.bin")});
  ASSERT_FALSE(Exists(PathOn(kB, "look1.bin")));

  // GNU stat (statx), then bash's test (stat), cp's source (statx/fstatat).
  EXPECT_EQ(RunOk(kB, {"stat", "-c", "%s", PathOn(kB, "look1.bin")}),
            std::to_string(data.size()) + "\n");
  EXPECT_EQ(ReadAll(PathOn(kB, "look1.bin")), data);
  EXPECT_EQ(RunOk(kB, {"bash", "-c", "test -f '" + PathOn(kB, "look2.bin") + "' && echo yes"}),
            "yes\n");
  const std::string copy = work_ + "/look-copy.bin";
  RunOk(kB, {"cp", PathOn(kB, "look3.bin"), copy});
  EXPECT_EQ(ReadAll(copy), data);
  EXPECT_EQ(
      RunOk(kB, {"/usr/bin/python3", "-c", "import os,sys; print(os.path.getsize(sys.argv[1]))",
                 PathOn(kB, "look1.bin")}),
      std::to_string(data.size()) + "\n");

  // Never published: missing at once, though a consume would wait 30 s.
  const uint64_t t0 = MonoNs();
  auto r = cluster().RunOnNode(kB, {"stat", PathOn(kB, "never.bin")}, 20000, PreloadEnv());
  ASSERT_TRUE(r.ok()) << Str(r.status());
  EXPECT_FALSE(r->timed_out);
  EXPECT_FALSE(r->status.success()) << r->output;
  EXPECT_NE(r->output.find("No such file"), std::string::npos) << r->output;
  EXPECT_LT(MonoNs() - t0, 10ull * 1000000000ull);
  EXPECT_FALSE(Exists(PathOn(kB, "never.bin")));
  EXPECT_EQ(RunOk(kB, {"bash", "-c", "test -e '" + PathOn(kB, "never.bin") + "' || echo missing"}),
            "missing\n");
}

// Programs built against a C library older than glibc 2.33 look at files
// through __xstat, __xstat64, __lxstat, __lxstat64, __fxstatat and
// __fxstatat64, bound to those symbols' original versions (their stat,
// lstat and fstatat were inline wrappers). dyad-preload-oldstat makes
// exactly such references (.symver); under the library each of the six
// brings a file published on A here with the right size, and leaves errno
// as it was; a look at a file here asks the service nothing; a name nobody
// published stays ENOENT at once (one request per look, never a wait), and
// the version argument reaches the C library unchanged (a bad one: EINVAL).
TEST_F(PreloadTest, OldGlibcStatEntryPointsBringPublishedFiles) {
  const std::string oldstat = std::string(DYAD_BUILD_BIN_DIR) + "/dyad-preload-oldstat";
  if (!Exists(oldstat))
    GTEST_SKIP() << "this C library has no __xstat/__lxstat/__fxstatat compatibility symbols "
                    "(dyad-preload-oldstat was not built)";
  const std::vector<std::string> ops = {"xstat",    "xstat64",  "lxstat",
                                        "lxstat64", "fxstatat", "fxstatat64"};
  std::map<std::string, std::string> data;
  for (size_t i = 0; i < ops.size(); ++i) {
    const std::string& op = ops[i];
    data[op] = RandomBytes(50000 + 777 * i, 40 + static_cast<uint32_t>(i));
    const std::string src = work_ + "/old-" + op + ".bin";
    WriteAll(src, data[op]);
    RunOk(kA, {"cp", src, PathOn(kA, "old-" + op + ".bin")});
    ASSERT_FALSE(Exists(PathOn(kB, "old-" + op + ".bin")));
  }
  // Each op looks at its own file; the expected line has the producer's size.
  auto looks = [&](const std::string& stem) {
    std::vector<std::string> argv = {oldstat};
    for (const auto& op : ops) {
      argv.push_back(op);
      argv.push_back(PathOn(kB, stem + op + ".bin"));
    }
    return argv;
  };
  std::string found;
  for (const auto& op : ops)
    found += op + " rc=0 errno=kept size=" + std::to_string(data[op].size()) + "\n";

  // The references are the old versioned symbols and bind to the library
  // (the dynamic linker's own account of it).
  const std::string bindings = work_ + "/bindings";
  const uint64_t asked = NamesAsked(kB);
  const uint64_t transfers = Counter(kB, "transfers.in");
  EXPECT_EQ(RunOk(kB, looks("old-"), {{"LD_DEBUG", "bindings"}, {"LD_DEBUG_OUTPUT", bindings}}),
            found);
  EXPECT_EQ(NamesAsked(kB), asked + ops.size()) << "one request per look";
  EXPECT_EQ(Counter(kB, "transfers.in"), transfers + ops.size());
  for (const auto& op : ops)
    EXPECT_TRUE(ReadAll(PathOn(kB, "old-" + op + ".bin")) == data[op]) << op << ": other bytes";
  std::string log;
  for (const auto& entry : std::filesystem::directory_iterator(work_))
    if (entry.path().filename().string().rfind("bindings.", 0) == 0) log += ReadAll(entry.path());
  for (const auto& op : ops) {
    // e.g. "binding file .../dyad-preload-oldstat [0] to .../libdyad_wrapper.so [0]:
    // normal symbol `__xstat' [GLIBC_2.2.5]"
    const std::string sym = "`__" + op + "' [GLIBC_";
    bool bound = false;
    std::istringstream lines(log);
    for (std::string line; std::getline(lines, line);)
      bound = bound || (line.find("binding file " + oldstat + " ") != std::string::npos &&
                        line.find(" to " + lib_ + " ") != std::string::npos &&
                        line.find(sym) != std::string::npos);
    EXPECT_TRUE(bound) << "__" << op << " of the program is not bound to " << lib_
                       << " at a GLIBC version:\n"
                       << log.substr(0, 4000);
  }

  // Here now: the real call finds each file and nobody is asked.
  const uint64_t here = NamesAsked(kB);
  EXPECT_EQ(RunOk(kB, looks("old-")), found);
  EXPECT_EQ(NamesAsked(kB), here);
  EXPECT_EQ(Counter(kB, "transfers.in"), transfers + ops.size());

  // Nobody published these: ENOENT at once (a consume would wait 30 s),
  // one request per look, nothing made here.
  std::string missing;
  for (const auto& op : ops) missing += op + " rc=-1 errno=ENOENT size=-1\n";
  const uint64_t before_missing = NamesAsked(kB);
  const uint64_t t0 = MonoNs();
  EXPECT_EQ(RunOk(kB, looks("never-")), missing);
  EXPECT_LT(MonoNs() - t0, 10ull * 1000000000ull);
  EXPECT_EQ(NamesAsked(kB), before_missing + ops.size());
  for (const auto& op : ops) EXPECT_FALSE(Exists(PathOn(kB, "never-" + op + ".bin")));

  // The version argument is the C library's to judge.
  EXPECT_EQ(RunOk(kB, {oldstat, "badver", PathOn(kB, "old-xstat.bin")}),
            "badver rc=-1 errno=EINVAL size=-1\n");
}

// A training job finds its data by listing a directory: on B, before
// anything there opened them, `ls -1`, os.listdir, os.scandir (d_type, no
// stat), glob.glob and pathlib's rglob find every file published on A,
// also below a subdirectory B does not have yet; reading each gives its
// exact bytes; a name both here and published appears once.
TEST_F(PreloadTest, ListingAConsumerDirectoryShowsFilesPublishedElsewhere) {
  list_ = true;
  const std::vector<std::string> names = {"lst1.bin",          "lst2.bin",      "lst3.txt",
                                          "deep/sub/lst4.bin", "deep/lst5.bin", "both.bin"};
  ASSERT_EQ(::mkdir(PathOn(kA, "deep").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(PathOn(kA, "deep/sub").c_str(), 0755), 0);
  std::map<std::string, std::string> data;
  uint32_t seed = 40;
  for (const std::string& n : names) {
    data[n] = RandomBytes(4000 + seed, seed);
    const std::string src = work_ + "/src-" + std::to_string(seed++);
    WriteAll(src, data[n]);
    RunOk(kA, {"cp", src, PathOn(kA, n)});
  }
  WriteAll(PathOn(kB, "both.bin"), data["both.bin"]);  // here too (as if brought before)
  WriteAll(PathOn(kB, "local-only.dat"), "local");
  ASSERT_FALSE(Exists(PathOn(kB, "lst1.bin")));
  ASSERT_FALSE(Exists(PathOn(kB, "deep")));

  // ls (readdir64): each name once, the subdirectory too.
  const std::string ls = RunOk(kB, {"ls", "-1", dmd(kB)});
  for (const char* n :
       {"lst1.bin\n", "lst2.bin\n", "lst3.txt\n", "deep\n", "both.bin\n", "local-only.dat\n"}) {
    const size_t at = ls.find(n);
    EXPECT_TRUE(at != std::string::npos && (at == 0 || ls[at - 1] == '\n')) << n << " in\n" << ls;
    EXPECT_EQ(ls.find(n, at + 1), std::string::npos) << n << " twice in\n" << ls;
  }

  // os.scandir gives DT_REG/DT_DIR without a stat: nothing is brought yet.
  const std::string scan = RunOk(
      kB,
      {"/usr/bin/python3", "-c",
       "import os,sys\n"
       "for e in sorted(os.scandir(sys.argv[1]), key=lambda e: e.name):\n"
       "  if e.name.startswith(('lst','deep','both')): print(e.name, e.is_file(), e.is_dir())\n"
       "print(sorted(n for n in os.listdir(sys.argv[1]) if n.startswith(('lst','deep','both'))))\n",
       dmd(kB)});
  EXPECT_EQ(scan,
            "both.bin True False\ndeep False True\nlst1.bin True False\nlst2.bin True False\n"
            "lst3.txt True False\n"
            "['both.bin', 'deep', 'lst1.bin', 'lst2.bin', 'lst3.txt']\n");
  EXPECT_FALSE(Exists(PathOn(kB, "lst1.bin")));

  // glob and rglob, then every file read through open: exact bytes.
  const std::string py =
      "import glob,os,pathlib,sys\n"
      "d=sys.argv[1]\n"
      "print(sorted(os.path.basename(p) for p in glob.glob(d + '/*.bin')))\n"
      "def fnv(b):\n"
      "  h=1469598103934665603\n"
      "  for c in b: h=((h^c)*1099511628211)&0xffffffffffffffff\n"
      "  return h\n"
      "for p in sorted(pathlib.Path(d).rglob('*')):\n"
      "  r=str(p.relative_to(d))\n"
      "  if p.is_dir(): print(r, 'dir')\n"
      "  elif r!='local-only.dat':\n"
      "    b=open(p,'rb').read(); print(r, len(b), '%016x' % fnv(b))\n";
  std::string expect = "['both.bin', 'lst1.bin', 'lst2.bin']\n";
  // sorted() of paths compares them component by component.
  for (const char* n : {"both.bin", "deep", "deep/lst5.bin", "deep/sub", "deep/sub/lst4.bin",
                        "lst1.bin", "lst2.bin", "lst3.txt"}) {
    if (data.count(n) == 0) {
      expect += std::string(n) + " dir\n";
      continue;
    }
    char buf[64];
    std::snprintf(buf, sizeof(buf), " %zu %016" PRIx64 "\n", data[n].size(), Fnv(data[n]));
    expect += std::string(n) + buf;
  }
  auto lists_before = cluster().Counter(kB, "requests.list");
  EXPECT_EQ(RunOk(kB, {"/usr/bin/python3", "-c", py, dmd(kB)}), expect);
  for (const std::string& n : names) EXPECT_EQ(ReadAll(PathOn(kB, n)), data[n]) << n;
  // The glob and the walk of three directories: one listing request, the
  // others answered from it (a second one only on a machine so slow that
  // the script outlived the 5 s the names are kept).
  auto lists_after = cluster().Counter(kB, "requests.list");
  ASSERT_TRUE(lists_before.ok() && lists_after.ok());
  EXPECT_GE(*lists_after - *lists_before, 1u);
  EXPECT_LE(*lists_after - *lists_before, 2u);
}

// By default (and with DYAD_PRELOAD_LIST=0) a listing gives the real
// entries only (and a directory only published elsewhere stays missing); a
// directory outside the managed ones lists exactly as without the library;
// DYAD_PRELOAD_LIST=1 merges.
// Item 4 of the client's cost per consume: a listing takes a relative
// name as every other call does (NameFor): with DYAD_PATH_RELATIVE against
// the managed directory, not the working directory. From a working
// directory outside it that has an empty "rl" of its own, `ls rl` shows the
// files published in the managed directory's rl/; without
// DYAD_PATH_RELATIVE it shows the working directory's rl only.
TEST_F(PreloadTest, ListingUnderPathRelativeTakesNamesAgainstTheManagedDirectory) {
  list_ = true;
  ASSERT_EQ(::mkdir(PathOn(kA, "rl").c_str(), 0755), 0);
  const std::string src = work_ + "/rl-src";
  WriteAll(src, "published in rl");
  RunOk(kA, {"cp", src, PathOn(kA, "rl/x.dat")});
  const std::string wd = cluster().node(kB).dir + "/wd";
  ASSERT_EQ(::mkdir(wd.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((wd + "/rl").c_str(), 0755), 0);
  const std::string cmd = "cd '" + wd + "' && ls -1 rl";
  EXPECT_EQ(RunOk(kB, {"/bin/sh", "-c", cmd}, {{"DYAD_PATH_RELATIVE", "1"}}), "x.dat\n");
  EXPECT_EQ(RunOk(kB, {"/bin/sh", "-c", cmd}), "");
}

TEST_F(PreloadTest, ListingIsOffByDefaultAndLeavesOtherDirectoriesAlone) {
  const std::string src = work_ + "/off.bin";
  WriteAll(src, RandomBytes(5000, 9));
  ASSERT_EQ(::mkdir(PathOn(kA, "offdir").c_str(), 0755), 0);
  RunOk(kA, {"cp", src, PathOn(kA, "off.bin")});
  RunOk(kA, {"cp", src, PathOn(kA, "offdir/in.bin")});
  WriteAll(PathOn(kB, "here.dat"), "here");

  for (const Env& env : {Env{}, Env{{"DYAD_PRELOAD_LIST", "0"}}}) {
    const std::string off = RunOk(kB, {"ls", "-1", dmd(kB)}, env);
    EXPECT_NE(off.find("here.dat\n"), std::string::npos) << off;
    EXPECT_EQ(off.find("off"), std::string::npos) << off;
  }
  auto r = cluster().RunOnNode(kB, {"ls", "-1", PathOn(kB, "offdir")}, 30000,
                               PreloadEnv({{"DYAD_PRELOAD_LIST", "0"}}));
  ASSERT_TRUE(r.ok()) << Str(r.status());
  EXPECT_FALSE(r->status.success()) << r->output;
  EXPECT_FALSE(Exists(PathOn(kB, "offdir")));

  // Outside: the same listing with and without the library.
  const std::string plain = work_ + "/plain-list";
  ASSERT_EQ(::mkdir(plain.c_str(), 0755), 0);
  for (const char* n : {"x.bin", "off.bin", "lst1.bin"}) WriteAll(plain + "/" + n, n);
  const std::string with = RunOk(kB, {"ls", "-1a", plain});
  auto w = cluster().RunOnNode(kB, {"ls", "-1a", plain}, 30000, {});
  ASSERT_TRUE(w.ok() && w->status.success());
  EXPECT_EQ(with, w->output);
  EXPECT_EQ(with, ".\n..\nlst1.bin\noff.bin\nx.bin\n");

  // DYAD_PRELOAD_LIST=1 merges, and a published-only subdirectory opens (opendir
  // of it asks; `ls` of it in a process that has not listed its parent
  // looks at it first, and a look never lists: ENOENT, as documented).
  list_ = true;
  const std::string on = RunOk(kB, {"ls", "-1", dmd(kB)});
  EXPECT_NE(on.find("off.bin\n"), std::string::npos) << on;
  EXPECT_NE(on.find("offdir\n"), std::string::npos) << on;
  EXPECT_EQ(RunOk(kB, {"/usr/bin/python3", "-c", "import os,sys; print(os.listdir(sys.argv[1]))",
                       PathOn(kB, "offdir")}),
            "['in.bin']\n");
  EXPECT_EQ(RunOk(kB, {"ls", "-1", PathOn(kB, "offdir")}), "in.bin\n");
}

// GNU find (fts: openat + fdopendir, fstatat on each directory before it
// descends) walks into directories only published elsewhere.
TEST_F(PreloadTest, ListingFindWalksIntoPublishedDirectories) {
  list_ = true;
  const std::string src = work_ + "/find.bin";
  WriteAll(src, RandomBytes(2000, 12));
  ASSERT_EQ(::mkdir(PathOn(kA, "f1").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(PathOn(kA, "f1/f2").c_str(), 0755), 0);
  for (const char* n : {"top.bin", "f1/mid.bin", "f1/f2/low.bin"})
    RunOk(kA, {"cp", src, PathOn(kA, n)});
  EXPECT_EQ(RunOk(kB, {"bash", "-c", "cd '" + dmd(kB) + "' && find . -name '*.bin' | sort"}),
            "./f1/f2/low.bin\n./f1/mid.bin\n./top.bin\n");
}

// A C program's stream of a consumer directory (opendir, and fdopendir as
// GNU find uses): published names after the real ones, each once, with
// d_type and a nonzero d_ino; telldir/seekdir land on the same entries and
// rewinddir reads the same stream again.
TEST_F(PreloadTest, ListingStreamSeeksAndRewindsOverPublishedNames) {
  list_ = true;
  const std::string src = work_ + "/seek.bin";
  WriteAll(src, RandomBytes(3000, 11));
  ASSERT_EQ(::mkdir(PathOn(kA, "sub").c_str(), 0755), 0);
  for (const char* n : {"a.bin", "b.bin", "sub/c.bin"}) RunOk(kA, {"cp", src, PathOn(kA, n)});
  WriteAll(PathOn(kB, "b.bin"), "here");
  WriteAll(PathOn(kB, "local.dat"), "here");
  for (const char* how : {"opendir", "fdopendir"}) {
    const std::string out = RunOk(kB, {helper_, "list", dmd(kB), how});
    for (const char* line : {"a.bin REG\n", "b.bin REG\n", "sub DIR\n", "local.dat REG\n",
                             "seek ok\n", "rewind ok\n"}) {
      const size_t at = out.find(line);
      EXPECT_TRUE(at != std::string::npos && (at == 0 || out[at - 1] == '\n'))
          << how << ": " << line << " in\n"
          << out;
      EXPECT_EQ(out.find(line, at + 1), std::string::npos) << how << ": twice\n" << out;
    }
    EXPECT_LT(out.find("local.dat"), out.find("a.bin")) << how << ": real entries first\n" << out;
    EXPECT_EQ(out.find("ino0"), std::string::npos) << out;
  }
  EXPECT_FALSE(Exists(PathOn(kB, "a.bin")));  // listed, not brought
}

// The service is away: a listing shows the files here, succeeds, and says
// so once on stderr.
TEST_F(PreloadTest, ListingWithServiceAwayShowsLocalFilesAndSaysSoOnce) {
  list_ = true;
  WriteAll(PathOn(kB, "here.dat"), "here");
  ASSERT_EQ(::mkdir(PathOn(kB, "hsub").c_str(), 0755), 0);
  const Env dead = {{"DYAD_SERVICE_SOCKET", work_ + "/no-such.sock"}};
  const std::string out = RunOk(kB, {"ls", "-1", dmd(kB), PathOn(kB, "hsub")}, dead);
  EXPECT_NE(out.find("here.dat\n"), std::string::npos) << out;
  const size_t first = out.find("dyad-preload");
  ASSERT_NE(first, std::string::npos) << out;
  EXPECT_NE(out.find("the listing shows the files here only"), std::string::npos) << out;
  EXPECT_EQ(out.find("dyad-preload", first + 1), std::string::npos) << "more than once:\n" << out;
}

// A consumer must not see the file while the producer still holds it open.
TEST_F(PreloadTest, ConsumerWaitsForLastCloseNotForCreate) {
  const std::string out = work_ + "/reader.out";
  emu::Process reader = Start(kB, {helper_, "read-threads", PathOn(kB, "held.dat")}, out);
  const std::string wout = work_ + "/writer.out";
  emu::Process writer =
      Start(kA, {helper_, "write-openat", dmd(kA), "held.dat", "200000", "1500"}, wout);
  // The writer keeps the file open for 1.5 s after writing it all.
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  EXPECT_FALSE(writer.Exited());
  EXPECT_FALSE(reader.Exited()) << "consumer read a file still open for writing:\n" << ReadAll(out);
  FinishOk(writer, wout);
  FinishOk(reader, out);
  EXPECT_EQ(ReadAll(out),
            HelperLine(PathOn(kB, "held.dat"), ReadAll(PathOn(kA, "held.dat"))) + "\n");
}

TEST_F(PreloadTest, DdWritesThroughDup2) {
  const std::string data = RandomBytes(2 * kMiB, 2);
  const std::string src = work_ + "/dd.src";
  WriteAll(src, data);
  RunOk(kA, {"dd", "if=" + src, "of=" + PathOn(kA, "dd.bin"), "bs=65536", "status=none"});
  EXPECT_EQ(RunOk(kB, {"sha256sum", PathOn(kB, "dd.bin")}), Sha256Of(data, PathOn(kB, "dd.bin")));
}

TEST_F(PreloadTest, TarExtractThenReadEveryFile) {
  const std::string tree = work_ + "/tree";
  ASSERT_EQ(::mkdir(tree.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((tree + "/sub").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((tree + "/sub/deep").c_str(), 0755), 0);
  const std::map<std::string, std::string> files = {
      {"t/a.txt", TextLines(100, "a")},
      {"t/sub/b.bin", RandomBytes(300000, 3)},
      {"t/sub/deep/c.txt", TextLines(5000, "c")},
      {"t/sub/empty.dat", ""},
  };
  for (const auto& [name, data] : files) WriteAll(tree + "/" + name.substr(2), data);
  const std::string tarball = work_ + "/tree.tar";
  emu::SpawnOptions o;
  o.argv = {"tar", "-cf", tarball, "-C", work_, "--transform=s,^tree,t,", "tree"};
  auto made = emu::RunCapture(o, 30000);
  ASSERT_TRUE(made.ok() && made->status.success()) << (made.ok() ? made->output : "");

  RunOk(kA, {"tar", "-xf", tarball, "-C", dmd(kA)});
  for (const auto& [name, data] : files) {
    EXPECT_EQ(RunOk(kB, {"cat", PathOn(kB, name)}), data) << name;
  }
}

TEST_F(PreloadTest, PythonReadsWithOpenRb) {
  const std::string data = RandomBytes(kMiB + 5, 4);
  const std::string src = work_ + "/py.src";
  WriteAll(src, data);
  const std::string out = work_ + "/py.out";
  emu::Process py =
      Start(kB,
            {"/usr/bin/python3", "-c",
             "import sys, hashlib\n"
             "with open(sys.argv[1], 'rb') as f: print(hashlib.sha256(f.read()).hexdigest())\n",
             PathOn(kB, "py.bin")},
            out);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  RunOk(kA, {"cp", src, PathOn(kA, "py.bin")});
  FinishOk(py, out);
  EXPECT_EQ(ReadAll(out), Sha256Of(data, "x").substr(0, 64) + "\n");

  // Python as the producer too (open(..., "wb") from two threads).
  RunOk(kA, {"/usr/bin/python3", "-c",
             "import sys, threading\n"
             "def w(i):\n"
             "    with open(sys.argv[1] + '/pyw%d.txt' % i, 'wb') as f:\n"
             "        f.write(b'python %d\\n' % i * 1000)\n"
             "ts = [threading.Thread(target=w, args=(i,)) for i in range(2)]\n"
             "[t.start() for t in ts]; [t.join() for t in ts]\n",
             dmd(kA)});
  for (int i = 0; i < 2; ++i) {
    std::string expected;
    for (int k = 0; k < 1000; ++k) expected += "python " + std::to_string(i) + "\n";
    EXPECT_EQ(RunOk(kB, {"cat", PathOn(kB, "pyw" + std::to_string(i) + ".txt")}), expected);
  }
}

// A reader of a copy complete here holds no lock (docs/preload.md, "Copies
// already here"). A program on that node that then rewrites the file (cp
// over it: an open with O_TRUNC) gets a new file at the name, so the
// reader, which opened the copy before, still reads all of the old bytes,
// and later readers get the new ones.
TEST_F(PreloadTest, RewriteOfACopyHereLeavesAnOpenReaderItsWholeFile) {
  const std::string v1 = RandomBytes(2 * kMiB + 7, 11), v2 = RandomBytes(kMiB + 3, 12);
  WriteAll(work_ + "/rw.v1", v1);
  WriteAll(work_ + "/rw.v2", v2);
  RunOk(kA, {"cp", work_ + "/rw.v1", PathOn(kA, "rw.bin")});
  EXPECT_EQ(RunOk(kB, {"sha256sum", PathOn(kB, "rw.bin")}), Sha256Of(v1, PathOn(kB, "rw.bin")));
  const std::string ready = work_ + "/rw.ready", go = work_ + "/rw.go", out = work_ + "/rw.out";
  emu::Process reader = Start(kB,
                              {"/usr/bin/python3", "-c",
                               "import sys, os, time, hashlib\n"
                               "path, ready, go = sys.argv[1:4]\n"
                               "with open(path, 'rb') as f:\n"
                               "    a = f.read(1 << 20)\n"
                               "    open(ready, 'w').close()\n"
                               "    t = time.time()\n"
                               "    while not os.path.exists(go):\n"
                               "        if time.time() - t > 30: sys.exit('no go')\n"
                               "        time.sleep(0.01)\n"
                               "    b = f.read()\n"
                               "print(len(a) + len(b), hashlib.sha256(a + b).hexdigest())\n",
                               PathOn(kB, "rw.bin"), ready, go},
                              out);
  const Deadline by = Deadline::AfterMs(30000);
  while (!Exists(ready) && !by.expired() && !reader.Exited())
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(Exists(ready)) << ReadAll(out);
  // Not waited for (the reader holds no lock), and no torn copy for it.
  RunOk(kB, {"cp", work_ + "/rw.v2", PathOn(kB, "rw.bin")});
  WriteAll(go, "");
  FinishOk(reader, out);
  EXPECT_EQ(ReadAll(out), std::to_string(v1.size()) + " " + Sha256Of(v1, "x").substr(0, 64) + "\n");
  EXPECT_EQ(RunOk(kB, {"sha256sum", PathOn(kB, "rw.bin")}), Sha256Of(v2, PathOn(kB, "rw.bin")));
  // A truncating open leaves errno as it was, whether it replaced a copy
  // placed here (the first) or truncated a file of this node's (the second).
  RunOk(kA, {"cp", work_ + "/rw.v1", PathOn(kA, "rw-errno.bin")});
  EXPECT_EQ(RunOk(kB, {"sha256sum", PathOn(kB, "rw-errno.bin")}),
            Sha256Of(v1, PathOn(kB, "rw-errno.bin")));
  EXPECT_EQ(
      RunOk(kB, {helper_, "calls", "trunc", PathOn(kB, "rw-errno.bin"), PathOn(kB, "rw-errno.bin"),
                 "trunc", PathOn(kB, "rw.bin"), PathOn(kB, "rw.bin")}),
      "trunc rc=0 errno=kept\ntrunc rc=0 errno=kept\n");
  // The temporary name is gone.
  for (const auto& e : std::filesystem::directory_iterator(dmd(kB)))
    EXPECT_EQ(e.path().filename().string().find(".dyad-rewrite."), std::string::npos) << e.path();
}

TEST_F(PreloadTest, OpenatRdwrProducer) {
  // With DYAD_FSYNC_WRITE the publication also goes through the fsync path.
  RunOk(kA, {helper_, "write-openat", dmd(kA), "rdwr.dat", "123457"}, {{"DYAD_FSYNC_WRITE", "1"}});
  const std::string produced = ReadAll(PathOn(kA, "rdwr.dat"));
  ASSERT_EQ(produced.size(), 123457u);
  EXPECT_EQ(RunOk(kB, {helper_, "read-threads", PathOn(kB, "rdwr.dat")}),
            HelperLine(PathOn(kB, "rdwr.dat"), produced) + "\n");
}

// A file open several times (open, fopen, an fcntl duplicate) is published
// once, at its last close, with all of its bytes.
TEST_F(PreloadTest, FileOpenedTwicePublishesOnceAtLastClose) {
  const uint64_t before = Counter(kA, "requests.publish");
  EXPECT_EQ(RunOk(kA, {helper_, "write-twice", dmd(kA), "twice.dat", "100000"}),
            "closed first\nclosed second\nclosed last\n");
  EXPECT_EQ(Counter(kA, "requests.publish"), before + 1);
  const std::string produced = ReadAll(PathOn(kA, "twice.dat"));
  ASSERT_EQ(produced.size(), 100000u);
  EXPECT_EQ(RunOk(kB, {helper_, "read-threads", PathOn(kB, "twice.dat")}),
            HelperLine(PathOn(kB, "twice.dat"), produced) + "\n");
}

// A program that exits with the file still open publishes it at exit.
TEST_F(PreloadTest, FileLeftOpenAtExitIsPublished) {
  RunOk(kA, {helper_, "write-noclose", dmd(kA), "noclose.dat", "4321"});
  const std::string produced = ReadAll(PathOn(kA, "noclose.dat"));
  ASSERT_EQ(produced.size(), 4321u);
  EXPECT_EQ(RunOk(kB, {helper_, "read-threads", PathOn(kB, "noclose.dat")}),
            HelperLine(PathOn(kB, "noclose.dat"), produced) + "\n");
}

// Relative names: against the working directory (cp run inside the managed
// directory), and with DYAD_PATH_RELATIVE against the managed directory.
TEST_F(PreloadTest, RelativeNames) {
  const std::string text = TextLines(1000, "rel");
  WriteAll(work_ + "/rel.src", text);
  RunOk(kA, {"/bin/sh", "-c", "cd '" + dmd(kA) + "' && cp '" + work_ + "/rel.src' rel.txt"});
  EXPECT_EQ(RunOk(kB, {"/bin/sh", "-c", "cd '" + dmd(kB) + "' && cat rel.txt"}), text);
  // DYAD_PATH_RELATIVE: the consumer names the file relative to the managed
  // directory while its working directory is that directory too.
  RunOk(kA, {"cp", work_ + "/rel.src", PathOn(kA, "rel2.txt")});
  EXPECT_EQ(RunOk(kB, {"/bin/sh", "-c", "cd '" + dmd(kB) + "' && cat rel2.txt"},
                  {{"DYAD_PATH_RELATIVE", "1"}}),
            text);
}

// Children forked by a preloaded producer publish their own files; the
// parent publishes its own once; an 8-thread reader gets them all.
TEST_F(PreloadTest, ForkingProducerAndEightThreadReader) {
  std::vector<std::string> names;
  for (int i = 0; i < 7; ++i) names.push_back("fork" + std::to_string(i) + ".dat");
  names.push_back("parent.dat");
  std::vector<std::string> argv = {helper_, "read-threads"};
  for (const auto& n : names) argv.push_back(PathOn(kB, n));
  const std::string out = work_ + "/threads.out";
  emu::Process reader = Start(kB, argv, out);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  RunOk(kA, {helper_, "fork-produce", dmd(kA), "7", "50000"});
  FinishOk(reader, out);
  std::string expected;
  for (const auto& n : names) expected += HelperLine(PathOn(kB, n), ReadAll(PathOn(kA, n))) + "\n";
  EXPECT_EQ(ReadAll(out), expected);
  EXPECT_EQ(ReadAll(PathOn(kA, "fork3.dat")).size(), 50003u);
}

// Eight threads of one process write eight files at once; eight threads of
// a reader started first get them all.
TEST_F(PreloadTest, EightThreadWriterEightThreadReader) {
  std::vector<std::string> argv = {helper_, "read-threads"};
  for (int i = 0; i < 8; ++i) argv.push_back(PathOn(kB, "thr" + std::to_string(i) + ".dat"));
  const std::string out = work_ + "/thr.out";
  emu::Process reader = Start(kB, argv, out);
  RunOk(kA, {helper_, "write-threads", dmd(kA), "8", "70000"});
  FinishOk(reader, out);
  std::string expected;
  for (int i = 0; i < 8; ++i) {
    const std::string n = "thr" + std::to_string(i) + ".dat";
    expected += HelperLine(PathOn(kB, n), ReadAll(PathOn(kA, n))) + "\n";
  }
  EXPECT_EQ(ReadAll(out), expected);
  EXPECT_EQ(Counter(kA, "requests.publish"), 8u);
}

// Outside the managed directories the library changes nothing: same
// results and errno as without it.
TEST_F(PreloadTest, NonManagedPathsBehaveAsWithoutLibrary) {
  const std::string dir_a = work_ + "/plain-a", dir_b = work_ + "/plain-b";
  ASSERT_EQ(::mkdir(dir_a.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(dir_b.c_str(), 0755), 0);
  const std::string with = RunOk(kA, {helper_, "probe", dir_a});
  auto r = cluster().RunOnNode(kA, {helper_, "probe", dir_b}, 30000, {});
  ASSERT_TRUE(r.ok() && r->status.success());
  std::string without = r->output;
  EXPECT_EQ(with, without);
  EXPECT_NE(with.find("open-missing rc=-1 errno=ENOENT"), std::string::npos) << with;
  EXPECT_NE(with.find("excl-existing rc=-1 errno=EEXIST"), std::string::npos) << with;
  EXPECT_NE(with.find("open-dir-as-file rc=-1 errno=EISDIR"), std::string::npos) << with;
  EXPECT_NE(with.find("errno-after-success 1234"), std::string::npos) << with;
  EXPECT_NE(with.find("close-bad rc=-1 errno=EBADF"), std::string::npos) << with;
  // And nothing was published for them.
  EXPECT_EQ(Counter(kA, "requests.publish"), 0u);
}

// Service unreachable: one clear message, the managed open fails (default)
// or passes through (DYAD_PRELOAD_ON_ERROR=pass); other paths unaffected.
TEST_F(PreloadTest, UnreachableServiceFailsOrPassesAsConfigured) {
  WriteFileOn(kB, "local.dat", 1000);
  const Env dead = {{"DYAD_SERVICE_SOCKET", work_ + "/no-such.sock"}};
  auto r = cluster().RunOnNode(kB, {"cat", PathOn(kB, "local.dat"), PathOn(kB, "other.dat")}, 30000,
                               PreloadEnv(dead));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->status.success());
  size_t first = r->output.find("dyad-preload");
  ASSERT_NE(first, std::string::npos) << r->output;
  EXPECT_EQ(r->output.find("dyad-preload", first + 1), std::string::npos)
      << "more than one message:\n"
      << r->output;

  Env pass = dead;
  pass["DYAD_PRELOAD_ON_ERROR"] = "pass";
  auto p = cluster().RunOnNode(kB, {"cat", PathOn(kB, "local.dat")}, 30000, PreloadEnv(pass));
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->status.success()) << p->output;
  EXPECT_NE(p->output.find("dyad-preload"), std::string::npos) << p->output;
  EXPECT_EQ(p->output.size() - p->output.find('\n') - 1, 1000u);
}

// Issue 26 item 11: preloaded with neither DYAD_PATH_CONSUMER nor
// DYAD_PATH_PRODUCER, `cat` said only ENOENT. One line per process now says
// what to set; the program's calls and errno are as without the library,
// and DYAD_PRELOAD_QUIET=1 hides the line.
TEST_F(PreloadTest, Issue26Item11_NoManagedDirectorySaysWhatToSetOncePerProcess) {
  const Env unmanaged = {{"DYAD_PATH_CONSUMER", ""}, {"DYAD_PATH_PRODUCER", ""}};
  const std::string missing = PathOn(kB, "not-here.dat");
  auto r =
      cluster().RunOnNode(kB, {"cat", missing, missing, missing}, 30000, PreloadEnv(unmanaged));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->status.success());
  EXPECT_NE(r->output.find("No such file"), std::string::npos) << r->output;
  const size_t first = r->output.find("dyad-preload");
  ASSERT_NE(first, std::string::npos) << r->output;
  EXPECT_EQ(r->output.find("dyad-preload", first + 1), std::string::npos) << "more than one line:\n"
                                                                          << r->output;
  EXPECT_NE(r->output.find("set DYAD_PATH_CONSUMER", first), std::string::npos) << r->output;

  // The probe's results (errno included) are those without the library.
  const std::string dir = work_ + "/unmanaged", plain = work_ + "/unmanaged-plain";
  ASSERT_EQ(::mkdir(dir.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(plain.c_str(), 0755), 0);
  auto with = cluster().RunOnNode(kB, {helper_, "probe", dir}, 30000, PreloadEnv(unmanaged));
  ASSERT_TRUE(with.ok() && with->status.success()) << (with.ok() ? with->output : "");
  auto without = cluster().RunOnNode(kB, {helper_, "probe", plain}, 30000, {});
  ASSERT_TRUE(without.ok() && without->status.success());
  std::string w = with->output;
  const size_t line = w.find("dyad-preload");
  ASSERT_NE(line, std::string::npos) << w;
  w.erase(line, w.find('\n', line) + 1 - line);
  EXPECT_EQ(w, without->output);

  Env quiet = unmanaged;
  quiet["DYAD_PRELOAD_QUIET"] = "1";
  auto q = cluster().RunOnNode(kB, {"cat", missing}, 30000, PreloadEnv(quiet));
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->output.find("dyad-preload"), std::string::npos) << q->output;
}

// ---------------------------------------------------------------------------
// Files renamed or linked into the producer directory (docs/preload.md,
// "Renamed and linked files"). Consumers get DYAD_CONSUME_TIMEOUT=10: on a
// library that does not publish such files they fail instead of hanging.

const Env kShortWait = {{"DYAD_CONSUME_TIMEOUT", "10"}};

// The content dyad-preload-helper writes for `name` (its Content()).
std::string HelperContent(const std::string& name, size_t size) {
  uint64_t x = Fnv(name);
  std::string v(size, '\0');
  for (size_t i = 0; i < size; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v[i] = static_cast<char>(x >> 56);
  }
  return v;
}

bool SameFileSystem(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return ::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev;
}

// `mv` of a finished file from outside into the producer directory (a
// rename, not a copy: same file system); a consumer started first gets it.
TEST_F(PreloadTest, MvOfFinishedFileIntoProducerDirectoryIsPublished) {
  const std::string data = RandomBytes(kMiB + 3, 11);
  const std::string src = work_ + "/mv.src";
  WriteAll(src, data);
  ASSERT_TRUE(SameFileSystem(src, dmd(kA))) << "mv would copy instead of renaming";
  const std::string out = work_ + "/mv.out";
  emu::Process sha = Start(kB, {"sha256sum", PathOn(kB, "mv.bin")}, out, kShortWait);
  RunOk(kA, {"mv", src, PathOn(kA, "mv.bin")});
  FinishOk(sha, out);
  EXPECT_EQ(ReadAll(out), Sha256Of(data, PathOn(kB, "mv.bin")));
  EXPECT_FALSE(Exists(src));
  EXPECT_EQ(Counter(kA, "requests.publish"), 1u);
}

// Python's atomic write: x.tmp written, then os.replace(x.tmp, x); twice,
// the second replacing a published version the consumer has read.
TEST_F(PreloadTest, PythonWritesTmpThenOsReplace) {
  const std::string script =
      "import os, sys\n"
      "d, src = sys.argv[1], sys.argv[2]\n"
      "with open(src, 'rb') as f: data = f.read()\n"
      "with open(os.path.join(d, 'x.tmp'), 'wb') as f: f.write(data)\n"
      "os.replace(os.path.join(d, 'x.tmp'), os.path.join(d, 'x'))\n";
  for (int version = 1; version <= 2; ++version) {
    const std::string data = RandomBytes(300000 + static_cast<size_t>(version), 20 + version);
    const std::string src = work_ + "/py" + std::to_string(version) + ".src";
    WriteAll(src, data);
    RunOk(kA, {"/usr/bin/python3", "-c", script, dmd(kA), src});
    EXPECT_EQ(RunOk(kB, {"cat", PathOn(kB, "x")}, kShortWait), data) << "version " << version;
  }
}

// O_TMPFILE + linkat: the /proc/self/fd/N + AT_SYMLINK_FOLLOW form and the
// AT_EMPTY_PATH form.
TEST_F(PreloadTest, TmpfileLinkatIsPublished) {
  for (const std::string form : {"proc", "empty"}) {
    const std::string name = "tmpfile-" + form + ".dat";
    EXPECT_EQ(RunOk(kA, {helper_, "tmpfile-link", dmd(kA), name, "150001", form}),
              "linkat rc=0 errno=-\n");
    EXPECT_EQ(ReadAll(PathOn(kA, name)), HelperContent(name, 150001));
    EXPECT_EQ(RunOk(kB, {helper_, "read-threads", PathOn(kB, name)}, kShortWait),
              HelperLine(PathOn(kB, name), HelperContent(name, 150001)) + "\n");
  }
  EXPECT_EQ(Counter(kA, "requests.publish"), 2u);
}

// A file renamed while this process still writes it is published once, at
// its last close, under the new name, with every byte.
TEST_F(PreloadTest, RenameOfFileStillOpenPublishesOnceAtCloseUnderNewName) {
  const std::string out = work_ + "/openren.out";
  emu::Process reader =
      Start(kB, {helper_, "read-threads", PathOn(kB, "openren.dat")}, out, kShortWait);
  EXPECT_EQ(RunOk(kA, {helper_, "write-rename", PathOn(kA, "openren.tmp"),
                       PathOn(kA, "openren.dat"), "200000"}),
            "renamed\nclosed rc=0\n");
  FinishOk(reader, out);
  EXPECT_EQ(ReadAll(out),
            HelperLine(PathOn(kB, "openren.dat"), HelperContent("openren.dat", 200000)) + "\n");
  EXPECT_EQ(Counter(kA, "requests.publish"), 1u);
}

// renameat (directory descriptors, relative names) over a published file:
// the consumer that read the old version gets the new one.
TEST_F(PreloadTest, RenameOverPublishedFileGivesConsumerNewVersion) {
  const std::string v1 = TextLines(3000, "v1"), v2 = TextLines(4000, "v2");
  WriteAll(work_ + "/v1", v1);
  WriteAll(work_ + "/v2", v2);
  RunOk(kA, {"cp", work_ + "/v1", PathOn(kA, "over.txt")});
  EXPECT_EQ(RunOk(kB, {"cat", PathOn(kB, "over.txt")}, kShortWait), v1);
  EXPECT_EQ(RunOk(kA, {helper_, "calls", "renameat", work_ + "/v2", PathOn(kA, "over.txt")}),
            "renameat rc=0 errno=kept\n");
  EXPECT_EQ(RunOk(kB, {"cat", PathOn(kB, "over.txt")}, kShortWait), v2);
  EXPECT_EQ(Counter(kA, "requests.publish"), 2u);
}

// A destination outside the managed directory publishes nothing, nor does
// a directory renamed in; a file this process writes that is renamed out is
// no longer published at its close (which succeeds), and a consumer of its
// old name times out.
TEST_F(PreloadTest, RenameToOutsidePublishesNothing) {
  EXPECT_EQ(
      RunOk(kA, {helper_, "write-rename", PathOn(kA, "gone.tmp"), work_ + "/gone.dat", "5000"}),
      "renamed\nclosed rc=0\n");
  EXPECT_EQ(ReadAll(work_ + "/gone.dat"), HelperContent("gone.dat", 5000));
  WriteAll(work_ + "/o1", "outside");
  EXPECT_EQ(RunOk(kA, {helper_, "calls", "rename", work_ + "/o1", work_ + "/o2", "link",
                       work_ + "/o2", work_ + "/o3"}),
            "rename rc=0 errno=kept\nlink rc=0 errno=kept\n");
  // A directory renamed in is not published (nor are the files inside it).
  ASSERT_EQ(::mkdir((work_ + "/dir").c_str(), 0755), 0);
  WriteAll(work_ + "/dir/inside.dat", "inside");
  EXPECT_EQ(RunOk(kA, {helper_, "calls", "rename", work_ + "/dir", PathOn(kA, "dir")}),
            "rename rc=0 errno=kept\n");
  EXPECT_EQ(ReadAll(PathOn(kA, "dir/inside.dat")), "inside");
  EXPECT_EQ(Counter(kA, "requests.publish"), 0u);
  const auto start = std::chrono::steady_clock::now();
  auto r = cluster().RunOnNode(kB, {"cat", PathOn(kB, "gone.tmp")}, 30000,
                               PreloadEnv({{"DYAD_CONSUME_TIMEOUT", "1"}}));
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->status.success()) << r->output;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(15));
}

// Failing calls keep their errno exactly and publish nothing; a successful
// call afterwards in the same process (renameat2 RENAME_NOREPLACE) does.
TEST_F(PreloadTest, FailingRenameKeepsErrnoAndPublishesNothing) {
  WriteAll(PathOn(kA, "exists.dat"), "already here");
  WriteAll(work_ + "/fresh.src", "fresh");
  const std::vector<std::string> failing = {
      "rename",    PathOn(kA, "missing"), PathOn(kA, "m1"),
      "noreplace", work_ + "/fresh.src",  PathOn(kA, "exists.dat"),
      "link",      PathOn(kA, "missing"), PathOn(kA, "m2"),
      "linkat",    work_ + "/fresh.src",  PathOn(kA, "exists.dat")};
  const std::string expected =
      "rename rc=-1 errno=ENOENT\nnoreplace rc=-1 errno=EEXIST\nlink rc=-1 errno=ENOENT\n"
      "linkat rc=-1 errno=EEXIST\n";
  std::vector<std::string> argv = {helper_, "calls"};
  argv.insert(argv.end(), failing.begin(), failing.end());
  // The same results without the library.
  auto plain = cluster().RunOnNode(kA, argv, 30000, {});
  ASSERT_TRUE(plain.ok() && plain->status.success());
  EXPECT_EQ(plain->output, expected);
  for (const std::string& s :
       std::vector<std::string>{"noreplace", work_ + "/fresh.src", PathOn(kA, "fresh.dat")})
    argv.push_back(s);
  EXPECT_EQ(RunOk(kA, argv), expected + "noreplace rc=0 errno=kept\n");
  EXPECT_EQ(Counter(kA, "requests.publish"), 1u);
  EXPECT_EQ(RunOk(kB, {"cat", PathOn(kB, "fresh.dat")}, kShortWait), "fresh");
}

// RENAME_EXCHANGE publishes both names; link and linkat publish the new
// name.
TEST_F(PreloadTest, RenameExchangeAndLinksPublishTheNewNames) {
  const std::string one = RandomBytes(1000, 31), two = RandomBytes(2000, 32);
  WriteAll(PathOn(kA, "ex1"), one);
  WriteAll(PathOn(kA, "ex2"), two);
  WriteAll(work_ + "/l1", "linked with link");
  WriteAll(work_ + "/l2", "linked with linkat");
  EXPECT_EQ(RunOk(kA, {helper_, "calls", "exchange", PathOn(kA, "ex1"), PathOn(kA, "ex2"), "link",
                       work_ + "/l1", PathOn(kA, "l1"), "linkat", work_ + "/l2", PathOn(kA, "l2")}),
            "exchange rc=0 errno=kept\nlink rc=0 errno=kept\nlinkat rc=0 errno=kept\n");
  EXPECT_EQ(Counter(kA, "requests.publish"), 4u);
  EXPECT_EQ(RunOk(kB, {"cat", PathOn(kB, "ex1")}, kShortWait), two);
  EXPECT_EQ(RunOk(kB, {"cat", PathOn(kB, "ex2")}, kShortWait), one);
  EXPECT_EQ(RunOk(kB, {"cat", PathOn(kB, "l1")}, kShortWait), "linked with link");
  EXPECT_EQ(RunOk(kB, {"cat", PathOn(kB, "l2")}, kShortWait), "linked with linkat");
}

// Holds LOCK_EX on `path` (as a producer writing it does) with flock(1),
// outside DYAD, for `secs`; returns once the lock is held.
emu::Process HoldLock(EmuCluster& cluster, const std::string& path, const std::string& secs,
                      const std::string& out) {
  auto p = cluster.SpawnOnNode(kA, {"flock", "-x", path, "sleep", secs}, {}, out);
  EXPECT_TRUE(p.ok()) << Str(p.status());
  if (!p.ok()) return emu::Process();
  const Deadline deadline = Deadline::AfterMs(10000);
  for (;;) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.valid() && ::flock(fd.get(), LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) break;
    if (fd.valid()) ::flock(fd.get(), LOCK_UN);
    if (deadline.expired() || p->Exited()) {
      ADD_FAILURE() << "flock did not take the lock:\n" << ReadAll(out);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return std::move(*p);
}

// A file another process still writes (it holds the producer's LOCK_EX) is
// published once that lock is released; a lock not released within
// DYAD_RPC_TIMEOUT fails the call (EIO, one stderr line), nothing published.
TEST_F(PreloadTest, RenameOfFileAnotherWriterHoldsWaitsForItsLock) {
  WriteAll(PathOn(kA, "locked.tmp"), "complete");
  emu::Process holder = HoldLock(cluster(), PathOn(kA, "locked.tmp"), "1.5", work_ + "/h1.out");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(
      RunOk(kA, {helper_, "calls", "rename", PathOn(kA, "locked.tmp"), PathOn(kA, "locked.dat")}),
      "rename rc=0 errno=kept\n");
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(700))
      << "published while another process held the file's lock";
  FinishOk(holder, work_ + "/h1.out");
  EXPECT_EQ(RunOk(kB, {"cat", PathOn(kB, "locked.dat")}, kShortWait), "complete");
  EXPECT_EQ(Counter(kA, "requests.publish"), 1u);

  emu::Process stuck = HoldLock(cluster(), PathOn(kA, "locked.dat"), "30", work_ + "/h2.out");
  auto r = cluster().RunOnNode(
      kA, {helper_, "calls", "rename", PathOn(kA, "locked.dat"), PathOn(kA, "stuck.dat")}, 30000,
      PreloadEnv({{"DYAD_RPC_TIMEOUT", "1"}}));
  stuck.Kill();
  ASSERT_TRUE(r.ok());
  EXPECT_NE(r->output.find("rename rc=-1 errno=EIO\n"), std::string::npos) << r->output;
  EXPECT_NE(r->output.find("dyad-preload"), std::string::npos) << r->output;
  EXPECT_TRUE(Exists(PathOn(kA, "stuck.dat")));
  EXPECT_EQ(Counter(kA, "requests.publish"), 1u);
}

// A consumed file this process still reads (its descriptor carries the
// shared lock that keeps the copy from eviction) renamed within the shared
// directory: the library does not wait for its own process's lock.
TEST_F(PreloadTest, RenameOfFileThisProcessReadsDoesNotWaitForItsOwnLock) {
  const std::string text = TextLines(200, "read");
  WriteAll(work_ + "/read.src", text);
  RunOk(kA, {"cp", work_ + "/read.src", PathOn(kA, "reading.txt")});
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(RunOk(kB,
                  {"/usr/bin/python3", "-c",
                   "import os, sys\n"
                   "d = sys.argv[1]\n"
                   "with open(os.path.join(d, 'reading.txt'), 'rb') as f:\n"
                   "    os.rename(os.path.join(d, 'reading.txt'), os.path.join(d, 'read.txt'))\n"
                   "    sys.stdout.write(f.read().decode())\n",
                   dmd(kB)},
                  {{"DYAD_RPC_TIMEOUT", "20"}}),
            text);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(RunOk(kA, {"cat", PathOn(kA, "read.txt")}, kShortWait), text);
}

// A file renamed into the consumer directory (apart from the producer
// directory here) makes this node its owner, as writing it there does: it
// is copied to the producer directory and published from this node.
TEST_F(PreloadTest, RenameIntoConsumerDirectoryIsAdopted) {
  const std::string cons = cluster().node(kB).dir + "/cons";
  ASSERT_EQ(::mkdir(cons.c_str(), 0755), 0);
  const std::string data = RandomBytes(70000, 41);
  WriteAll(work_ + "/adopt.src", data);
  RunOk(kB, {"mv", work_ + "/adopt.src", cons + "/adopt.dat"}, {{"DYAD_PATH_CONSUMER", cons}});
  EXPECT_EQ(ReadAll(PathOn(kB, "adopt.dat")), data);  // in B's producer directory
  EXPECT_EQ(Counter(kB, "requests.publish"), 1u);
  EXPECT_EQ(RunOk(kA, {"cat", PathOn(kA, "adopt.dat")}, kShortWait), data);
}

// The rename has happened when its publication fails: by default the call
// says so (-1, EIO, one stderr line), with DYAD_PRELOAD_ON_ERROR=pass it
// succeeds; either way the file has its new name.
TEST_F(PreloadTest, RenamePublishFailureFailsWithEioOrPasses) {
  const Env dead = {{"DYAD_SERVICE_SOCKET", work_ + "/no-such.sock"}};
  Env pass = dead;
  pass["DYAD_PRELOAD_ON_ERROR"] = "pass";
  const struct {
    const char* name;
    const Env& env;
    const char* said;
  } cases[] = {{"f1", dead, "rename rc=-1 errno=EIO\n"}, {"f2", pass, "rename rc=0 errno=kept\n"}};
  for (const auto& c : cases) {
    WriteAll(work_ + "/" + c.name, c.name);
    auto r = cluster().RunOnNode(
        kA, {helper_, "calls", "rename", work_ + "/" + c.name, PathOn(kA, c.name)}, 30000,
        PreloadEnv(c.env));
    ASSERT_TRUE(r.ok());
    EXPECT_NE(r->output.find(c.said), std::string::npos) << r->output;
    EXPECT_NE(r->output.find("dyad-preload"), std::string::npos) << r->output;
    EXPECT_EQ(ReadAll(PathOn(kA, c.name)), c.name);
  }
}

}  // namespace
}  // namespace dyad::it
