// dyad-prefetch: small files with prefetch on publication, against the
// physical references measured in the same run.
//
// Two emulated nodes; the producer (a `dyad demo` worker on node A) writes
// and publishes --count files of --size bytes; the consumer is this
// process, a client of node B's service through the C API. --layout picks
// where it reads: `private`, a consumer directory of its own (every file
// present there is complete: level 1), or `shared`, node B's one managed
// directory, also its producer directory, as the README and
// docs/deployment.md set nodes up (a copy is recognised as complete by its
// version stamp).
//   after      the consumer declares the prefetch (dyad_prefetch), the
//              producer publishes every file, then the consumer reads every
//              file in order (dyad_consume + open/read/close): files/s,
//              against a plain open/read/close of the same files copied into
//              a tmpfs directory (/dev/shm), best of 3 passes;
//   backlog    the producer publishes every file first; the consumer then
//              declares the prefetch: files/s of the prefetch pipeline alone
//              (declaration to the last file placed, from node B's
//              prefetch.fetched counter), against the producer's rate;
//   streaming  the consumer declares the prefetch and starts reading first;
//              the producer then publishes: end-to-end files/s (producer's
//              first write to the consumer's last read) against the
//              producer's own write+publish rate in the same phase.
// Every file read is verified after the timed loops. A figure printer,
// never a pass/fail test.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "common/time.h"
#include "dyad/client/dyad_client.h"
#include "dyad/core/dyad_ctx.h"
#include "emu/cluster.h"
#include "emu/pattern.h"
#include "emu/worker.h"

namespace dyad::bench {
namespace {

struct Args {
  std::string read_list;  // child mode: read the files listed there (see ReadListMain)
  uint64_t count = 5000;
  uint64_t size = 4096;
  std::string phases = "after,backlog,streaming";
  std::string layout = "private";
  ClusterArgs cl;
  bool Has(const char* p) const { return phases.find(p) != std::string::npos; }
};

void Usage() {
  std::printf(
      "usage: dyad-prefetch [--count N] [--size BYTES] [--phases after,backlog,streaming]\n"
      "                     [--layout private|shared] [--mode MODE] [--loopback] [--tmp DIR]\n"
      "                     [--json]\n"
      "Small files consumed with prefetch declared, against a plain read of the same files\n"
      "from tmpfs and against the producer's own publish rate (default 5000 files of 4096 B).\n"
      "--layout: the consumer reads from a directory of its own (private, the default) or\n"
      "from the node's one managed directory, which is also its producer directory (shared).\n");
}

std::vector<emu::ManifestEntry> Files(const std::string& dir, uint64_t count, uint64_t size) {
  std::vector<emu::ManifestEntry> v;
  char name[96];
  for (uint64_t i = 0; i < count; ++i) {
    std::snprintf(name, sizeof name, "%s/d%03llu/f%06llu.dat", dir.c_str(),
                  static_cast<unsigned long long>(i / 100), static_cast<unsigned long long>(i));
    v.push_back({name, static_cast<int64_t>(size)});
  }
  return v;
}

// open/read/close of one file; false on any failure.
bool ReadWhole(const std::string& path, std::vector<char>& buf) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  bool ok = true;
  for (;;) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) ok = false;
    if (n <= 0) break;
  }
  ::close(fd);
  return ok;
}

// The consumer's loop: consume (through DYAD or not) and read each file.
struct Pass {
  uint64_t first_ns = 0, last_ns = 0;
  int failures = 0;
};
Pass ReadAll(const std::vector<std::string>& paths, bool consume) {
  std::vector<char> buf(64 << 10);
  Pass p;
  dyad_ctx_t* ctx = dyad_ctx_get();
  p.first_ns = WallNs();
  for (const std::string& path : paths) {
    if (consume && dyad_consume(ctx, path.c_str()) != DYAD_RC_OK) ++p.failures;
    if (!ReadWhole(path, buf)) ++p.failures;
  }
  p.last_ns = WallNs();
  return p;
}

int Verify(const std::string& dir, const std::vector<emu::ManifestEntry>& files) {
  int bad = 0;
  for (const auto& f : files)
    if (!emu::VerifyPatternFile(dir + "/" + f.name, emu::PatternSeed(f.name), f.size).ok()) ++bad;
  return bad;
}

// Copies every file under `from` to `to` (not timed).
bool CopyTree(const std::string& from, const std::string& to,
              const std::vector<emu::ManifestEntry>& files) {
  std::vector<char> buf(1 << 20);
  for (const auto& f : files) {
    const std::string dst = to + "/" + f.name;
    for (size_t pos = to.size() + 1; (pos = dst.find('/', pos)) != std::string::npos; ++pos)
      ::mkdir(dst.substr(0, pos).c_str(), 0755);
    const int in = ::open((from + "/" + f.name).c_str(), O_RDONLY | O_CLOEXEC);
    const int out = ::open(dst.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    bool ok = in >= 0 && out >= 0;
    for (ssize_t n; ok && (n = ::read(in, buf.data(), buf.size())) > 0;)
      ok = ::write(out, buf.data(), static_cast<size_t>(n)) == n;
    if (in >= 0) ::close(in);
    if (out >= 0) ::close(out);
    if (!ok) return false;
  }
  return true;
}

// Starts the producer worker on node A and waits for it.
Result<std::vector<emu::FileResult>> Produce(emu::EmuCluster& c, const std::string& dyad,
                                             const std::string& manifest) {
  auto p = c.SpawnOnNode(
      0, {dyad, "--role", "produce", "--manifest", manifest, "--result", manifest + ".produce"}, {},
      manifest + ".produce.out");
  if (!p.ok()) return p.status();
  auto st = p->Wait(Deadline::AfterMs(1800000));
  if (!st.ok()) return st.status();
  return emu::ReadResults(manifest + ".produce");
}

// Child mode (--read-list FILE): open/read/close of every path listed in
// FILE (one per line), 3 passes; prints the best files/s, the first pass's
// files/s (under the preload library: copies it has not seen before) and
// the failures. Run under LD_PRELOAD=libdyad_wrapper.so, it is an
// unmodified reader's cost.
int ReadListMain(const std::string& list) {
  std::vector<std::string> paths;
  if (FILE* f = std::fopen(list.c_str(), "r")) {
    char line[4096];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      std::string p(line);
      if (!p.empty() && p.back() == '\n') p.pop_back();
      if (!p.empty()) paths.push_back(p);
    }
    std::fclose(f);
  }
  if (paths.empty()) return 2;
  double best = 0, first = 0;
  int failures = 0;
  for (int i = 0; i < 3; ++i) {
    const Pass p = ReadAll(paths, false);
    failures += p.failures;
    const double rate = Rate(paths.size(), p.first_ns, p.last_ns);
    if (i == 0) first = rate;
    best = std::max(best, rate);
  }
  std::printf("%.1f %.1f %d\n", best, first, failures);
  return failures == 0 ? 0 : 1;
}

// Best files/s of ReadListMain over `paths` in a child process, under the
// preload library when `preload` (`first`: its first pass's); 0 on failure.
double ReadInChild(const std::string& work, const std::vector<std::string>& paths, bool preload,
                   double* first) {
  const std::string list = work + "/read-list";
  if (FILE* f = std::fopen(list.c_str(), "w")) {
    for (const std::string& p : paths) std::fprintf(f, "%s\n", p.c_str());
    std::fclose(f);
  } else {
    return 0;
  }
  std::string cmd;
  if (preload) cmd = "LD_PRELOAD='" + std::string(DYAD_BUILD_BIN_DIR) + "/libdyad_wrapper.so' ";
  cmd += "/proc/" + std::to_string(::getpid()) + "/exe --read-list '" + list + "'";
  FILE* out = ::popen(cmd.c_str(), "r");
  if (out == nullptr) return 0;
  double fps = 0;
  int failures = -1;
  if (std::fscanf(out, "%lf %lf %d", &fps, first, &failures) != 3) fps = 0;
  if (::pclose(out) != 0 || failures != 0) return 0;
  return fps;
}

struct Figures {
  double preload_fps = 0, preload_plain_fps = 0;  // open/read/close in a child, with and without
  double preload_first_fps = 0, preload_plain_first_fps = 0;  // ... their first passes
  double after_fps = 0, again_fps = 0, tmpfs_fps = 0, in_place_fps = 0, producer_fps = 0,
         stream_fps = 0, stream_producer_fps = 0, backlog_fps = 0, backlog_producer_fps = 0;
  unsigned long long misses = 0;          // consumes that reached the service (after phase)
  unsigned long long preload_misses = 0;  // ... of the reads under the preload library
  int failures = 0;
};

void PhaseAfter(emu::EmuCluster& c, const std::string& dyad, const Args& a, const std::string& cons,
                Figures* f) {
  const auto files = Files("after", a.count, a.size);
  const std::string m = c.base_dir() + "/bench-after";
  (void)emu::WriteManifest(m, files);
  if (dyad_prefetch(dyad_ctx_get(), (cons + "/after/").c_str()) != DYAD_RC_OK) {
    std::fprintf(stderr, "dyad_prefetch: %s\n", dyad_last_error());
    ++f->failures;
    return;
  }
  auto pr = Produce(c, dyad, m);
  if (!pr.ok() || pr->empty()) {
    ++f->failures;
    return;
  }
  f->producer_fps = Rate(pr->size(), pr->front().start_ns, pr->back().end_ns);
  auto consumes = [&c]() -> uint64_t {
    Result<uint64_t> n = c.Counter(1, "requests.consume");
    return n.ok() ? *n : 0;
  };
  const uint64_t before = consumes();
  std::vector<std::string> paths;
  for (const auto& e : files) paths.push_back(cons + "/" + e.name);
  const Pass p = ReadAll(paths, true);
  f->misses = consumes() - before;
  f->after_fps = Rate(files.size(), p.first_ns, p.last_ns);
  f->failures += p.failures + Verify(cons, files);
  // The same consumes again: every file local, DYAD's level-1 cost alone.
  const Pass again = ReadAll(paths, true);
  f->again_fps = Rate(files.size(), again.first_ns, again.last_ns);
  // An unmodified reader (open/read/close) under the preload library, and
  // the same program without it.
  const uint64_t before_preload = consumes();
  f->preload_fps = ReadInChild(c.base_dir(), paths, true, &f->preload_first_fps);
  f->preload_plain_fps = ReadInChild(c.base_dir(), paths, false, &f->preload_plain_first_fps);
  if (f->preload_fps == 0 || f->preload_plain_fps == 0) ++f->failures;
  f->preload_misses = consumes() - before_preload;

  // The same read without DYAD, in the consumer directory itself: what the
  // directory's file system costs, apart from DYAD's level-1 check.
  for (int i = 0; i < 3; ++i) {
    const Pass b = ReadAll(paths, false);
    f->in_place_fps = std::max(f->in_place_fps, Rate(files.size(), b.first_ns, b.last_ns));
  }
  char shm[] = "/dev/shm/dyad-bench-XXXXXX";
  if (::mkdtemp(shm) == nullptr || !CopyTree(cons, shm, files)) {
    ++f->failures;
    return;
  }
  std::vector<std::string> plain;
  for (const auto& e : files) plain.push_back(std::string(shm) + "/" + e.name);
  for (int i = 0; i < 3; ++i) {
    const Pass b = ReadAll(plain, false);
    f->failures += b.failures;
    f->tmpfs_fps = std::max(f->tmpfs_fps, Rate(files.size(), b.first_ns, b.last_ns));
  }
  const std::string rm = std::string("rm -rf '") + shm + "'";
  if (std::system(rm.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", shm);
}

void PhaseBacklog(emu::EmuCluster& c, const std::string& dyad, const Args& a,
                  const std::string& cons, Figures* f) {
  const auto files = Files("backlog", a.count, a.size);
  const std::string m = c.base_dir() + "/bench-backlog";
  (void)emu::WriteManifest(m, files);
  auto pr = Produce(c, dyad, m);
  if (!pr.ok() || pr->empty()) {
    ++f->failures;
    return;
  }
  f->backlog_producer_fps = Rate(pr->size(), pr->front().start_ns, pr->back().end_ns);
  auto fetched = [&c]() -> uint64_t {
    Result<uint64_t> n = c.Counter(1, "prefetch.fetched");
    return n.ok() ? *n : 0;
  };
  const uint64_t before = fetched();
  const uint64_t t0 = WallNs();
  if (dyad_prefetch(dyad_ctx_get(), (cons + "/backlog/").c_str()) != DYAD_RC_OK) {
    ++f->failures;
    return;
  }
  const Deadline limit = Deadline::AfterMs(300000);
  while (fetched() - before < files.size() && !limit.expired())
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // each look is a status call
  if (fetched() - before < files.size()) {
    std::fprintf(stderr, "backlog: only %llu of %zu files prefetched\n",
                 static_cast<unsigned long long>(fetched() - before), files.size());
    ++f->failures;
    return;
  }
  f->backlog_fps = Rate(files.size(), t0, WallNs());
  f->failures += Verify(cons, files);
}

void PhaseStreaming(emu::EmuCluster& c, const std::string& dyad, const Args& a,
                    const std::string& cons, Figures* f) {
  const auto files = Files("stream", a.count, a.size);
  const std::string m = c.base_dir() + "/bench-stream";
  (void)emu::WriteManifest(m, files);
  std::vector<std::string> paths;
  for (const auto& e : files) paths.push_back(cons + "/" + e.name);
  if (dyad_prefetch(dyad_ctx_get(), (cons + "/stream/").c_str()) != DYAD_RC_OK) {
    ++f->failures;
    return;
  }
  Pass p;
  std::thread consumer([&] { p = ReadAll(paths, true); });
  // The consumer is parked in its first consume before the producer starts.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  auto pr = Produce(c, dyad, m);
  consumer.join();
  if (!pr.ok() || pr->empty()) {
    ++f->failures;
    return;
  }
  f->stream_producer_fps = Rate(pr->size(), pr->front().start_ns, pr->back().end_ns);
  f->stream_fps = Rate(files.size(), pr->front().start_ns, p.last_ns);
  f->failures += p.failures + Verify(cons, files);
}

int Drive(const Args& a) {
  const std::string dyad = FindDemoProgram("dyad-prefetch");
  if (dyad.empty()) return 2;
  auto cluster = StartBenchCluster("dyad-prefetch", 2, a.cl);
  if (!cluster) return 1;
  emu::EmuCluster& c = *cluster;
  // private: a consumer directory of its own on node B (not B's producer
  // directory); shared: B's managed directory, as the node's environment
  // sets it (producer = consumer directory).
  const bool shared = a.layout == "shared";
  const std::string cons = shared ? c.node(1).dmd : c.node(1).dir + "/consumer";
  ::mkdir(cons.c_str(), 0755);
  for (const auto& [k, v] : c.node(1).env) ::setenv(k.c_str(), v.c_str(), 1);
  if (!shared) {
    ::unsetenv("DYAD_PATH_PRODUCER");
    ::setenv("DYAD_PATH_CONSUMER", cons.c_str(), 1);
  }
  if (dyad_init_env(DYAD_COMM_RECV, nullptr) != DYAD_RC_OK) {
    std::fprintf(stderr, "dyad_init_env: %s\n", dyad_last_error());
    return 1;
  }
  Figures f;
  if (a.Has("after")) PhaseAfter(c, dyad, a, cons, &f);
  if (a.Has("backlog")) PhaseBacklog(c, dyad, a, cons, &f);
  if (a.Has("streaming")) PhaseStreaming(c, dyad, a, cons, &f);
  dyad_finalize();
  const double r_after = f.tmpfs_fps > 0 ? f.after_fps / f.tmpfs_fps : 0;
  const double r_stream = f.stream_producer_fps > 0 ? f.stream_fps / f.stream_producer_fps : 0;
  const double r_backlog = f.backlog_producer_fps > 0 ? f.backlog_fps / f.backlog_producer_fps : 0;
  if (a.cl.json) {
    std::printf(
        "{\"bench\": \"prefetch\", \"count\": %llu, \"size\": %llu, \"link\": \"%s\", "
        "\"layout\": \"%s\",\n"
        " \"after\": {\"files_per_s\": %.1f, \"tmpfs_files_per_s\": %.1f, \"ratio\": %.3f, "
        "\"service_requests\": %llu, \"producer_files_per_s\": %.1f, "
        "\"in_place_files_per_s\": %.1f, \"preload_files_per_s\": %.1f, "
        "\"preload_plain_files_per_s\": %.1f, \"preload_ratio\": %.3f, "
        "\"preload_first_pass_ratio\": %.3f, \"preload_service_requests\": %llu},\n"
        " \"backlog\": {\"files_per_s\": %.1f, \"producer_files_per_s\": %.1f, "
        "\"ratio\": %.3f},\n"
        " \"streaming\": {\"files_per_s\": %.1f, \"producer_files_per_s\": %.1f, "
        "\"ratio\": %.3f},\n \"failures\": %d}\n",
        static_cast<unsigned long long>(a.count), static_cast<unsigned long long>(a.size),
        c.uses_netns() ? "veth" : "loopback", a.layout.c_str(), f.after_fps, f.tmpfs_fps, r_after,
        f.misses, f.producer_fps, f.in_place_fps, f.preload_fps, f.preload_plain_fps,
        f.tmpfs_fps > 0 ? f.preload_fps / f.tmpfs_fps : 0,
        f.preload_plain_first_fps > 0 ? f.preload_first_fps / f.preload_plain_first_fps : 0,
        f.preload_misses, f.backlog_fps, f.backlog_producer_fps, r_backlog, f.stream_fps,
        f.stream_producer_fps, r_stream, f.failures);
  } else {
    std::printf("dyad-prefetch: %llu files of %s, link: %s, consumer directory: %s\n",
                static_cast<unsigned long long>(a.count), emu::HumanBytes(a.size).c_str(),
                c.uses_netns() ? "veth pair between network namespaces" : "loopback",
                shared ? "the node's one managed directory (shared)" : "a private one");
    std::printf("\n%-52s %12s %8s\n", "row", "files/s", "ratio");
    std::printf("%-52s %12.0f %8s\n", "plain open/read/close from tmpfs (best of 3)", f.tmpfs_fps,
                "");
    std::printf("%-52s %12.0f %8.2f\n", "plain open/read/close in the consumer directory",
                f.in_place_fps, f.tmpfs_fps > 0 ? f.in_place_fps / f.tmpfs_fps : 0);
    std::printf("%-52s %12.0f %8s\n", "producer write+publish (after phase)", f.producer_fps, "");
    std::printf("%-52s %12.0f %8.2f  (target >= 0.8; %llu reached the service)\n",
                "consume+read after publication, prefetch declared", f.after_fps, r_after,
                f.misses);
    std::printf("%-52s %12.0f %8.2f\n", "the same consume+read again (all level-1)", f.again_fps,
                f.tmpfs_fps > 0 ? f.again_fps / f.tmpfs_fps : 0);
    std::printf("%-52s %12.0f %8.2f\n", "open/read/close in a child, no preload",
                f.preload_plain_fps, f.tmpfs_fps > 0 ? f.preload_plain_fps / f.tmpfs_fps : 0);
    std::printf("%-52s %12.0f %8.2f  (target >= 0.8; %llu reached the service)\n",
                "the same under LD_PRELOAD=libdyad_wrapper.so", f.preload_fps,
                f.tmpfs_fps > 0 ? f.preload_fps / f.tmpfs_fps : 0, f.preload_misses);
    std::printf(
        "%-52s %12.0f %8.2f  (vs the first pass without preload)\n",
        "  its first pass (copies not seen before)", f.preload_first_fps,
        f.preload_plain_first_fps > 0 ? f.preload_first_fps / f.preload_plain_first_fps : 0);
    std::printf("%-52s %12.0f %8s\n", "producer write+publish (backlog phase)",
                f.backlog_producer_fps, "");
    std::printf("%-52s %12.0f %8.2f  (pipeline alone, vs the producer)\n",
                "prefetch of files published before the declaration", f.backlog_fps, r_backlog);
    std::printf("%-52s %12.0f %8s\n", "producer write+publish (streaming phase)",
                f.stream_producer_fps, "");
    std::printf("%-52s %12.0f %8.2f  (target >= 0.9)\n", "streaming end to end with prefetch",
                f.stream_fps, r_stream);
    std::printf("failures: %d\n", f.failures);
  }
  return f.failures == 0 ? 0 : 1;
}

int Main(int argc, char** argv) {
  Args a;
  const int rc = ParseArgs(
      argc, argv, "dyad-prefetch", Usage, &a.cl, [&a](const std::string& s, const NextArg& next) {
        if (s == "--count") return TakeU64(next, &a.count, 1);
        if (s == "--size") return TakeU64(next, &a.size);
        if (s == "--phases") return TakeString(next, &a.phases);
        if (s == "--read-list") return TakeString(next, &a.read_list);
        if (s == "--layout") {
          const OptionResult r = TakeString(next, &a.layout);
          if (r == OptionResult::kTaken && a.layout != "private" && a.layout != "shared") {
            std::fprintf(stderr,
                         "dyad-prefetch: --layout is private or shared, "
                         "not '%s'\n",
                         a.layout.c_str());
            return OptionResult::kBad;
          }
          return r;
        }
        return OptionResult::kNotMine;
      });
  if (rc >= 0) return rc;
  return a.read_list.empty() ? Drive(a) : ReadListMain(a.read_list);
}

}  // namespace
}  // namespace dyad::bench

int main(int argc, char** argv) { return dyad::bench::Main(argc, argv); }
