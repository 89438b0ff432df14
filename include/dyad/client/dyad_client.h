/*
 * dyad_client.h: the producer and consumer calls of the DYAD C API.
 *
 * dyad_produce() publishes a file that is complete in the producer-managed
 * directory; dyad_consume() returns once the file is complete in the
 * consumer-managed directory (waiting for its publication and fetching it
 * from its owner node if needed). Both are thread-safe and may be called from
 * any thread once the context is initialized (dyad/core/dyad_ctx.h).
 * On error, dyad_last_error() describes what failed.
 */
#ifndef DYAD_CLIENT_DYAD_CLIENT_H
#define DYAD_CLIENT_DYAD_CLIENT_H

#include <dyad/dyad_config.hpp>
#include <dyad/common/dyad_rc.h>
#include <dyad/common/dyad_structures.h>
#include <dyad/core/dyad_ctx.h>

#ifdef __cplusplus
#include <cstdint>
extern "C" {
#else
#include <stdbool.h>
#include <stdint.h>
#endif

/* Metadata of a published file. The first two fields are upstream's. */
struct dyad_metadata {
    char *fpath;         /* path relative to the managed directory */
    uint32_t owner_rank; /* rank of the dyad-service that owns the file */
    uint64_t size;       /* size in bytes when published */
    uint64_t version;    /* modification stamp (ns) of the published copy */
};
typedef struct dyad_metadata dyad_metadata_t;

DYAD_DLL_EXPORTED dyad_rc_t dyad_produce(dyad_ctx_t *ctx, const char *fname);

DYAD_DLL_EXPORTED dyad_rc_t dyad_get_metadata(dyad_ctx_t *ctx, const char *fname, bool should_wait,
                                              dyad_metadata_t **mdata);

DYAD_DLL_EXPORTED dyad_rc_t dyad_free_metadata(dyad_metadata_t **mdata);

DYAD_DLL_EXPORTED dyad_rc_t dyad_consume(dyad_ctx_t *ctx, const char *fname);

DYAD_DLL_EXPORTED dyad_rc_t dyad_consume_w_metadata(dyad_ctx_t *ctx, const char *fname,
                                                    const dyad_metadata_t *mdata);

#ifdef __cplusplus
}
#endif

#endif /* DYAD_CLIENT_DYAD_CLIENT_H */
