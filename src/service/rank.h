// rank.h: where a dyad-service's rank comes from.
//
// A rank names one service in the cluster (peers fetch from "rank 3"), so a
// wrong one is worse than none: the service must never guess. The rank is,
// first match wins: -r/--rank; DYAD_SERVICE_RANK; the task rank a launcher
// sets for one task per node (FLUX_TASK_RANK, SLURM_PROCID,
// OMPI_COMM_WORLD_RANK, PMI_RANK, PMIX_RANK). A source that is present but
// not a plain decimal number (empty, "x", "-1", "3a", out of range) is an
// error, never skipped: `-r ""` or DYAD_SERVICE_RANK=$UNSET_VAR must not
// silently become rank 0 or fall through to another variable. No source at
// all is an error that names every option and variable.
//
// Pure functions; the environment is passed in, so tests need not touch the
// process's own.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "common/status.h"

namespace dyad {

// The launcher variables, in the order they are consulted (after
// DYAD_SERVICE_RANK), null-terminated.
extern const char* const kLauncherRankVariables[];

// A rank written as decimal digits only, at most UINT32_MAX. `source`
// names where the text came from, for the message ("-r/--rank",
// "DYAD_SERVICE_RANK").
Result<uint32_t> ParseRank(const std::string& text, const std::string& source);

// The rank of this service: `cli` (the -r/--rank value, when given), else
// the first variable set in `env` (DYAD_SERVICE_RANK, then the launcher
// variables). Errors are DYAD_RC_BAD_CLI_PARSE with a message that says
// what to do.
using GetEnvFn = std::function<const char*(const char*)>;
Result<uint32_t> ResolveServiceRank(const std::optional<std::string>& cli, const GetEnvFn& env);

}  // namespace dyad
