// secret.h: the cluster secret the modules of one Flux instance share.
//
// Service links stay authenticated with nothing for the user to manage: the
// first module of an instance to load appends a fresh secret (256 random
// bits, NewClusterSecret) to the primary-namespace key `dyadmod.secret`, and
// every module (itself included) uses the FIRST line of that key. A Flux
// KVS append is ordered, so modules that load at the same moment still agree
// on one secret. The primary namespace is readable by the instance owner
// only (the KVS refuses guests), so the secret is exactly as private as the
// instance.
#pragma once

#include <flux/core.h>

#include <string>

#include "common/status.h"

namespace dyad {

inline constexpr const char* kFluxSecretKey = "dyadmod.secret";

// Returns the instance's secret, creating it when absent. Each KVS round
// trip is bounded by `timeout_s`.
Result<std::string> AgreeClusterSecret(flux_t* h, double timeout_s);

}  // namespace dyad
