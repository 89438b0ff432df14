/*
 * dyad_dtl.h: names of the data transport layer (DTL) modes and of the
 * communication direction, as in upstream DYAD.
 *
 * DYAD_DTL_FLUX_RPC is kept for compatibility and selects the TCP streaming
 * transport between dyad-services (a consumer on a Flux node without the
 * dyad module fetches through Flux's dyad.fetch whatever the mode; see
 * docs/flux.md). DYAD_DTL_TCP is its own name.
 */
#ifndef DYAD_COMMON_DYAD_DTL_H
#define DYAD_COMMON_DYAD_DTL_H

#include <dyad/dyad_config.hpp>

#ifdef __cplusplus
extern "C" {
#endif

enum dyad_dtl_mode {
  DYAD_DTL_UCX = 0,
  DYAD_DTL_FLUX_RPC = 1,
  DYAD_DTL_DEFAULT = 1,
  DYAD_DTL_TCP = 2,
  DYAD_DTL_OFI = 3,
  DYAD_DTL_END = 4
};
typedef enum dyad_dtl_mode dyad_dtl_mode_t;

static const char* dyad_dtl_mode_name[DYAD_DTL_END + 1]
    __attribute__((unused)) = {"UCX", "FLUX_RPC", "TCP", "OFI", "DTL_UNKNOWN"};

enum dyad_dtl_comm_mode {
  DYAD_COMM_NONE = 0, /* no connection yet */
  DYAD_COMM_RECV = 1, /* consumer side: receives data */
  DYAD_COMM_SEND = 2, /* producer side: sends data */
  DYAD_COMM_END = 3
};
typedef enum dyad_dtl_comm_mode dyad_dtl_comm_mode_t;

#define DYAD_DTL_RPC_NAME "dyad.fetch"

struct dyad_dtl;

#ifdef __cplusplus
}
#endif

#endif /* DYAD_COMMON_DYAD_DTL_H */
