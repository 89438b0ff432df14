// Fuzz target: Redis URL parsing (kvs/redis ParseRedisUrl). Whatever the
// URL, the answer is a configuration within its documented ranges or an
// error, never a crash.
#include <string>

#include "fuzz/fuzz_util.h"
#include "kvs/redis/redis_kvs.h"

using namespace dyad;
using dyad::fuzz::Check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string url(reinterpret_cast<const char*>(data), size);
  Result<RedisConfig> cfg = ParseRedisUrl(url);
  if (!cfg.ok()) return 0;
  Check(cfg->port > 0 && cfg->port <= 65535);
  Check(cfg->db >= 0);
  Check(cfg->connect_timeout_ms >= 0 && cfg->command_timeout_ms >= 0);
  Check(!cfg->host.empty());
  return 0;
}
