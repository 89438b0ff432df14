#include "client/producer_lock.h"

#include <sys/file.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "client/ctx_internal.h"
#include "common/config.h"
#include "common/time.h"
#include "dyad/client/dyad_producer.h"

namespace dyad {

Status LockProducerFile(int fd, int op, int64_t timeout_ms) {
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  auto pause = std::chrono::microseconds(200);
  for (;;) {
    if (::flock(fd, op | LOCK_NB) == 0) return Status::OK();
    if (errno == EINTR) continue;
    if (errno != EWOULDBLOCK)
      return StatusFromErrno(errno, "lock the produced file", DYAD_RC_BADFIO);
    if (deadline.expired())
      return Status(DYAD_RC_TIMEOUT, "another process kept the produced file locked for " +
                                         std::to_string(timeout_ms) + " ms");
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::milliseconds(10)) pause *= 2;
  }
}

Status UnlockProducerFile(int fd) {
  while (::flock(fd, LOCK_UN) != 0) {
    if (errno != EINTR) return StatusFromErrno(errno, "unlock the produced file", DYAD_RC_BADFIO);
  }
  return Status::OK();
}

}  // namespace dyad

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
