#include "service/rank.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <limits>

namespace dyad {

const char* const kLauncherRankVariables[] = {
    "FLUX_TASK_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", nullptr};

namespace {

constexpr uint32_t kMaxRank = std::numeric_limits<uint32_t>::max();

std::string AllSources() {
  std::string vars = "DYAD_SERVICE_RANK";
  for (const char* const* v = kLauncherRankVariables; *v != nullptr; ++v) {
    vars += (v[1] == nullptr) ? " or " : ", ";
    vars += *v;
  }
  return vars;
}

}  // namespace

Result<uint32_t> ParseRank(const std::string& text, const std::string& source) {
  bool digits = !text.empty();
  for (char c : text) digits = digits && std::isdigit(static_cast<unsigned char>(c)) != 0;
  if (!digits)
    return Status(DYAD_RC_BAD_CLI_PARSE,
                  "invalid rank '" + text + "' (from " + source +
                      "): a rank is a non-negative decimal integer such as 0 or 17");
  errno = 0;
  const unsigned long long v = std::strtoull(text.c_str(), nullptr, 10);
  if (errno == ERANGE || v > kMaxRank)
    return Status(DYAD_RC_BAD_CLI_PARSE, "rank '" + text + "' (from " + source +
                                             ") is too large: the largest rank is " +
                                             std::to_string(kMaxRank));
  return static_cast<uint32_t>(v);
}

Result<uint32_t> ResolveServiceRank(const std::optional<std::string>& cli, const GetEnvFn& env) {
  if (cli) return ParseRank(*cli, "-r/--rank");
  if (const char* v = env("DYAD_SERVICE_RANK")) return ParseRank(v, "DYAD_SERVICE_RANK");
  for (const char* const* var = kLauncherRankVariables; *var != nullptr; ++var) {
    if (const char* v = env(*var)) {
      Result<uint32_t> r = ParseRank(v, std::string(*var) + ", set by the launcher");
      if (!r.ok())
        return r.status().Annotate(
            "cannot take the rank from the launcher (give -r/--rank N "
            "to override it)");
      return r;
    }
  }
  return Status(DYAD_RC_BAD_CLI_PARSE,
                "no rank: give -r/--rank N (0 for the service that hosts the embedded "
                "metadata store), or set " +
                    AllSources() + " (launchers such as flux, srun and mpirun set one per task)");
}

}  // namespace dyad
