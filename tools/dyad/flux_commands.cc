// flux_commands.cc: `dyad start` and `dyad stop`, as upstream DYAD's
// bin/dyad: load or remove the Flux module dyad.so on the brokers of the
// enclosing Flux instance (flux exec -r RANKS flux module load|remove).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "common/config.h"

extern char** environ;

namespace dyad {
namespace cli {

namespace {

std::string SelfDir() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return ".";
  std::string self(buf, static_cast<size_t>(n));
  return self.substr(0, self.rfind('/'));
}

bool InFlux(const char* cmd) {
  const char* uri = std::getenv("FLUX_URI");
  if (uri != nullptr && *uri != '\0') return true;
  std::cerr << "dyad " << cmd
            << ": no Flux instance (FLUX_URI is not set): run it inside one, e.g. in a job of "
               "flux alloc or flux batch, or under flux start\n";
  return false;
}

int Run(const char* cmd, const std::vector<std::string>& args, bool verbose) {
  if (verbose) {
    std::cout << "dyad " << cmd << ":";
    for (const std::string& a : args) std::cout << " " << a;
    std::cout << std::endl;
  }
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid;
  const int err = ::posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
  if (err != 0) {
    std::cerr << "dyad " << cmd << ": cannot run '" << args[0] << "': " << std::strerror(err)
              << "\n";
    return kExitFailed;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      std::cerr << "dyad " << cmd << ": waitpid: " << std::strerror(errno) << "\n";
      return kExitFailed;
    }
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return kExitOk;
  std::cerr << "dyad " << cmd << ": '" << args[0] << " " << args[1] << " " << args[2] << " "
            << args[3] << " ...' failed ("
            << (WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                  : "signal " + std::to_string(WTERMSIG(status)))
            << "); `flux dmesg` on the failing broker says why\n";
  return kExitFailed;
}

}  // namespace

std::string FindFluxModule() {
  const std::string dir = SelfDir();
  // Installed: PREFIX/bin/dyad and PREFIX/lib/dyad.so; built: BUILD/dyad
  // and BUILD/lib/dyad.so.
  for (const std::string& p : {dir + "/../lib/dyad.so", dir + "/lib/dyad.so"})
    if (::access(p.c_str(), R_OK) == 0) return p;
  return "";
}

int CmdFluxStart(const FluxStartOptions& o) {
  if (!InFlux("start")) return kExitFailed;
  std::string module = o.module;
  if (module.empty()) module = FindFluxModule();
  if (module.empty()) {
    std::cerr << "dyad start: the Flux module dyad.so is not installed beside dyad (looked for "
              << SelfDir() << "/../lib/dyad.so); give it with --module PATH, or build DYAD with "
              << "flux-core (docs/flux.md)\n";
    return kExitFailed;
  }
  if (o.path.empty() || o.path[0] != '/') {
    std::cerr << "dyad start: -p PATH must be an absolute path (the brokers do not run in your "
                 "working directory)\n";
    return kExitUsage;
  }
  std::vector<std::string> args = {"flux", "exec", "-r", o.ranks, "flux", "module", "load", module};
  // (the module sees the broker's environment, not this one: the caller's
  // DYAD_DTL_MODE goes on the command line)
  std::string mode = o.mode;
  if (std::optional<std::string> env = GetEnv("DYAD_DTL_MODE"); mode.empty() && env) mode = *env;
  if (!mode.empty()) args.insert(args.end(), {"--mode", mode});
  if (!o.kvs.empty()) args.insert(args.end(), {"--kvs", o.kvs});
  if (o.debug) args.push_back("--debug");
  args.push_back(o.path);
  return Run("start", args, o.verbose);
}

int CmdFluxStop(const std::string& ranks, bool verbose) {
  if (!InFlux("stop")) return kExitFailed;
  return Run("stop", {"flux", "exec", "-r", ranks, "flux", "module", "remove", "dyad"}, verbose);
}

}  // namespace cli
}  // namespace dyad
