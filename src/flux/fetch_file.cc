#include "flux/fetch_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/fsutil.h"

namespace dyad {

int ErrnoForStatus(const Status& st, int fallback) {
  switch (st.code()) {
    case DYAD_RC_PERM:
      return EPERM;
    case DYAD_RC_BADREQUEST:
      return EINVAL;
    case DYAD_RC_TIMEOUT:
      return ETIMEDOUT;
    default:
      return fallback != 0 ? fallback : EIO;
  }
}

Result<FetchFile> FetchFile::Open(const std::string& root, const std::string& upath, int* errnum) {
  *errnum = 0;
  if (root.empty()) {
    *errnum = ENOENT;
    return Status(DYAD_RC_BADMANAGEDPATH, "dyad.fetch: the module has no producer directory");
  }
  errno = 0;
  Result<UniqueFd> fd = OpenBeneath(root, upath, O_RDONLY | O_NOCTTY | O_NONBLOCK);
  if (!fd.ok()) {
    const int err = errno;
    *errnum = ErrnoForStatus(fd.status(), err);
    return fd.status();
  }
  struct stat st;
  if (::fstat(fd->get(), &st) != 0) {
    *errnum = errno;
    return StatusFromErrno(errno, "fstat '" + upath + "'");
  }
  if (!S_ISREG(st.st_mode)) {
    *errnum = S_ISDIR(st.st_mode) ? EISDIR : EPERM;
    return Status(DYAD_RC_PERM, "'" + upath + "' is not a regular file");
  }
  // Reads are blocking from here on (a FIFO or device was refused above).
  const int flags = ::fcntl(fd->get(), F_GETFL);
  if (flags >= 0) ::fcntl(fd->get(), F_SETFL, flags & ~O_NONBLOCK);
  FetchFile f;
  f.fd_ = std::move(*fd);
  f.size_ = static_cast<uint64_t>(st.st_size);
  return f;
}

bool FetchFile::TryLockShared() {
  while (::flock(fd_.get(), LOCK_SH | LOCK_NB) != 0) {
    if (errno == EINTR) continue;
    // EWOULDBLOCK: the producer writes it now. Anything else (ENOLCK on a
    // file system without flock): serve it, as the service's file server does.
    return errno != EWOULDBLOCK;
  }
  return true;
}

Status FetchFile::Next(std::string* buf, size_t max) {
  // The size when it was opened: a file that grows meanwhile is served as
  // it was (a rewrite must be published again anyway).
  if (offset_ >= size_) {
    buf->clear();
    return Status::OK();
  }
  if (max > size_ - offset_) max = static_cast<size_t>(size_ - offset_);
  buf->resize(max);
  for (;;) {
    const ssize_t n = ::pread(fd_.get(), buf->data(), max, static_cast<off_t>(offset_));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      buf->clear();
      return StatusFromErrno(errno, "read", DYAD_RC_BADFIO);
    }
    buf->resize(static_cast<size_t>(n));
    offset_ += static_cast<uint64_t>(n);
    return Status::OK();
  }
}

}  // namespace dyad
