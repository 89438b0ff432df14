/*
 * dyad_client.h: the producer and consumer calls of the DYAD C API.
 *
 * dyad_produce() publishes a file that is complete in the producer-managed
 * directory; dyad_consume() returns once the file is complete in the
 * consumer-managed directory (waiting for its publication and fetching it
 * from its owner node if needed). Both are thread-safe and may be called from
 * any thread once the context is initialized (dyad/core/dyad_ctx.h).
 * On error, dyad_last_error() describes what failed.
 *
 * Beyond upstream: dyad_prefetch() declares what this process will read so
 * the node's service fetches each matching file as soon as it is published
 * (a later dyad_consume() is then a local hit); dyad_consume_batch()
 * consumes many files in one request, fetched concurrently; and
 * dyad_consume_start()/dyad_consume_wait() do the same in the background
 * (start now, wait later). See docs/prefetch.md.
 */
#ifndef DYAD_CLIENT_DYAD_CLIENT_H
#define DYAD_CLIENT_DYAD_CLIENT_H

#include <dyad/common/dyad_rc.h>
#include <dyad/common/dyad_structures.h>
#include <dyad/core/dyad_ctx.h>
#include <dyad/dyad_config.hpp>

#ifdef __cplusplus
#include <cstddef>
#include <cstdint>
extern "C" {
#else
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#endif

/* Metadata of a published file. The first two fields are upstream's. */
struct dyad_metadata {
  char* fpath;         /* path relative to the managed directory */
  uint32_t owner_rank; /* rank of the dyad-service that owns the file */
  uint64_t size;       /* size in bytes when published */
  uint64_t version;    /* modification stamp (ns) of the published copy */
};
typedef struct dyad_metadata dyad_metadata_t;

DYAD_DLL_EXPORTED dyad_rc_t dyad_produce(dyad_ctx_t* ctx, const char* fname);

DYAD_DLL_EXPORTED dyad_rc_t dyad_get_metadata(dyad_ctx_t* ctx, const char* fname, bool should_wait,
                                              dyad_metadata_t** mdata);

DYAD_DLL_EXPORTED dyad_rc_t dyad_free_metadata(dyad_metadata_t** mdata);

DYAD_DLL_EXPORTED dyad_rc_t dyad_consume(dyad_ctx_t* ctx, const char* fname);

DYAD_DLL_EXPORTED dyad_rc_t dyad_consume_w_metadata(dyad_ctx_t* ctx, const char* fname,
                                                    const dyad_metadata_t* mdata);

/* Declares that this process will read the files matching `pattern`: a
 * path prefix, or a glob when it holds '*', '?' or '[' ('*' also matches
 * '/'), absolute under the consumer directory or relative to it. Files
 * already published are fetched at once, later ones as they are published.
 * The declaration lasts until dyad_prefetch_cancel() or the service stops. */
DYAD_DLL_EXPORTED dyad_rc_t dyad_prefetch(dyad_ctx_t* ctx, const char* pattern);
DYAD_DLL_EXPORTED dyad_rc_t dyad_prefetch_cancel(dyad_ctx_t* ctx, const char* pattern);

/* Consumes `n` files in one request. `rcs` (NULL, or room for `n` codes)
 * gets each file's result; the return value is DYAD_RC_OK when all
 * succeeded, else the first failure's code (dyad_last_error() names it). */
DYAD_DLL_EXPORTED dyad_rc_t dyad_consume_batch(dyad_ctx_t* ctx, const char* const* fnames, size_t n,
                                               dyad_rc_t* rcs);

/* The same in the background: dyad_consume_start() returns at once (the
 * names are copied); dyad_consume_wait() blocks until every file is done,
 * fills `rcs` as dyad_consume_batch does, and frees the handle. Every
 * started handle must be waited for exactly once. */
typedef struct dyad_consume_handle dyad_consume_handle_t;
DYAD_DLL_EXPORTED dyad_rc_t dyad_consume_start(dyad_ctx_t* ctx, const char* const* fnames, size_t n,
                                               dyad_consume_handle_t** handle);
DYAD_DLL_EXPORTED dyad_rc_t dyad_consume_wait(dyad_consume_handle_t* handle, dyad_rc_t* rcs);

#ifdef __cplusplus
}
#endif

#endif /* DYAD_CLIENT_DYAD_CLIENT_H */
