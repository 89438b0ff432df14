#include "emu/netns.h"

#include <dirent.h>
#include <fcntl.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "common/config.h"
#include "common/net.h"
#include "common/time.h"
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

Status ParallelFor(int n, int threads, const std::function<Status(int)>& fn) {
  std::vector<Status> results(static_cast<size_t>(std::max(n, 0)));
  std::atomic<int> next{0};
  auto run = [&] {
    for (int i = next.fetch_add(1); i < n; i = next.fetch_add(1)) results[i] = fn(i);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::min(threads, n); ++t) pool.emplace_back(run);
  run();
  for (std::thread& t : pool) t.join();
  for (Status& st : results)
    if (!st.ok()) return st;
  return Status::OK();
}

Status IpBatch(const std::vector<std::string>& lines, const std::string& netns,
               const std::string& scratch_file, bool force) {
  if (lines.empty()) return Status::OK();
  std::string text;
  for (const std::string& l : lines) text += l + "\n";
  {
    UniqueFd fd(::open(scratch_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    if (!fd.valid()) return StatusFromErrno(errno, "create '" + scratch_file + "'");
    DYAD_RETURN_IF_ERROR(WriteFully(fd.get(), text.data(), text.size()));
  }
  std::vector<std::string> args;
  if (!netns.empty()) args = {"-n", netns};
  if (force) args.push_back("-force");
  args.insert(args.end(), {"-batch", scratch_file});
  Status st = Ip(args);
  ::unlink(scratch_file.c_str());
  return st;
}

Status CreateNetnsBatch(const std::vector<std::string>& names, const std::string& scratch_file) {
  std::vector<std::string> lines;
  for (const std::string& n : names) lines.push_back("netns add " + n);
  return IpBatch(lines, "", scratch_file);
}

Status DeleteNetnsBatch(const std::vector<std::string>& names, const std::string& scratch_file) {
  std::vector<std::string> lines;
  for (const std::string& n : names)
    if (::access(("/run/netns/" + n).c_str(), F_OK) == 0) lines.push_back("netns delete " + n);
  if (IpBatch(lines, "", scratch_file, /*force=*/true).ok()) return Status::OK();
  // One by one what is left (e.g. the scratch file could not be written).
  Status first;
  for (const std::string& n : names) {
    Status st = DeleteNetns(n);
    if (!st.ok() && first.ok()) first = st;
  }
  return first;
}

namespace {

// A veth's carrier comes up asynchronously, up to a second later (the
// kernel's link-watch delay). Services list usable interfaces once, when
// they start (UCX does), so they start only once their eth0 is running;
// otherwise a fresh node would see only "lo". Asked with an ioctl from a
// thread inside the namespace: no process per poll.
Status WaitRunning(const std::string& netns, Deadline deadline) {
  bool running = false;
  Status st;
  while (!running) {
    st = RunInNetns(netns, [&] {
      UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
      struct ifreq ifr;
      std::memset(&ifr, 0, sizeof ifr);
      std::strncpy(ifr.ifr_name, "eth0", IFNAMSIZ - 1);
      running = s.valid() && ::ioctl(s.get(), SIOCGIFFLAGS, &ifr) == 0 &&
                (ifr.ifr_flags & IFF_RUNNING) != 0;
    });
    if (!st.ok()) return st;
    if (running) break;
    if (deadline.expired())
      return Status(DYAD_RC_SYSFAIL, netns + ": eth0 not running after 10 s (no carrier)");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return Status::OK();
}

}  // namespace

Status ConnectNodes(const std::vector<NodeLink>& nodes, const std::string& hub,
                    const std::string& scratch_dir) {
  const int n = static_cast<int>(nodes.size());
  // Links are created inside the namespaces directly, never in the host's,
  // so deleting the namespaces removes them and names cannot collide.
  if (n == 2) {
    DYAD_RETURN_IF_ERROR(Ip({"-n", nodes[0].netns, "link", "add", "eth0", "type", "veth", "peer",
                             "name", "eth0", "netns", nodes[1].netns}));
  } else if (n > 2) {
    std::vector<std::string> lines = {"link add br0 type bridge", "link set br0 up"};
    for (int i = 0; i < n; ++i) {
      const std::string port = "p" + std::to_string(i);
      lines.push_back("link add " + port + " type veth peer name eth0 netns " + nodes[i].netns);
      lines.push_back("link set " + port + " master br0 up");
    }
    DYAD_RETURN_IF_ERROR(IpBatch(lines, hub, scratch_dir + "/ip-hub.batch"));
  }
  const Deadline deadline = Deadline::AfterMs(10000);
  // Each node's own commands in one process; several nodes at once, as
  // each process mostly waits.
  return ParallelFor(n, 8, [&](int i) -> Status {
    const NodeLink& node = nodes[static_cast<size_t>(i)];
    std::vector<std::string> lines = {"link set lo up"};
    if (n >= 2) {
      lines.push_back("addr add " + node.ip + "/24 dev eth0");
      lines.push_back("link set eth0 up");
    }
    DYAD_RETURN_IF_ERROR(
        IpBatch(lines, node.netns, scratch_dir + "/ip-node" + std::to_string(i) + ".batch"));
    return n >= 2 ? WaitRunning(node.netns, deadline) : Status::OK();
  });
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
