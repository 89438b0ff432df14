// The flux store's row (common/backend.h).
#include "common/backend.h"

namespace dyad {

const BackendRow& BackendRow_flux() {
  static const BackendRow row = {
      BackendKind::kStore,
      "flux",
      {"flux://", "flux"},
      {},
      "The KVS of a Flux instance: `flux://` (the instance of $FLUX_URI, as under `flux start`, "
      "`flux alloc` or the Flux module) or `flux://?uri=URI`. Keys escaped, values readable "
      "with `flux kvs get`; the default store under the Flux module. See \"The flux:// store\" in "
      "docs/configuration.md.",
      TransportCaps{},
      KvsCapsWith({&KvsCaps::shared, &KvsCaps::native_wait, &KvsCaps::async_wait, &KvsCaps::watch}),
      {},
      "DYAD_ENABLE_FLUX",
      "flux-core",
      DYAD_BACKEND_BUILT,
  };
  return row;
}

}  // namespace dyad
