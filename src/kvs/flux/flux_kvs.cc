// flux_kvs.cc: the flux:// store (being written; see flux_keys.h).
#include <memory>
#include <string>

#include "kvs/kvs.h"

namespace dyad {

Result<std::unique_ptr<Kvs>> OpenKvs_flux(const std::string& url, const KvsOptions& options) {
  (void)options;
  return Status(DYAD_RC_NOTSUP,
                "metadata store '" + url + "': the flux:// store is not written yet");
}

}  // namespace dyad
