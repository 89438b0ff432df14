// module_options.h: the command line of the Flux module dyad.so.
//
// `flux module load dyad.so [OPTIONS] [PRODUCER_PATH]` passes OPTIONS to
// mod_main without a program name. Upstream DYAD's options are accepted as
// they are (-m/--mode, -d/--debug, -i/--info_log, -e/--error_log, -h/--help
// and the producer path); ours add the store (-k/--kvs) and the service
// binary (--service). Parsed by hand, not getopt: the broker loads modules on
// several threads, and getopt's state is global. No libflux here, so the
// parser is tested without a Flux instance.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace dyad {

struct ModuleOptions {
  bool help = false;
  bool debug = false;
  std::string mode;             // "" = DYAD_DTL_MODE or the service's default
  std::string info_log;         // upstream -i: per rank, FILE.<rank>
  std::string error_log;        // upstream -e: per rank, FILE.<rank>
  std::string kvs = "flux://";  // -k: flux://, embedded, memory, redis://...
  std::string service;          // --service: the dyad-service binary ("" = found beside dyad.so)
  std::string producer_path;    // "" = DYAD_PATH_PRODUCER
  double ready_timeout_s = 60;  // --ready-timeout: bound on `flux module load`
  // --fetch-chunk: bytes per dyad.fetch response. Upstream's FLUX_RPC
  // consumers take exactly one data response per file, so a file larger
  // than this fails there (DYAD_RC_BADRPC); ours read the whole stream.
  uint64_t fetch_chunk = 16u << 20;
};

// Parses the module's arguments (no program name). Errors name the
// offending argument (DYAD_RC_BADREQUEST).
Result<ModuleOptions> ParseModuleOptions(const std::vector<std::string>& args);

// The text of `flux module load dyad.so --help` (logged to flux dmesg).
std::string ModuleHelp();

// The modes the module accepts (upstream's spelling, any case).
bool IsModuleMode(const std::string& mode);

}  // namespace dyad
