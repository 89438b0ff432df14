#include "common/fsutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/seal.h"

namespace dyad {

uint64_t MtimeNs(const struct stat& st) {
  return static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull +
         static_cast<uint64_t>(st.st_mtim.tv_nsec);
}

Result<std::string> ValidateUpath(const std::string& upath) {
  if (upath.empty()) return Status(DYAD_RC_BADREQUEST, "empty path");
  if (upath.size() > PATH_MAX) return Status(DYAD_RC_BADREQUEST, "path too long");
  if (upath.find('\0') != std::string::npos)
    return Status(DYAD_RC_BADREQUEST, "path contains a NUL byte");
  if (upath[0] == '/')
    return Status(DYAD_RC_PERM, "absolute path '" + upath + "' refused (must be relative)");
  std::string out;
  size_t pos = 0;
  while (pos <= upath.size()) {
    size_t slash = upath.find('/', pos);
    if (slash == std::string::npos) slash = upath.size();
    const std::string comp = upath.substr(pos, slash - pos);
    pos = slash + 1;
    if (comp.empty() || comp == ".") continue;
    if (comp == "..") return Status(DYAD_RC_PERM, "path '" + upath + "' refused ('..' component)");
    if (!out.empty()) out += '/';
    out += comp;
  }
  if (out.empty()) return Status(DYAD_RC_BADREQUEST, "path '" + upath + "' names no file");
  return out;
}

std::string NormalizeAbsolute(const std::string& path) {
  std::vector<std::string> parts;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t slash = path.find('/', pos);
    if (slash == std::string::npos) slash = path.size();
    std::string comp = path.substr(pos, slash - pos);
    pos = slash + 1;
    if (comp.empty() || comp == ".") continue;
    if (comp == "..") {
      if (!parts.empty()) parts.pop_back();
      continue;
    }
    parts.push_back(std::move(comp));
  }
  std::string out;
  for (const auto& p : parts) out += "/" + p;
  return out.empty() ? "/" : out;
}

std::string CanonicalPath(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) != nullptr) return buf;
  std::string abs = path;
  if (abs.empty() || abs[0] != '/') {
    char cwd[PATH_MAX];
    if (::getcwd(cwd, sizeof cwd) != nullptr) abs = std::string(cwd) + "/" + abs;
  }
  return NormalizeAbsolute(abs);
}

std::optional<std::string> RelativeTo(const std::string& root, const std::string& path) {
  if (root.empty()) return std::nullopt;
  std::string r = root;
  while (r.size() > 1 && r.back() == '/') r.pop_back();
  if (path.size() < r.size() || path.compare(0, r.size(), r) != 0) return std::nullopt;
  if (path.size() == r.size()) return std::string();
  if (r == "/") return path.substr(1);
  if (path[r.size()] != '/') return std::nullopt;
  size_t start = r.size();
  while (start < path.size() && path[start] == '/') ++start;
  return path.substr(start);
}

// openat2(2) relative to `dir`: a descriptor, or -1 with errno set.
static long Openat2(int dir, const std::string& path, int flags, mode_t mode, uint64_t resolve) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.mode = (flags & O_CREAT) ? mode : 0;
  how.resolve = resolve;
  return ::syscall(SYS_openat2, dir, path.c_str(), &how, sizeof how);
}

Result<UniqueFd> OpenBeneath(const std::string& root, const std::string& upath, int flags,
                             mode_t mode) {
  Result<std::string> rel = ValidateUpath(upath);
  if (!rel.ok()) return rel.status();
  UniqueFd dir(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return StatusFromErrno(errno, "open managed directory '" + root + "'");
  const long fd = Openat2(dir.get(), *rel, flags, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS);
  if (fd >= 0) return UniqueFd(static_cast<int>(fd));
  if (errno == EXDEV)
    return Status(DYAD_RC_PERM,
                  "path '" + upath + "' escapes the managed directory '" + root + "'");
  if (errno != ENOSYS) return StatusFromErrno(errno, "open '" + root + "/" + *rel + "'");

  // Kernels before 5.6: resolve and check the prefix instead.
  const std::string full = root + "/" + *rel;
  UniqueFd f(::open(full.c_str(), flags | O_CLOEXEC, mode));
  if (!f.valid()) return StatusFromErrno(errno, "open '" + full + "'");
  char real[PATH_MAX];
  const std::string proc = "/proc/self/fd/" + std::to_string(f.get());
  const ssize_t n = ::readlink(proc.c_str(), real, sizeof real - 1);
  if (n <= 0) return StatusFromErrno(errno, "readlink " + proc);
  real[n] = '\0';
  if (!RelativeTo(CanonicalPath(root), real))
    return Status(DYAD_RC_PERM,
                  "path '" + upath + "' escapes the managed directory '" + root + "'");
  return f;
}

Result<UniqueFd> OpenParentBeneath(const std::string& root, const std::string& upath, bool create,
                                   std::string* leaf) {
  Result<std::string> rel = ValidateUpath(upath);
  if (!rel.ok()) return rel.status();
  UniqueFd dir(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return StatusFromErrno(errno, "open managed directory '" + root + "'");
  const size_t last = rel->rfind('/');
  if (last != std::string::npos) {
    // Usually the directories exist: one openat2 that refuses every symlink
    // (and anything resolving outside `root`) opens them all. Otherwise the
    // walk below creates them one at a time with the same refusals.
    const long fd = Openat2(dir.get(), rel->substr(0, last), O_RDONLY | O_DIRECTORY, 0,
                            RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
    if (fd >= 0) {
      if (leaf != nullptr) *leaf = rel->substr(last + 1);
      return UniqueFd(static_cast<int>(fd));
    }
  }
  size_t pos = 0;
  for (size_t slash; (slash = rel->find('/', pos)) != std::string::npos; pos = slash + 1) {
    const std::string name = rel->substr(pos, slash - pos);
    if (create && ::mkdirat(dir.get(), name.c_str(), 0755) != 0 && errno != EEXIST)
      return StatusFromErrno(errno, "mkdir '" + root + "/" + rel->substr(0, slash) + "'");
    // O_NOFOLLOW: a symlink among the directories (planted, or swapped in
    // after a check) must not lead a placement out of the managed directory.
    UniqueFd next(
        ::openat(dir.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next.valid()) {
      const int err = errno;
      const std::string where = root + "/" + rel->substr(0, slash);
      if (err == ELOOP || err == ENOTDIR)
        return Status(DYAD_RC_PERM, "'" + where +
                                        "' is a symlink or not a directory; DYAD only "
                                        "places files in real directories beneath '" +
                                        root + "'");
      return StatusFromErrno(err, "open directory '" + where + "'");
    }
    dir = std::move(next);
  }
  if (leaf != nullptr) *leaf = rel->substr(pos);
  return dir;
}

Status MakeParentDirs(const std::string& root, const std::string& upath) {
  return OpenParentBeneath(root, upath, true, nullptr).status();
}

AtomicFile::~AtomicFile() { Abort(); }

void AtomicFile::Abort() {
  if (!committed_ && !temp_name_.empty() && dir_.valid())
    ::unlinkat(dir_.get(), temp_name_.c_str(), 0);
  temp_name_.clear();
  fd_.reset();
}

Status AtomicFile::Create(const std::string& root, const std::string& upath) {
  Abort();
  committed_ = false;
  Result<UniqueFd> dir = OpenParentBeneath(root, upath, true, &leaf_);
  if (!dir.ok()) return dir.status();
  dir_ = std::move(*dir);
  unsigned char rnd[8];
  DYAD_RETURN_IF_ERROR(RandomBytes(rnd, sizeof rnd));
  char suffix[20];
  std::snprintf(suffix, sizeof suffix, "%02x%02x%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2],
                rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
  std::string base = leaf_;
  if (base.size() > 200) base.resize(200);
  temp_name_ = kPartPrefix + base + "." + suffix;
  // Private until committed, when it gets the owner's mode.
  fd_.reset(::openat(dir_.get(), temp_name_.c_str(),
                     O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!fd_.valid()) {
    const int err = errno;
    temp_name_.clear();
    return StatusFromErrno(err, "create temporary for '" + root + "/" + upath + "'");
  }
  return Status::OK();
}

Status AtomicFile::Commit(uint64_t version_ns, bool fsync_data, mode_t mode) {
  if (!fd_.valid()) return Status(DYAD_RC_BADFIO, "commit without an open temporary");
  // Permission bits only: never set-id or sticky bits from a peer.
  if (::fchmod(fd_.get(), mode & 0777) != 0) return StatusFromErrno(errno, "chmod " + temp_name_);
  if (version_ns != 0) {
    timespec ts[2];
    ts[0].tv_sec = 0;
    ts[0].tv_nsec = UTIME_OMIT;
    ts[1].tv_sec = static_cast<time_t>(version_ns / 1000000000ull);
    ts[1].tv_nsec = static_cast<long>(version_ns % 1000000000ull);
    if (::futimens(fd_.get(), ts) != 0) return StatusFromErrno(errno, "futimens " + temp_name_);
  }
  if (fsync_data && ::fsync(fd_.get()) != 0) return StatusFromErrno(errno, "fsync " + temp_name_);
  // renameat replaces whatever has the final name (even a symlink) without
  // following it.
  if (::renameat(dir_.get(), temp_name_.c_str(), dir_.get(), leaf_.c_str()) != 0)
    return StatusFromErrno(errno, "rename into '" + leaf_ + "'");
  committed_ = true;
  fd_.reset();
  dir_.reset();
  return Status::OK();
}

Status PreadFully(int fd, char* out, size_t len, uint64_t offset) {
  for (size_t got = 0; got < len;) {
    const ssize_t r = ::pread(fd, out + got, len - got, static_cast<off_t>(offset + got));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return StatusFromErrno(errno, "read source", DYAD_RC_BADFIO);
    if (r == 0)
      return Status(DYAD_RC_BADFIO, "source ended at byte " + std::to_string(offset + got) +
                                        " (it shrank during the transfer)");
    got += static_cast<size_t>(r);
  }
  return Status::OK();
}

size_t RemoveStaleTemporaries(const std::string& root) {
  size_t removed = 0;
  DIR* d = ::opendir(root.c_str());
  if (d == nullptr) return 0;
  std::vector<std::string> subdirs;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    const std::string full = root + "/" + name;
    if (name.rfind(kPartPrefix, 0) == 0) {
      if (::unlink(full.c_str()) == 0) ++removed;
      continue;
    }
    struct stat st;
    if (e->d_type == DT_DIR ||
        (e->d_type == DT_UNKNOWN && ::lstat(full.c_str(), &st) == 0 && S_ISDIR(st.st_mode)))
      subdirs.push_back(full);
  }
  ::closedir(d);
  for (const auto& s : subdirs) removed += RemoveStaleTemporaries(s);
  return removed;
}

}  // namespace dyad
