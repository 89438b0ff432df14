// redis_slot.cc: key -> hash slot (see redis_slot.h).
#include "kvs/redis/redis_slot.h"

#include <array>

namespace dyad {
namespace {

constexpr std::array<uint16_t, 256> MakeTable() {
  std::array<uint16_t, 256> t{};
  for (int i = 0; i < 256; ++i) {
    uint16_t crc = static_cast<uint16_t>(i << 8);
    for (int bit = 0; bit < 8; ++bit)
      crc = static_cast<uint16_t>((crc & 0x8000) ? (crc << 1) ^ 0x1021 : crc << 1);
    t[static_cast<size_t>(i)] = crc;
  }
  return t;
}

constexpr std::array<uint16_t, 256> kTable = MakeTable();

}  // namespace

uint16_t RedisCrc16(const char* data, size_t len) {
  uint16_t crc = 0;
  for (size_t i = 0; i < len; ++i) {
    const uint8_t byte = static_cast<uint8_t>(data[i]);
    crc = static_cast<uint16_t>((crc << 8) ^ kTable[((crc >> 8) ^ byte) & 0xff]);
  }
  return crc;
}

int RedisKeySlot(const std::string& key) {
  const size_t open = key.find('{');
  if (open != std::string::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != std::string::npos && close > open + 1)
      return RedisCrc16(key.data() + open + 1, close - open - 1) % kRedisSlots;
  }
  return RedisCrc16(key.data(), key.size()) % kRedisSlots;
}

}  // namespace dyad
