// The embedded store's row (common/backend.h).
#include "common/backend.h"

namespace dyad {

const BackendRow& BackendRow_embedded() {
  static const BackendRow row = {
      BackendKind::kStore,
      "embedded",
      {"embedded", "embedded://"},
      {},
      "Hosted by one dyad-service, the root (`embedded`, usually rank 0); every other service "
      "names the root (`embedded://ROOT_HOST:PORT`). Zero extra processes; not persistent.",
      TransportCaps{},
      KvsCapsWith(
          {&KvsCaps::shared, &KvsCaps::hosted_by_service, &KvsCaps::async_wait, &KvsCaps::watch}),
      {},
      "",
      "",
      DYAD_BACKEND_BUILT,
  };
  return row;
}

}  // namespace dyad
