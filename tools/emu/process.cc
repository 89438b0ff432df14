#include "emu/process.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "common/net.h"

extern char** environ;

namespace dyad::emu {
namespace {

// Process groups this process started and has not reaped yet. An emergency
// teardown on another thread reads it, so it is guarded by a mutex; a pid
// stays reserved (alive or zombie) for as long as it is listed here.
std::mutex& RegistryMu() {
  static std::mutex mu;
  return mu;
}
std::set<pid_t>& Registry() {
  static std::set<pid_t> live;
  return live;
}
void Register(pid_t pid) {
  std::lock_guard<std::mutex> lock(RegistryMu());
  Registry().insert(pid);
}
void Unregister(pid_t pid) {
  std::lock_guard<std::mutex> lock(RegistryMu());
  Registry().erase(pid);
}

// What the child reports through the exec-error pipe when it cannot start.
struct ChildError {
  int step;
  int err;
};
enum ChildStep { kStepSetpgid = 1, kStepParentGone, kStepSetns, kStepDup, kStepChdir, kStepExec };

const char* StepName(int step) {
  switch (step) {
    case kStepSetpgid:
      return "setpgid";
    case kStepParentGone:
      return "parent exited before exec";
    case kStepSetns:
      return "setns (enter network namespace)";
    case kStepDup:
      return "dup2 (redirect output)";
    case kStepChdir:
      return "chdir";
    case kStepExec:
      return "execve";
  }
  return "child setup";
}

[[noreturn]] void ChildFail(int pipe_fd, int step) {
  ChildError e{step, errno};
  ssize_t ignored = ::write(pipe_fd, &e, sizeof e);
  (void)ignored;
  _exit(127);
}

int PidfdOpen(pid_t pid) {
#ifdef SYS_pidfd_open
  const long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd >= 0) {
    ::fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
    return static_cast<int>(fd);
  }
#endif
  return -1;
}

ExitStatus FromWaitStatus(int st) {
  ExitStatus s;
  if (WIFEXITED(st)) {
    s.exited = true;
    s.code = WEXITSTATUS(st);
  } else if (WIFSIGNALED(st)) {
    s.signal = WTERMSIG(st);
  }
  return s;
}

}  // namespace

std::string ExitStatus::ToString() const {
  if (exited) return "exit code " + std::to_string(code);
  return std::string("killed by signal ") + std::to_string(signal) + " (" + strsignal(signal) + ")";
}

std::string FindProgram(const std::string& name) {
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  std::string path = "/usr/local/bin:/usr/bin:/bin";
  if (const char* p = std::getenv("PATH"); p && *p) path = p;
  // `ip` lives in sbin, which a non-root PATH often lacks.
  path += ":/usr/local/sbin:/usr/sbin:/sbin";
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    const std::string dir = path.substr(start, end - start);
    if (!dir.empty()) {
      const std::string candidate = dir + "/" + name;
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    start = end + 1;
  }
  return "";
}

Process::Process(Process&& other) noexcept
    : pid_(other.pid_), pidfd_(other.pidfd_), status_(std::move(other.status_)) {
  other.pid_ = -1;
  other.pidfd_ = -1;
  other.status_.reset();
}

Process& Process::operator=(Process&& other) noexcept {
  if (this != &other) {
    Release();
    pid_ = other.pid_;
    pidfd_ = other.pidfd_;
    status_ = std::move(other.status_);
    other.pid_ = -1;
    other.pidfd_ = -1;
    other.status_.reset();
  }
  return *this;
}

Process::~Process() { Release(); }

void Process::Release() {
  if (pid_ > 0 && !status_) Kill();
  if (pidfd_ >= 0) ::close(pidfd_);
  pidfd_ = -1;
  pid_ = -1;
}

Result<Process> Process::Spawn(const SpawnOptions& o) {
  if (o.argv.empty()) return Status(DYAD_RC_BADREQUEST, "spawn: empty argument list");
  const std::string program = FindProgram(o.argv[0]);
  if (program.empty())
    return Status(DYAD_RC_SYSFAIL,
                  "spawn: program '" + o.argv[0] + "' not found or not executable");

  // Everything the child needs is built before fork: after fork a
  // multi-threaded parent's child may only make async-signal-safe calls.
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (!eq) continue;
    std::string name(*e, static_cast<size_t>(eq - *e));
    if (o.clear_dyad_env && name.rfind("DYAD_", 0) == 0) continue;
    env[name] = eq + 1;
  }
  for (const auto& [k, v] : o.env) env[k] = v;
  std::vector<std::string> env_strings;
  env_strings.reserve(env.size());
  for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = o.argv;
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  UniqueFd out_file, err_file;
  int out_fd = o.stdout_fd;
  if (out_fd < 0 && !o.stdout_path.empty()) {
    out_file.reset(::open(o.stdout_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    if (!out_file.valid()) return StatusFromErrno(errno, "spawn: open '" + o.stdout_path + "'");
    out_fd = out_file.get();
  }
  int err_fd = o.stderr_fd;
  if (err_fd < 0 && !o.stderr_path.empty()) {
    if (o.stderr_path == o.stdout_path && out_fd >= 0) {
      err_fd = out_fd;
    } else {
      err_file.reset(
          ::open(o.stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
      if (!err_file.valid()) return StatusFromErrno(errno, "spawn: open '" + o.stderr_path + "'");
      err_fd = err_file.get();
    }
  }
  UniqueFd netns_fd;
  if (!o.netns.empty()) {
    const std::string path = "/run/netns/" + o.netns;
    netns_fd.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!netns_fd.valid()) return StatusFromErrno(errno, "spawn: open network namespace " + path);
  }
  UniqueFd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  int errpipe[2];
  if (::pipe2(errpipe, O_CLOEXEC) != 0) return StatusFromErrno(errno, "spawn: pipe2");
  UniqueFd err_read(errpipe[0]);
  UniqueFd err_write(errpipe[1]);

  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return StatusFromErrno(errno, "spawn: fork");
  if (pid == 0) {
    const int ep = err_write.get();
    if (::setpgid(0, 0) != 0) ChildFail(ep, kStepSetpgid);
    if (o.die_with_parent) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ChildFail(ep, kStepParentGone);
    }
    // Callers (the demo) block SIGINT/SIGTERM in every thread to handle them
    // on one; a blocked mask and ignored dispositions survive exec, and a
    // service that cannot see SIGTERM could not be stopped cleanly.
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl;
    std::memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGPIPE, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGUSR1, SIGUSR2})
      ::sigaction(sig, &dfl, nullptr);
    if (netns_fd.valid() && ::setns(netns_fd.get(), CLONE_NEWNET) != 0) ChildFail(ep, kStepSetns);
    if (devnull.valid() && ::dup2(devnull.get(), 0) < 0) ChildFail(ep, kStepDup);
    if (out_fd >= 0 && ::dup2(out_fd, 1) < 0) ChildFail(ep, kStepDup);
    if (err_fd >= 0 && ::dup2(err_fd, 2) < 0) ChildFail(ep, kStepDup);
    if (!o.cwd.empty() && ::chdir(o.cwd.c_str()) != 0) ChildFail(ep, kStepChdir);
    ::execve(program.c_str(), argv.data(), envp.data());
    ChildFail(ep, kStepExec);
  }

  Register(pid);
  // Also set the group from the parent: whichever runs first wins, and
  // either way the group exists before anyone signals it.
  ::setpgid(pid, pid);
  err_write.reset();
  ChildError ce{};
  ssize_t n;
  do {
    n = ::read(err_read.get(), &ce, sizeof ce);
  } while (n < 0 && errno == EINTR);
  if (n == static_cast<ssize_t>(sizeof ce)) {
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    Unregister(pid);
    return Status(DYAD_RC_SYSFAIL,
                  "spawn '" + o.argv[0] + "': " + StepName(ce.step) + ": " + std::strerror(ce.err));
  }
  Process p;
  p.pid_ = pid;
  p.pidfd_ = PidfdOpen(pid);
  return p;
}

bool Process::Poll(int64_t block_ms) {
  if (status_) return true;
  if (pid_ <= 0) return false;
  const Deadline until = Deadline::AfterMs(block_ms > 0 ? block_ms : 0);
  for (;;) {
    siginfo_t info;
    std::memset(&info, 0, sizeof info);
    // WNOWAIT leaves the zombie in place: its pid (and so the process group
    // id) cannot be reused while we sweep the group below.
    const int rc = ::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT);
    if (rc == 0 && info.si_pid == pid_) break;
    if (rc != 0 && errno == ECHILD) {
      // Reaped by someone else (a stray waitpid(-1)); the status is lost.
      status_ = ExitStatus{};
      Unregister(pid_);
      return true;
    }
    if (block_ms <= 0 || until.expired()) return false;
    if (pidfd_ >= 0) {
      pollfd p{pidfd_, POLLIN, 0};
      ::poll(&p, 1, static_cast<int>(until.RemainingMs(1000)));
    } else {
      // No pidfd (old kernel): poll the child's state at a short interval.
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::min<int64_t>(5, until.RemainingMs(5))));
    }
  }
  ::kill(-pid_, SIGKILL);  // stragglers of the group (the leader is a zombie)
  int st = 0;
  while (::waitpid(pid_, &st, 0) < 0 && errno == EINTR) {
  }
  status_ = FromWaitStatus(st);
  Unregister(pid_);
  if (pidfd_ >= 0) ::close(pidfd_);
  pidfd_ = -1;
  return true;
}

bool Process::Exited() { return Poll(0); }

Result<ExitStatus> Process::Wait(Deadline deadline) {
  if (pid_ <= 0) return Status(DYAD_RC_BADREQUEST, "wait: no process");
  for (;;) {
    if (Poll(deadline.RemainingMs(200))) return *status_;
    if (deadline.expired())
      return Status(DYAD_RC_TIMEOUT, "process " + std::to_string(pid_) + " still running");
  }
}

void Process::Signal(int sig) {
  if (pid_ > 0 && !status_) ::kill(-pid_, sig);
}

ExitStatus Process::Stop(int64_t grace_ms) {
  if (pid_ <= 0) return ExitStatus{};
  if (status_) return *status_;
  Signal(SIGTERM);
  if (Poll(grace_ms)) return *status_;
  return Kill();
}

ExitStatus Process::Kill() {
  if (pid_ <= 0) return ExitStatus{};
  if (status_) return *status_;
  Signal(SIGKILL);
  // SIGKILL is prompt unless the child sits in uninterruptible I/O; bound the
  // wait anyway and leave a zombie rather than hang a teardown.
  if (Poll(30000)) return *status_;
  ExitStatus s;
  s.signal = SIGKILL;
  return s;
}

Result<RunResult> RunCapture(SpawnOptions options, int64_t timeout_ms) {
  UniqueFd out(::memfd_create("dyad-emu-run", MFD_CLOEXEC));
  if (!out.valid()) return StatusFromErrno(errno, "memfd_create");
  options.stdout_fd = out.get();
  options.stderr_fd = out.get();
  Result<Process> p = Process::Spawn(options);
  if (!p.ok()) return p.status();
  RunResult r;
  Result<ExitStatus> st = p->Wait(Deadline::AfterMs(timeout_ms));
  if (st.ok()) {
    r.status = *st;
  } else {
    r.timed_out = true;
    r.status = p->Kill();
  }
  char buf[65536];
  off_t off = 0;
  for (;;) {
    const ssize_t n = ::pread(out.get(), buf, sizeof buf, off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    r.output.append(buf, static_cast<size_t>(n));
    off += n;
    if (r.output.size() > (64u << 20)) break;
  }
  return r;
}

void KillChildGroup(pid_t pid) {
  std::lock_guard<std::mutex> lock(RegistryMu());
  if (Registry().count(pid)) ::kill(-pid, SIGKILL);
}

void KillAllChildren() {
  std::lock_guard<std::mutex> lock(RegistryMu());
  for (pid_t pid : Registry()) ::kill(-pid, SIGKILL);
}

}  // namespace dyad::emu
