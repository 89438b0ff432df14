// redis_slot.h: the Redis Cluster hash slot of a key.
//
// CRC16 (XMODEM: polynomial 0x1021, initial value 0) of the key, modulo
// 16384; when the key holds a non-empty "{...}" hash tag (the first "{"
// and the first "}" after it), only the tag is hashed, as Redis does.
// Threading: pure functions.
#pragma once

#include <cstdint>
#include <string>

namespace dyad {

constexpr int kRedisSlots = 16384;

uint16_t RedisCrc16(const char* data, size_t len);
int RedisKeySlot(const std::string& key);

}  // namespace dyad
