// Fuzz target: Redis URL parsing (kvs/redis ParseRedisUrl). Whatever the
// URL, the answer is a configuration within its documented ranges or an
// error, never a crash.
#include <string>

#include "fuzz/fuzz_util.h"
#include "kvs/redis/redis_url.h"

using namespace dyad;
using dyad::fuzz::Check;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string url(reinterpret_cast<const char*>(data), size);
  Result<RedisConfig> cfg = ParseRedisUrl(url);
  if (!cfg.ok()) return 0;
  Check(!cfg->nodes.empty());
  for (const RedisAddress& node : cfg->nodes) {
    Check(node.port > 0 && node.port <= 65535);
    Check(!node.host.empty());
  }
  Check(cfg->db >= 0);
  Check(cfg->connect_timeout_ms >= 0 && cfg->command_timeout_ms >= 0);
  return 0;
}
