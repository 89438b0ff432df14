// ctx_internal.h: the private side of the C context (dyad/core/dyad_ctx.h):
// the definition of struct dyad_ctx and its helpers, inside libdyad_ctx
// (c_api.cc, client_api.cc). libdyad_client reaches the context only through
// the public C++ client (dyad::client::Client::FromContext).
//
// There is exactly one context per process, a never-destroyed object that
// every thread sees (upstream kept it thread-local). It holds a shared_ptr
// to the current dyad::Client; an operation copies that pointer under the
// context mutex and then runs without any lock, so dyad_finalize() or a
// re-initialization while another thread is inside dyad_consume() cannot
// pull the client from under it. The context mutex is a leaf lock (nothing
// else is acquired while it is held) and is held across fork().
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "client/c_guard.h"
#include "client/client.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "dyad/common/dyad_dtl.h"
#include "dyad/common/dyad_rc.h"
#include "dyad/common/dyad_structures.h"

struct dyad_ctx {
  dyad::Mutex mu;
  std::shared_ptr<dyad::Client> client GUARDED_BY(mu);  // null while not initialized
  std::atomic<bool> initialized{false};  // mirrors client != nullptr, for lock-free gets
  dyad_dtl_comm_mode_t comm_mode GUARDED_BY(mu) = DYAD_COMM_NONE;
};

namespace dyad {
namespace capi {

// The process's context object (never null, never destroyed).
dyad_ctx* Context();

// The client behind `ctx` for one operation, or DYAD_RC_NOCTX when `ctx` is
// null, not this process's context, or not initialized.
Result<std::shared_ptr<Client>> ClientOf(dyad_ctx_t* ctx);

// Records `st` as the calling thread's last error (dyad_last_error) and
// returns its code.
dyad_rc_t Fail(const Status& st);
inline dyad_rc_t Fail(dyad_rc_t code, const std::string& message) {
  return Fail(Status(code, message));
}

}  // namespace capi
}  // namespace dyad
