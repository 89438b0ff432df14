// commands.h: the subcommands of the `dyad` command (main.cc parses the
// command line and calls one of these).
//
// Each returns the process exit code: 0 success, 1 the operation failed
// (the reason is on stderr). Output goes to stdout; nothing is printed on
// success unless the command is a query or `verbose` is set. Single-threaded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dyad {
namespace cli {

constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;
constexpr int kExitUsage = 2;

enum class InfoFormat { kText, kJson, kMarkdown };

// Version, compiled-in transports and stores, and the configuration table
// with each variable's current value.
int CmdInfo(InfoFormat format);

// Publishes each file through the C API (environment configuration).
int CmdProduce(const std::vector<std::string>& paths, bool verbose);

// Consumes each file; `timeout_s` >= 0 overrides DYAD_CONSUME_TIMEOUT
// (0: no limit). With `verbose`, prints per-file latency and what happened.
int CmdConsume(const std::vector<std::string>& paths, double timeout_s, bool verbose);

// Declares (or withdraws) prefetch patterns with the local dyad-service:
// it then fetches matching files into DYAD_PATH_CONSUMER as they are
// published (docs/prefetch.md).
int CmdPrefetch(const std::vector<std::string>& patterns, bool cancel);

// Lists published files whose relative path starts with `prefix`.
// `ns` overrides DYAD_KVS_NAMESPACE when `ns_given`.
int CmdList(const std::string& prefix, const std::string& ns, bool ns_given, uint32_t limit,
            bool json);

// Identity and counters of the local dyad-service.
int CmdStatus(bool json);

}  // namespace cli
}  // namespace dyad
