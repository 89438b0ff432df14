/*
 * dyad_structures.h: the opaque DYAD context type shared by the C headers.
 * Its contents are private; use the functions of dyad/core/dyad_ctx.h.
 */
#ifndef DYAD_COMMON_STRUCTURES_H
#define DYAD_COMMON_STRUCTURES_H

#include <dyad/dyad_config.hpp>

struct dyad_ctx;
typedef struct dyad_ctx dyad_ctx_t;

#endif /* DYAD_COMMON_STRUCTURES_H */
