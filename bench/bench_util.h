// bench_util.h: what the benchmark programs share (header-only).
//
//   * option parsing: ParseU64 and the options every cluster benchmark takes
//     (--json, --loopback, --mode, --tmp), parsed by ParseClusterOption;
//   * starting the two-or-more-node emulated cluster they run on;
//   * small file helpers (atomic text write, whole-file read);
//   * per-process resource samples from /proc (CPU seconds, peak RSS,
//     context switches), used for the resource figures of `make bench` and
//     the per-call breakdowns.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "common/status.h"
#include "common/time.h"
#include "emu/cluster.h"

#ifndef DYAD_BUILD_BIN_DIR
#define DYAD_BUILD_BIN_DIR ""
#endif

namespace dyad::bench {

// --- options -------------------------------------------------------------------

// A non-negative decimal; false on anything else (including a missing value).
inline bool ParseU64(const char* s, uint64_t* out) {
  if (!s || !*s || *s == '-') return false;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (*end) return false;
  *out = v;
  return true;
}

// "1048576,4194304" -> {1048576, 4194304}; false on an empty or bad item.
inline bool ParseU64List(const char* s, std::vector<uint64_t>* out) {
  if (!s || !*s) return false;
  out->clear();
  std::string item;
  for (const char* p = s;; ++p) {
    if (*p == ',' || *p == '\0') {
      uint64_t v = 0;
      if (!ParseU64(item.c_str(), &v)) return false;
      out->push_back(v);
      item.clear();
      if (*p == '\0') break;
    } else {
      item += *p;
    }
  }
  return !out->empty();
}

// Options of every benchmark that runs on an emulated cluster.
struct ClusterArgs {
  bool json = false;
  bool loopback = false;   // never network namespaces
  std::string mode;        // transport; "" = the default
  std::string tmp;         // parent of the cluster directory
  std::string protection;  // services' --protection; "" = their default (integrity)
  std::string kvs;         // services' --kvs; "" = the embedded store hosted by node 0
};

enum class OptionResult { kNotMine, kTaken, kBad };

// Takes option `s` (its value, if any, from `next`) when it is one of the
// ClusterArgs options.
inline OptionResult ParseClusterOption(const std::string& s,
                                       const std::function<const char*()>& next, ClusterArgs* a) {
  if (s == "--json") {
    a->json = true;
  } else if (s == "--loopback") {
    a->loopback = true;
  } else if (s == "--mode" || s == "--tmp" || s == "--protection" || s == "--kvs") {
    const char* v = next();
    if (!v) return OptionResult::kBad;
    (s == "--mode" ? a->mode : s == "--tmp" ? a->tmp : s == "--kvs" ? a->kvs : a->protection) = v;
  } else {
    return OptionResult::kNotMine;
  }
  return OptionResult::kTaken;
}

using NextArg = std::function<const char*()>;
// Takes one program-specific option (its value, if any, from the NextArg).
using OptionTaker = std::function<OptionResult(const std::string&, const NextArg&)>;

// The option loop of a benchmark's main: -h/--help prints `usage`, the
// ClusterArgs options go to `cl` (when not null), the rest to `take`.
// Returns -1 to go on, otherwise the exit code (2 on a bad option).
inline int ParseArgs(int argc, char** argv, const char* prog, void (*usage)(), ClusterArgs* cl,
                     const OptionTaker& take) {
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    const NextArg next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (s == "-h" || s == "--help") {
      usage();
      return 0;
    }
    OptionResult r = cl ? ParseClusterOption(s, next, cl) : OptionResult::kNotMine;
    if (r == OptionResult::kNotMine) r = take(s, next);
    if (r == OptionResult::kNotMine) {
      std::fprintf(stderr, "%s: unknown option '%s'\n", prog, s.c_str());
      return 2;
    }
    if (r == OptionResult::kBad) {
      std::fprintf(stderr, "%s: bad or missing value for '%s'\n", prog, s.c_str());
      return 2;
    }
  }
  return -1;
}

// Parses a number option into `out`, accepting values in [lo, hi].
inline OptionResult TakeU64(const NextArg& next, uint64_t* out, uint64_t lo = 0,
                            uint64_t hi = UINT64_MAX) {
  uint64_t v = 0;
  if (!ParseU64(next(), &v) || v < lo || v > hi) return OptionResult::kBad;
  *out = v;
  return OptionResult::kTaken;
}

// Parses a string option into `out`.
inline OptionResult TakeString(const NextArg& next, std::string* out) {
  const char* v = next();
  if (!v) return OptionResult::kBad;
  *out = v;
  return OptionResult::kTaken;
}

// --- cluster -------------------------------------------------------------------

// dyad-demo, whose worker roles the benchmarks run on the nodes, beside
// this program ("" and a message when missing).
inline std::string FindDemoProgram(const char* prog) {
  const std::string demo = emu::FindSiblingProgram("dyad-demo", DYAD_BUILD_BIN_DIR);
  if (demo.empty()) std::fprintf(stderr, "%s: dyad-demo was not found\n", prog);
  return demo;
}

// Starts `nodes` emulated nodes for a benchmark; null (after a message) on
// failure. Installs the signal teardown first.
inline std::unique_ptr<emu::EmuCluster> StartBenchCluster(const char* prog, int nodes,
                                                          const ClusterArgs& a) {
  emu::InstallSignalTeardown();
  emu::ClusterOptions o;
  o.bin_dir = DYAD_BUILD_BIN_DIR;
  o.mode = a.mode;
  o.use_netns = !a.loopback;
  o.tmp_parent = a.tmp;
  if (!a.protection.empty()) o.extra_service_args = {"--protection", a.protection};
  o.kvs = a.kvs;
  // DYAD_BENCH_KEEP=1 leaves the node directories and service logs behind
  // for a post-mortem (the path is printed by a failing run).
  if (const char* k = std::getenv("DYAD_BENCH_KEEP"); k && *k && std::string(k) != "0")
    o.keep = true;
  auto started = emu::EmuCluster::Start(nodes, o);
  if (!started.ok()) {
    std::fprintf(stderr, "%s: %s\n", prog, started.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*started);
}

// Waits (bounded) for `path` to exist while `p` runs.
inline bool WaitForFile(const std::string& path, emu::Process& p, int64_t timeout_ms = 10000) {
  const Deadline d = Deadline::AfterMs(timeout_ms);
  struct stat st;
  while (::stat(path.c_str(), &st) != 0) {
    if (p.Exited() || d.expired()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

// --- files and numbers -----------------------------------------------------------

// Writes `text` to `path` through a temporary file and rename.
inline Status WriteText(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return StatusFromErrno(errno, "create '" + tmp + "'");
  DYAD_RETURN_IF_ERROR(WriteFully(fd.get(), text.data(), text.size()));
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return StatusFromErrno(errno, "rename '" + tmp + "'");
  return Status::OK();
}

// The whole file; what was read before an error ("" if it cannot be opened).
// Plain read(2): a /proc file of a process that exits meanwhile fails with
// ESRCH, on which std::ifstream's buffer would throw.
inline std::string ReadText(const std::string& path) {
  std::string s;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return s;
  char buf[8192];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    s.append(buf, static_cast<size_t>(n));
  }
  return s;
}

inline std::string SelfExe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  buf[n] = '\0';
  return buf;
}

inline double MBps(uint64_t bytes, uint64_t ns) {
  return ns ? static_cast<double>(bytes) / 1e6 / (static_cast<double>(ns) / 1e9) : 0;
}

// n events between two monotonic nanosecond stamps, per second.
inline double Rate(uint64_t n, uint64_t first, uint64_t last) {
  return last > first ? static_cast<double>(n) / (static_cast<double>(last - first) / 1e9) : 0;
}

// "[1.000000, 2.000000]"
// `s` as a JSON string literal (quotes, backslashes and control
// characters escaped).
inline std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

inline std::string JsonList(const std::vector<double>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// One value per line (latency dumps for the CDF plots); "" path = nothing.
inline void WriteValues(const std::string& path, const std::vector<double>& v) {
  if (path.empty()) return;
  std::string s;
  char line[64];
  for (double x : v) {
    std::snprintf(line, sizeof line, "%.6f\n", x);
    s += line;
  }
  (void)WriteText(path, s);
}

// --- resources -------------------------------------------------------------------

struct ProcSample {
  bool ok = false;
  double cpu_s = 0;      // utime + stime
  uint64_t hwm_kib = 0;  // VmHWM: peak resident set
  uint64_t rss_kib = 0;  // VmRSS
};

// The number after `key` in a /proc status text; 0 when absent.
inline uint64_t StatusField(const std::string& status, const char* key) {
  const size_t at = status.find(key);
  return at == std::string::npos
             ? 0
             : std::strtoull(status.c_str() + at + std::strlen(key), nullptr, 10);
}

struct SwitchSample {
  bool ok = false;
  uint64_t voluntary = 0;    // the thread blocked (waited for something)
  uint64_t involuntary = 0;  // the thread was preempted
};

// Context switches of a live process: the sum over the threads it has now
// (/proc/<pid>/task/*/status). Threads that ended are not counted, so take
// both samples of a difference while the same threads run.
inline SwitchSample SampleSwitches(pid_t pid) {
  SwitchSample s;
  if (pid <= 0) return s;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(tasks.c_str());
  if (d == nullptr) return s;
  while (const dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string status = ReadText(tasks + "/" + e->d_name + "/status");
    s.voluntary += StatusField(status, "\nvoluntary_ctxt_switches:");
    s.involuntary += StatusField(status, "\nnonvoluntary_ctxt_switches:");
  }
  ::closedir(d);
  s.ok = true;
  return s;
}

// CPU time and memory of a live process from /proc/<pid>/{stat,status}.
inline ProcSample SampleProc(pid_t pid) {
  ProcSample s;
  if (pid <= 0) return s;
  const std::string base = "/proc/" + std::to_string(pid);
  const std::string stat = ReadText(base + "/stat");
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return s;
  // Fields after "pid (comm)": state is field 3; utime 14, stime 15.
  std::vector<std::string> f;
  size_t i = close + 2;
  while (i < stat.size() && f.size() < 13) {
    size_t j = stat.find(' ', i);
    if (j == std::string::npos) j = stat.size();
    f.push_back(stat.substr(i, j - i));
    i = j + 1;
  }
  if (f.size() < 13) return s;
  const double tick = static_cast<double>(::sysconf(_SC_CLK_TCK));
  s.cpu_s = (std::strtod(f[11].c_str(), nullptr) + std::strtod(f[12].c_str(), nullptr)) / tick;
  const std::string status = ReadText(base + "/status");
  s.hwm_kib = StatusField(status, "VmHWM:");
  s.rss_kib = StatusField(status, "VmRSS:");
  s.ok = true;
  return s;
}

// Samples a child while it runs (VmHWM only grows, so the last sample before
// exit is its peak up to the sampling interval); the CPU time of the last
// sample misses at most one interval of work.
class ProcWatcher {
 public:
  explicit ProcWatcher(pid_t pid, int interval_ms = 5)
      : pid_(pid), thread_([this, interval_ms] {
          while (!stop_.load()) {
            const ProcSample s = SampleProc(pid_);
            // An exited but not yet reaped child has no memory figures left.
            if (s.ok && s.hwm_kib > 0) {
              std::lock_guard<std::mutex> l(mu_);
              last_ = s;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(interval_ms));
          }
        }) {}
  ~ProcWatcher() { Stop(); }
  ProcWatcher(const ProcWatcher&) = delete;
  ProcWatcher& operator=(const ProcWatcher&) = delete;

  ProcSample Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> l(mu_);
    return last_;
  }

 private:
  pid_t pid_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  ProcSample last_;
  std::thread thread_;
};

}  // namespace dyad::bench
