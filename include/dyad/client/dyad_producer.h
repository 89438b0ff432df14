/*
 * dyad_producer.h: the producer's lock, an addition of this implementation
 * to upstream DYAD's API (upstream has no equivalent).
 *
 * While a process writes a file under the producer-managed directory it
 * holds an exclusive flock() on it; the node's dyad-service takes a shared
 * lock before it serves the file, so a file being (re)written is never
 * served half-written. The preload library, the C++ streams and pydyad's
 * dyad_open all take the lock through these calls, with one bounded wait:
 * the context's RPC timeout (DYAD_RPC_TIMEOUT), polling at growing intervals,
 * interruptions retried. Publishing stays dyad_produce() after the close.
 */
#ifndef DYAD_CLIENT_DYAD_PRODUCER_H
#define DYAD_CLIENT_DYAD_PRODUCER_H

#include <dyad/common/dyad_rc.h>
#include <dyad/core/dyad_ctx.h>
#include <dyad/dyad_config.hpp>

#ifdef __cplusplus
extern "C" {
#endif

/* Takes the exclusive producer lock on `fd`. `ctx` gives the bound (NULL:
 * the default of DYAD_RPC_TIMEOUT). DYAD_RC_TIMEOUT when another holder kept
 * it that long, DYAD_RC_BADFIO (errno set) when the file cannot be locked. */
DYAD_DLL_EXPORTED dyad_rc_t dyad_producer_lock(const dyad_ctx_t* ctx, int fd);

/* Takes a shared lock on `fd`: a reader in the producer directory of its own
 * node, which a local producer may rewrite. Same bound and codes. */
DYAD_DLL_EXPORTED dyad_rc_t dyad_producer_lock_shared(const dyad_ctx_t* ctx, int fd);

/* Releases either lock. */
DYAD_DLL_EXPORTED dyad_rc_t dyad_producer_unlock(int fd);

#ifdef __cplusplus
}
#endif

#endif /* DYAD_CLIENT_DYAD_PRODUCER_H */
