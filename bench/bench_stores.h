// bench_stores.h: the metadata stores the store benchmarks run against
// (dyad-waits, dyad-metadata-scale), header-only.
//
//   * EmbeddedRootProcess: a real root dyad-service hosting the embedded
//     store, in a child process of its own (as on a cluster, where the
//     root is another node's daemon), forked before the benchmark starts
//     any thread, killed with it (PR_SET_PDEATHSIG) and stopped in order
//     by the destructor;
//   * Redis servers and clusters come from the test helpers
//     (tools/emu/redis_server.h, redis_cluster.h);
//   * RaiseFdLimit, ThreadsOf: thousands of waits need thousands of
//     descriptors, and their cost is counted in threads.
#pragma once

#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "service/service.h"

namespace dyad::bench {

constexpr char kStoreSecret[] = "bench-secret-0123456789abcdef0123";

// Lifts the soft limit on open descriptors to the hard one.
inline void RaiseFdLimit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &r);
  }
}

inline uint64_t FdLimit() {
  rlimit r{};
  return ::getrlimit(RLIMIT_NOFILE, &r) == 0 ? r.rlim_cur : 0;
}

// "Threads:" of /proc/<pid>/status (0 when unknown).
inline int ThreadsOf(pid_t pid) {
  FILE* f = std::fopen(("/proc/" + std::to_string(pid) + "/status").c_str(), "r");
  if (f == nullptr) return 0;
  char line[256];
  int n = 0;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "Threads: %d", &n) == 1) break;
  std::fclose(f);
  return n;
}

class EmbeddedRootProcess {
 public:
  // Forks the root. Call before this process starts any thread.
  static std::unique_ptr<EmbeddedRootProcess> Fork(const std::string& dir, std::string* error) {
    int to_child[2], from_child[2];
    if (::pipe(to_child) != 0 || ::pipe(from_child) != 0) {
      *error = "pipe failed";
      return nullptr;
    }
    const pid_t pid = ::fork();
    if (pid < 0) {
      *error = "fork failed";
      return nullptr;
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::close(to_child[1]);
      ::close(from_child[0]);
      ::_exit(RunRoot(dir, to_child[0], from_child[1]));
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    std::unique_ptr<EmbeddedRootProcess> root(new EmbeddedRootProcess(pid, to_child[1]));
    char buf[128] = {0};
    ssize_t got = 0;
    while (got < static_cast<ssize_t>(sizeof buf) - 1) {
      const ssize_t n = ::read(from_child[0], buf + got, sizeof buf - 1 - static_cast<size_t>(got));
      if (n <= 0) break;
      got += n;
      if (std::memchr(buf, '\n', static_cast<size_t>(got)) != nullptr) break;
    }
    ::close(from_child[0]);
    root->address_ = std::string(buf, static_cast<size_t>(got));
    while (!root->address_.empty() && root->address_.back() == '\n') root->address_.pop_back();
    if (root->address_.empty() || root->address_.rfind("error", 0) == 0) {
      *error = "root service: " + root->address_;
      return nullptr;
    }
    return root;
  }

  ~EmbeddedRootProcess() {
    ::close(control_);  // the root stops when this closes
    for (int i = 0; i < 1000; ++i) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      ::usleep(10000);
    }
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  EmbeddedRootProcess(const EmbeddedRootProcess&) = delete;
  EmbeddedRootProcess& operator=(const EmbeddedRootProcess&) = delete;

  std::string url() const { return "embedded://" + address_; }
  pid_t pid() const { return pid_; }

 private:
  EmbeddedRootProcess(pid_t pid, int control) : pid_(pid), control_(control) {}

  // The child: a root service until the parent closes `control`.
  static int RunRoot(const std::string& dir, int control, int report) {
    RaiseFdLimit();
    // Its log goes beside the benchmark's files, not over its table.
    if (std::freopen((dir + "/root.log").c_str(), "a", stderr) == nullptr) return 1;
    ServiceOptions o;
    o.rank = 0;
    o.listen = "127.0.0.1:0";
    o.socket_path = dir + "/root-" + std::to_string(::getpid()) + ".sock";
    o.kvs_url = "embedded";
    o.secret = kStoreSecret;
    o.rpc_timeout_ms = 60000;
    // Every client of the benchmark connects from 127.0.0.1, where a
    // cluster's services would come from as many addresses: the cap on
    // handshakes per remote address must not refuse them at the start.
    o.max_per_peer = o.max_unauthenticated;
    Service svc(o);
    Status st = svc.Start();
    const std::string line = (st.ok() ? svc.tcp_address() : "error " + st.ToString()) + "\n";
    if (::write(report, line.data(), line.size()) < 0) return 1;
    ::close(report);
    if (!st.ok()) return 1;
    char c;
    while (::read(control, &c, 1) > 0) {
    }
    svc.Stop();
    return 0;
  }

  pid_t pid_;
  int control_;
  std::string address_;
};

}  // namespace dyad::bench
