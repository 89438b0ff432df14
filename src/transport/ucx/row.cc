// The ucx transport's row (common/backend.h).
#include "common/backend.h"

namespace dyad {

const BackendRow& BackendRow_ucx() {
  static const BackendRow row = {
      BackendKind::kTransport,
      "ucx",
      {"UCX"},
      {},
      "UCX (InfiniBand, RoCE, shared memory, tcp): chunks move as tagged messages into the "
      "requester's registered buffers; between services on one host the owner writes them "
      "straight into the requester's shared buffer (docs/ucx.md).",
      TransportCapsWith({&TransportCaps::needs_registration}),  // pooled, registered buffers
      KvsCaps{},
      {
          {"DYAD_UCX_POOL_BUFFERS", ConfigKind::kUint, "4", "service",
           "UCX transport: registered buffers per pool (receive and send, each 2 x --chunk-size "
           "bytes), 1..1024 (docs/ucx.md)."},
          {"DYAD_UCX_SHM", ConfigKind::kString, "auto", "service",
           "UCX transport: 'auto' lets two services on one host move files through shared memory "
           "(the owner writes into the requester's buffer); 'off' keeps them on UCX messages "
           "(docs/ucx.md)."},
      },
      "DYAD_ENABLE_UCX",
      "libucx-dev",
      DYAD_BACKEND_BUILT,
  };
  return row;
}

}  // namespace dyad
