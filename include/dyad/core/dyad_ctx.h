/*
 * dyad_ctx.h: creation and teardown of the DYAD context, as in upstream DYAD.
 *
 * There is one context per process (upstream keeps a thread-local pointer set
 * by the thread that initialized it, so other threads saw none). Here every
 * thread of the process sees the same context, and every call below is
 * thread-safe. dyad_init()/dyad_finalize() must not race with calls that use
 * the context (initialize before starting worker threads, as with MPI).
 *
 * The context talks to the node's dyad-service. `flux_handle` (a flux_t*,
 * as upstream's) may be NULL, or the caller's open Flux handle: on a Flux
 * node whose broker runs no dyad.so module, consumes then look up records
 * in the instance's KVS and fetch from the owner's module with that handle
 * (instead of one DYAD opens from FLUX_URI). The handle is not owned: keep
 * it open until dyad_finalize(). See docs/flux.md.
 */
#ifndef DYAD_CORE_DYAD_CTX_H
#define DYAD_CORE_DYAD_CTX_H

#include <dyad/common/dyad_dtl.h>
#include <dyad/common/dyad_rc.h>
#include <dyad/common/dyad_structures.h>
#include <dyad/dyad_config.hpp>

#ifdef __cplusplus
extern "C" {
#else
#include <stdbool.h>
#endif

DYAD_DLL_EXPORTED dyad_ctx_t* dyad_ctx_get(void);
DYAD_DLL_EXPORTED void dyad_ctx_init(dyad_dtl_comm_mode_t dtl_comm_mode, void* flux_handle);
DYAD_DLL_EXPORTED void dyad_ctx_fini(void);

/* Initializes the process's context with explicit settings (see docs/configuration.md).
 * Returns DYAD_RC_OK if already initialized and reinit is false. */
DYAD_DLL_EXPORTED dyad_rc_t dyad_init(bool debug, bool check, bool shared_storage, bool reinit,
                                      bool async_publish, bool fsync_write, unsigned int key_depth,
                                      unsigned int key_bins, unsigned int service_mux,
                                      const char* kvs_namespace, const char* prod_managed_path,
                                      const char* cons_managed_path, bool relative_to_managed_path,
                                      const char* dtl_mode_str,
                                      const dyad_dtl_comm_mode_t dtl_comm_mode, void* flux_handle);

/* Initializes the context from the DYAD_* environment variables. */
DYAD_DLL_EXPORTED dyad_rc_t dyad_init_env(const dyad_dtl_comm_mode_t dtl_comm_mode,
                                          void* flux_handle);

DYAD_DLL_EXPORTED dyad_rc_t dyad_set_prod_path(const char* path);
DYAD_DLL_EXPORTED dyad_rc_t dyad_set_cons_path(const char* path);
DYAD_DLL_EXPORTED dyad_rc_t dyad_set_and_init_dtl_mode(const char* dtl_mode_name,
                                                       dyad_dtl_comm_mode_t dtl_comm_mode);

/* Releases everything the context holds but keeps the context object. */
DYAD_DLL_EXPORTED dyad_rc_t dyad_clear(void);
/* Releases the context. Safe to call when not initialized. */
DYAD_DLL_EXPORTED dyad_rc_t dyad_finalize(void);

#ifdef __cplusplus
}
#endif

#endif /* DYAD_CORE_DYAD_CTX_H */
