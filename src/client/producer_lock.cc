#include "client/producer_lock.h"

#include <sys/file.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "common/time.h"

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
