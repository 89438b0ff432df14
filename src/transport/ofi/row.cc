// The ofi transport's row (common/backend.h).
#include "common/backend.h"

namespace dyad {

const BackendRow& BackendRow_ofi() {
  static const BackendRow row = {
      BackendKind::kTransport,
      "ofi",
      {"OFI"},
      {"MARGO"},  // upstream's Margo DTL rode on libfabric; this is its role here
      "libfabric (verbs, cxi/Slingshot, efa, psm2/opx, tcp, shm): the requester pulls each "
      "chunk with one-sided RMA reads from the owner's registered buffers, several in flight "
      "(docs/ofi.md). MARGO selects it.",
      TransportCapsWith({&TransportCaps::rma_get, &TransportCaps::needs_registration}),
      KvsCaps{},
      {
          {"DYAD_OFI_PROVIDER", ConfigKind::kString, "", "service",
           "OFI transport: libfabric provider to use (tcp, shm, verbs, cxi, efa, psm2, opx, ...); "
           "unset means $FI_PROVIDER if set, else the highest-ranked provider with RMA reads that "
           "reaches other hosts. Every service must use the same one (docs/ofi.md)."},
          {"DYAD_OFI_DOMAIN", ConfigKind::kString, "", "service",
           "OFI transport: libfabric domain (NIC or interface, e.g. mlx5_0, cxi0, eth0); unset "
           "prefers a non-loopback one (docs/ofi.md)."},
          {"DYAD_OFI_POOL_BUFFERS", ConfigKind::kUint, "4", "service",
           "OFI transport: registered buffers per pool (receive and send, each 2 x --chunk-size "
           "bytes), 1..1024 (docs/ofi.md)."},
      },
      "DYAD_ENABLE_OFI",
      "libfabric-dev",
      DYAD_BACKEND_BUILT,
  };
  return row;
}

}  // namespace dyad
