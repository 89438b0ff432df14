// cluster.h: an emulated DYAD cluster on one machine.
//
// EmuCluster gives each emulated node what a real node has: its own network
// (a Linux network namespace with a private address, joined to the others by
// a veth pair or, for three or more nodes, a bridge in a hub namespace), its
// own node-local storage (<base>/node<i>/dmd), and its own dyad-service. When
// namespaces are unavailable (not root, or DYAD_EMU_NO_NETNS=1) the nodes
// share the loopback interface and differ by port. Addresses are taken from
// 10.213.0.0/16 and exist only inside namespaces the cluster created.
//
// Teardown (explicit, from the destructor, or from the signal thread that
// InstallSignalTeardown starts) stops every process, deletes the namespaces
// and removes the directory tree. Construction first deletes namespaces left
// behind by emulated clusters of processes that no longer exist.
//
// Threading: one thread drives a cluster; Teardown may additionally run from
// the signal thread (it only kills, deletes namespaces and removes files).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/net.h"
#include "common/status.h"
#include "common/time.h"
#include "emu/process.h"
#include "proto/protocol.h"

namespace dyad::emu {

struct ClusterOptions {
  // Node whose service hosts the embedded metadata store.
  int root_node = 0;
  // Metadata store URL of every service (e.g. redis://127.0.0.1:6379);
  // "" = the embedded store hosted by root_node's service.
  std::string kvs;
  // Transport (`dyad-service -m`, and DYAD_DTL_MODE for clients); "" = default.
  std::string mode;
  // Appended to every dyad-service command line (before the directory).
  std::vector<std::string> extra_service_args;
  // Appended to the command line of node i's service only (after the above).
  std::map<int, std::vector<std::string>> node_service_args;
  // Give the services the cluster secret (--secret-file). Without it they
  // need another credential (e.g. --munge) in the extra arguments.
  bool use_secret = true;
  // Extra environment of the services.
  std::map<std::string, std::string> service_env;
  // dyad-service to run; "" = FindSiblingProgram("dyad-service", bin_dir).
  std::string service_binary;
  // Where to look for dyad-service and dyad first.
  std::string bin_dir;
  // Use network namespaces when available (false: always loopback).
  bool use_netns = true;
  // Leave the directory tree in place at teardown (namespaces still go).
  bool keep = false;
  // Bound on a service becoming ready.
  int64_t ready_timeout_ms = 10000;
  // Parent of the cluster directory; "" = $TMPDIR or /tmp.
  std::string tmp_parent;
  // Services log at debug level.
  bool debug = false;
  // DYAD_KVS_NAMESPACE given to clients.
  std::string kvs_namespace = "emu";
  // TCP port of the services inside namespaces (loopback mode picks free ports).
  uint16_t netns_port = 7590;
  // Emulates a shared file system: every node's managed directory is
  // <base>/shared, and clients get DYAD_SHARED_STORAGE=1.
  bool shared_storage = false;
};

struct NodeInfo {
  int index = 0;
  uint32_t rank = 0;
  std::string netns;  // "" in loopback mode
  std::string ip;
  uint16_t port = 0;  // service TCP port (known once the service has started)
  std::string dir;    // <base>/node<i>
  std::string dmd;    // managed directory (producer and consumer)
  std::string run;    // socket, ready file
  std::string log;    // service and worker logs
  std::string socket;
  std::string ready_file;
  std::string service_log;
  // Environment for a client on this node (DYAD_PATH_PRODUCER/CONSUMER,
  // DYAD_SERVICE_SOCKET, DYAD_KVS_NAMESPACE, DYAD_DTL_MODE when set).
  std::map<std::string, std::string> env;
  std::string address() const { return ip + ":" + std::to_string(port); }
};

class EmuCluster {
 public:
  // Creates the nodes and starts every service: the root, then all the
  // others at once, their readiness bounded together by
  // options.ready_timeout_ms. On failure everything created is removed and
  // the error carries the failing service's log tail.
  static Result<std::unique_ptr<EmuCluster>> Start(int n_nodes, ClusterOptions options = {});

  EmuCluster(const EmuCluster&) = delete;
  EmuCluster& operator=(const EmuCluster&) = delete;
  ~EmuCluster();

  int size() const { return static_cast<int>(nodes_.size()); }
  bool uses_netns() const { return netns_; }
  const NodeInfo& node(int i) const { return nodes_.at(i).info; }
  const ClusterOptions& options() const { return options_; }
  const std::string& base_dir() const { return base_; }
  const std::string& secret_file() const { return secret_file_; }
  const std::string& secret() const { return secret_; }

  Status StartService(int i);
  // SIGTERM; an error if the service needed SIGKILL after `grace_ms` or
  // exited with a failure status (it is stopped either way).
  Status StopService(int i, int64_t grace_ms = 5000);
  Status KillService(int i);
  Status RestartService(int i);
  bool ServiceRunning(int i);
  pid_t ServicePid(int i) const;

  // Starts a program on node i (in its namespace) with the node's client
  // environment plus `extra_env`. Output goes to `output_path`, by default a
  // fresh file in the node's log directory.
  Result<Process> SpawnOnNode(int i, const std::vector<std::string>& argv,
                              const std::map<std::string, std::string>& extra_env = {},
                              const std::string& output_path = "");
  // Runs a program on node i to completion (killed after `timeout_ms`).
  Result<RunResult> RunOnNode(int i, const std::vector<std::string>& argv, int64_t timeout_ms,
                              const std::map<std::string, std::string>& extra_env = {});

  // A TCP connection made from inside node `from`'s network.
  Result<UniqueFd> ConnectFrom(int from, const std::string& address, Deadline deadline);

  // Shapes node i's outgoing traffic to `rate` (tc tbf, e.g. "400mbit") so
  // that a transfer lasts long enough to be interrupted; "" removes the
  // limit. DYAD_RC_NOTSUP in loopback mode (the host's interfaces are never
  // touched).
  Status LimitBandwidth(int i, const std::string& rate);

  // The service's statistics (status RPC over its Unix socket).
  Result<StatusReply> ServiceStatus(int i);
  // One counter; an error if the service does not report it.
  Result<uint64_t> Counter(int i, const std::string& name);

  // The last `max_bytes` of the service's log and captured output.
  std::string ServiceLogTail(int i, size_t max_bytes = 4000) const;

  // Stops everything and removes what the cluster created. Idempotent.
  void Teardown();

 private:
  struct Node {
    NodeInfo info;
    Process service;
    std::string service_out;  // captured stdout/stderr of the service
  };

  explicit EmuCluster(ClusterOptions options);
  Status Setup(int n_nodes);
  Status SetupNetwork(int n_nodes);
  std::vector<std::string> ServiceArgv(int i) const;
  // Starts node i's service without waiting for it (StartService = this + WaitReady).
  Status SpawnService(int i);
  Status WaitReady(int i, Deadline deadline);
  void ReleaseResources();  // namespaces and directory; any thread

  friend void EmergencyTeardownAll();

  ClusterOptions options_;
  std::vector<Node> nodes_;
  bool netns_ = false;
  std::string root_;  // <tmp_parent>/dyademu-XXXXXX: owner.pid, removed at teardown
  std::string base_;  // root_/c-XXXXXX: the nodes' directories (cluster.cc: SpreadBelow)
  std::string shared_;
  std::string secret_;
  std::string secret_file_;
  std::string service_binary_;
  std::atomic<int> spawn_seq_{0};
  std::vector<pid_t> spawned_;  // worker processes started on nodes

  // Guards what the signal thread may read: namespace names and the base.
  std::mutex res_mu_;
  std::vector<std::string> netns_names_;
  bool released_ = false;
  bool torn_down_ = false;
};

// Finds a program installed beside the running one: the environment
// override DYAD_SERVICE_BIN for dyad-service, `bin_dir`, the directory of
// /proc/self/exe and its parent, then PATH.
// "" if not found.
std::string FindSiblingProgram(const std::string& name, const std::string& bin_dir = "");

// One request of `type` on a fresh connection to the service listening on
// Unix socket `socket_path`; the reply's body.
Result<std::string> CallLocalService(const std::string& socket_path, MsgType type,
                                     const std::string& request, Deadline deadline);

// Status RPC to the service listening on Unix socket `socket_path`.
Result<StatusReply> QueryServiceStatus(const std::string& socket_path,
                                       Deadline deadline = Deadline::AfterMs(10000));

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (and the threads
// it creates later) and starts a thread that, on one of them, tears down
// every live EmuCluster and then dies of that signal. Call early in main,
// before other threads exist. Idempotent.
void InstallSignalTeardown();
// What that thread runs; exposed for tests.
void EmergencyTeardownAll();
// True once an emergency teardown has started (the process is about to die
// of a signal); long-running callers use it to stop reporting.
bool Interrupted();

// Recursively removes a directory tree (not following symlinks).
Status RemoveTree(const std::string& path);

}  // namespace dyad::emu
