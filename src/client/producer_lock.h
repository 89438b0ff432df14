// producer_lock.h: the one implementation of the producer's lock
// (include/dyad/client/dyad_producer.h says what it is for).
#pragma once

#include <cstdint>

#include "common/status.h"

namespace dyad {

// flock(fd, op) with op LOCK_EX or LOCK_SH, waiting at most `timeout_ms`
// (< 0: no limit) by polling non-blocking at intervals growing from 200 us
// to 10 ms; EINTR is retried. Errors: DYAD_RC_TIMEOUT, DYAD_RC_BADFIO.
Status LockProducerFile(int fd, int op, int64_t timeout_ms);
Status UnlockProducerFile(int fd);

}  // namespace dyad
