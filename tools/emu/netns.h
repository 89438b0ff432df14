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

// Runs `fn` on a helper thread that has entered namespace `name` (sockets
// it creates belong to that namespace and stay usable after it returns).
// An empty name runs `fn` in the current namespace.
Status RunInNetns(const std::string& name, const std::function<void()>& fn);

}  // namespace dyad::emu
