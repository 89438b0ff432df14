// key.h: the metadata key scheme of upstream DYAD (gen_path_key).
//
// A key is `b1.b2...bD.path`: for each of `depth` levels a hex bin number
// (MurmurHash3_x64_128 of the path, padded with '@' to 128 bytes when
// shorter, with a per-level seed; the four 32-bit words XORed, modulo `bins`),
// then the path itself. Producers and consumers must use the same depth and
// bins, which is why every language binding shares one set of defaults.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace dyad {

constexpr uint32_t kDefaultKeyDepth = 3;
constexpr uint32_t kDefaultKeyBins = 1024;

// Returns the key for `upath` (a path relative to the managed directory).
// `bins` of 0 is treated as 1. `upath` must be non-empty.
std::string GenPathKey(std::string_view upath, uint32_t depth, uint32_t bins);

// Inverse of the path part: strips the `depth` bin components from a key.
// Returns an empty view if the key does not have that many components.
std::string_view PathOfKey(std::string_view key, uint32_t depth);

}  // namespace dyad
