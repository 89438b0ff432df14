// ownership.cc: read-write ownership on the client side (Client::Adopt).
//
// A consumer that wrote a consumed file hands it to its node: the bytes go
// to the same path under the producer directory, written under the
// producer's exclusive lock (the service serves files under a shared one,
// so nobody is sent half of it), and are published from there with the
// consumer copy named, so the service keeps that copy as the current
// version and tells the services holding older ones (docs/consistency.md).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "client/client.h"
#include "client/producer_lock.h"
#include "common/fsutil.h"
#include "common/net.h"

namespace dyad {

namespace {

// Copies all of `src` (from offset 0) to `dst` (at its start).
Status CopyAll(int src, int dst) {
  loff_t in = 0, out = 0;
  for (;;) {
    const ssize_t n = ::copy_file_range(src, &in, dst, &out, 1 << 30, 0);
    if (n == 0) return Status::OK();
    if (n > 0) continue;
    if (errno == EINTR) continue;
    if (errno != EXDEV && errno != EINVAL && errno != ENOSYS && errno != EOPNOTSUPP)
      return StatusFromErrno(errno, "copy to the producer directory", DYAD_RC_BADFIO);
    break;  // not between these files: plain reads and writes from here
  }
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::pread(src, buf, sizeof(buf), in);
    if (n == 0) return Status::OK();
    if (n < 0) {
      if (errno == EINTR) continue;
      return StatusFromErrno(errno, "read the written copy", DYAD_RC_BADFIO);
    }
    for (ssize_t done = 0; done < n;) {
      const ssize_t w = ::pwrite(dst, buf + done, static_cast<size_t>(n - done), out);
      if (w < 0 && errno == EINTR) continue;
      if (w < 0) return StatusFromErrno(errno, "write the producer copy", DYAD_RC_BADFIO);
      done += w;
      out += w;
    }
    in += n;
  }
}

}  // namespace

Status Client::CopyToProducer(const std::string& upath, int src_fd, struct stat* published) {
  struct stat sst;
  if (::fstat(src_fd, &sst) != 0 || !S_ISREG(sst.st_mode))
    return Status(DYAD_RC_BADFIO,
                  "'" + upath + "' in the consumer directory is not a regular file");
  DYAD_RETURN_IF_ERROR(MakeParentDirs(prod_.given(), upath));
  const std::string dst = prod_.given() + "/" + upath;
  UniqueFd out(
      ::open(dst.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, sst.st_mode & 0777));
  if (!out.valid()) return StatusFromErrno(errno, "open '" + dst + "' for writing", DYAD_RC_BADFIO);
  // Truncated only under the lock: the service may be sending the previous
  // bytes of this path (under its shared lock) right now.
  DYAD_RETURN_IF_ERROR(LockProducerFile(out.get(), LOCK_EX, config_.rpc_timeout_ms));
  if (::ftruncate(out.get(), 0) != 0)
    return StatusFromErrno(errno, "truncate '" + dst + "'", DYAD_RC_BADFIO);
  DYAD_RETURN_IF_ERROR(CopyAll(src_fd, out.get()));
  if (::fchmod(out.get(), sst.st_mode & 0777) != 0 ||
      (config_.fsync_write && ::fsync(out.get()) != 0) || ::fstat(out.get(), published) != 0)
    return StatusFromErrno(errno, "finish '" + dst + "'", DYAD_RC_BADFIO);
  return Status::OK();  // closing `out` releases the lock
}

Status Client::Adopt(const std::string& fname, int src_fd) {
  Result<std::string> upath = Resolve(fname, Side::kConsumer);
  if (!upath.ok()) return Finish(upath.status(), "adopt", fname);
  if (!has_producer_path())
    return Finish(Status(DYAD_RC_BADMANAGEDPATH,
                         "a consumer that writes a consumed file becomes its owner, which needs "
                         "a producer directory served by the node's service (DYAD_PATH_PRODUCER)"),
                  "adopt", fname);
  const std::string copy = cons_.given() + "/" + *upath;
  UniqueFd own;
  if (src_fd < 0) {
    own = UniqueFd(::open(copy.c_str(), O_RDONLY | O_CLOEXEC));
    if (!own.valid())
      return Finish(StatusFromErrno(errno, "open '" + copy + "'", DYAD_RC_BADFIO), "adopt", fname);
    src_fd = own.get();
  }
  struct stat published;
  Status st = CopyToProducer(*upath, src_fd, &published);
  if (!st.ok()) return Finish(st.Annotate("adopt '" + *upath + "'"), "adopt", fname);
  return Finish(Publish(*upath, published, cons_.CurrentCanonical() + "/" + *upath), "adopt",
                fname);
}

}  // namespace dyad
