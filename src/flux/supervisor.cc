#include "flux/supervisor.h"

#include <flux/core.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>

extern char** environ;

namespace dyad {

namespace {

double WallNow() {
  struct timeval tv;
  ::gettimeofday(&tv, nullptr);
  return static_cast<double>(tv.tv_sec) + static_cast<double>(tv.tv_usec) / 1e6;
}

// The service writes "TIME LEVEL prefix: message"; flux dmesg gets the same
// level.
int LevelOfLine(const std::string& line) {
  const std::string head = line.substr(0, 48);
  if (head.find(" ERROR ") != std::string::npos) return LOG_ERR;
  if (head.find(" WARN ") != std::string::npos) return LOG_WARNING;
  if (head.find(" DEBUG ") != std::string::npos) return LOG_DEBUG;
  return LOG_INFO;
}

constexpr double kReadyPollS = 0.02;
constexpr double kStableRunS = 60;  // a run this long resets the restart count
constexpr size_t kKeptLines = 8;    // last output lines kept for a failure message

}  // namespace

enum class Phase { kStarting, kReady, kFailed };

struct Supervisor::Impl {
  Config cfg;
  std::thread thread;
  int wake_fd = -1;

  // Shared with the module's thread.
  std::mutex mu;
  std::condition_variable cv;
  Phase phase = Phase::kStarting;
  std::string failure;
  Snapshot snap;

  // Supervisor thread only.
  flux_t* h = nullptr;
  flux_reactor_t* r = nullptr;
  flux_subprocess_t* p = nullptr;
  flux_watcher_t* wake_w = nullptr;
  flux_watcher_t* ready_w = nullptr;
  flux_watcher_t* restart_w = nullptr;
  flux_watcher_t* kill_w = nullptr;
  bool stopping = false;
  bool killed = false;
  bool ready_this_run = false;
  double launched_at = 0;
  int in_a_row = 0;
  std::deque<std::string> last_lines;
  std::string partial[2];  // stdout, stderr

  void SetState(const char* state) {
    std::lock_guard<std::mutex> lk(mu);
    snap.state = state;
  }
  void Fail(const std::string& why) {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (phase == Phase::kStarting) {
        phase = Phase::kFailed;
        failure = why;
      }
      snap.state = "failed";
    }
    cv.notify_all();
  }
  std::string LastLines() const {
    std::string out;
    for (const std::string& l : last_lines) out += "\n  " + l;
    return out;
  }

  // A restart listens on the port the first run got (other services, and
  // with -k embedded the whole instance's store clients, know it): the
  // "--listen HOST:0" argument becomes HOST:PORT from the ready file.
  void KeepPort() {
    std::ifstream in(cfg.ready_file);
    std::string line, port;
    while (std::getline(in, line))
      if (line.compare(0, 7, "listen=") == 0) port = line.substr(line.rfind(':') + 1);
    if (port.empty() || port == "0") return;
    for (size_t i = 0; i + 1 < cfg.argv.size(); ++i) {
      std::string& v = cfg.argv[i + 1];
      if (cfg.argv[i] == "--listen" && v.size() > 2 && v.compare(v.size() - 2, 2, ":0") == 0)
        v = v.substr(0, v.size() - 1) + port;
    }
  }
  void Main();
  void Launch();
  void Ended(const std::string& how);
  void Emit(int stream, const char* data, size_t len, bool eof);
  void BeginStop();
};

// Runs a libflux callback's body: an exception must not unwind into C code.
template <typename F>
static void Guarded(flux_t* h, const char* where, F&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    if (h != nullptr) flux_log(h, LOG_ERR, "dyad.so supervisor (%s): %s", where, e.what());
  }
}

static Supervisor::Impl* ImplOf(flux_subprocess_t* p) {
  return static_cast<Supervisor::Impl*>(flux_subprocess_aux_get(p, "dyad::supervisor"));
}

void Supervisor::Impl::Emit(int stream, const char* data, size_t len, bool eof) {
  std::string& buf = partial[stream];
  buf.append(data, len);
  size_t start = 0;
  for (;;) {
    const size_t nl = buf.find('\n', start);
    if (nl == std::string::npos) break;
    std::string line = buf.substr(start, nl - start);
    start = nl + 1;
    if (line.empty()) continue;
    flux_log(h, LevelOfLine(line), "dyad-service: %s", line.c_str());
    last_lines.push_back(std::move(line));
    if (last_lines.size() > kKeptLines) last_lines.pop_front();
  }
  buf.erase(0, start);
  // A line longer than 64 KiB, or the last one without a newline.
  if ((eof && !buf.empty()) || buf.size() > 65536) {
    flux_log(h, LevelOfLine(buf), "dyad-service: %s", buf.c_str());
    last_lines.push_back(buf);
    if (last_lines.size() > kKeptLines) last_lines.pop_front();
    buf.clear();
  }
}

static void OnOutputBody(flux_subprocess_t* p, const char* stream) {
  Supervisor::Impl* s = ImplOf(p);
  if (s == nullptr) return;
  const char* data = nullptr;
  const int n = flux_subprocess_read(p, stream, &data);
  const int which = std::strcmp(stream, "stderr") == 0 ? 1 : 0;
  if (n > 0) s->Emit(which, data, static_cast<size_t>(n), false);
  if (n == 0 || flux_subprocess_read_stream_closed(p, stream)) s->Emit(which, "", 0, true);
}

static void OnStateBody(flux_subprocess_t* p, flux_subprocess_state_t state) {
  Supervisor::Impl* s = ImplOf(p);
  if (s == nullptr) return;
  if (state == FLUX_SUBPROCESS_RUNNING) {
    std::lock_guard<std::mutex> lk(s->mu);
    s->snap.pid = flux_subprocess_pid(p);
  } else if (state == FLUX_SUBPROCESS_FAILED) {
    // No completion follows a failure.
    const int err = flux_subprocess_fail_errno(p);
    const char* what = flux_subprocess_fail_error(p);
    s->Ended(std::string("could not be started: ") + (what != nullptr ? what : std::strerror(err)));
  }
}

static void OnCompletionBody(flux_subprocess_t* p) {
  Supervisor::Impl* s = ImplOf(p);
  if (s == nullptr) return;
  std::string how;
  if (flux_subprocess_state(p) == FLUX_SUBPROCESS_EXITED) {
    const int sig = flux_subprocess_signaled(p);
    if (sig > 0)
      how = "killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
    else
      how = "exited with status " + std::to_string(flux_subprocess_exit_code(p));
  } else {
    how = std::string("ended in state ") + flux_subprocess_state_string(flux_subprocess_state(p));
  }
  s->Ended(how);
}

static void OnReadyTimerBody(flux_reactor_t*, flux_watcher_t* w, int, void* arg) {
  auto* s = static_cast<Supervisor::Impl*>(arg);
  struct stat st;
  if (s->p == nullptr || ::stat(s->cfg.ready_file.c_str(), &st) != 0) return;
  flux_watcher_stop(w);
  s->ready_this_run = true;
  s->KeepPort();
  bool first = false;
  {
    std::lock_guard<std::mutex> lk(s->mu);
    first = s->phase == Phase::kStarting;
    if (first) s->phase = Phase::kReady;
    s->snap.state = "running";
    s->snap.up_since = WallNow();
  }
  if (first) {
    s->cv.notify_all();
    flux_log(s->h, LOG_INFO, "dyad-service (pid %d) is ready", static_cast<int>(s->snap.pid));
  } else {
    flux_log(s->h, LOG_INFO, "dyad-service restarted (pid %d) and is ready again",
             static_cast<int>(s->snap.pid));
  }
}

static void OnRestartTimerBody(flux_reactor_t*, flux_watcher_t*, int, void* arg) {
  auto* s = static_cast<Supervisor::Impl*>(arg);
  if (!s->stopping) s->Launch();
}

static void OnKillTimerBody(flux_reactor_t* r, flux_watcher_t* w, int, void* arg) {
  auto* s = static_cast<Supervisor::Impl*>(arg);
  if (s->p != nullptr && !s->killed) {
    flux_log(s->h, LOG_WARNING, "dyad-service did not stop within %.0f s of SIGTERM: SIGKILL",
             s->cfg.stop_grace_s);
    s->killed = true;
    if (flux_future_t* f = flux_subprocess_kill(s->p, SIGKILL)) flux_future_destroy(f);
    flux_timer_watcher_reset(w, 3.0, 0);
    flux_watcher_start(w);
    return;
  }
  // Still no completion: give up waiting (closing the connection makes the
  // subprocess server kill what is left).
  flux_reactor_stop(r);
}

static void OnWakeBody(flux_reactor_t*, flux_watcher_t*, int, void* arg) {
  auto* s = static_cast<Supervisor::Impl*>(arg);
  uint64_t v;
  if (::read(s->wake_fd, &v, sizeof v) < 0 && errno == EAGAIN) return;
  s->BeginStop();
}

static void OnOutput(flux_subprocess_t* p, const char* stream) {
  Supervisor::Impl* s = ImplOf(p);
  Guarded(s != nullptr ? s->h : nullptr, "OnOutput", [&] { OnOutputBody(p, stream); });
}

static void OnState(flux_subprocess_t* p, flux_subprocess_state_t state) {
  Supervisor::Impl* s = ImplOf(p);
  Guarded(s != nullptr ? s->h : nullptr, "OnState", [&] { OnStateBody(p, state); });
}

static void OnCompletion(flux_subprocess_t* p) {
  Supervisor::Impl* s = ImplOf(p);
  Guarded(s != nullptr ? s->h : nullptr, "OnCompletion", [&] { OnCompletionBody(p); });
}

static void OnReadyTimer(flux_reactor_t* r, flux_watcher_t* w, int revents, void* arg) {
  Supervisor::Impl* s = static_cast<Supervisor::Impl*>(arg);
  Guarded(s != nullptr ? s->h : nullptr, "OnReadyTimer",
          [&] { OnReadyTimerBody(r, w, revents, arg); });
}

static void OnRestartTimer(flux_reactor_t* r, flux_watcher_t* w, int revents, void* arg) {
  Supervisor::Impl* s = static_cast<Supervisor::Impl*>(arg);
  Guarded(s != nullptr ? s->h : nullptr, "OnRestartTimer",
          [&] { OnRestartTimerBody(r, w, revents, arg); });
}

static void OnKillTimer(flux_reactor_t* r, flux_watcher_t* w, int revents, void* arg) {
  Supervisor::Impl* s = static_cast<Supervisor::Impl*>(arg);
  Guarded(s != nullptr ? s->h : nullptr, "OnKillTimer",
          [&] { OnKillTimerBody(r, w, revents, arg); });
}

static void OnWake(flux_reactor_t* r, flux_watcher_t* w, int revents, void* arg) {
  Supervisor::Impl* s = static_cast<Supervisor::Impl*>(arg);
  Guarded(s != nullptr ? s->h : nullptr, "OnWake", [&] { OnWakeBody(r, w, revents, arg); });
}

void Supervisor::Impl::BeginStop() {
  if (stopping) return;
  stopping = true;
  SetState("stopping");
  flux_watcher_stop(restart_w);
  flux_watcher_stop(ready_w);
  if (p == nullptr) {
    flux_reactor_stop(r);
    return;
  }
  if (flux_future_t* f = flux_subprocess_kill(p, SIGTERM)) flux_future_destroy(f);
  flux_timer_watcher_reset(kill_w, cfg.stop_grace_s, 0);
  flux_watcher_start(kill_w);
}

void Supervisor::Impl::Launch() {
  ::unlink(cfg.ready_file.c_str());
  ready_this_run = false;
  flux_cmd_t* cmd = flux_cmd_create(0, nullptr, environ);
  bool ok = cmd != nullptr;
  for (size_t i = 0; ok && i < cfg.argv.size(); ++i)
    ok = flux_cmd_argv_append(cmd, cfg.argv[i].c_str()) == 0;
  for (size_t i = 0; ok && i < cfg.env.size(); ++i)
    ok = flux_cmd_setenvf(cmd, 1, cfg.env[i].first.c_str(), "%s", cfg.env[i].second.c_str()) == 0;
  if (ok) ok = flux_cmd_setcwd(cmd, "/") == 0;
  flux_subprocess_ops_t ops;
  std::memset(&ops, 0, sizeof ops);
  ops.on_completion = OnCompletion;
  ops.on_state_change = OnState;
  ops.on_stdout = OnOutput;
  ops.on_stderr = OnOutput;
  const int err = errno;
  if (ok) p = flux_rexec(h, static_cast<int>(cfg.rank), 0, cmd, &ops);
  const int rexec_err = errno;
  if (cmd != nullptr) flux_cmd_destroy(cmd);
  if (!ok || p == nullptr) {
    const std::string why = std::string("could not be started through the broker: ") +
                            std::strerror(ok ? rexec_err : err);
    p = nullptr;
    Ended(why);
    return;
  }
  flux_subprocess_aux_set(p, "dyad::supervisor", this, nullptr);
  launched_at = flux_reactor_now(r);
  {
    std::lock_guard<std::mutex> lk(mu);
    ++snap.starts;
    snap.pid = 0;
    snap.state = snap.starts == 1 ? "starting" : "restarting";
  }
  flux_timer_watcher_reset(ready_w, kReadyPollS, kReadyPollS);
  flux_watcher_start(ready_w);
}

void Supervisor::Impl::Ended(const std::string& how) {
  if (p != nullptr) {
    flux_subprocess_aux_set(p, "dyad::supervisor", nullptr, nullptr);
    flux_subprocess_destroy(p);
    p = nullptr;
  }
  flux_watcher_stop(ready_w);
  {
    std::lock_guard<std::mutex> lk(mu);
    ++snap.exits;
    snap.last_exit = how;
    snap.pid = 0;
    snap.up_since = 0;
  }
  if (stopping) {
    flux_log(h, LOG_INFO, "dyad-service stopped (%s)", how.c_str());
    SetState("stopped");
    flux_reactor_stop(r);
    return;
  }
  bool starting;
  {
    std::lock_guard<std::mutex> lk(mu);
    starting = phase == Phase::kStarting;
  }
  if (starting) {
    Fail("dyad-service " + how + " before it was ready" +
         (last_lines.empty() ? std::string() : "; its last lines:" + LastLines()));
    flux_reactor_stop(r);
    return;
  }
  const double ran = flux_reactor_now(r) - launched_at;
  if (ran >= kStableRunS) in_a_row = 0;
  if (in_a_row >= cfg.max_restarts) {
    flux_log(h, LOG_ERR,
             "dyad-service %s; not restarted: it ended %d times in a row (flux module reload "
             "dyad to try again)",
             how.c_str(), in_a_row + 1);
    SetState("failed");
    return;
  }
  const double delay = static_cast<double>(1 << in_a_row);
  ++in_a_row;
  {
    std::lock_guard<std::mutex> lk(mu);
    ++snap.restarts;
    snap.state = "restarting";
  }
  flux_log(h, LOG_ERR,
           "dyad-service %s; restarting it in %.0f s (restart %d of at most %d in a row)",
           how.c_str(), delay, in_a_row, cfg.max_restarts);
  flux_timer_watcher_reset(restart_w, delay, 0);
  flux_watcher_start(restart_w);
}

void Supervisor::Impl::Main() {
  h = flux_open(cfg.uri.c_str(), 0);
  if (h == nullptr) {
    Fail("cannot connect to the broker at " + cfg.uri + ": " + std::strerror(errno));
    return;
  }
  r = flux_reactor_create(0);
  if (r == nullptr || flux_set_reactor(h, r) < 0) {
    Fail(std::string("cannot create a reactor: ") + std::strerror(errno));
    if (r != nullptr) flux_reactor_destroy(r);
    flux_close(h);
    return;
  }
  flux_log_set_appname(h, "dyad");
  wake_w = flux_fd_watcher_create(r, wake_fd, FLUX_POLLIN, OnWake, this);
  ready_w = flux_timer_watcher_create(r, kReadyPollS, kReadyPollS, OnReadyTimer, this);
  restart_w = flux_timer_watcher_create(r, 1, 0, OnRestartTimer, this);
  kill_w = flux_timer_watcher_create(r, cfg.stop_grace_s, 0, OnKillTimer, this);
  if (wake_w == nullptr || ready_w == nullptr || restart_w == nullptr || kill_w == nullptr) {
    Fail(std::string("cannot create watchers: ") + std::strerror(errno));
  } else {
    flux_watcher_start(wake_w);
    Launch();
    if (p != nullptr) flux_reactor_run(r, 0);
  }
  if (p != nullptr) {
    // Gave up waiting for its end: the connection's close below makes the
    // subprocess server kill it.
    flux_subprocess_aux_set(p, "dyad::supervisor", nullptr, nullptr);
    flux_subprocess_destroy(p);
    p = nullptr;
  }
  for (flux_watcher_t* w : {wake_w, ready_w, restart_w, kill_w}) flux_watcher_destroy(w);
  flux_close(h);
  flux_reactor_destroy(r);
  h = nullptr;
  r = nullptr;
  {
    std::lock_guard<std::mutex> lk(mu);
    if (phase == Phase::kStarting) {
      phase = Phase::kFailed;
      if (failure.empty()) failure = "the supervisor ended";
    }
    if (snap.state != "failed") snap.state = "stopped";
  }
  cv.notify_all();
}

Supervisor::Supervisor(Config config) : impl_(new Impl) {
  impl_->cfg = std::move(config);
  impl_->snap.state = "starting";
}

Supervisor::~Supervisor() {
  Stop();
  if (impl_->wake_fd >= 0) ::close(impl_->wake_fd);
  delete impl_;
}

Status Supervisor::Start(double timeout_s) {
  impl_->wake_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl_->wake_fd < 0) return StatusFromErrno(errno, "eventfd");
  impl_->thread = std::thread([this] { impl_->Main(); });
  std::unique_lock<std::mutex> lk(impl_->mu);
  const bool decided = impl_->cv.wait_for(lk, std::chrono::duration<double>(timeout_s),
                                          [this] { return impl_->phase != Phase::kStarting; });
  if (!decided)
    return Status(DYAD_RC_TIMEOUT, "dyad-service was not ready within " +
                                       std::to_string(static_cast<int>(timeout_s)) +
                                       " s (--ready-timeout); see flux dmesg for its output");
  if (impl_->phase == Phase::kFailed) return Status(DYAD_RC_NOSERVICE, impl_->failure);
  return Status::OK();
}

void Supervisor::Stop() {
  if (!impl_->thread.joinable()) return;
  const uint64_t one = 1;
  if (::write(impl_->wake_fd, &one, sizeof one) < 0) {
    // (an eventfd write fails only on overflow)
  }
  impl_->thread.join();
}

Supervisor::Snapshot Supervisor::Get() {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->snap;
}

}  // namespace dyad
