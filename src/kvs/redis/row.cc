// The redis store's row (common/backend.h).
#include "common/backend.h"

namespace dyad {

const BackendRow& BackendRow_redis() {
  static const BackendRow row = {
      BackendKind::kStore,
      "redis",
      {"redis://", "redis+cluster://", "redis+sentinel://", "rediss://", "redis"},
      {},
      "Redis shared by every service: one server (redis://[[USER]:PASSWORD@]HOST:PORT[/DB]), "
      "a Redis Cluster (redis+cluster://HOST:PORT[,HOST:PORT...]) or a primary kept available "
      "by Redis Sentinel (redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]); "
      "docs/redis.md.",
      TransportCaps{},
      KvsCapsWith({&KvsCaps::persistent, &KvsCaps::shared, &KvsCaps::native_wait,
                   &KvsCaps::async_wait, &KvsCaps::watch}),
      {
          {"DYAD_REDIS_PASSWORD", ConfigKind::kString, "", "service",
           "Password for a redis:// store whose URL names none (keeps it out of command lines "
           "and `ps`)."},
      },
      "DYAD_ENABLE_REDIS",
      "libhiredis-dev",
      DYAD_BACKEND_BUILT,
  };
  return row;
}

}  // namespace dyad
