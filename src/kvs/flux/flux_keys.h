// flux_keys.h: how the flux:// store lays out keys and values in a Flux KVS.
// Plain functions (no libflux): the store uses them, and so do clients that
// read records of a Flux instance with libflux loaded at run time.
#pragma once

#include <string>

namespace dyad {

// The Flux KVS key of `key` (filled in by the store's commit).
std::string FluxKvsKey(const std::string& key);

}  // namespace dyad
