// The memory store's row (common/backend.h).
#include "common/backend.h"

namespace dyad {

const BackendRow& BackendRow_memory() {
  static const BackendRow row = {
      BackendKind::kStore,
      "memory",
      {"memory", "memory://"},
      {},
      "In the service's own memory, visible to that service only: a single node, or tests.",
      TransportCaps{},
      KvsCapsWith({&KvsCaps::native_wait, &KvsCaps::async_wait, &KvsCaps::watch}),
      {},
      "",
      "",
      DYAD_BACKEND_BUILT,
  };
  return row;
}

}  // namespace dyad
