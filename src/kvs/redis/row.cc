// The redis store's row (common/backend.h).
#include "common/backend.h"

namespace dyad {

const BackendRow& BackendRow_redis() {
  static const BackendRow row = {
      BackendKind::kStore,
      "redis",
      {"redis://", "rediss://", "redis"},
      {},
      "A Redis server shared by every service: redis://[[USER]:PASSWORD@]HOST:PORT[/DB] "
      "(docs/redis.md).",
      TransportCaps{},
      KvsCapsWith({&KvsCaps::persistent, &KvsCaps::shared, &KvsCaps::native_wait}),
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
