#include "common/fsutil.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
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

// openat2 beneath the root `dir` (at `root`): the descriptor, or the
// error as OpenBeneath reports it; ENOSYS (a kernel before 5.6) is left in
// errno with an empty result for the caller's fallback.
static std::optional<Result<UniqueFd>> OpenUnder(int dir, const std::string& root,
                                                 const std::string& upath, const std::string& rel,
                                                 int flags, mode_t mode) {
  const long fd = Openat2(dir, rel, flags, mode, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS);
  if (fd >= 0) return Result<UniqueFd>(UniqueFd(static_cast<int>(fd)));
  if (errno == EXDEV)
    return Result<UniqueFd>(
        Status(DYAD_RC_PERM, "path '" + upath + "' escapes the managed directory '" + root + "'"));
  if (errno != ENOSYS)
    return Result<UniqueFd>(StatusFromErrno(errno, "open '" + root + "/" + rel + "'"));
  return std::nullopt;
}

Result<UniqueFd> OpenBeneath(const std::string& root, const std::string& upath, int flags,
                             mode_t mode) {
  Result<std::string> rel = ValidateUpath(upath);
  if (!rel.ok()) return rel.status();
  UniqueFd dir(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return StatusFromErrno(errno, "open managed directory '" + root + "'");
  if (std::optional<Result<UniqueFd>> r = OpenUnder(dir.get(), root, upath, *rel, flags, mode))
    return std::move(*r);

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

std::shared_ptr<const UniqueFd> BeneathRoot::Held(bool reopen) {
  std::lock_guard<std::mutex> lk(mu_);
  if (dir_ && !reopen) return dir_;
  UniqueFd fd(::open(root_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) {
    dir_.reset();
    return nullptr;
  }
  dir_ = std::make_shared<const UniqueFd>(std::move(fd));
  return dir_;
}

Result<UniqueFd> BeneathRoot::Open(const std::string& upath, int flags, mode_t mode) {
  std::shared_ptr<const UniqueFd> dir = Held(false);
  if (!dir) return OpenBeneath(root_, upath, flags, mode);  // says why the root cannot be opened
  Result<std::string> rel = ValidateUpath(upath);
  if (!rel.ok()) return rel.status();
  std::optional<Result<UniqueFd>> r = OpenUnder(dir->get(), root_, upath, *rel, flags, mode);
  if (!r) return OpenBeneath(root_, upath, flags, mode);  // no openat2: its fallback
  if (r->ok() || r->status().code() == DYAD_RC_PERM) return std::move(*r);
  // A miss: the directory at the root's path may be another one now (the
  // old one removed or renamed). Then the open is made again under it.
  struct stat held, now;
  if (::fstat(dir->get(), &held) != 0 || ::stat(root_.c_str(), &now) != 0 ||
      (held.st_dev == now.st_dev && held.st_ino == now.st_ino))
    return std::move(*r);
  dir = Held(true);
  if (!dir) return OpenBeneath(root_, upath, flags, mode);
  r = OpenUnder(dir->get(), root_, upath, *rel, flags, mode);
  if (!r) return OpenBeneath(root_, upath, flags, mode);
  return std::move(*r);
}

Result<UniqueFd> OpenParentBeneath(const std::string& root, const std::string& upath, bool create,
                                   std::string* leaf) {
  Result<std::string> rel = ValidateUpath(upath);
  if (!rel.ok()) return rel.status();
  const size_t last = rel->rfind('/');
  if (!root.empty() && root[0] == '/') {
    // Usually nothing on the way is a symlink: one openat2 from the root of
    // the file system that refuses every symlink (the root's own path
    // included) reaches the directory through real directories only, hence
    // beneath `root` (`rel` has no ".."). Otherwise the walk below decides.
    const std::string parent = last == std::string::npos ? root : root + "/" + rel->substr(0, last);
    const long fd = Openat2(AT_FDCWD, parent, O_RDONLY | O_DIRECTORY, 0,
                            RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
    if (fd >= 0) {
      if (leaf != nullptr) *leaf = last == std::string::npos ? *rel : rel->substr(last + 1);
      return UniqueFd(static_cast<int>(fd));
    }
  }
  UniqueFd dir(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir.valid()) return StatusFromErrno(errno, "open managed directory '" + root + "'");
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

namespace {

// A temporary name for `leaf`: kPartPrefix, the leaf (shortened), this
// process's random prefix (64 bits from getrandom, once) and a counter.
// What keeps a temporary safe is O_EXCL | O_NOFOLLOW (a planted name is
// skipped, never followed) and the directory's descriptor, not the name:
// whoever can list the directory sees the names anyway. The random prefix
// keeps two processes (two services of one node, a restarted one) from
// colliding; the counter never repeats a name within the process.
Result<std::string> TempName(const std::string& leaf) {
  static std::once_flag once;
  static char prefix[17];
  static Status prefix_status;
  static std::atomic<uint64_t> counter{0};
  std::call_once(once, [] {
    unsigned char rnd[8];
    prefix_status = RandomBytes(rnd, sizeof rnd);
    for (size_t i = 0; i < sizeof rnd; ++i)
      std::snprintf(prefix + 2 * i, 3, "%02x", static_cast<unsigned>(rnd[i]));
  });
  if (!prefix_status.ok()) return prefix_status;
  char suffix[40];
  std::snprintf(suffix, sizeof suffix, ".%s%llx", prefix,
                static_cast<unsigned long long>(counter.fetch_add(1, std::memory_order_relaxed)));
  std::string base = leaf;
  if (base.size() > 200) base.resize(200);
  return kPartPrefix + base + suffix;
}

// Calls `make` with fresh temporary names for `leaf` until it succeeds
// (true; the name it took) or fails (false, errno set) other than because
// the name is taken, at most 9 names.
Result<std::string> WithTempName(const std::string& leaf, const std::string& what,
                                 const std::function<bool(const char*)>& make) {
  for (int attempt = 0;; ++attempt) {
    Result<std::string> name = TempName(leaf);
    if (!name.ok() || make(name->c_str())) return name;
    if (errno != EEXIST || attempt == 8) return StatusFromErrno(errno, what);
  }
}

// How this process links an O_TMPFILE file: linkat(AT_EMPTY_PATH) needs
// CAP_DAC_READ_SEARCH; /proc/self/fd with AT_SYMLINK_FOLLOW needs /proc.
// Learned at the first link and kept.
enum LinkWay : int { kLinkUnknown = 0, kLinkEmptyPath, kLinkProc, kLinkNone };
std::atomic<int> g_link_way{kLinkUnknown};
std::atomic<bool> g_force_named{false};

// linkat of the unnamed file `fd` as `name` in `dir`: 0, or -1 with errno.
int LinkFd(int fd, int dir, const char* name) {
  const int way = g_link_way.load(std::memory_order_relaxed);
  if (way == kLinkUnknown || way == kLinkEmptyPath) {
    if (::linkat(fd, "", dir, name, AT_EMPTY_PATH) == 0) {
      g_link_way.store(kLinkEmptyPath, std::memory_order_relaxed);
      return 0;
    }
    // Without the capability the empty path is looked up as a name: ENOENT.
    if (errno != ENOENT || way == kLinkEmptyPath) return -1;
  }
  char proc[40];
  std::snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
  if (::linkat(AT_FDCWD, proc, dir, name, AT_SYMLINK_FOLLOW) == 0) {
    g_link_way.store(kLinkProc, std::memory_order_relaxed);
    return 0;
  }
  const int err = errno;
  if (err == EEXIST)
    g_link_way.store(kLinkProc, std::memory_order_relaxed);
  else if (err == ENOENT && way == kLinkUnknown && ::access("/proc/self/fd", F_OK) != 0)
    g_link_way.store(kLinkNone, std::memory_order_relaxed);  // no /proc: named temporaries
  errno = err;
  return -1;
}

}  // namespace

AtomicFile::~AtomicFile() { Abort(); }

void AtomicFile::ForceNamedTemporaries(bool on) { g_force_named.store(on); }

void AtomicFile::Abort() {
  if (!committed_ && !temp_name_.empty() && dir_.valid())
    ::unlinkat(dir_.get(), temp_name_.c_str(), 0);
  temp_name_.clear();
  fd_.reset();
  dir_.reset();
}

Status AtomicFile::Create(const std::string& root, const std::string& upath) {
  Abort();
  committed_ = false;
  Result<UniqueFd> dir = OpenParentBeneath(root, upath, true, &leaf_);
  if (!dir.ok()) return dir.status();
  dir_ = std::move(*dir);
  const std::string what = "'" + root + "/" + upath + "'";
  if (g_link_way.load(std::memory_order_relaxed) != kLinkNone && !g_force_named.load()) {
    // Invisible until linked, so it may have its final mode from the start
    // (Commit changes it only when the producer's differs).
    fd_.reset(::openat(dir_.get(), ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644));
    if (fd_.valid()) return Status::OK();
    const int err = errno;
    // No O_TMPFILE here (the file system, or a kernel before 3.11 that
    // takes the flag for O_DIRECTORY): a named temporary instead.
    if (err != EOPNOTSUPP && err != EISDIR && err != EINVAL)
      return StatusFromErrno(err, "create the file for " + what);
  }
  return CreateNamed(what);
}

Status AtomicFile::CreateNamed(const std::string& what) {
  Result<std::string> name =
      WithTempName(leaf_, "create temporary for " + what, [&](const char* n) {
        // Private until committed, when it gets the owner's mode.
        fd_.reset(
            ::openat(dir_.get(), n, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
        return fd_.valid();
      });
  if (!name.ok()) return name.status();
  temp_name_ = std::move(*name);
  return Status::OK();
}

Status AtomicFile::LinkUnnamed() {
  // A new file: its name straight away (it cannot exist half written).
  if (LinkFd(fd_.get(), dir_.get(), leaf_.c_str()) == 0) return Status::OK();
  if (errno != EEXIST) return StatusFromErrno(errno, "link '" + leaf_ + "' into place");
  // A new version of a file already there: a temporary name, renamed over
  // the old one (renameat replaces whatever has the final name, even a
  // symlink, without following it).
  Result<std::string> name =
      WithTempName(leaf_, "link a temporary for '" + leaf_ + "'",
                   [&](const char* n) { return LinkFd(fd_.get(), dir_.get(), n) == 0; });
  if (!name.ok()) return name.status();
  if (::renameat(dir_.get(), name->c_str(), dir_.get(), leaf_.c_str()) != 0) {
    const int err = errno;
    ::unlinkat(dir_.get(), name->c_str(), 0);
    return StatusFromErrno(err, "rename into '" + leaf_ + "'");
  }
  return Status::OK();
}

Status AtomicFile::Commit(uint64_t version_ns, bool fsync_data, mode_t mode) {
  CommitOptions o;
  o.version_ns = version_ns;
  o.fsync_data = fsync_data;
  o.mode = mode;
  return Commit(o);
}

Status AtomicFile::Commit(const CommitOptions& o) {
  if (!fd_.valid()) return Status(DYAD_RC_BADFIO, "commit without an open temporary");
  const std::string& what = temp_name_.empty() ? leaf_ : temp_name_;
  if (o.version_ns != 0) {
    timespec ts[2];
    ts[0].tv_sec = 0;
    ts[0].tv_nsec = UTIME_OMIT;
    ts[1].tv_sec = static_cast<time_t>(o.version_ns / 1000000000ull);
    ts[1].tv_nsec = static_cast<long>(o.version_ns % 1000000000ull);
    if (::futimens(fd_.get(), ts) != 0) return StatusFromErrno(errno, "futimens " + what);
  }
  if (o.xattr_name != nullptr)
    (void)::fsetxattr(fd_.get(), o.xattr_name, o.xattr_value.data(), o.xattr_value.size(), 0);
  // Permission bits only: never set-id or sticky bits from a peer.
  const mode_t mode = o.mode & 0777;
  bool chmod_needed = true;
  if (o.expect_size >= 0 || o.placed != nullptr) {
    // After futimens: the mtime as the file system keeps it (its
    // granularity), which the node cache compares later.
    struct stat st;
    if (::fstat(fd_.get(), &st) != 0) return StatusFromErrno(errno, "stat " + what);
    if (o.expect_size >= 0 && st.st_size != o.expect_size)
      return Status(DYAD_RC_STALE, std::to_string(st.st_size) + " bytes arrived, " +
                                       std::to_string(o.expect_size) +
                                       " were expected; nothing was placed");
    // Created 0644 (under the umask): usually the producer's mode already.
    chmod_needed = (st.st_mode & 07777) != mode;
    st.st_mode = (st.st_mode & ~static_cast<mode_t>(07777)) | mode;
    if (o.placed != nullptr) *o.placed = st;
  }
  if (chmod_needed && ::fchmod(fd_.get(), mode) != 0)
    return StatusFromErrno(errno, "chmod " + what);
  if (o.fsync_data && ::fsync(fd_.get()) != 0) return StatusFromErrno(errno, "fsync " + what);
  if (temp_name_.empty()) {
    DYAD_RETURN_IF_ERROR(LinkUnnamed());
  } else if (::renameat(dir_.get(), temp_name_.c_str(), dir_.get(), leaf_.c_str()) != 0) {
    // renameat replaces whatever has the final name (even a symlink)
    // without following it.
    return StatusFromErrno(errno, "rename into '" + leaf_ + "'");
  }
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
