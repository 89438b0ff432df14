// redis_server.h: a real redis-server on 127.0.0.1 for the tests and the
// metadata benchmarks (part of the emulator harness, header-only).
//
// Each RedisServer owns a fresh temporary directory (its config, log,
// and persistence files) and one redis-server child process on a free
// loopback port. The child gets PR_SET_PDEATHSIG, so it dies with the test
// even if the test crashes; the destructor kills it (bounded) and removes the
// directory. Stop()/Start() restart the server on the same port and
// directory, which is how tests check persistence and reconnection.
//
// Threading: use from one thread (the test body).
#pragma once

#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "common/config.h"

namespace dyad {
namespace emu {

// The redis-server binary, or "" when none is installed.
inline std::string FindRedisServer() {
  const std::optional<std::string> env = GetEnv("DYAD_TEST_REDIS_SERVER");
  if (env && ::access(env->c_str(), X_OK) == 0) return *env;
  for (const char* p :
       {"/usr/bin/redis-server", "/usr/local/bin/redis-server", "/usr/sbin/redis-server"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "";
}

// A loopback port nobody listens on right now.
inline int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  int port = -1;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

// A port nobody listens on that can be bound, or -1.
inline bool CanBind(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// A free port whose Redis Cluster bus port (port + 10000) is free too.
inline int FreeClusterPort() {
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int p = FreePort();
    if (p > 0 && p + 10000 <= 65535 && CanBind(p + 10000)) return p;
    if (p > 0 && p > 55535) {
      // Ephemeral ports are high: try below them.
      const int q = 20000 + (p * 7919 + attempt * 104729) % 30000;
      if (CanBind(q) && CanBind(q + 10000)) return q;
    }
  }
  return -1;
}

inline bool CanConnect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// Polls `ok` every 20 ms for at most `ms`.
template <typename Pred>
bool WaitUntil(int ms, Pred ok) {
  for (int waited = 0; waited <= ms; waited += 20) {
    if (ok()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

class RedisServer {
 public:
  enum class Kind { kServer, kSentinel };
  // `extra_config` is appended to the generated redis.conf (e.g.
  // "appendonly yes\n", "requirepass x\n"). A kSentinel runs Redis
  // Sentinel (redis-server in sentinel mode, Debian's redis-sentinel) with
  // `extra_config` holding its "sentinel ..." lines.
  explicit RedisServer(std::string extra_config = "", Kind kind = Kind::kServer)
      : extra_(std::move(extra_config)), kind_(kind) {
    binary_ = FindRedisServer();
    // Debian's redis-sentinel package ships the sentinel under its own name.
    if (kind_ == Kind::kSentinel && ::access("/usr/bin/redis-sentinel", X_OK) == 0)
      binary_ = "/usr/bin/redis-sentinel";
    char tmpl[] = "/tmp/dyad-redis-test.XXXXXX";
    if (::mkdtemp(tmpl) != nullptr) dir_ = tmpl;
  }
  ~RedisServer() {
    Kill();
    if (!dir_.empty()) {
      const std::string cmd = "rm -rf '" + dir_ + "'";
      if (::system(cmd.c_str()) != 0) {
        // Nothing more to do in a destructor; the directory is in /tmp.
      }
    }
  }
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  bool available() const { return !binary_.empty(); }
  int port() const { return port_; }
  const std::string& dir() const { return dir_; }
  std::string url(const std::string& userinfo = "") const {
    return "redis://" + userinfo + "127.0.0.1:" + std::to_string(port_);
  }
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  // Picks the port before the first Start (e.g. one with a free cluster bus).
  void UsePort(int port) { port_ = port; }

  // Starts (or restarts, on the same port and directory) the server and
  // waits until it accepts connections, at most 5 s. Returns an error text,
  // empty on success.
  std::string Start() {
    if (binary_.empty()) return "redis-server not installed";
    if (dir_.empty()) return "mkdtemp failed";
    if (pid_ > 0) return "already running";
    if (port_ <= 0) port_ = FreePort();
    if (port_ <= 0) return "no free port";
    const std::string conf = dir_ + "/redis.conf";
    // A sentinel rewrites its configuration as it learns: write it once.
    if (kind_ == Kind::kServer || ::access(conf.c_str(), F_OK) != 0) {
      std::ofstream out(conf, std::ios::trunc);
      out << "port " << port_ << "\nbind 127.0.0.1\ndir " << dir_ << "\ndaemonize no\nlogfile "
          << dir_ << "/redis.log\nprotected-mode no\n";
      if (kind_ == Kind::kServer) out << "save \"\"\nappendonly no\n";
      out << extra_;
    }
    const pid_t pid = ::fork();
    if (pid < 0) return "fork failed";
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (kind_ == Kind::kSentinel) {
        ::execl(binary_.c_str(), binary_.c_str(), conf.c_str(), "--sentinel",
                static_cast<char*>(nullptr));
      } else {
        ::execl(binary_.c_str(), binary_.c_str(), conf.c_str(), static_cast<char*>(nullptr));
      }
      ::_exit(127);
    }
    pid_ = pid;
    for (int i = 0; i < 500; ++i) {
      if (CanConnect(port_)) return "";
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return "redis-server exited at start; see " + dir_ + "/redis.log";
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    Kill();
    return "redis-server did not listen within 5 s";
  }

  // SIGTERM (Redis flushes its append-only file and exits), at most 5 s,
  // then SIGKILL.
  void Stop() { Signal(SIGTERM, 5000); }
  // SIGKILL: a crash. What reached the append-only file with
  // "appendfsync always" survives.
  void Kill() { Signal(SIGKILL, 5000); }

 private:
  void Signal(int sig, int wait_ms) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    for (int i = 0; i < wait_ms / 10; ++i) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  std::string binary_;
  std::string extra_;
  Kind kind_;
  std::string dir_;
  int port_ = -1;
  pid_t pid_ = -1;
};

}  // namespace emu
}  // namespace dyad
