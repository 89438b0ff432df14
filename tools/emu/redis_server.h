// redis_server.h: a real redis-server on 127.0.0.1 for the tests and the
// metadata benchmark (part of the emulator harness, header-only).
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

class RedisServer {
 public:
  // `extra_config` is appended to the generated redis.conf (e.g.
  // "appendonly yes\n", "requirepass x\n").
  explicit RedisServer(std::string extra_config = "") : extra_(std::move(extra_config)) {
    binary_ = FindRedisServer();
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
    {
      std::ofstream out(conf, std::ios::trunc);
      out << "port " << port_ << "\nbind 127.0.0.1\ndir " << dir_
          << "\ndaemonize no\nsave \"\"\nappendonly no\nlogfile " << dir_
          << "/redis.log\nprotected-mode no\n"
          << extra_;
    }
    const pid_t pid = ::fork();
    if (pid < 0) return "fork failed";
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::execl(binary_.c_str(), binary_.c_str(), conf.c_str(), static_cast<char*>(nullptr));
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
  std::string dir_;
  int port_ = -1;
  pid_t pid_ = -1;
};

}  // namespace emu
}  // namespace dyad
