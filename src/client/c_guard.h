// c_guard.h: no exception crosses the C API. Used by libdyad_ctx
// (c_api.cc) and libdyad_client (c_client.cc); the error is recorded through
// the public dyad::client::SetLastError, so both libraries fill the same
// dyad_last_error() (the one in libdyad_ctx).
#pragma once

#include <exception>
#include <new>
#include <string>

#include "dyad/client/dyad_client.hpp"
#include "dyad/common/dyad_rc.h"

namespace dyad {
namespace capi {

// Runs `body` and turns any exception into DYAD_RC_SYSFAIL.
template <typename F>
dyad_rc_t Guard(const char* what, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    try {
      return client::SetLastError(
          client::Status(DYAD_RC_SYSFAIL, std::string(what) + ": out of memory"));
    } catch (...) {
      return DYAD_RC_SYSFAIL;
    }
  } catch (const std::exception& e) {
    try {
      return client::SetLastError(
          client::Status(DYAD_RC_SYSFAIL, std::string(what) + ": " + e.what()));
    } catch (...) {
      return DYAD_RC_SYSFAIL;
    }
  } catch (...) {
    return DYAD_RC_SYSFAIL;
  }
}

}  // namespace capi
}  // namespace dyad
