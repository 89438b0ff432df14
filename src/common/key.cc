#include "common/key.h"

#include <cstdio>
#include <vector>

#include "common/murmur3.h"

namespace dyad {
namespace {

constexpr uint32_t kSeedPrimes[10] = {104677u, 104681u, 104683u, 104693u, 104701u,
                                      104707u, 104711u, 104717u, 104723u, 104729u};
constexpr uint32_t kSeedBase = 57u;
constexpr size_t kPadLength = 128;

}  // namespace

std::string GenPathKey(std::string_view upath, uint32_t depth, uint32_t bins) {
  if (bins == 0) bins = 1;
  std::string input(upath);
  if (input.size() < kPadLength) input.append(kPadLength - input.size(), '@');

  std::string key;
  key.reserve(depth * 4 + upath.size());
  uint32_t seed = kSeedBase;
  char hex[16];
  for (uint32_t level = 0; level < depth; ++level) {
    seed += kSeedPrimes[level % 10];
    uint32_t words[4];
    MurmurHash3_x64_128(input.data(), input.size(), seed, words);
    const uint32_t bin = (words[0] ^ words[1] ^ words[2] ^ words[3]) % bins;
    const int n = std::snprintf(hex, sizeof hex, "%x.", bin);
    key.append(hex, static_cast<size_t>(n));
  }
  key.append(upath);
  return key;
}

std::string_view PathOfKey(std::string_view key, uint32_t depth) {
  size_t pos = 0;
  for (uint32_t i = 0; i < depth; ++i) {
    const size_t dot = key.find('.', pos);
    if (dot == std::string_view::npos) return {};
    pos = dot + 1;
  }
  return key.substr(pos);
}

}  // namespace dyad
