// process.h: child processes of the emulated cluster.
//
// A Process is one spawned program, optionally inside a network namespace,
// always the leader of its own process group so that stopping it also stops
// anything it started. Output goes to files or descriptors the caller picks.
// Every wait is bounded by a Deadline; a Process that is destroyed while its
// child still runs kills the whole group and reaps it, so no test or demo
// leaves processes behind. Children die with the thread that spawned them
// (PR_SET_PDEATHSIG) unless told otherwise, which covers a parent that
// crashes before it can clean up.
//
// Threading: a Process object is used by one thread at a time. Spawn is safe
// from any thread (the child only makes async-signal-safe calls before exec).
// Live process groups are recorded in a process-wide registry so that an
// emergency teardown (KillAllChildren) can reach them from another thread.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/time.h"

namespace dyad::emu {

// How a child ended.
struct ExitStatus {
  bool exited = false;  // true: normal exit with `code`; false: killed by `signal`
  int code = 0;
  int signal = 0;
  bool success() const { return exited && code == 0; }
  // Shell convention: the code, or 128 + signal.
  int ShellCode() const { return exited ? code : 128 + signal; }
  std::string ToString() const;
};

struct SpawnOptions {
  // argv[0] is the program: a path, or a name looked up in PATH.
  std::vector<std::string> argv;
  // Variables set (or overridden) in the child's environment.
  std::map<std::string, std::string> env;
  // Drops inherited DYAD_* variables first, so a user's shell settings
  // cannot leak into an emulated node.
  bool clear_dyad_env = true;
  // Network namespace (a name under /run/netns) to run in; "" = ours.
  std::string netns;
  // Output: a descriptor (kept open by the caller), else a file path
  // (created, appended to), else inherited. stderr_path equal to
  // stdout_path shares one descriptor so lines interleave in order.
  int stdout_fd = -1;
  int stderr_fd = -1;
  std::string stdout_path;
  std::string stderr_path;
  std::string cwd;
  // SIGKILL the child when the spawning thread exits.
  bool die_with_parent = true;
};

class Process {
 public:
  Process() = default;
  Process(Process&& other) noexcept;
  Process& operator=(Process&& other) noexcept;
  Process(const Process&) = delete;
  Process& operator=(const Process&) = delete;
  // Kills the process group and reaps the child if it is still running.
  ~Process();

  // Starts the child. Fails (with the reason) if the program cannot be
  // executed or the namespace cannot be entered.
  static Result<Process> Spawn(const SpawnOptions& options);

  bool valid() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // True once the child has exited (then reaped; see exit_status()).
  bool Exited();
  const std::optional<ExitStatus>& exit_status() const { return status_; }

  // Waits for the child to exit. DYAD_RC_TIMEOUT if it still runs at the
  // deadline (the child keeps running). Stragglers left in its process group
  // are killed when the leader exits.
  Result<ExitStatus> Wait(Deadline deadline);

  // Sends `sig` to the whole process group (no-op once reaped).
  void Signal(int sig);
  // SIGTERM, then SIGKILL after `grace_ms`; always returns with the child reaped.
  ExitStatus Stop(int64_t grace_ms = 3000);
  // SIGKILL to the group and reap.
  ExitStatus Kill();

 private:
  // Reaps if the child has exited; with `block_ms` > 0 waits that long.
  bool Poll(int64_t block_ms);
  void Release();

  pid_t pid_ = -1;
  int pidfd_ = -1;
  std::optional<ExitStatus> status_;
};

// Runs a program to completion with stdout and stderr captured together.
struct RunResult {
  ExitStatus status;
  std::string output;
  bool timed_out = false;  // killed because it outlived the timeout
};
// On timeout the child is killed and `timed_out` set (not an error Status).
Result<RunResult> RunCapture(SpawnOptions options, int64_t timeout_ms);

// Sends SIGKILL to every live process group spawned by this process.
// Safe to call from any thread; does not reap.
void KillAllChildren();
// Sends SIGKILL to the group of `pid` if it is a live child of ours
// (not yet reaped). Safe to call from any thread; does not reap.
void KillChildGroup(pid_t pid);

// Resolves a program name like execvp would; "" if not found.
std::string FindProgram(const std::string& name);

}  // namespace dyad::emu
