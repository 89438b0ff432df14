// The local transport's row (common/backend.h).
#include "common/backend.h"

namespace dyad {

const BackendRow& BackendRow_local() {
  static const BackendRow row = {
      BackendKind::kTransport,
      "local",
      {"LOCAL"},
      {},
      "Copies within one node (copy_file_range, holes kept) from the owner service's producer "
      "directory; chosen automatically for every owner on the same node.",
      TransportCapsWith({&TransportCaps::same_node_only}),
      KvsCaps{},
      {},
      "",
      "",
      DYAD_BACKEND_BUILT,
  };
  return row;
}

}  // namespace dyad
