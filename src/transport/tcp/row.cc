// The tcp transport's row (common/backend.h).
#include "common/backend.h"

namespace dyad {

const BackendRow& BackendRow_tcp() {
  static const BackendRow row = {
      BackendKind::kTransport,
      "tcp",
      {"TCP", "FLUX_RPC"},
      {},
      "Streams the file on the authenticated fetch session (sendfile/splice on the owner, bounded "
      "buffers on the requester). FLUX_RPC, upstream's default mode, selects it.",
      TransportCapsWith({&TransportCaps::data_on_session, &TransportCaps::zero_copy_send}),
      KvsCaps{},
      {},
      "",
      "",
      DYAD_BACKEND_BUILT,
  };
  return row;
}

}  // namespace dyad
