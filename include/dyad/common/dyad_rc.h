/*
 * dyad_rc.h: return codes of every DYAD C entry point.
 *
 * The numeric values match upstream DYAD so that programs which test for a
 * specific code keep working. Codes this implementation adds (timeouts, an
 * unreachable service, refused requests) live in their own range, -4000 and
 * below, and are still negative, so DYAD_IS_ERROR() treats them as errors.
 * dyad_rc_name() and dyad_rc_message() turn a code into text; both return
 * static strings and are safe from any thread.
 */
#ifndef DYAD_COMMON_DYAD_RC_H
#define DYAD_COMMON_DYAD_RC_H

#include <dyad/dyad_config.hpp>

#ifdef __cplusplus
extern "C" {
#endif

enum dyad_core_return_codes {
  DYAD_RC_OK = 0,       /* success */
  DYAD_RC_SYSFAIL = -1, /* a system or C library call failed */

  DYAD_RC_NOCTX = -1000,           /* no DYAD context (dyad_init not called or failed) */
  DYAD_RC_BADMETADATA = -1001,     /* metadata could not be built or parsed */
  DYAD_RC_BADFIO = -1002,          /* file I/O failed */
  DYAD_RC_BADMANAGEDPATH = -1003,  /* producer or consumer managed path is unusable */
  DYAD_RC_BADDTLMODE = -1004,      /* unknown or not compiled-in transport */
  DYAD_RC_UNTRACKED = -1005,       /* path is not under a managed directory */
  DYAD_RC_BAD_B64DECODE = -1006,   /* base64 decoding failed */
  DYAD_RC_BAD_COMM_MODE = -1007,   /* invalid dyad_dtl_comm_mode_t */
  DYAD_RC_BAD_CLI_ARG_DEF = -1008, /* a command-line option could not be defined */
  DYAD_RC_BAD_CLI_PARSE = -1009,   /* command-line parsing failed */
  DYAD_RC_BADBUF = -1010,          /* invalid buffer or pointer argument */

  /* The -2000 range kept its upstream names; "Flux" here means the
   * metadata store and service RPC layer that replace Flux. */
  DYAD_RC_FLUXFAIL = -2000,     /* the service layer failed */
  DYAD_RC_BADCOMMIT = -2001,    /* publishing metadata failed */
  DYAD_RC_NOTFOUND = -2002,     /* metadata not found */
  DYAD_RC_BADFETCH = -2003,     /* fetching a file from its owner failed */
  DYAD_RC_BADRPC = -2004,       /* an RPC failed or got an unexpected reply */
  DYAD_RC_BADPACK = -2005,      /* encoding a message failed */
  DYAD_RC_BADUNPACK = -2006,    /* decoding a message failed (malformed input) */
  DYAD_RC_RPC_FINISHED = -2007, /* the data stream ended sooner than expected */

  DYAD_RC_UCXINIT_FAIL = -3001,
  DYAD_RC_UCXWAIT_FAIL = -3002,
  DYAD_RC_UCXEP_FAIL = -3003,
  DYAD_RC_UCXCOMM_FAIL = -3004,
  DYAD_RC_UCXMMAP_FAIL = -3005,
  DYAD_RC_UCXRKEY_PACK_FAILED = -3006,
  DYAD_RC_UCXRKEY_UNPACK_FAILED = -3007,
  DYAD_RC_MARGOINIT_FAIL = -3101,
  DYAD_RC_MARGO_BAD_PROTO = -3102,

  /* Added by this implementation. */
  DYAD_RC_TIMEOUT = -4000,    /* a bounded wait (e.g. DYAD_CONSUME_TIMEOUT) expired */
  DYAD_RC_NOSERVICE = -4001,  /* the local dyad-service is not reachable */
  DYAD_RC_CONNLOST = -4002,   /* a peer closed the connection or vanished mid-operation */
  DYAD_RC_PERM = -4003,       /* refused: path escapes the managed directory, or not permitted */
  DYAD_RC_AUTH = -4004,       /* peer authentication failed */
  DYAD_RC_NOTSUP = -4005,     /* operation not supported by this backend */
  DYAD_RC_BADREQUEST = -4006, /* malformed or invalid request */
  DYAD_RC_CANCELLED = -4007,  /* the operation was cancelled (shutdown or interrupt) */
  DYAD_RC_STALE = -4008,      /* the owner's copy changed since it was published */
  DYAD_RC_NOSPACE = -4009     /* no room: the consumer's file system or the node's cache budget */
};

typedef enum dyad_core_return_codes dyad_rc_t;

#define DYAD_IS_ERROR(code) ((code) < 0)

/* Symbolic name of a code, e.g. "DYAD_RC_TIMEOUT"; "DYAD_RC_UNKNOWN" otherwise. */
DYAD_DLL_EXPORTED const char* dyad_rc_name(int rc);
/* One-line human description of a code. */
DYAD_DLL_EXPORTED const char* dyad_rc_message(int rc);
/* Message of the last failed DYAD call made by the calling thread
 * (more specific than dyad_rc_message, e.g. which file timed out). */
DYAD_DLL_EXPORTED const char* dyad_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* DYAD_COMMON_DYAD_RC_H */
