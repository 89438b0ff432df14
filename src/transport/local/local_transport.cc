#include "transport/local/local_transport.h"

#include <fcntl.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "common/fsutil.h"
#include "common/wire.h"

namespace dyad {
namespace {

// One system call moves at most this much, so a huge copy is a sequence of
// calls (keeps each call's duration and the kernel's work per call sane).
constexpr uint64_t kMaxCallBytes = 1ull << 30;
// Bounce buffer of the last-resort read/write path.
constexpr size_t kCopyBufferBytes = 1u << 20;

bool FallBackOn(int err) {
  return err == EXDEV || err == ENOSYS || err == EINVAL || err == EOPNOTSUPP || err == ENOTSUP;
}

std::string Bytes(uint64_t n) { return std::to_string(n); }

// Copies a byte range of the source to the destination's current position
// with the best method that works; `method_` only ever degrades, so a failed
// fast path is tried once per CopyRange call, not once per chunk.
class RangeCopier {
 public:
  RangeCopier(int src_fd, int dst_fd, uint64_t size, TransferStats* stats)
      : src_(src_fd), dst_(dst_fd), size_(size), stats_(stats) {}

  // Copies source bytes [begin, end) to the destination's position.
  Status CopySegment(uint64_t begin, uint64_t end) {
    uint64_t pos = begin;
    while (pos < end) {
      const size_t want = static_cast<size_t>(std::min(end - pos, kMaxCallBytes));
      Result<size_t> n = CopyOnce(pos, want);
      if (!n.ok()) return n.status();
      if (*n == 0) {
        return Status(DYAD_RC_BADFIO, "source ended at " + Bytes(pos) + " bytes, expected " +
                                          Bytes(size_) + " (truncated while copying?)");
      }
      pos += *n;
      if (stats_ != nullptr) {
        stats_->bytes += *n;
        stats_->chunks += 1;
      }
    }
    return Status::OK();
  }

 private:
  enum class Method { kCopyFileRange, kSendfile, kReadWrite };

  // One step of at most `want` bytes from source offset `pos`; 0 means the
  // source has no bytes at `pos` any more.
  Result<size_t> CopyOnce(uint64_t pos, size_t want) {
    for (;;) {
      off_t in_off = static_cast<off_t>(pos);
      ssize_t n = -1;
      switch (method_) {
        case Method::kCopyFileRange:
          n = ::copy_file_range(src_, &in_off, dst_, nullptr, want, 0);
          // EBADF here also means an O_APPEND destination, which the other
          // methods handle; a truly bad descriptor fails there too.
          if (n < 0 && errno != EINTR && (FallBackOn(errno) || errno == EBADF)) {
            method_ = Method::kSendfile;
            continue;
          }
          break;
        case Method::kSendfile:
          n = ::sendfile(dst_, src_, &in_off, want);
          if (n < 0 && errno != EINTR && FallBackOn(errno)) {
            method_ = Method::kReadWrite;
            continue;
          }
          break;
        case Method::kReadWrite:
          return ReadWriteOnce(pos, want);
      }
      if (n >= 0) return static_cast<size_t>(n);
      if (errno == EINTR) continue;
      return StatusFromErrno(errno, "copy at offset " + Bytes(pos), DYAD_RC_BADFIO);
    }
  }

  Result<size_t> ReadWriteOnce(uint64_t pos, size_t want) {
    if (buf_.empty()) buf_.resize(kCopyBufferBytes);
    const size_t len = std::min(want, buf_.size());
    ssize_t r;
    do {
      r = ::pread(src_, buf_.data(), len, static_cast<off_t>(pos));
    } while (r < 0 && errno == EINTR);
    if (r < 0) return StatusFromErrno(errno, "read at offset " + Bytes(pos), DYAD_RC_BADFIO);
    if (r == 0) return size_t{0};
    DYAD_RETURN_IF_ERROR(WriteFully(dst_, buf_.data(), static_cast<size_t>(r)));
    return static_cast<size_t>(r);
  }

  const int src_;
  const int dst_;
  const uint64_t size_;
  TransferStats* const stats_;
  Method method_ = Method::kCopyFileRange;
  std::vector<char> buf_;
};

// Restores a descriptor's file position on scope exit (SEEK_DATA/SEEK_HOLE
// move it as a side effect, and the caller may share the descriptor).
class ScopedFilePosition {
 public:
  explicit ScopedFilePosition(int fd) : fd_(fd), pos_(::lseek(fd, 0, SEEK_CUR)) {}
  ScopedFilePosition(const ScopedFilePosition&) = delete;
  ScopedFilePosition& operator=(const ScopedFilePosition&) = delete;
  ~ScopedFilePosition() {
    if (pos_ >= 0) ::lseek(fd_, pos_, SEEK_SET);
  }

 private:
  const int fd_;
  const off_t pos_;
};

// The requester's copy of the owner's file, opened beneath the owner's
// root; it may block on the disk (never on the peer). Nothing crosses the
// session, so a failure leaves it usable.
Status CopyFromOwner(uint64_t size, const std::string& reply_args, int sink_fd,
                     TransferStats* stats) {
  Decoder d(reply_args);
  const std::string root = d.Str();
  const std::string upath = d.Str();
  const uint64_t dev = d.U64();
  const uint64_t ino = d.U64();
  if (d.failed() || !d.done() || root.empty() || root[0] != '/')
    return Status(DYAD_RC_BADUNPACK, "local pull: malformed reply from the owner");
  const std::string path = root + "/" + upath;
  // Beneath the owner's root (a symlink swapped in for a directory cannot
  // lead out of it), without blocking (a FIFO swapped in cannot hang us).
  Result<UniqueFd> opened = OpenBeneath(root, upath, O_RDONLY | O_NONBLOCK | O_NOFOLLOW);
  if (!opened.ok()) return opened.status().Annotate("local pull");
  UniqueFd src = std::move(*opened);
  struct stat st;
  if (::fstat(src.get(), &st) != 0)
    return StatusFromErrno(errno, "local pull: stat '" + path + "'", DYAD_RC_BADFIO);
  if (!S_ISREG(st.st_mode))
    return Status(DYAD_RC_BADFIO, "local pull: '" + path + "' is not a regular file");
  if (static_cast<uint64_t>(st.st_dev) != dev || static_cast<uint64_t>(st.st_ino) != ino)
    return Status(DYAD_RC_STALE,
                  "local pull: '" + path + "' is no longer the file the owner checked");
  if (static_cast<uint64_t>(st.st_size) < size) {
    return Status(DYAD_RC_BADFIO, "local pull: '" + path + "' is " + Bytes(st.st_size) +
                                      " bytes, the owner promised " + Bytes(size) +
                                      " (changed since the reply?)");
  }
  if (sink_fd < 0) return Status(DYAD_RC_BADFIO, "local pull: no sink file descriptor");
  Status copied = LocalTransport::CopyRange(src.get(), sink_fd, size, stats);
  return copied.Annotate("local pull of '" + path + "'");
}

}  // namespace

LocalTransport::LocalTransport(const TransportOptions& options) : Transport(options) {}

// The reply names the file by where the owner resolved it (its root and the
// path beneath) and by what it is (device, inode): the requester opens it
// beneath the same root, never following a symlink out of it, and accepts
// only the very file the owner checked.
Result<std::string> LocalTransport::ReplyArgs(const FileSource& src) {
  if (src.root.empty() || src.root[0] != '/' || src.upath.empty())
    return Status(DYAD_RC_BADREQUEST, "local transport needs the owner's root and path");
  Encoder e;
  e.Str(src.root).Str(src.upath).U64(src.dev).U64(src.ino);
  return e.data();
}

// The requester reads the file itself (on the runtime's pool: the copy may
// block on the disk); nothing goes on the session.
Task<Status> LocalTransport::Pull(Channel& session, uint64_t size, const std::string& reply_args,
                                  int sink_fd, TransferStats* stats, TransferWaits& waits) {
  (void)session;
  *stats = TransferStats();
  co_return co_await waits.Run(true,
                               [&] { return CopyFromOwner(size, reply_args, sink_fd, stats); });
}

// Nothing to send: the requester copies the file itself.
Task<Status> LocalTransport::Push(Channel& session, const FileSource& src,
                                  const std::string& request_args, TransferStats* stats,
                                  TransferWaits& waits) {
  (void)session, (void)src, (void)request_args, (void)waits;
  *stats = TransferStats();
  co_return Status::OK();
}

Status LocalTransport::CopyRange(int src_fd, int dst_fd, uint64_t size, TransferStats* stats) {
  if (stats != nullptr) *stats = TransferStats();
  if (size == 0) return Status::OK();
  struct stat src_st;
  if (::fstat(src_fd, &src_st) != 0) return StatusFromErrno(errno, "stat source", DYAD_RC_BADFIO);
  if (static_cast<uint64_t>(src_st.st_size) < size) {
    return Status(DYAD_RC_BADFIO,
                  "source is " + Bytes(src_st.st_size) + " bytes, expected " + Bytes(size));
  }
  // Holes can be kept only by seeking in a regular destination; a pipe or
  // socket destination gets every byte, zeros included, and so does an
  // O_APPEND one (its writes ignore the position we would seek to).
  struct stat dst_st;
  if (::fstat(dst_fd, &dst_st) != 0)
    return StatusFromErrno(errno, "stat destination", DYAD_RC_BADFIO);
  const int dst_flags = ::fcntl(dst_fd, F_GETFL);
  bool skip_holes = S_ISREG(dst_st.st_mode) && S_ISREG(src_st.st_mode) && dst_flags >= 0 &&
                    (dst_flags & O_APPEND) == 0;
  off_t dst_start = 0;
  if (skip_holes) {
    dst_start = ::lseek(dst_fd, 0, SEEK_CUR);
    if (dst_start < 0) skip_holes = false;
  }

  ScopedFilePosition keep_src_position(src_fd);
  RangeCopier copier(src_fd, dst_fd, size, stats);
  uint64_t pos = 0;
  while (pos < size) {
    uint64_t seg_end = size;
    if (skip_holes) {
      const off_t data = ::lseek(src_fd, static_cast<off_t>(pos), SEEK_DATA);
      uint64_t data_at = pos;
      if (data >= 0) {
        data_at = std::min<uint64_t>(static_cast<uint64_t>(data), size);
      } else if (errno == ENXIO) {
        data_at = size;  // only a hole (or the end) from here on
      } else {
        skip_holes = false;  // no SEEK_DATA support: copy everything
      }
      if (data_at > pos) {
        // Leave a hole in the destination by moving past it.
        if (::lseek(dst_fd, static_cast<off_t>(data_at - pos), SEEK_CUR) < 0)
          return StatusFromErrno(errno, "seek destination", DYAD_RC_BADFIO);
        if (stats != nullptr) stats->bytes += data_at - pos;
        pos = data_at;
        continue;
      }
      if (skip_holes) {
        const off_t hole = ::lseek(src_fd, static_cast<off_t>(pos), SEEK_HOLE);
        if (hole > static_cast<off_t>(pos)) seg_end = std::min<uint64_t>(hole, size);
      }
    }
    DYAD_RETURN_IF_ERROR(copier.CopySegment(pos, seg_end));
    pos = seg_end;
  }

  if (skip_holes) {
    // A trailing hole was only seeked over; extend the file to cover it.
    const uint64_t end = static_cast<uint64_t>(dst_start) + size;
    if (::fstat(dst_fd, &dst_st) != 0)
      return StatusFromErrno(errno, "stat destination", DYAD_RC_BADFIO);
    if (static_cast<uint64_t>(dst_st.st_size) < end &&
        ::ftruncate(dst_fd, static_cast<off_t>(end)) != 0)
      return StatusFromErrno(errno, "extend destination", DYAD_RC_BADFIO);
  }
  // Holes read as "no data" even when the source was truncated under us;
  // only the size tells a hole from a cut file.
  if (::fstat(src_fd, &src_st) != 0) return StatusFromErrno(errno, "stat source", DYAD_RC_BADFIO);
  if (static_cast<uint64_t>(src_st.st_size) < size) {
    return Status(DYAD_RC_BADFIO, "source shrank to " + Bytes(src_st.st_size) +
                                      " bytes while copying " + Bytes(size));
  }
  return Status::OK();
}

DYAD_DEFINE_TRANSPORT_FACTORY(local, LocalTransport)

}  // namespace dyad
