#include "emu/cluster.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <linux/fs.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "common/config.h"
#include "common/seal.h"
#include "common/time.h"
#include "common/wire.h"
#include "emu/netns.h"

namespace dyad::emu {
namespace {

// Live clusters, for the signal thread.
std::mutex& ClustersMu() {
  static std::mutex mu;
  return mu;
}
std::set<EmuCluster*>& Clusters() {
  static std::set<EmuCluster*> live;
  return live;
}

std::atomic<int> g_cluster_seq{0};

// Set (and held) by the emergency teardown of the signal thread.
std::atomic<bool> g_interrupted{false};
std::mutex& EmergencyMu() {
  static std::mutex mu;
  return mu;
}

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string SelfExeDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  buf[n] = '\0';
  return Dirname(buf);
}

Status MakeDir(const std::string& path, mode_t mode = 0755) {
  if (::mkdir(path.c_str(), mode) != 0 && errno != EEXIST)
    return StatusFromErrno(errno, "mkdir '" + path + "'");
  // The umask may have narrowed the mode; the service's socket directory
  // must be exactly 0700.
  if (::chmod(path.c_str(), mode) != 0) return StatusFromErrno(errno, "chmod '" + path + "'");
  return Status::OK();
}

std::string ReadTail(const std::string& path, size_t max_bytes) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return "";
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return "";
  const off_t size = st.st_size;
  const off_t start =
      size > static_cast<off_t>(max_bytes) ? size - static_cast<off_t>(max_bytes) : 0;
  std::string out(static_cast<size_t>(size - start), '\0');
  const ssize_t n = ::pread(fd.get(), out.data(), out.size(), start);
  out.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return out;
}

// Parses "key=value" lines.
std::map<std::string, std::string> ReadKeyValues(const std::string& path) {
  std::map<std::string, std::string> kv;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) kv[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return kv;
}

int RemoveEntry(const char* path, const struct stat*, int type, struct FTW*) {
  if (type == FTW_DP)
    ::rmdir(path);
  else
    ::unlink(path);
  return 0;
}

// Removes <parent>/dyademu-* trees whose owner.pid names a dead process
// (a demo or test that was killed before it could clean up).
void SweepStaleDirectories(const std::string& parent) {
  DIR* d = ::opendir(parent.c_str());
  if (!d) return;
  std::vector<std::string> stale;
  while (dirent* e = ::readdir(d)) {
    if (std::strncmp(e->d_name, "dyademu-", 8) != 0) continue;
    const std::string dir = parent + "/" + e->d_name;
    std::ifstream in(dir + "/owner.pid");
    long pid = 0;
    if (!(in >> pid) || pid <= 0 || pid == ::getpid()) continue;
    if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) stale.push_back(dir);
  }
  ::closedir(d);
  for (const auto& dir : stale) (void)RemoveTree(dir);
}

// Asks ext4 to spread the subdirectories of `dir` over its block groups
// (the "top directory" flag, chattr +T: the Orlov allocator then starts a
// new subdirectory in a group chosen from the hash of its name, not beside
// its parent). Best effort: other file systems refuse the flag.
//
// Why: ext4 without a journal (this project's VMs have their /tmp on one)
// does not reuse an inode freed less than ~30 s ago, and every inode
// allocation in a block group scans past each such inode (recently_deleted()
// in fs/ext4/ialloc.c). A benchmark run removes its tree at the end, so the
// next run, placed in the same group as everything else created in /tmp,
// paid that scan on every file it created: dyad-small-files on ext4 fell
// from 2,000 to 900 files/s run after run (publish and consume alike), and
// a plain loop of open(O_CREAT) in /tmp took 700 us per file. Below a top
// directory, a randomly named subdirectory starts in a fresh group, away
// from the inodes earlier runs just freed.
// True when the flag was set.
bool SpreadBelow(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return false;
  int flags = 0;
  if (::ioctl(fd.get(), FS_IOC_GETFLAGS, &flags) != 0) return false;
  flags |= FS_TOPDIR_FL;
  return ::ioctl(fd.get(), FS_IOC_SETFLAGS, &flags) == 0;
}

// Whether creating a file in `dir` is quick (the fastest of three creates
// under 200 us; a group whose recently freed inodes are scanned takes about
// a millisecond per file). The probes are removed.
bool CreatesQuickly(const std::string& dir) {
  uint64_t best = UINT64_MAX;
  for (int i = 0; i < 3; ++i) {
    const std::string probe = dir + "/.probe" + std::to_string(i);
    const uint64_t t0 = MonoNs();
    UniqueFd fd(::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    const uint64_t took = MonoNs() - t0;
    if (!fd.valid()) return true;  // not ours to judge: the caller reports errors
    ::unlink(probe.c_str());
    best = std::min(best, took);
  }
  return best < 200000;
}

}  // namespace

Status RemoveTree(const std::string& path) {
  if (path.empty() || path == "/")
    return Status(DYAD_RC_BADREQUEST, "refusing to remove '" + path + "'");
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) return Status::OK();
  if (::nftw(path.c_str(), RemoveEntry, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) != 0)
    return StatusFromErrno(errno, "remove '" + path + "'");
  if (::lstat(path.c_str(), &st) == 0)
    return Status(DYAD_RC_SYSFAIL, "could not remove all of '" + path + "'");
  return Status::OK();
}

std::string FindSiblingProgram(const std::string& name, const std::string& bin_dir) {
  std::vector<std::string> candidates;
  if (!bin_dir.empty()) candidates.push_back(bin_dir + "/" + name);
  if (name == "dyad-service") {
    if (std::optional<std::string> v = GetEnv("DYAD_SERVICE_BIN"); v && !v->empty())
      candidates.insert(candidates.begin(), *v);
  }
  const std::string self = SelfExeDir();
  if (!self.empty()) {
    candidates.push_back(self + "/" + name);
    candidates.push_back(Dirname(self) + "/" + name);
  }
  for (const auto& c : candidates) {
    if (::access(c.c_str(), X_OK) == 0) return c;
  }
  return FindProgram(name);
}

Result<std::string> CallLocalService(const std::string& socket_path, MsgType type,
                                     const std::string& request, Deadline deadline) {
  auto addr = ParseAddress("unix:" + socket_path);
  if (!addr.ok()) return addr.status();
  auto fd = Connect(*addr, deadline);
  if (!fd.ok()) return fd.status();
  Channel ch(std::move(*fd), Trust::kUnauthenticated);
  DYAD_RETURN_IF_ERROR(TrustLocalService(ch));
  std::string body;
  DYAD_RETURN_IF_ERROR(CallRpc(ch, type, request, &body, deadline));
  return body;
}

Result<StatusReply> QueryServiceStatus(const std::string& socket_path, Deadline deadline) {
  Result<std::string> body = CallLocalService(socket_path, MsgType::kStatus, "", deadline);
  if (!body.ok()) return body.status().Annotate("status of service at " + socket_path);
  StatusReply reply;
  Decoder d(*body);
  if (!reply.DecodeFrom(d))
    return Status(DYAD_RC_BADUNPACK, "malformed status reply from " + socket_path);
  return reply;
}

EmuCluster::EmuCluster(ClusterOptions options) : options_(std::move(options)) {}

Result<std::unique_ptr<EmuCluster>> EmuCluster::Start(int n_nodes, ClusterOptions options) {
  if (n_nodes < 1 || n_nodes > 250)
    return Status(DYAD_RC_BADREQUEST, "emulated cluster: 1 to 250 nodes");
  if (options.root_node < 0 || options.root_node >= n_nodes)
    return Status(DYAD_RC_BADREQUEST, "emulated cluster: root node out of range");
  std::unique_ptr<EmuCluster> c(new EmuCluster(std::move(options)));
  {
    std::lock_guard<std::mutex> lock(ClustersMu());
    Clusters().insert(c.get());
  }
  Status st = c->Setup(n_nodes);
  if (!st.ok()) {
    c->Teardown();
    return st;
  }
  return c;
}

EmuCluster::~EmuCluster() { Teardown(); }

Status EmuCluster::Setup(int n_nodes) {
  service_binary_ = options_.service_binary.empty()
                        ? FindSiblingProgram("dyad-service", options_.bin_dir)
                        : options_.service_binary;
  if (service_binary_.empty() || ::access(service_binary_.c_str(), X_OK) != 0)
    return Status(DYAD_RC_SYSFAIL, "dyad-service not found (looked beside this program, in '" +
                                       options_.bin_dir + "', $DYAD_SERVICE_BIN and PATH)");

  netns_ = options_.use_netns && NetnsAvailable();
  if (netns_) SweepStaleNetns();

  std::string parent = options_.tmp_parent;
  if (parent.empty()) {
    const char* t = std::getenv("TMPDIR");
    parent = (t && *t) ? t : "/tmp";
  }
  SweepStaleDirectories(parent);
  std::string templ = parent + "/dyademu-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr)
    return StatusFromErrno(errno, "mkdtemp in '" + parent + "'");
  {
    std::lock_guard<std::mutex> lock(res_mu_);
    root_ = templ;
  }
  ::chmod(root_.c_str(), 0755);
  if (!options_.keep) {
    // Marks the tree as removable once this process is gone (see
    // SweepStaleDirectories); kept trees carry no marker.
    const std::string pid = std::to_string(::getpid()) + "\n";
    UniqueFd fd(
        ::open((root_ + "/owner.pid").c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (fd.valid()) (void)WriteFully(fd.get(), pid.data(), pid.size());
  }
  // The nodes live one level down, in a directory with a random name below
  // a "top directory": see SpreadBelow.
  const bool spread = SpreadBelow(root_);
  std::string inner;
  for (int attempt = 0;; ++attempt) {
    inner = root_ + "/c-XXXXXX";
    if (::mkdtemp(inner.data()) == nullptr)
      return StatusFromErrno(errno, "mkdtemp in '" + root_ + "'");
    // The group chosen may still be one where files were removed seconds
    // ago (an earlier run's): creating a file there takes a millisecond
    // rather than microseconds. Another name then, a few times at most.
    if (!spread || attempt == 5 || CreatesQuickly(inner)) break;
    ::rmdir(inner.c_str());
  }
  {
    std::lock_guard<std::mutex> lock(res_mu_);
    base_ = inner;
  }
  ::chmod(base_.c_str(), 0755);
  shared_ = base_ + "/shared";
  DYAD_RETURN_IF_ERROR(MakeDir(shared_));

  // The cluster secret: random, readable by the owner only (the service
  // refuses a secret file others can read).
  unsigned char raw[24];
  DYAD_RETURN_IF_ERROR(RandomBytes(raw, sizeof raw));
  static const char* kHex = "0123456789abcdef";
  for (unsigned char b : raw) {
    secret_ += kHex[b >> 4];
    secret_ += kHex[b & 15];
  }
  secret_file_ = base_ + "/secret";
  {
    UniqueFd fd(::open(secret_file_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd.valid()) return StatusFromErrno(errno, "create '" + secret_file_ + "'");
    const std::string line = secret_ + "\n";
    DYAD_RETURN_IF_ERROR(WriteFully(fd.get(), line.data(), line.size()));
  }

  nodes_.resize(static_cast<size_t>(n_nodes));
  for (int i = 0; i < n_nodes; ++i) {
    NodeInfo& n = nodes_[i].info;
    n.index = i;
    n.rank = static_cast<uint32_t>(i);
    n.dir = base_ + "/node" + std::to_string(i);
    n.dmd = options_.shared_storage ? shared_ : n.dir + "/dmd";
    n.run = n.dir + "/run";
    n.log = n.dir + "/log";
    for (const auto* d : {&n.dir, &n.dmd, &n.log}) DYAD_RETURN_IF_ERROR(MakeDir(*d));
    // Holds the service's socket: dyad-service refuses a directory others can use.
    DYAD_RETURN_IF_ERROR(MakeDir(n.run, 0700));
    if (options_.shared_storage) n.env["DYAD_SHARED_STORAGE"] = "1";
    n.socket = n.run + "/service.sock";
    n.ready_file = n.run + "/ready";
    n.service_log = n.log + "/service.log";
    nodes_[i].service_out = n.log + "/service.out";
    n.env["DYAD_PATH_PRODUCER"] = n.dmd;
    n.env["DYAD_PATH_CONSUMER"] = n.dmd;
    n.env["DYAD_SERVICE_SOCKET"] = n.socket;
    n.env["DYAD_KVS_NAMESPACE"] = options_.kvs_namespace;
    if (!options_.mode.empty()) n.env["DYAD_DTL_MODE"] = options_.mode;
  }

  DYAD_RETURN_IF_ERROR(SetupNetwork(n_nodes));

  // The root first: the others need its address for the metadata store.
  DYAD_RETURN_IF_ERROR(StartService(options_.root_node));
  // Then every other service at once, and one bounded wait for all: a
  // service's start is mostly waiting (its store connection, its ready
  // file), so 64 nodes take about as long as one instead of 64 times it.
  for (int i = 0; i < n_nodes; ++i) {
    if (i != options_.root_node) DYAD_RETURN_IF_ERROR(SpawnService(i));
  }
  const Deadline deadline = Deadline::AfterMs(options_.ready_timeout_ms);
  for (int i = 0; i < n_nodes; ++i) {
    if (i != options_.root_node) DYAD_RETURN_IF_ERROR(WaitReady(i, deadline));
  }
  return Status::OK();
}

Status EmuCluster::SetupNetwork(int n) {
  if (!netns_) {
    // Loopback: every node on 127.0.0.1, each service picks a free port at
    // its first start and keeps it across restarts.
    for (auto& node : nodes_) {
      node.info.ip = "127.0.0.1";
      node.info.port = 0;
    }
    return Status::OK();
  }
  const int seq = g_cluster_seq.fetch_add(1);
  const std::string stem =
      std::string(kNetnsPrefix) + std::to_string(::getpid()) + "-" + std::to_string(seq) + "-";
  const std::string subnet = "10.213." + std::to_string(::getpid() % 200) + ".";
  const std::string hub = stem + "hub";
  std::vector<NodeLink> links;
  {
    // Recorded before they exist, so a failure half way (or a signal)
    // deletes whatever was created; deleting a missing one is no error.
    std::lock_guard<std::mutex> lock(res_mu_);
    for (int i = 0; i < n; ++i) {
      NodeInfo& info = nodes_[i].info;
      info.netns = stem + std::to_string(i);
      info.ip = subnet + std::to_string(i + 1);
      info.port = options_.netns_port;
      netns_names_.push_back(info.netns);
      links.push_back({info.netns, info.ip});
    }
    if (n > 2) netns_names_.push_back(hub);
  }
  std::vector<std::string> names;
  for (const NodeLink& l : links) names.push_back(l.netns);
  if (n > 2) names.push_back(hub);
  DYAD_RETURN_IF_ERROR(CreateNetnsBatch(names, base_ + "/ip-netns.batch"));
  return ConnectNodes(links, hub, base_);
}

std::vector<std::string> EmuCluster::ServiceArgv(int i) const {
  const NodeInfo& n = nodes_[i].info;
  const bool root = i == options_.root_node;
  std::vector<std::string> a = {
      service_binary_, "-r", std::to_string(n.rank), "-l", n.address(), "-s", n.socket};
  a.push_back("-k");
  if (!options_.kvs.empty()) {
    a.push_back(options_.kvs);
  } else if (root) {
    a.push_back("embedded");
    a.push_back("--root");
  } else {
    a.push_back("embedded://" + nodes_[options_.root_node].info.address());
  }
  if (options_.use_secret) {
    a.push_back("--secret-file");
    a.push_back(secret_file_);
  }
  for (const std::string& s :
       {std::string("--ready-file"), n.ready_file, std::string("-i"), n.service_log,
        std::string("-e"), n.service_log, std::string("--cons-path"), n.dmd})
    a.push_back(s);
  if (!options_.mode.empty()) {
    a.push_back("-m");
    a.push_back(options_.mode);
  }
  if (options_.debug) a.push_back("-d");
  a.insert(a.end(), options_.extra_service_args.begin(), options_.extra_service_args.end());
  if (auto it = options_.node_service_args.find(i); it != options_.node_service_args.end())
    a.insert(a.end(), it->second.begin(), it->second.end());
  a.push_back(n.dmd);
  return a;
}

Status EmuCluster::StartService(int i) {
  Node& node = nodes_.at(static_cast<size_t>(i));
  if (node.service.valid() && !node.service.Exited()) return Status::OK();
  DYAD_RETURN_IF_ERROR(SpawnService(i));
  return WaitReady(i, Deadline::AfterMs(options_.ready_timeout_ms));
}

Status EmuCluster::SpawnService(int i) {
  Node& node = nodes_.at(static_cast<size_t>(i));
  if (i != options_.root_node && nodes_[options_.root_node].info.port == 0)
    return Status(DYAD_RC_NOSERVICE,
                  "node " + std::to_string(i) + ": the root service has not started yet");
  ::unlink(node.info.ready_file.c_str());
  SpawnOptions o;
  o.argv = ServiceArgv(i);
  o.env = options_.service_env;
  o.netns = node.info.netns;
  o.stdout_path = node.service_out;
  o.stderr_path = node.service_out;
  {
    // A marker in the captured output separates the runs of a restarted service.
    UniqueFd fd(::open(node.service_out.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
    std::string cmd = "--- start:";
    for (const auto& a : o.argv) cmd += " " + a;
    cmd += "\n";
    if (fd.valid()) (void)WriteFully(fd.get(), cmd.data(), cmd.size());
  }
  auto p = Process::Spawn(o);
  if (!p.ok()) return p.status().Annotate("start dyad-service on node " + std::to_string(i));
  node.service = std::move(*p);
  return Status::OK();
}

Status EmuCluster::WaitReady(int i, Deadline deadline) {
  Node& node = nodes_[i];
  for (;;) {
    struct stat st;
    if (::stat(node.info.ready_file.c_str(), &st) == 0) {
      auto kv = ReadKeyValues(node.info.ready_file);
      auto listen = ParseAddress(kv["advertise"]);
      if (listen.ok() && listen->port != 0) {
        // Keep the port: a restarted service must be found where the
        // others (and the metadata store's membership record) expect it.
        node.info.port = listen->port;
        return Status::OK();
      }
    }
    if (node.service.Exited()) {
      return Status(DYAD_RC_NOSERVICE, "dyad-service on node " + std::to_string(i) + " exited (" +
                                           node.service.exit_status()->ToString() +
                                           ") before becoming ready:\n" + ServiceLogTail(i));
    }
    if (deadline.expired()) {
      node.service.Kill();
      return Status(DYAD_RC_TIMEOUT,
                    "dyad-service on node " + std::to_string(i) + " not ready within " +
                        std::to_string(options_.ready_timeout_ms) + " ms:\n" + ServiceLogTail(i));
    }
    // The ready file appears once; polling it at a short interval is the
    // simplest bounded wait that also notices the service dying.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

Status EmuCluster::StopService(int i, int64_t grace_ms) {
  Node& node = nodes_.at(static_cast<size_t>(i));
  if (!node.service.valid()) return Status::OK();
  if (node.service.exit_status()) return Status::OK();
  node.service.Signal(SIGTERM);
  auto st = node.service.Wait(Deadline::AfterMs(grace_ms));
  if (!st.ok()) {
    node.service.Kill();
    return Status(DYAD_RC_TIMEOUT, "dyad-service on node " + std::to_string(i) +
                                       " ignored SIGTERM for " + std::to_string(grace_ms) +
                                       " ms; killed");
  }
  if (!st->success())
    return Status(DYAD_RC_SYSFAIL,
                  "dyad-service on node " + std::to_string(i) + " stopped with " + st->ToString());
  return Status::OK();
}

Status EmuCluster::KillService(int i) {
  Node& node = nodes_.at(static_cast<size_t>(i));
  if (node.service.valid()) node.service.Kill();
  return Status::OK();
}

Status EmuCluster::RestartService(int i) {
  Status stop = StopService(i);
  Status start = StartService(i);
  if (!start.ok()) return start;
  return stop;
}

bool EmuCluster::ServiceRunning(int i) {
  Node& node = nodes_.at(static_cast<size_t>(i));
  return node.service.valid() && !node.service.Exited();
}

pid_t EmuCluster::ServicePid(int i) const {
  return nodes_.at(static_cast<size_t>(i)).service.pid();
}

Result<Process> EmuCluster::SpawnOnNode(int i, const std::vector<std::string>& argv,
                                        const std::map<std::string, std::string>& extra_env,
                                        const std::string& output_path) {
  const NodeInfo& n = node(i);
  SpawnOptions o;
  o.argv = argv;
  o.env = n.env;
  for (const auto& [k, v] : extra_env) o.env[k] = v;
  o.netns = n.netns;
  o.stdout_path = output_path.empty()
                      ? n.log + "/proc-" + std::to_string(spawn_seq_.fetch_add(1)) + ".out"
                      : output_path;
  o.stderr_path = o.stdout_path;
  auto p = Process::Spawn(o);
  if (p.ok()) spawned_.push_back(p->pid());
  return p;
}

Result<RunResult> EmuCluster::RunOnNode(int i, const std::vector<std::string>& argv,
                                        int64_t timeout_ms,
                                        const std::map<std::string, std::string>& extra_env) {
  const NodeInfo& n = node(i);
  SpawnOptions o;
  o.argv = argv;
  o.env = n.env;
  for (const auto& [k, v] : extra_env) o.env[k] = v;
  o.netns = n.netns;
  return RunCapture(o, timeout_ms);
}

Result<UniqueFd> EmuCluster::ConnectFrom(int from, const std::string& address, Deadline deadline) {
  auto addr = ParseAddress(address);
  if (!addr.ok()) return addr.status();
  Result<UniqueFd> out(Status(DYAD_RC_SYSFAIL, "not run"));
  Status st = RunInNetns(node(from).netns, [&] { out = Connect(*addr, deadline); });
  if (!st.ok()) return st;
  return out;
}

Status EmuCluster::LimitBandwidth(int i, const std::string& rate) {
  const NodeInfo& n = node(i);
  if (n.netns.empty() || size() < 2)
    return Status(DYAD_RC_NOTSUP, "bandwidth limits need network namespaces");
  std::vector<std::string> argv = {"tc", "qdisc"};
  if (rate.empty()) {
    argv.insert(argv.end(), {"del", "dev", "eth0", "root"});
  } else {
    // replace: works whether or not a limit is already set.
    argv.insert(argv.end(), {"replace", "dev", "eth0", "root", "tbf", "rate", rate, "burst",
                             "256kb", "latency", "200ms"});
  }
  SpawnOptions o;
  o.argv = argv;
  o.netns = n.netns;
  auto r = RunCapture(o, 10000);
  if (!r.ok()) return r.status();
  if (!r->status.success())
    return Status(DYAD_RC_SYSFAIL, "tc on node " + std::to_string(i) + ": " + r->output);
  return Status::OK();
}

Result<StatusReply> EmuCluster::ServiceStatus(int i) { return QueryServiceStatus(node(i).socket); }

Result<uint64_t> EmuCluster::Counter(int i, const std::string& name) {
  auto s = ServiceStatus(i);
  if (!s.ok()) return s.status();
  auto it = s->counters.find(name);
  if (it == s->counters.end())
    return Status(DYAD_RC_NOTFOUND,
                  "service on node " + std::to_string(i) + " reports no counter '" + name + "'");
  return it->second;
}

std::string EmuCluster::ServiceLogTail(int i, size_t max_bytes) const {
  const Node& n = nodes_.at(static_cast<size_t>(i));
  std::string out =
      "--- " + n.info.service_log + " (tail)\n" + ReadTail(n.info.service_log, max_bytes);
  const std::string captured = ReadTail(n.service_out, max_bytes);
  if (!captured.empty()) out += "\n--- " + n.service_out + " (tail)\n" + captured;
  return out;
}

void EmuCluster::ReleaseResources() {
  // Held throughout, so that a second caller (teardown racing the signal
  // thread) returns only once everything is gone.
  std::lock_guard<std::mutex> lock(res_mu_);
  if (released_) return;
  released_ = true;
  if (!netns_names_.empty()) {
    // One process for all of them; the batch file lives in the tree removed
    // just after (or in /tmp when the tree is gone already).
    const std::string scratch = (base_.empty() ? std::string("/tmp") : base_) + "/ip-delete.batch";
    Status st = DeleteNetnsBatch(netns_names_, scratch);
    if (!st.ok()) std::fprintf(stderr, "dyad emu: %s\n", st.ToString().c_str());
  }
  if (!options_.keep && !root_.empty()) {
    Status st = RemoveTree(root_);
    if (!st.ok()) std::fprintf(stderr, "dyad emu: %s\n", st.ToString().c_str());
  }
}

void EmuCluster::Teardown() {
  if (torn_down_) return;
  torn_down_ = true;
  // Workers first: they may hold connections to the services.
  for (pid_t pid : spawned_) KillChildGroup(pid);
  // SIGTERM every service at once, then wait for each, so n nodes take one
  // grace period rather than n.
  for (auto& node : nodes_) node.service.Signal(SIGTERM);
  for (auto& node : nodes_) {
    if (!node.service.valid()) continue;
    if (!node.service.Wait(Deadline::AfterMs(3000)).ok()) node.service.Kill();
  }
  ReleaseResources();
  std::lock_guard<std::mutex> lock(ClustersMu());
  Clusters().erase(this);
}

bool Interrupted() { return g_interrupted.load(); }

void EmergencyTeardownAll() {
  std::lock_guard<std::mutex> emergency(EmergencyMu());
  g_interrupted = true;
  KillAllChildren();
  // Holding the registry lock keeps every listed cluster alive: a cluster
  // being destroyed on another thread waits in Teardown to unregister.
  std::lock_guard<std::mutex> lock(ClustersMu());
  for (EmuCluster* c : Clusters()) c->ReleaseResources();
}

void InstallSignalTeardown() {
  static std::once_flag once;
  std::call_once(once, [] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);
    // A main thread that finishes while the signal thread is still tearing
    // down must not end the process half way: exit waits for it.
    std::atexit([] {
      if (g_interrupted.load()) {
        std::lock_guard<std::mutex> wait(EmergencyMu());
      }
    });
    std::thread([set] {
      int sig = 0;
      while (sigwait(&set, &sig) != 0) {
      }
      std::fprintf(stderr, "\ndyad: %s received, tearing down the emulated cluster\n",
                   strsignal(sig));
      EmergencyTeardownAll();
      // Die of the same signal so the parent shell sees the usual status.
      ::signal(sig, SIG_DFL);
      sigset_t one;
      sigemptyset(&one);
      sigaddset(&one, sig);
      pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
      ::raise(sig);
      _exit(128 + sig);
    }).detach();
  });
}

}  // namespace dyad::emu
