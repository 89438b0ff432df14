// pattern.h: deterministic file contents for the demo, tests and benchmarks.
//
// Every file's bytes are a pure function of its relative name: a counter-based
// generator (SplitMix64 over 8-byte words, seeded by a 64-bit FNV-1a hash of
// the name), so any range can be produced or checked at any offset without
// reading what precedes it, and a consumer can verify a file it receives
// without a copy of the original. Stateless; safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace dyad::emu {

uint64_t PatternSeed(std::string_view name);

// Fills `buf` with bytes [offset, offset + len) of the stream for `seed`.
void FillPattern(uint64_t seed, uint64_t offset, void* buf, size_t len);

// Writes `size` bytes of the pattern to `fd` (from its current position).
Status WritePattern(int fd, uint64_t seed, uint64_t size);

// Checks that the file at `path` has `expect_size` bytes (unless negative)
// and that every byte matches the pattern. The error names the first bad
// offset.
Status VerifyPatternFile(const std::string& path, uint64_t seed, int64_t expect_size);

}  // namespace dyad::emu
