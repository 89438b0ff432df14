// netns.h: Linux network namespaces for the emulated cluster.
//
// Thin wrappers over iproute2 (`ip netns`, `ip link`, `ip addr`) plus
// setns(2). Everything the emulated cluster creates lives inside namespaces
// it owns (named "dyademu-<pid>-..."), so deleting those namespaces removes
// every interface and address with them; the host's own network is never
// touched. Functions are thread-safe; RunInNetns switches only a helper
// thread, never the caller's.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "common/status.h"

namespace dyad::emu {

// Prefix of every namespace the emulated cluster creates.
inline constexpr const char* kNetnsPrefix = "dyademu-";

// True when this process can create network namespaces (root, iproute2
// present, a probe namespace can be created) and DYAD_EMU_NO_NETNS is not
// set to a true value. The answer is computed once and cached.
bool NetnsAvailable();
// Why NetnsAvailable() is false ("" when it is true).
std::string NetnsUnavailableReason();

// Runs `ip ARGS...`; on failure the error carries ip's output.
Status Ip(const std::vector<std::string>& args);

Status CreateNetns(const std::string& name);
// Removes the namespace name (the namespace itself goes away with its last
// process). Missing namespaces are not an error.
Status DeleteNetns(const std::string& name);
// Names under /run/netns.
std::vector<std::string> ListNetns();

// Deletes "dyademu-<pid>-*" namespaces whose <pid> is no longer alive
// (left behind by a test or demo that was killed). Returns how many.
int SweepStaleNetns();

// Runs fn(0), ..., fn(n - 1) on up to `threads` threads and returns the
// error of the lowest failing index (every call runs either way).
Status ParallelFor(int n, int threads, const std::function<Status(int)>& fn);

// Runs the `ip` commands `lines` (one per line, without "ip") in one `ip
// -batch` process, inside namespace `netns` ("" = ours). The lines go
// through `scratch_file`. With `force` every line is tried and the error
// reports the failures; otherwise ip stops at the first failing line.
// One process for many commands: on a loaded machine each `ip` process
// costs tens of milliseconds, which made a 64-node cluster take a minute.
Status IpBatch(const std::vector<std::string>& lines, const std::string& netns,
               const std::string& scratch_file, bool force = false);

// Creates the namespaces `names` (already recorded for deletion by the
// caller) in one batch; deletes them likewise (missing ones are skipped).
Status CreateNetnsBatch(const std::vector<std::string>& names, const std::string& scratch_file);
Status DeleteNetnsBatch(const std::vector<std::string>& names, const std::string& scratch_file);

// Joins node namespaces, each getting "eth0" with address ip/24 and its
// loopback up: a veth pair for two, otherwise one veth per node onto bridge
// br0 inside namespace `hub` (which must exist). Returns once every eth0
// is running (bounded). `scratch_dir` holds the batch files.
struct NodeLink {
  std::string netns;
  std::string ip;
};
Status ConnectNodes(const std::vector<NodeLink>& nodes, const std::string& hub,
                    const std::string& scratch_dir);

// Runs `fn` on a helper thread that has entered namespace `name` (sockets
// it creates belong to that namespace and stay usable after it returns).
// An empty name runs `fn` in the current namespace.
Status RunInNetns(const std::string& name, const std::function<void()>& fn);

}  // namespace dyad::emu
