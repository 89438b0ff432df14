// preload_overhead.cc: dyad-preload-overhead, the cost of libdyad_wrapper.so
// on paths DYAD does not manage.
//
// The program re-executes itself as a child that times open()+close() (and
// fopen()+fclose()) of an ordinary file many times, alternately without and
// with LD_PRELOAD=libdyad_wrapper.so (managed directories configured, so the
// library is active but the paths are outside them). Each configuration runs
// --runs times; the medians are printed with their ratio. The preloaded
// child also interleaves, block by block, intercepted calls with direct
// calls into libc.so.6, which cancels most of the noise of a shared machine.
// The target is a ratio within 1.05. No service is needed: nothing is
// managed, so the library never contacts one.
//
// Threading: single-threaded; children are waited for with a bound.
#include <dlfcn.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#ifndef DYAD_BUILD_BIN_DIR
#define DYAD_BUILD_BIN_DIR ""
#endif

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

using OpenFn = int (*)(const char*, int, ...);
using CloseFn = int (*)(int);

double NowNs() {
  timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e9 + static_cast<double>(ts.tv_nsec);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Blocks of kBlock calls are timed separately and the median block is kept:
// on a shared machine a block that was preempted is an outlier and drops
// out, where a total would absorb every other program's CPU time.
constexpr int kBlock = 200;

// Child: ns per open+close and per fopen+fclose of `file` through the
// normal symbols (intercepted when the library is preloaded), then the same
// interleaved block by block with the C library's own open/close, looked up
// in libc.so.6 directly, in this one process.
int Child(const std::string& file, long iters) {
  const char* f = file.c_str();
  for (int i = 0; i < 1000; ++i) {  // warm-up (and the library's one-time init)
    const int fd = ::open(f, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return std::perror("open"), 1;
    ::close(fd);
  }
  const long blocks = std::max(1L, iters / kBlock);
  std::vector<double> open_b, fopen_b, direct_b, hooked_b;
  for (long b = 0; b < blocks; ++b) {
    const double t0 = NowNs();
    for (int i = 0; i < kBlock; ++i) ::close(::open(f, O_RDONLY | O_CLOEXEC));
    open_b.push_back((NowNs() - t0) / kBlock);
  }
  for (long b = 0; b < blocks / 4 + 1; ++b) {
    const double t0 = NowNs();
    for (int i = 0; i < kBlock; ++i) std::fclose(std::fopen(f, "r"));
    fopen_b.push_back((NowNs() - t0) / kBlock);
  }
  void* libc = ::dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
  auto direct_open = libc ? reinterpret_cast<OpenFn>(::dlsym(libc, "open")) : nullptr;
  auto direct_close = libc ? reinterpret_cast<CloseFn>(::dlsym(libc, "close")) : nullptr;
  if (direct_open == nullptr || direct_close == nullptr) return 1;
  for (long b = 0; b < blocks; ++b) {
    double t0 = NowNs();
    for (int i = 0; i < kBlock; ++i) direct_close(direct_open(f, O_RDONLY | O_CLOEXEC));
    direct_b.push_back((NowNs() - t0) / kBlock);
    t0 = NowNs();
    for (int i = 0; i < kBlock; ++i) ::close(::open(f, O_RDONLY | O_CLOEXEC));
    hooked_b.push_back((NowNs() - t0) / kBlock);
  }
  std::printf("%.2f %.2f %.2f %.2f\n", Median(open_b), Median(fopen_b), Median(direct_b),
              Median(hooked_b));
  return 0;
}

// Runs ourselves as a child with `env` as the whole environment; parses
// its two figures. Bounded: the child is killed after 120 s.
bool RunChild(const std::string& self, const std::vector<std::string>& args,
              const std::vector<std::string>& env, double out_v[4]) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return false;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, pipefd[1], STDOUT_FILENO);
  std::vector<char*> argv, envp;
  argv.push_back(const_cast<char*>(self.c_str()));
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  for (const auto& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, self.c_str(), &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(pipefd[1]);
  if (rc != 0) {
    ::close(pipefd[0]);
    return false;
  }
  std::string out;
  char buf[256];
  const auto deadline = Clock::now() + std::chrono::seconds(120);
  for (;;) {
    const ssize_t n = ::read(pipefd[0], buf, sizeof(buf));
    if (n > 0) {
      out.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR && Clock::now() < deadline) continue;
    break;
  }
  ::close(pipefd[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return false;
  return std::sscanf(out.c_str(), "%lf %lf %lf %lf", &out_v[0], &out_v[1], &out_v[2], &out_v[3]) ==
         4;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 4 && std::strcmp(argv[1], "--child") == 0)
    return Child(argv[2], std::strtol(argv[3], nullptr, 10));

  long iters = 200000;
  int runs = 11;
  std::string lib = std::string(DYAD_BUILD_BIN_DIR) + "/libdyad_wrapper.so";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iterations" && i + 1 < argc) {
      iters = std::strtol(argv[++i], nullptr, 10);
    } else if (a == "--runs" && i + 1 < argc) {
      runs = std::atoi(argv[++i]);
    } else if (a == "--library" && i + 1 < argc) {
      lib = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--iterations N] [--runs R] [--library libdyad_wrapper.so]\n",
                   argv[0]);
      return 2;
    }
  }
  if (iters < 4 || runs < 1) return 2;
  if (::access(lib.c_str(), R_OK) != 0) {
    std::fprintf(stderr, "dyad-preload-overhead: %s not found (--library)\n", lib.c_str());
    return 1;
  }
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return 1;
  self[n] = '\0';

  char tmpl[] = "/tmp/dyad-preload-bench-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return std::perror("mkdtemp"), 1;
  const std::string dir = tmpl;
  const std::string file = dir + "/plain.dat", managed = dir + "/managed";
  int fd = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ssize_t w = ::write(fd, "x", 1);
    (void)w;
    ::close(fd);
  }
  ::mkdir(managed.c_str(), 0755);

  // The parent's environment minus LD_PRELOAD and DYAD_*, for both.
  std::vector<std::string> base;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "LD_PRELOAD=", 11) == 0 || std::strncmp(*e, "DYAD_", 5) == 0) continue;
    base.push_back(*e);
  }
  std::vector<std::string> with = base;
  with.push_back("LD_PRELOAD=" + lib);
  with.push_back("DYAD_PATH_PRODUCER=" + managed);
  with.push_back("DYAD_PATH_CONSUMER=" + managed);
  with.push_back("DYAD_SERVICE_SOCKET=" + dir + "/none.sock");

  const std::vector<std::string> args = {"--child", file, std::to_string(iters)};
  std::vector<double> open_plain, open_pre, fopen_plain, fopen_pre, direct, hooked;
  bool ok = true;
  for (int r = 0; r < runs && ok; ++r) {
    // Alternate the order so that drift (frequency, cache) hits both.
    for (int k = 0; k < 2 && ok; ++k) {
      const bool preload = (r + k) % 2 == 1;
      double v[4] = {0, 0, 0, 0};
      ok = RunChild(self, args, preload ? with : base, v);
      (preload ? open_pre : open_plain).push_back(v[0]);
      (preload ? fopen_pre : fopen_plain).push_back(v[1]);
      if (preload) {
        direct.push_back(v[2]);
        hooked.push_back(v[3]);
      }
    }
  }
  ::unlink(file.c_str());
  ::rmdir(managed.c_str());
  ::rmdir(dir.c_str());
  if (!ok) {
    std::fprintf(stderr, "dyad-preload-overhead: a child run failed\n");
    return 1;
  }
  const double op = Median(open_plain), ow = Median(open_pre);
  const double fp = Median(fopen_plain), fw = Median(fopen_pre);
  const double dn = Median(direct), hn = Median(hooked);
  std::printf("dyad-preload-overhead: %ld iterations x %d runs, non-managed absolute path\n", iters,
              runs);
  std::printf("(medians of %d-call blocks, then of runs; ns per call pair)\n", kBlock);
  std::printf("%-34s %12s %12s %8s\n", "call", "without", "with", "ratio");
  std::printf("%-34s %12.1f %12.1f %8.3f\n", "open+close (separate processes)", op, ow, ow / op);
  std::printf("%-34s %12.1f %12.1f %8.3f\n", "fopen+fclose (separate processes)", fp, fw, fw / fp);
  std::printf("%-34s %12.1f %12.1f %8.3f\n", "open+close (interleaved, 1 process)", dn, hn,
              hn / dn);
  std::printf("target: ratio <= 1.05 -> %s\n",
              ow / op <= 1.05 && hn / dn <= 1.05 ? "met" : "NOT met");
  return 0;
}
