// format.h: how the tools, the emulator and the service print sizes, ids
// and wall-clock times, so every report reads the same.
#pragma once

#include <cstdint>
#include <string>

namespace dyad {

// "0 B", "512 B", "1.5 KiB", ... "2.0 PiB" (binary units, one decimal).
std::string HumanBytes(uint64_t bytes);

// A 64-bit id as 16 lowercase hex digits (incarnations).
std::string Hex64(uint64_t v);

// Local time "YYYY-MM-DD HH:MM:SS" of a wall-clock time in ns since the
// epoch; `unknown` when it is 0.
std::string LocalDateTime(uint64_t wall_ns, const char* unknown);

}  // namespace dyad
