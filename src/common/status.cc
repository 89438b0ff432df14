#include "common/status.h"

#include <cstring>

namespace dyad {

std::string Status::ToString() const {
  if (ok()) return "DYAD_RC_OK";
  std::string s = dyad_rc_name(code_);
  if (!message_.empty()) {
    s += ": ";
    s += message_;
  }
  return s;
}

dyad_rc_t RcFromWire(int32_t code) {
  if (std::strcmp(dyad_rc_name(code), "DYAD_RC_UNKNOWN") == 0) return DYAD_RC_BADRPC;
  return static_cast<dyad_rc_t>(code);
}

Status StatusFromErrno(int err, const std::string& what, dyad_rc_t code) {
  if (code == DYAD_RC_SYSFAIL) {
    switch (err) {
      case ETIMEDOUT:
        code = DYAD_RC_TIMEOUT;
        break;
      case EACCES:
      case EPERM:
      case ELOOP:
      case EXDEV:
        code = DYAD_RC_PERM;
        break;
      case ECONNRESET:
      case EPIPE:
      case ECONNABORTED:
        code = DYAD_RC_CONNLOST;
        break;
      case ENOSPC:
      case EDQUOT:
        code = DYAD_RC_NOSPACE;
        break;
      case ENOENT:
      case EISDIR:
      case ENOTDIR:
      case EIO:
        code = DYAD_RC_BADFIO;
        break;
      default:
        break;
    }
  }
  return Status(code, what + ": " + std::strerror(err));
}

}  // namespace dyad

extern "C" {

const char* dyad_rc_name(int rc) {
  switch (rc) {
#define DYAD_RC_CASE(x) \
  case x:               \
    return #x;
    DYAD_RC_CASE(DYAD_RC_OK)
    DYAD_RC_CASE(DYAD_RC_SYSFAIL)
    DYAD_RC_CASE(DYAD_RC_NOCTX)
    DYAD_RC_CASE(DYAD_RC_BADMETADATA)
    DYAD_RC_CASE(DYAD_RC_BADFIO)
    DYAD_RC_CASE(DYAD_RC_BADMANAGEDPATH)
    DYAD_RC_CASE(DYAD_RC_BADDTLMODE)
    DYAD_RC_CASE(DYAD_RC_UNTRACKED)
    DYAD_RC_CASE(DYAD_RC_BAD_B64DECODE)
    DYAD_RC_CASE(DYAD_RC_BAD_COMM_MODE)
    DYAD_RC_CASE(DYAD_RC_BAD_CLI_ARG_DEF)
    DYAD_RC_CASE(DYAD_RC_BAD_CLI_PARSE)
    DYAD_RC_CASE(DYAD_RC_BADBUF)
    DYAD_RC_CASE(DYAD_RC_FLUXFAIL)
    DYAD_RC_CASE(DYAD_RC_BADCOMMIT)
    DYAD_RC_CASE(DYAD_RC_NOTFOUND)
    DYAD_RC_CASE(DYAD_RC_BADFETCH)
    DYAD_RC_CASE(DYAD_RC_BADRPC)
    DYAD_RC_CASE(DYAD_RC_BADPACK)
    DYAD_RC_CASE(DYAD_RC_BADUNPACK)
    DYAD_RC_CASE(DYAD_RC_RPC_FINISHED)
    DYAD_RC_CASE(DYAD_RC_UCXINIT_FAIL)
    DYAD_RC_CASE(DYAD_RC_UCXWAIT_FAIL)
    DYAD_RC_CASE(DYAD_RC_UCXEP_FAIL)
    DYAD_RC_CASE(DYAD_RC_UCXCOMM_FAIL)
    DYAD_RC_CASE(DYAD_RC_UCXMMAP_FAIL)
    DYAD_RC_CASE(DYAD_RC_UCXRKEY_PACK_FAILED)
    DYAD_RC_CASE(DYAD_RC_UCXRKEY_UNPACK_FAILED)
    DYAD_RC_CASE(DYAD_RC_MARGOINIT_FAIL)
    DYAD_RC_CASE(DYAD_RC_MARGO_BAD_PROTO)
    DYAD_RC_CASE(DYAD_RC_TIMEOUT)
    DYAD_RC_CASE(DYAD_RC_NOSERVICE)
    DYAD_RC_CASE(DYAD_RC_CONNLOST)
    DYAD_RC_CASE(DYAD_RC_PERM)
    DYAD_RC_CASE(DYAD_RC_AUTH)
    DYAD_RC_CASE(DYAD_RC_NOTSUP)
    DYAD_RC_CASE(DYAD_RC_BADREQUEST)
    DYAD_RC_CASE(DYAD_RC_CANCELLED)
    DYAD_RC_CASE(DYAD_RC_STALE)
    DYAD_RC_CASE(DYAD_RC_NOSPACE)
#undef DYAD_RC_CASE
    default:
      return "DYAD_RC_UNKNOWN";
  }
}

const char* dyad_rc_message(int rc) {
  switch (rc) {
    case DYAD_RC_OK:
      return "success";
    case DYAD_RC_SYSFAIL:
      return "a system call failed";
    case DYAD_RC_NOCTX:
      return "DYAD is not initialized";
    case DYAD_RC_BADMETADATA:
      return "invalid metadata";
    case DYAD_RC_BADFIO:
      return "file I/O failed";
    case DYAD_RC_BADMANAGEDPATH:
      return "bad managed path";
    case DYAD_RC_BADDTLMODE:
      return "unknown or unavailable transport (DTL) mode";
    case DYAD_RC_UNTRACKED:
      return "path is not under a DYAD-managed directory";
    case DYAD_RC_BAD_B64DECODE:
      return "base64 decoding failed";
    case DYAD_RC_BAD_COMM_MODE:
      return "invalid communication mode";
    case DYAD_RC_BAD_CLI_ARG_DEF:
      return "bad command-line option definition";
    case DYAD_RC_BAD_CLI_PARSE:
      return "bad command line";
    case DYAD_RC_BADBUF:
      return "invalid buffer or pointer";
    case DYAD_RC_FLUXFAIL:
      return "service layer failure";
    case DYAD_RC_BADCOMMIT:
      return "publishing metadata failed";
    case DYAD_RC_NOTFOUND:
      return "not found";
    case DYAD_RC_BADFETCH:
      return "fetching the file from its owner failed";
    case DYAD_RC_BADRPC:
      return "RPC failed";
    case DYAD_RC_BADPACK:
      return "message encoding failed";
    case DYAD_RC_BADUNPACK:
      return "malformed message";
    case DYAD_RC_RPC_FINISHED:
      return "data stream ended early";
    case DYAD_RC_TIMEOUT:
      return "timed out";
    case DYAD_RC_NOSERVICE:
      return "dyad-service is not reachable";
    case DYAD_RC_CONNLOST:
      return "connection lost";
    case DYAD_RC_PERM:
      return "permission denied";
    case DYAD_RC_AUTH:
      return "authentication failed";
    case DYAD_RC_NOTSUP:
      return "not supported";
    case DYAD_RC_BADREQUEST:
      return "bad request";
    case DYAD_RC_CANCELLED:
      return "cancelled";
    case DYAD_RC_STALE:
      return "file changed since it was published";
    case DYAD_RC_NOSPACE:
      return "no space left for the copy";
    // The Margo codes name the role the OFI (libfabric) transport plays.
    case DYAD_RC_MARGOINIT_FAIL:
      return "OFI (libfabric) transport setup failed";
    case DYAD_RC_MARGO_BAD_PROTO:
      return "libfabric provider unavailable or mismatched";
    default:
      if (rc <= -3001 && rc >= -3199) return "UCX/Margo transport failure";
      return "unknown error";
  }
}

}  // extern "C"
