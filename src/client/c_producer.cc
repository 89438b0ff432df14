// c_producer.cc: the C calls of dyad/client/dyad_producer.h, in libdyad_ctx
// (they need the context for their bound). The lock itself is the client
// core's (producer_lock.h), which the preload library uses directly.
#include <sys/file.h>

#include <cerrno>
#include <memory>

#include "client/ctx_internal.h"
#include "client/producer_lock.h"
#include "common/config.h"
#include "dyad/client/dyad_producer.h"

namespace {

// The context's RPC timeout; without a context (or an initialized one), the
// process's, else DYAD_RPC_TIMEOUT's default.
int64_t BoundOf(const dyad_ctx_t* ctx) {
  dyad_ctx_t* c = ctx != nullptr ? const_cast<dyad_ctx_t*>(ctx) : dyad_ctx_get();
  if (c != nullptr) {
    dyad::Result<std::shared_ptr<dyad::Client>> client = dyad::capi::ClientOf(c);
    if (client.ok()) return (*client)->config().rpc_timeout_ms;
  }
  dyad::Result<int64_t> env = dyad::EnvTimeoutMs("DYAD_RPC_TIMEOUT", 60000);
  return env.ok() ? *env : 60000;
}

dyad_rc_t Code(const dyad::Status& st) {
  if (st.code() == DYAD_RC_BADFIO && errno == 0) errno = EIO;
  if (st.code() == DYAD_RC_TIMEOUT) errno = ETIMEDOUT;
  return st.code();
}

}  // namespace

extern "C" {

dyad_rc_t dyad_producer_lock(const dyad_ctx_t* ctx, int fd) {
  return Code(dyad::LockProducerFile(fd, LOCK_EX, BoundOf(ctx)));
}

dyad_rc_t dyad_producer_lock_shared(const dyad_ctx_t* ctx, int fd) {
  return Code(dyad::LockProducerFile(fd, LOCK_SH, BoundOf(ctx)));
}

dyad_rc_t dyad_producer_unlock(int fd) { return Code(dyad::UnlockProducerFile(fd)); }

}  // extern "C"
