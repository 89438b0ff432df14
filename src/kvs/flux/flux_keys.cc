#include "kvs/flux/flux_keys.h"

namespace dyad {

std::string FluxKvsKey(const std::string& key) { return "dyad." + key; }

}  // namespace dyad
