// registry.cc: OpenKvs() and KvsBackendNames(), from an explicit list.
//
// Backends are listed here by hand rather than registered by static
// initializers, so linking the static library can never drop one silently
// and the set that exists is visible in one place.
#include <memory>
#include <string>
#include <vector>

#include "kvs/embedded/embedded_kvs.h"
#include "kvs/kvs.h"
#include "kvs/memory/memory_kvs.h"
#ifdef DYAD_HAVE_REDIS
#include "kvs/redis/redis_kvs.h"
#endif

namespace dyad {
namespace {

constexpr const char kEmbeddedScheme[] = "embedded://";
constexpr const char kRedisScheme[] = "redis://";
constexpr const char kRedisTlsScheme[] = "rediss://";

bool StartsWith(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

std::string Available() {
#ifdef DYAD_HAVE_REDIS
  return "available: memory, embedded://HOST:PORT, redis://[[USER]:PASSWORD@]HOST:PORT[/DB]";
#else
  return "available: memory, embedded://HOST:PORT";
#endif
}

}  // namespace

std::vector<std::string> KvsBackendNames() {
#ifdef DYAD_HAVE_REDIS
  return {"memory", "embedded", "redis"};
#else
  return {"memory", "embedded"};
#endif
}

Result<std::unique_ptr<Kvs>> OpenKvs(const std::string& url, const KvsOptions& options) {
  if (url == "memory" || url == "memory://") {
    return std::unique_ptr<Kvs>(std::make_unique<MemoryKvs>());
  }
  if (url == "embedded" || url == kEmbeddedScheme) {
    // The plain form means "this service hosts the root store"; the service
    // handles it itself (EmbeddedKvsServer). A client needs an address.
    return Status(DYAD_RC_BADREQUEST,
                  "metadata store '" + url +
                      "' names the store hosted by the root service; a client of it needs "
                      "embedded://HOST:PORT");
  }
  if (StartsWith(url, kEmbeddedScheme)) {
    Result<std::unique_ptr<EmbeddedKvs>> kvs =
        EmbeddedKvs::Open(url.substr(sizeof(kEmbeddedScheme) - 1), options);
    if (!kvs.ok()) return kvs.status();
    return std::unique_ptr<Kvs>(std::move(*kvs));
  }
  if (url == "redis" || StartsWith(url, kRedisScheme) || StartsWith(url, kRedisTlsScheme)) {
#ifdef DYAD_HAVE_REDIS
    if (url == "redis") {
      return Status(
          DYAD_RC_BADREQUEST,
          "metadata store 'redis' needs an address: redis://[[USER]:PASSWORD@]HOST:PORT[/DB]");
    }
    Result<std::unique_ptr<RedisKvs>> kvs = RedisKvs::Open(url, options);
    if (!kvs.ok()) return kvs.status();
    return std::unique_ptr<Kvs>(std::move(*kvs));
#else
    return Status(DYAD_RC_NOTSUP,
                  "redis store not compiled in (build with DYAD_ENABLE_REDIS); " + Available());
#endif
  }
  return Status(DYAD_RC_NOTSUP, "unknown metadata store '" + url + "'; " + Available());
}

}  // namespace dyad
