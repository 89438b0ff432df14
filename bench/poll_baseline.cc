// dyad-poll-baseline: what users do without DYAD, as the baseline of the
// small-files figures.
//
// A producer process writes --count files of --size bytes into one shared
// directory, each as "<name>.tmp" then rename() to its final name (so a
// reader never sees a partial file); a consumer process, started first,
// waits for each file in order by polling stat() with a --poll-us sleep
// between attempts, then opens and reads it whole. Reported like the
// streaming phase of dyad-small-files: end-to-end files/s (the producer's
// first write to the consumer's last read) and p50/p99 latency from a
// rename returning to the read of that file completing. On one machine the
// shared directory is local and in the page cache: a best case no parallel
// file system reaches.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_util.h"
#include "emu/pattern.h"
#include "emu/worker.h"

namespace dyad::bench {
namespace {

struct Args {
  uint64_t count = 5000;
  uint64_t size = 4096;
  uint64_t poll_us = 1000;
  bool json = false;
  std::string tmp;
  std::string latencies;
};

void Usage() {
  std::printf(
      "usage: dyad-poll-baseline [--count N] [--size BYTES] [--poll-us US] [--tmp DIR]\n"
      "                          [--json] [--latencies FILE]\n"
      "Producer writes+renames files into a shared directory, a polling consumer\n"
      "(stat() loop, US microseconds between attempts; default 1000) reads each as it\n"
      "appears. Default 5000 files of 4096 bytes.\n");
}

// Shared between the driver and its two children.
struct Stamps {
  uint64_t produced_first;  // producer's first write started
  uint64_t published[1];    // [count]: rename of file i returned
};

std::string Name(const std::string& dir, uint64_t i) {
  char name[64];
  std::snprintf(name, sizeof name, "/d%03llu/f%06llu.dat", static_cast<unsigned long long>(i / 100),
                static_cast<unsigned long long>(i));
  return dir + name;
}

int Producer(const Args& a, const std::string& dir, Stamps* st) {
  std::vector<char> buf(a.size ? a.size : 1);
  st->produced_first = MonoNs();
  for (uint64_t i = 0; i < a.count; ++i) {
    if (i % 100 == 0) ::mkdir((dir + "/d" + Name("", i).substr(2, 3)).c_str(), 0755);
    const std::string final_name = Name(dir, i), tmp = final_name + ".tmp";
    emu::FillPattern(i + 1, 0, buf.data(), a.size);
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!fd.valid() || !WriteFully(fd.get(), buf.data(), a.size).ok()) return 1;
    if (::close(fd.release()) != 0) return 1;
    if (::rename(tmp.c_str(), final_name.c_str()) != 0) return 1;
    st->published[i] = MonoNs();
  }
  return 0;
}

int Consumer(const Args& a, const std::string& dir, uint64_t* done, int64_t timeout_ms) {
  std::vector<char> buf(std::max<uint64_t>(a.size, 1) + 1);
  const Deadline d = Deadline::AfterMs(timeout_ms);
  for (uint64_t i = 0; i < a.count; ++i) {
    const std::string name = Name(dir, i);
    struct stat sb;
    while (::stat(name.c_str(), &sb) != 0) {
      if (errno != ENOENT || d.expired()) return 1;
      ::usleep(static_cast<useconds_t>(a.poll_us));
    }
    UniqueFd fd(::open(name.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) return 1;
    uint64_t got = 0;
    for (;;) {
      const ssize_t n = ::read(fd.get(), buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      got += static_cast<uint64_t>(n);
    }
    if (got != a.size) return 1;
    done[i] = MonoNs();
  }
  return 0;
}

int Drive(const Args& a) {
  std::string parent = a.tmp;
  if (parent.empty()) parent = ::getenv("TMPDIR") ? ::getenv("TMPDIR") : "/tmp";
  std::string tmpl = parent + "/dyad-poll-baseline.XXXXXX";
  if (!::mkdtemp(&tmpl[0])) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string dir = tmpl;
  const size_t bytes = sizeof(Stamps) + 2 * a.count * sizeof(uint64_t);
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 1;
  auto* st = static_cast<Stamps*>(mem);
  uint64_t* done = st->published + a.count;
  const int64_t timeout_ms = 600000;
  const pid_t cons = ::fork();
  if (cons == 0) ::_exit(Consumer(a, dir, done, timeout_ms));
  const pid_t prod = ::fork();
  if (prod == 0) ::_exit(Producer(a, dir, st));
  int cs = 0, ps = 0;
  ::waitpid(prod, &ps, 0);
  ::waitpid(cons, &cs, 0);
  (void)emu::RemoveTree(dir);
  const bool ok = WIFEXITED(ps) && WEXITSTATUS(ps) == 0 && WIFEXITED(cs) && WEXITSTATUS(cs) == 0;
  std::vector<double> lat;
  uint64_t last = 0;
  for (uint64_t i = 0; ok && i < a.count; ++i) {
    last = std::max(last, done[i]);
    if (done[i] >= st->published[i])
      lat.push_back(static_cast<double>(done[i] - st->published[i]) / 1e6);
  }
  const double fps = ok ? Rate(a.count, st->produced_first, last) : 0;
  const double p50 = emu::Percentile(lat, 50), p99 = emu::Percentile(lat, 99);
  WriteValues(a.latencies, lat);
  ::munmap(mem, bytes);
  if (a.json) {
    std::printf(
        "{\"bench\": \"poll_baseline\", \"count\": %llu, \"size\": %llu, \"poll_us\": %llu, "
        "\"ok\": %s,\n \"streaming\": {\"files_per_s\": %.1f, \"latency_p50_ms\": %.4f, "
        "\"latency_p99_ms\": %.4f}}\n",
        static_cast<unsigned long long>(a.count), static_cast<unsigned long long>(a.size),
        static_cast<unsigned long long>(a.poll_us), ok ? "true" : "false", fps, p50, p99);
  } else {
    std::printf("dyad-poll-baseline: %llu files of %s, poll every %llu us: %s\n",
                static_cast<unsigned long long>(a.count), emu::HumanBytes(a.size).c_str(),
                static_cast<unsigned long long>(a.poll_us), ok ? "ok" : "FAILED");
    std::printf("  end-to-end %.0f files/s, latency p50 %.3f ms, p99 %.3f ms\n", fps, p50, p99);
  }
  return ok ? 0 : 1;
}

int Main(int argc, char** argv) {
  Args a;
  ClusterArgs cl;  // only --json and --tmp apply
  const int rc = ParseArgs(argc, argv, "dyad-poll-baseline", Usage, &cl,
                           [&a](const std::string& s, const NextArg& next) {
                             if (s == "--count") return TakeU64(next, &a.count, 1);
                             if (s == "--size") return TakeU64(next, &a.size);
                             if (s == "--poll-us") return TakeU64(next, &a.poll_us);
                             if (s == "--latencies") return TakeString(next, &a.latencies);
                             return OptionResult::kNotMine;
                           });
  if (rc >= 0) return rc;
  a.json = cl.json;
  a.tmp = cl.tmp;
  return Drive(a);
}

}  // namespace
}  // namespace dyad::bench

int main(int argc, char** argv) { return dyad::bench::Main(argc, argv); }
