// murmur3.h: MurmurHash3, x64 128-bit variant (Austin Appleby's public-domain
// algorithm), used by the metadata key scheme. Pure function, thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>

namespace dyad {

// Hashes `len` bytes at `data` with `seed`; writes 16 bytes (two uint64_t,
// viewed by callers as four uint32_t words) to `out`.
void MurmurHash3_x64_128(const void* data, size_t len, uint32_t seed, void* out);

}  // namespace dyad
