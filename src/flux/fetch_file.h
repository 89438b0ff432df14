// fetch_file.h: one file served by dyad.fetch (upstream's FLUX_RPC format),
// without libflux so that its rules are tested alone.
//
// The file is opened beneath the producer directory (ValidateUpath, then
// openat2 RESOLVE_BENEATH: no "..", no absolute path, no symlink that
// leaves the directory), must be a regular file, and is read one chunk at a
// time: memory does not grow with the file. A producer that holds its
// exclusive lock (flock, the producer lock of dyad_producer.h) is waited
// for by the caller, which retries TryLockShared on a timer instead of
// blocking its reactor.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "common/net.h"
#include "common/status.h"

namespace dyad {

class FetchFile {
 public:
  // Opens `upath` beneath `root`. On failure `*errnum` gets the errno a
  // Flux error response carries (EINVAL malformed path, EPERM escape or not
  // a regular file, ENOENT missing, ...).
  static Result<FetchFile> Open(const std::string& root, const std::string& upath, int* errnum);

  // flock(LOCK_SH | LOCK_NB): true when taken (or the file system has no
  // flock), false while a producer holds its exclusive lock.
  bool TryLockShared();

  // Reads the next chunk of at most `max` bytes into `buf` (resized);
  // an empty chunk is the end of the file. Errors: DYAD_RC_BADFIO.
  Status Next(std::string* buf, size_t max);

  uint64_t size() const { return size_; }
  uint64_t offset() const { return offset_; }
  int fd() const { return fd_.get(); }

 private:
  UniqueFd fd_;
  uint64_t size_ = 0;
  uint64_t offset_ = 0;
};

// errno for a dyad Status of a failed open (DYAD_RC_PERM -> EPERM, ...),
// `fallback` when nothing more precise is known.
int ErrnoForStatus(const Status& st, int fallback);

}  // namespace dyad
