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

// Writes a new cluster secret (256 random bits, 64 hex digits) to `path`,
// created mode 0600 (never over an existing file, never through a symlink).
int CmdSecretInit(const std::string& path);
// Checks the secret in `path` as dyad-service would (mode, strength);
// prints what is wrong, never the secret.
int CmdSecretCheck(const std::string& path);

// Publishes each file (the client core, configured from the environment).
int CmdProduce(const std::vector<std::string>& paths, bool verbose);

// Consumes each file; `timeout_s` >= 0 overrides DYAD_CONSUME_TIMEOUT
// (0: no limit). With `verbose`, prints per-file latency and what happened
// (which transport moved it, from which owner). With `progress`, a transfer
// that lasts shows a progress bar when stdout and stderr are terminals.
int CmdConsume(const std::vector<std::string>& paths, double timeout_s, bool verbose,
               bool progress = true);

// Declares (or withdraws) prefetch patterns with the local dyad-service:
// it then fetches matching files into DYAD_PATH_CONSUMER as they are
// published (docs/prefetch.md).
int CmdPrefetch(const std::vector<std::string>& patterns, bool cancel);

// Lists published files whose relative path starts with `prefix`.
// Lists published files whose relative path starts with `prefix`, sorted
// by path, marking those whose owner service is down.
// `ns` overrides DYAD_KVS_NAMESPACE when `ns_given`.
int CmdList(const std::string& prefix, const std::string& ns, bool ns_given, uint32_t limit,
            bool json);

// Identity, counters and transfers in flight of the local dyad-service;
// `prometheus` prints the counters in Prometheus' text format instead.
int CmdStatus(bool json, bool prometheus = false);

// `dyad start`: loads the Flux module dyad.so on the brokers `ranks` of the
// enclosing instance (flux exec -r RANKS flux module load DYAD.SO ...
// PATH), as upstream's `dyad start`. The module is found beside this
// program (PREFIX/lib/dyad.so) unless `module` names it.
struct FluxStartOptions {
  std::string path;    // producer directory (absolute)
  std::string mode;    // --mode for the module ("" = its default)
  std::string kvs;     // --kvs for the module ("" = flux://)
  std::string module;  // dyad.so ("" = beside this program)
  std::string ranks = "all";
  bool debug = false;
  bool verbose = false;
};
int CmdFluxStart(const FluxStartOptions& options);
// `dyad stop`: flux exec -r RANKS flux module remove dyad.
int CmdFluxStop(const std::string& ranks, bool verbose);
// PREFIX/lib/dyad.so (or BUILD/lib/dyad.so) beside this program, "" if none.
std::string FindFluxModule();

}  // namespace cli
}  // namespace dyad
