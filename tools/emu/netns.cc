#include "emu/netns.h"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/config.h"
#include "common/net.h"
#include "emu/process.h"

namespace dyad::emu {
namespace {

std::once_flag g_probe_once;
std::string g_unavailable_reason;

void Probe() {
  if (auto v = GetEnv("DYAD_EMU_NO_NETNS"); v && ParseBool(*v)) {
    g_unavailable_reason = "DYAD_EMU_NO_NETNS is set";
    return;
  }
  if (::geteuid() != 0) {
    g_unavailable_reason = "not running as root";
    return;
  }
  if (FindProgram("ip").empty()) {
    g_unavailable_reason = "iproute2 ('ip') not found";
    return;
  }
  const std::string name = std::string(kNetnsPrefix) + std::to_string(::getpid()) + "-probe";
  Status st = CreateNetns(name);
  if (!st.ok()) {
    g_unavailable_reason = "cannot create a network namespace: " + st.message();
    return;
  }
  (void)DeleteNetns(name);
}

}  // namespace

bool NetnsAvailable() {
  std::call_once(g_probe_once, Probe);
  return g_unavailable_reason.empty();
}

std::string NetnsUnavailableReason() {
  NetnsAvailable();
  return g_unavailable_reason;
}

Status Ip(const std::vector<std::string>& args) {
  SpawnOptions o;
  o.argv.push_back("ip");
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  Result<RunResult> r = RunCapture(o, 15000);
  std::string cmd = "ip";
  for (const auto& a : args) cmd += " " + a;
  if (!r.ok()) return r.status().Annotate(cmd);
  if (r->timed_out) return Status(DYAD_RC_TIMEOUT, cmd + ": timed out");
  if (!r->status.success()) {
    std::string out = r->output;
    while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
    return Status(DYAD_RC_SYSFAIL, cmd + ": " + r->status.ToString() + ": " + out);
  }
  return Status::OK();
}

Status CreateNetns(const std::string& name) { return Ip({"netns", "add", name}); }

Status DeleteNetns(const std::string& name) {
  const std::string path = "/run/netns/" + name;
  if (::access(path.c_str(), F_OK) != 0) return Status::OK();
  return Ip({"netns", "delete", name});
}

std::vector<std::string> ListNetns() {
  std::vector<std::string> names;
  DIR* d = ::opendir("/run/netns");
  if (!d) return names;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    names.emplace_back(e->d_name);
  }
  ::closedir(d);
  return names;
}

int SweepStaleNetns() {
  const std::string prefix = kNetnsPrefix;
  int removed = 0;
  for (const std::string& name : ListNetns()) {
    if (name.rfind(prefix, 0) != 0) continue;
    const size_t start = prefix.size();
    const size_t dash = name.find('-', start);
    if (dash == std::string::npos) continue;
    const std::string pid_text = name.substr(start, dash - start);
    char* end = nullptr;
    const long pid = std::strtol(pid_text.c_str(), &end, 10);
    if (pid_text.empty() || *end != '\0' || pid <= 0) continue;
    if (pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    if (DeleteNetns(name).ok()) ++removed;
  }
  return removed;
}

Status RunInNetns(const std::string& name, const std::function<void()>& fn) {
  if (name.empty()) {
    fn();
    return Status::OK();
  }
  Status result;
  // setns(CLONE_NEWNET) applies to the calling thread only, so a throwaway
  // thread keeps the caller (and the rest of the process) where it is.
  std::thread t([&] {
    const std::string path = "/run/netns/" + name;
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) {
      result = StatusFromErrno(errno, "open " + path);
      return;
    }
    if (::setns(fd.get(), CLONE_NEWNET) != 0) {
      result = StatusFromErrno(errno, "setns " + path);
      return;
    }
    fn();
  });
  t.join();
  return result;
}

}  // namespace dyad::emu
