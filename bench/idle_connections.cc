// dyad-idle-connections: what idle connections cost one dyad-service.
//
// Starts two dyad-service processes on loopback (the root, rank 0, and the
// measured service, rank 1), then measures the measured service three
// times: with no idle connection, after --clients idle local clients have
// connected to its Unix socket, and after --peers idle peer services have
// also connected to its TCP port and completed the authenticated handshake.
// Each time: its threads (/proc/PID/task), its resident memory (VmRSS), and
// the p50/p99 latency of --consumes real consumes through it (a file
// published on the root, fetched by the measured service for a client).
//
// Only the wire protocol is used, so the same program measures any build of
// dyad-service (--service PATH): run it against the old and the new one.
// The services get DYAD_MAX_CONNECTIONS above the connection count, so no
// build refuses the idle ones. This process holds every idle connection and
// raises its descriptor limit to the hard limit; counts beyond it are cut.
//
// Usage: dyad-idle-connections [--service PATH] [--clients N] [--peers M]
//                              [--consumes K] [--tmp DIR] [--json]
#include <dirent.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "common/fsutil.h"
#include "common/key.h"
#include "common/net.h"
#include "emu/cluster.h"
#include "proto/auth.h"
#include "proto/protocol.h"

extern char** environ;

namespace dyad::bench {
namespace {

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

// One request to the service on Unix socket `sock` (the wire protocol only,
// so any build of dyad-service can be measured).
Result<std::string> CallLocal(const std::string& sock, MsgType type, const std::string& req,
                              int64_t timeout_ms = 10000) {
  return emu::CallLocalService(sock, type, req, Deadline::AfterMs(timeout_ms));
}

constexpr const char* kSecret = "idle-connections-bench-secret";

struct Args {
  std::string service = std::string(DYAD_BUILD_BIN_DIR) + "/dyad-service";
  uint64_t clients = 10000, peers = 1000, consumes = 50;
  std::string tmp = "/tmp";
  bool json = false;
};

struct Proc {
  pid_t pid = 0;
  std::string listen, socket;
};

size_t Threads(pid_t pid) {
  size_t n = 0;
  DIR* d = ::opendir(("/proc/" + std::to_string(pid) + "/task").c_str());
  if (d == nullptr) return 0;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

double RssMiB(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::strtod(line.c_str() + 6, nullptr) / 1024.0;
  return 0;
}

// Waits until the thread count of `pid` has not changed for 0.5 s (at most 60 s):
// a thread-per-connection service is still starting threads before that.
void Settle(pid_t pid) {
  size_t last = Threads(pid);
  auto stable_since = std::chrono::steady_clock::now();
  const Deadline deadline = Deadline::AfterMs(60000);
  while (!deadline.expired()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const size_t now = Threads(pid);
    if (now != last) {
      last = now;
      stable_since = std::chrono::steady_clock::now();
    } else if (std::chrono::steady_clock::now() - stable_since > std::chrono::milliseconds(500)) {
      return;
    }
  }
}

Result<Proc> StartService(const Args& a, const std::string& dir, int rank, const std::string& kvs) {
  const std::string name = rank == 0 ? "root" : "measured";
  ::mkdir((dir + "/" + name).c_str(), 0755);
  Proc p;
  p.socket = dir + "/" + name + ".sock";
  const std::string ready = dir + "/" + name + ".ready";
  std::vector<std::string> argv = {a.service,
                                   "-r",
                                   std::to_string(rank),
                                   "-k",
                                   kvs,
                                   "-l",
                                   "127.0.0.1:0",
                                   "-s",
                                   p.socket,
                                   "--secret-file",
                                   dir + "/secret",
                                   "--ready-file",
                                   ready,
                                   "-e",
                                   dir + "/" + name + ".err",
                                   "-i",
                                   dir + "/" + name + ".log",
                                   dir + "/" + name};
  std::vector<char*> cargv;
  for (std::string& s : argv) cargv.push_back(s.data());
  cargv.push_back(nullptr);
  std::vector<std::string> env = {"DYAD_MAX_CONNECTIONS=" +
                                  std::to_string(a.clients + a.peers + 1000)};
  for (char** e = environ; *e; ++e)
    if (std::strncmp(*e, "DYAD_MAX_CONNECTIONS=", 21) != 0) env.emplace_back(*e);
  std::vector<char*> cenv;
  for (std::string& s : env) cenv.push_back(s.data());
  cenv.push_back(nullptr);
  if (posix_spawn(&p.pid, a.service.c_str(), nullptr, nullptr, cargv.data(), cenv.data()) != 0)
    return Status(DYAD_RC_SYSFAIL, "cannot start " + a.service);
  const Deadline deadline = Deadline::AfterMs(30000);
  while (!deadline.expired()) {
    std::ifstream in(ready);
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("advertise=", 0) == 0) p.listen = line.substr(10);
    if (!p.listen.empty()) return p;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(p.pid, SIGKILL);
  ::waitpid(p.pid, nullptr, 0);
  return Status(DYAD_RC_TIMEOUT, name + " service did not start (see " + dir + ")");
}

void StopService(const Proc& p) {
  if (p.pid <= 0) return;
  ::kill(p.pid, SIGTERM);
  const Deadline deadline = Deadline::AfterMs(20000);
  while (!deadline.expired()) {
    if (::waitpid(p.pid, nullptr, WNOHANG) == p.pid) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(p.pid, SIGKILL);
  ::waitpid(p.pid, nullptr, 0);
}

// A connected local client. A blocking connect: on a full listen backlog it
// waits for the service to accept (bounded by SO_SNDTIMEO), where a
// non-blocking one would leave an unconnected socket behind.
Result<UniqueFd> ConnectLocal(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return StatusFromErrno(errno, "socket");
  timeval tv{10, 0};
  ::setsockopt(fd.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  std::strncpy(sa.sun_path, path.c_str(), sizeof sa.sun_path - 1);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0)
    return StatusFromErrno(errno, "connect " + path);
  return fd;
}

struct Sample {
  std::string label;
  size_t threads = 0;
  double rss = 0, p50 = 0, p99 = 0;
  int errors = 0;
  uint64_t refused = 0;  // the service's connections.refused counter
};

uint64_t RefusedConnections(const Proc& svc) {
  Result<std::string> body = CallLocal(svc.socket, MsgType::kStatus, "");
  StatusReply r;
  if (!body.ok()) return 0;
  Decoder d(*body);
  if (!r.DecodeFrom(d)) return 0;
  return r.counters["connections.refused"];
}

// Publishes `k` small files on the root and consumes each through the
// measured service; latency of each consume call.
Sample Measure(const std::string& label, const Args& a, const std::string& dir, const Proc& root,
               const Proc& svc, int round) {
  Sample s;
  s.label = label;
  s.threads = Threads(svc.pid);
  s.rss = RssMiB(svc.pid);
  std::vector<double> ms;
  for (uint64_t i = 0; i < a.consumes; ++i) {
    const std::string upath = "r" + std::to_string(round) + "-" + std::to_string(i) + ".dat";
    const std::string path = dir + "/root/" + upath;
    WriteFile(path, "payload of " + upath);
    struct stat sb;
    ::stat(path.c_str(), &sb);
    PublishRequest pub;
    pub.ns = "bench";
    pub.key = GenPathKey(upath, 3, 1024);
    pub.upath = upath;
    pub.prod_path = CanonicalPath(dir + "/root");
    pub.size = static_cast<uint64_t>(sb.st_size);
    pub.version = MtimeNs(sb);
    Encoder pe;
    pub.EncodeTo(pe);
    if (!CallLocal(root.socket, MsgType::kPublish, pe.data()).ok()) {
      ++s.errors;
      continue;
    }
    ConsumeRequest req;
    req.ns = "bench";
    req.key = pub.key;
    req.upath = upath;
    req.cons_path = CanonicalPath(dir + "/cons");
    req.timeout_ms = 30000;
    Encoder ce;
    req.EncodeTo(ce);
    const auto t0 = std::chrono::steady_clock::now();
    Result<std::string> r = CallLocal(svc.socket, MsgType::kConsume, ce.data(), 60000);
    const auto t1 = std::chrono::steady_clock::now();
    if (!r.ok()) {
      ++s.errors;
      continue;
    }
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  s.refused = RefusedConnections(svc);
  std::sort(ms.begin(), ms.end());
  if (!ms.empty()) {
    s.p50 = ms[ms.size() / 2];
    s.p99 = ms[std::min(ms.size() - 1, ms.size() * 99 / 100)];
  }
  return s;
}

int Usage() {
  std::fprintf(stderr,
               "usage: dyad-idle-connections [--service PATH] [--clients N] [--peers M] "
               "[--consumes K] [--tmp DIR] [--json]\n");
  return 2;
}

int Run(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string o = argv[i];
    if (o == "-h" || o == "--help") {
      std::printf(
          "dyad-idle-connections: threads, RSS and consume latency of one dyad-service "
          "under idle local clients and idle peers (bench/idle_connections.cc)\n");
      Usage();
      return 0;
    }
    if (o == "--json") {
      a.json = true;
      continue;
    }
    const char* v = i + 1 < argc ? argv[i + 1] : nullptr;
    if (v == nullptr) return Usage();
    if (o == "--service")
      a.service = v;
    else if (o == "--tmp")
      a.tmp = v;
    else if (o == "--clients" && ParseU64(v, &a.clients)) {
    } else if (o == "--peers" && ParseU64(v, &a.peers)) {
    } else if (o == "--consumes" && ParseU64(v, &a.consumes) && a.consumes > 0) {
    } else
      return Usage();
    ++i;
  }
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &rl);
  const uint64_t room = rl.rlim_cur > 200 ? rl.rlim_cur - 200 : 0;
  if (a.clients + a.peers > room) {
    std::fprintf(stderr, "descriptor limit %llu: clients and peers cut to fit\n",
                 static_cast<unsigned long long>(rl.rlim_cur));
    a.peers = std::min<uint64_t>(a.peers, room / 10);
    a.clients = room - a.peers;
  }
  std::string dir = a.tmp + "/dyad-idle.XXXXXX";
  if (::mkdtemp(dir.data()) == nullptr) return 1;
  ::mkdir((dir + "/cons").c_str(), 0755);
  if (!WriteText(dir + "/secret", kSecret).ok() || ::chmod((dir + "/secret").c_str(), 0600) != 0)
    return 1;

  int rc = 0;
  Result<Proc> root = StartService(a, dir, 0, "embedded");
  Result<Proc> svc = root.ok() ? StartService(a, dir, 1, "embedded://" + root->listen)
                               : Result<Proc>(root.status());
  std::vector<Sample> samples;
  std::vector<UniqueFd> clients;
  std::vector<std::unique_ptr<Channel>> peers;
  if (!svc.ok()) {
    std::fprintf(stderr, "%s\n", svc.status().ToString().c_str());
    rc = 1;
  } else {
    samples.push_back(Measure("no idle connection", a, dir, *root, *svc, 0));
    for (uint64_t i = 0; i < a.clients; ++i) {
      Result<UniqueFd> fd = ConnectLocal(svc->socket);
      if (!fd.ok()) {
        std::fprintf(stderr, "client %llu: %s\n", static_cast<unsigned long long>(i),
                     fd.status().ToString().c_str());
        break;
      }
      clients.push_back(std::move(*fd));
      if (i % 2048 == 2047) Settle(svc->pid);  // let a threaded service keep up with its backlog
    }
    Settle(svc->pid);
    samples.push_back(
        Measure(std::to_string(clients.size()) + " idle clients", a, dir, *root, *svc, 1));
    Result<SocketAddress> tcp = ParseAddress(svc->listen);
    const Authenticator auth{std::string(kSecret)};
    for (uint64_t i = 0; i < a.peers && tcp.ok(); ++i) {
      Result<UniqueFd> fd = Connect(*tcp, Deadline::AfterMs(5000));
      if (!fd.ok()) break;
      auto ch = std::make_unique<Channel>(std::move(*fd), Trust::kUnauthenticated);
      PeerIdentity them;
      Status st = auth.Connect(*ch, PeerIdentity{static_cast<uint32_t>(1000 + i), 1},
                               Deadline::AfterMs(10000), &them);
      if (!st.ok()) {
        std::fprintf(stderr, "peer %llu: %s\n", static_cast<unsigned long long>(i),
                     st.ToString().c_str());
        break;
      }
      peers.push_back(std::move(ch));
    }
    Settle(svc->pid);
    samples.push_back(Measure(
        std::to_string(clients.size()) + " clients + " + std::to_string(peers.size()) + " peers", a,
        dir, *root, *svc, 2));
  }
  if (a.json) {
    std::printf("{\"benchmark\":\"idle-connections\",\"service\":\"%s\",\"results\":[",
                a.service.c_str());
    for (size_t i = 0; i < samples.size(); ++i) {
      const Sample& s = samples[i];
      std::printf(
          "%s{\"label\":\"%s\",\"clients\":%zu,\"peers\":%zu,\"threads\":%zu,"
          "\"rss_mib\":%.1f,\"consume_p50_ms\":%.3f,\"consume_p99_ms\":%.3f,"
          "\"errors\":%d,\"refused\":%llu}",
          i ? "," : "", s.label.c_str(), i >= 1 ? clients.size() : 0, i >= 2 ? peers.size() : 0,
          s.threads, s.rss, s.p50, s.p99, s.errors, static_cast<unsigned long long>(s.refused));
    }
    std::printf("]}\n");
  } else {
    std::printf("dyad-idle-connections: %s\n", a.service.c_str());
    std::printf("%-34s %8s %10s %12s %12s %7s %8s\n", "idle connections", "threads", "RSS MiB",
                "consume p50", "consume p99", "errors", "refused");
    for (const Sample& s : samples)
      std::printf("%-34s %8zu %10.1f %9.2f ms %9.2f ms %7d %8llu\n", s.label.c_str(), s.threads,
                  s.rss, s.p50, s.p99, s.errors, static_cast<unsigned long long>(s.refused));
  }
  clients.clear();
  peers.clear();
  if (svc.ok()) StopService(*svc);
  if (root.ok()) StopService(*root);
  std::system(("rm -rf '" + dir + "'").c_str());
  for (const Sample& s : samples) rc |= s.errors > 0 ? 1 : 0;
  return rc;
}

}  // namespace
}  // namespace dyad::bench

int main(int argc, char** argv) { return dyad::bench::Run(argc, argv); }
