// dyad_params.hpp: explicit settings for the C++ streams, as in upstream DYAD.
//
// A dyad_params mirrors the parameters of dyad_init() (dyad/core/dyad_ctx.h)
// and is passed to dyad_stream_core::init(const dyad_params&). Its defaults
// are the C API's environment defaults (key depth 3, 1024 bins, service mux
// 1, DTL FLUX_RPC, no namespace, no managed paths), so a C++ program and a C
// or Python program of the same workflow compute the same metadata keys.
// Upstream's C++ defaults (depth 2, 256 bins, UCX) differed from its C
// defaults and made keys mismatch; that is deliberately not repeated.
//
// Threading: a plain value type; copy it freely, share it read-only.
#ifndef DYAD_STREAM_DYAD_PARAMS_HPP
#define DYAD_STREAM_DYAD_PARAMS_HPP

#include <dyad/common/dyad_dtl.h>
#include <dyad/dyad_config.hpp>

#include <string>

namespace dyad {

struct dyad_params {
  // DYAD_SYNC_DEBUG: one line on stderr per failure.
  bool m_debug = false;
  // DYAD_SYNC_CHECK.
  bool m_check = false;
  // DYAD_SHARED_STORAGE: the managed path is visible to every node.
  bool m_shared_storage = false;
  // DYAD_REINIT: replace a context that is already initialized.
  bool m_reinit = false;
  // DYAD_ASYNC_PUBLISH: publish returns once the node's service recorded it.
  bool m_async_publish = false;
  // DYAD_FSYNC_WRITE: the client also fsyncs the file and its directory on
  // publish (the streams always fsync the data they wrote).
  bool m_fsync_write = false;
  // DYAD_KEY_DEPTH: depth of the key hierarchy.
  unsigned int m_key_depth = 3u;
  // DYAD_KEY_BINS: hash bins per level.
  unsigned int m_key_bins = 1024u;
  // DYAD_SERVICE_MUX: services sharing one node-local storage.
  unsigned int m_service_mux = 1u;
  // DYAD_DTL_MODE as a dyad_dtl_mode value (DYAD_DTL_FLUX_RPC selects the
  // streaming TCP transport). Ignored when m_dtl_mode_name is not empty.
  int m_dtl_mode = DYAD_DTL_DEFAULT;
  // DYAD_DTL_MODE by name ("FLUX_RPC", "TCP", "UCX", "OFI", "LOCAL");
  // an extension over upstream, for the modes without an enum value.
  std::string m_dtl_mode_name;
  // DYAD_KVS_NAMESPACE ("" = the primary namespace).
  std::string m_kvs_namespace;
  // DYAD_PATH_CONSUMER ("" = not a consumer).
  std::string m_cons_managed_path;
  // DYAD_PATH_PRODUCER ("" = not a producer).
  std::string m_prod_managed_path;
  // DYAD_PATH_RELATIVE: relative names are relative to the managed path.
  bool m_relative_to_managed_path = false;

  dyad_params() = default;
};

}  // namespace dyad

#endif  // DYAD_STREAM_DYAD_PARAMS_HPP
