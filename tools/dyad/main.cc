// main.cc: the `dyad` command: inspect the configuration, publish and fetch
// files by hand, list published files, show a service's counters, and run
// the two-node demo. See `dyad --help` and `dyad SUBCOMMAND --help`.
//
// Exit codes: 0 success, 1 the operation failed, 2 usage error.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "commands.h"
#include "dyad/dyad_config.hpp"
#include "dyad_version.h"
#include "inspect.h"

namespace {

using dyad::cli::kExitFailed;
using dyad::cli::kExitOk;
using dyad::cli::kExitUsage;

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  std::string self(buf, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/'));
}

// `dyad demo ARGS` runs the demo program, dyad-demo (tools/demo), with ARGS:
// the emulator it needs is no part of this command. It sits beside `dyad`
// in the build tree and in <libexecdir>/dyad once installed.
int RunDemo(const std::vector<std::string>& rest) {
  const std::string dir = SelfDir();
  const std::vector<std::string> candidates = {dir + "/dyad-demo",
                                               dir + "/" DYAD_BIN_TO_LIBEXEC "/dyad-demo"};
  for (const std::string& demo : candidates) {
    if (::access(demo.c_str(), X_OK) != 0) continue;
    std::vector<std::string> args = {demo};
    args.insert(args.end(), rest.begin(), rest.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(demo.c_str(), argv.data());
    std::cerr << "dyad demo: cannot run " << demo << ": " << std::strerror(errno) << "\n";
    return kExitFailed;
  }
  std::cerr << "dyad demo: the demo program is not installed (looked for " << candidates[0]
            << " and " << candidates[1] << ")\n";
  return kExitFailed;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "dyad " DYAD_VERSION
      ": move files from the nodes that produce them to the nodes that read them.\n"
      "Settings come from DYAD_* environment variables (see `dyad info`); each node runs a "
      "dyad-service."};
  app.name("dyad");
  app.set_version_flag("--version", "dyad " DYAD_VERSION_FULL, "Show the version and exit");
  app.require_subcommand(0, 1);

  std::string socket;
  app.add_option("--socket", socket,
                 "Unix socket of the local dyad-service (sets DYAD_SERVICE_SOCKET)")
      ->type_name("PATH");

  // info
  auto* info =
      app.add_subcommand("info",
                         "Show the version, compiled-in transports and metadata stores, and every "
                         "configuration variable with its default and current value");
  bool info_json = false;
  bool info_markdown = false;
  info->add_flag("--json", info_json, "Print as JSON");
  info->add_flag("--markdown", info_markdown,
                 "Print the configuration table as Markdown (docs/configuration.md)");

  // produce
  auto* produce =
      app.add_subcommand("produce",
                         "Publish files that are complete in the producer-managed directory "
                         "(DYAD_PATH_PRODUCER), as dyad_produce() does");
  std::vector<std::string> produce_paths;
  bool produce_verbose = false;
  produce->add_option("PATH", produce_paths, "Files to publish")->required();
  produce->add_flag("-v,--verbose", produce_verbose,
                    "Print each file published and the time it took");

  // consume
  auto* consume = app.add_subcommand(
      "consume",
      "Wait until files are published and complete in the consumer-managed "
      "directory (DYAD_PATH_CONSUMER), fetching them if needed, as dyad_consume() does");
  std::vector<std::string> consume_paths;
  double consume_timeout = -1;
  bool consume_verbose = false;
  consume->add_option("PATH", consume_paths, "Files to consume")->required();
  consume
      ->add_option("-t,--timeout", consume_timeout,
                   "Longest wait per file in seconds, 0 = no limit (overrides "
                   "DYAD_CONSUME_TIMEOUT)")
      ->type_name("SEC")
      ->check(CLI::NonNegativeNumber);
  consume->add_flag("-v,--verbose", consume_verbose,
                    "Print per-file latency, whether the file was transferred, and which owner "
                    "and transport served it");
  bool consume_no_progress = false;
  consume->add_flag("--no-progress", consume_no_progress,
                    "Never draw a progress bar (drawn on a terminal while a transfer lasts)");

  // prefetch
  auto* prefetch = app.add_subcommand(
      "prefetch",
      "Declare what this node's consumers will read: the local dyad-service fetches "
      "matching files into DYAD_PATH_CONSUMER as soon as they are published "
      "(already published ones at once), so later consumes are local");
  std::vector<std::string> prefetch_patterns;
  bool prefetch_cancel = false;
  prefetch
      ->add_option("PATTERN", prefetch_patterns,
                   "Path prefix, or glob with * ? [ ] ('*' also matches '/'), under the consumer "
                   "directory (absolute) or relative to it")
      ->required();
  prefetch->add_flag("--cancel", prefetch_cancel, "Withdraw these declarations");

  // ls
  auto* ls = app.add_subcommand(
      "ls",
      "List published files sorted by path: path, owner rank (marked when its service is "
      "down), size, version time");
  std::string ls_prefix;
  std::string ls_ns;
  uint32_t ls_limit = 0;
  bool ls_json = false;
  ls->add_option("PREFIX", ls_prefix,
                 "Only paths (relative to the managed directory) starting with this");
  auto* ns_opt =
      ls->add_option("-n,--namespace", ls_ns, "Metadata namespace (default: DYAD_KVS_NAMESPACE)");
  ls->add_option("--limit", ls_limit, "Show at most this many (0 = all)");
  ls->add_flag("--json", ls_json, "Print as JSON");

  // status
  auto* status = app.add_subcommand(
      "status",
      "Show the local dyad-service's identity, counters, transfers in flight and "
      "the reads waiting for a publication (docs/operations.md)");
  std::string status_socket;
  bool status_json = false;
  bool status_prometheus = false;
  status->add_option("--socket", status_socket, "Unix socket of the service to ask")
      ->type_name("PATH");
  status->add_flag("--json", status_json, "Print as JSON");
  status->add_flag("--prometheus", status_prometheus,
                   "Print the counters and gauges in Prometheus' text format (counters end in "
                   "_total; for node_exporter's textfile collector or a scrape wrapper)");

  // peers
  auto* peers = app.add_subcommand(
      "peers",
      "List the services registered in the metadata store: rank, state (alive, down, "
      "stopped cleanly, stale, refused, from an authenticated ping by the local service), "
      "address, host, pid, incarnation, start time, last contact");
  double peers_timeout = 2;
  bool peers_json = false;
  peers
      ->add_option("-t,--timeout", peers_timeout,
                   "Seconds each service has to answer the ping (0: do not ping)")
      ->type_name("SEC")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  peers->add_flag("--json", peers_json, "Print as JSON");

  // secret
  auto* secret = app.add_subcommand(
      "secret", "Make or check the cluster secret the services authenticate each other with");
  secret->require_subcommand(1);
  auto* secret_init = secret->add_subcommand(
      "init",
      "Write a new cluster secret (256 random bits as 64 hex digits) to FILE, mode 600; an "
      "existing file is never overwritten");
  std::string secret_path;
  secret_init->add_option("FILE", secret_path, "Where to write it (e.g. ~/.dyad/secret)")
      ->required();
  auto* secret_check = secret->add_subcommand(
      "check",
      "Check FILE as dyad-service would (mode 600, at least 128 bits); never prints the secret");
  secret_check->add_option("FILE", secret_path, "The secret file")->required();

  // start / stop: the Flux module on the brokers of the enclosing instance.
  dyad::cli::FluxStartOptions start_opt;
  auto* start = app.add_subcommand(
      "start",
      "Load the Flux module dyad.so on every broker of the enclosing Flux instance "
      "(flux exec -r all flux module load PREFIX/lib/dyad.so [--mode MODE] PATH), as upstream's "
      "`dyad start`: each broker then runs its dyad-service and serves dyad.fetch");
  start->add_option("-p,--path", start_opt.path, "Producer-managed directory (absolute)")
      ->required()
      ->type_name("PATH");
  start
      ->add_option("-m,--mode", start_opt.mode,
                   "Transport: UCX, FLUX_RPC, MARGO, TCP or OFI (default DYAD_DTL_MODE, else "
                   "FLUX_RPC)")
      ->type_name("MODE");
  start
      ->add_option("-k,--kvs", start_opt.kvs,
                   "Metadata store: flux:// (default), embedded or redis://HOST:PORT")
      ->type_name("URL");
  start->add_option("--module", start_opt.module, "The module (default: PREFIX/lib/dyad.so)")
      ->type_name("PATH");
  start->add_option("-r,--ranks", start_opt.ranks, "Brokers to load it on (default all)")
      ->type_name("IDSET");
  start->add_flag("-d,--debug", start_opt.debug, "Debug logging (to flux dmesg)");
  start->add_flag("-v,--verbose", start_opt.verbose, "Print the command it runs");
  std::string stop_ranks = "all";
  bool stop_verbose = false;
  auto* stop = app.add_subcommand(
      "stop",
      "Remove the Flux module dyad from every broker of the enclosing Flux instance "
      "(flux exec -r all flux module remove dyad): each stops its dyad-service");
  stop->add_option("-r,--ranks", stop_ranks, "Brokers to remove it from (default all)")
      ->type_name("IDSET");
  stop->add_flag("-v,--verbose", stop_verbose, "Print the command it runs");

  // demo: everything after the word goes to dyad-demo untouched, --help too.
  auto* demo = app.add_subcommand("demo",
                                  "Run a two-node producer/consumer demonstration on this machine "
                                  "(`dyad demo --help` for its options)");
  demo->prefix_command();
  demo->set_help_flag();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }

  if (!socket.empty()) ::setenv("DYAD_SERVICE_SOCKET", socket.c_str(), 1);
  if (!status_socket.empty()) ::setenv("DYAD_SERVICE_SOCKET", status_socket.c_str(), 1);

  if (*info) {
    return dyad::cli::CmdInfo(info_json       ? dyad::cli::InfoFormat::kJson
                              : info_markdown ? dyad::cli::InfoFormat::kMarkdown
                                              : dyad::cli::InfoFormat::kText);
  }
  if (*produce) return dyad::cli::CmdProduce(produce_paths, produce_verbose);
  if (*consume)
    return dyad::cli::CmdConsume(consume_paths, consume_timeout, consume_verbose,
                                 !consume_no_progress);
  if (*prefetch) return dyad::cli::CmdPrefetch(prefetch_patterns, prefetch_cancel);
  if (*ls) return dyad::cli::CmdList(ls_prefix, ls_ns, ns_opt->count() > 0, ls_limit, ls_json);
  if (*status) return dyad::cli::CmdStatus(status_json, status_prometheus);
  if (*peers) return dyad::cli::CmdPeers(peers_timeout, peers_json);
  if (*demo) return RunDemo(demo->remaining());
  if (*start) return dyad::cli::CmdFluxStart(start_opt);
  if (*stop) return dyad::cli::CmdFluxStop(stop_ranks, stop_verbose);
  if (*secret_init) return dyad::cli::CmdSecretInit(secret_path);
  if (*secret_check) return dyad::cli::CmdSecretCheck(secret_path);

  std::cerr << app.help();
  return kExitUsage;
}
