// fsutil.h: path handling and file placement shared by client and service.
//
// The rules that keep DYAD safe live here:
//  * a relative path ("upath") received from anyone is checked by
//    ValidateUpath: non-empty, not absolute, no "..", no NUL;
//  * files are opened beneath a managed directory with openat2
//    RESOLVE_BENEATH, so symlinks cannot escape it;
//  * received files are written to a file without a name (O_TMPFILE) in
//    the target directory, or where the file system has none to a hidden
//    temporary name, and get their name only when complete (AtomicFile), so
//    a reader never sees a partial file and a crash leaves nothing (or a
//    named temporary that the next service start removes).
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "common/net.h"
#include "common/status.h"

namespace dyad {

// Prefix of temporary files created by AtomicFile (never published).
inline constexpr const char* kPartPrefix = ".dyad-part.";

// Checks a path relative to a managed directory and returns it normalized
// (duplicate and trailing slashes and "." components removed).
Result<std::string> ValidateUpath(const std::string& upath);

// Lexically normalizes an absolute path ("/a//b/./c/" -> "/a/b/c"); ".."
// components are resolved lexically.
std::string NormalizeAbsolute(const std::string& path);

// realpath() when the path exists, else the normalized absolute form
// (relative paths are taken against the working directory).
std::string CanonicalPath(const std::string& path);

// If `path` is `root` or below it, returns the part below ("" for root).
std::optional<std::string> RelativeTo(const std::string& root, const std::string& path);

// Opens `upath` beneath the directory `root` (no escape via "..", absolute
// components or symlinks). `flags` as for open(2).
Result<UniqueFd> OpenBeneath(const std::string& root, const std::string& upath, int flags,
                             mode_t mode = 0);

// OpenBeneath for one root opened many times (the owner serving fetches):
// the root's descriptor is kept, so an open costs one openat2 instead of
// three system calls. A root removed or replaced (another directory now at
// its path) is found on the first open that misses, which opens the root
// again and retries. Thread-safe.
class BeneathRoot {
 public:
  explicit BeneathRoot(std::string root) : root_(std::move(root)) {}
  const std::string& root() const { return root_; }
  Result<UniqueFd> Open(const std::string& upath, int flags, mode_t mode = 0);

 private:
  // The root's descriptor, opened when first needed; null when it cannot
  // be opened (the error comes from OpenBeneath's own open of the root).
  std::shared_ptr<const UniqueFd> Held(bool reopen);
  const std::string root_;
  std::mutex mu_;
  std::shared_ptr<const UniqueFd> dir_;  // guarded by mu_
};

// Opens the directory that holds `upath` beneath `root`, creating missing
// directories when `create` (mkdir -p), never following a symlink below
// `root` (DYAD_RC_PERM when one is in the way). `leaf` gets the last
// component of `upath`.
Result<UniqueFd> OpenParentBeneath(const std::string& root, const std::string& upath, bool create,
                                   std::string* leaf);
// Creates the directories of `upath`'s parent beneath `root` (mkdir -p), as
// OpenParentBeneath.
Status MakeParentDirs(const std::string& root, const std::string& upath);

// A file being received, placed atomically: Create opens it without a name
// (O_TMPFILE) in the destination's directory, Commit stamps it (mode,
// version as mtime, optionally an extended attribute) and links it under
// its final name when that is free, or links it under a temporary name and
// renames that over the old file (a new version replacing a copy); the
// destructor drops it otherwise (an unnamed file leaves nothing behind,
// even after a crash). Where the file system has no O_TMPFILE (EOPNOTSUPP,
// EISDIR, EINVAL), or the process cannot link one, the file is created
// under a hidden temporary name (kPartPrefix) beside the final path and
// renamed into place. The directory comes from OpenParentBeneath and every
// later step works on its descriptor, so no symlink can redirect the file
// elsewhere. Temporary names are the process's random prefix (read once)
// and a counter: never reused within the process, and created with O_EXCL,
// so a name planted by someone else is skipped, never followed.
class AtomicFile {
 public:
  // What Commit does besides linking.
  struct CommitOptions {
    uint64_t version_ns = 0;  // the file's mtime (0: left as written)
    bool fsync_data = false;
    mode_t mode = 0644;  // permission bits only (never set-id or sticky bits)
    // Best effort: an extended attribute (ignored where unsupported).
    const char* xattr_name = nullptr;
    std::string xattr_value;
    // When >= 0: the file must have exactly this size, else nothing is
    // placed (DYAD_RC_STALE).
    int64_t expect_size = -1;
    // When set: the placed file's fstat (after stamping).
    struct stat* placed = nullptr;
  };

  AtomicFile() = default;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  // Creates the file for `root`/`upath` (creating parent directories).
  Status Create(const std::string& root, const std::string& upath);
  int fd() const { return fd_.get(); }
  // True when the file being written has no name (O_TMPFILE).
  bool unnamed() const { return fd_.valid() && temp_name_.empty(); }
  // Gives the file `mode`'s permission bits (the producer's), sets the
  // modification time to `version_ns` (the producer's mtime, so a later
  // check can tell whether the local copy is current), optionally fsyncs,
  // and puts it at the final path.
  Status Commit(uint64_t version_ns, bool fsync_data, mode_t mode = 0644);
  Status Commit(const CommitOptions& options);
  // Drops the file now.
  void Abort();
  // Tests: every later Create in this process uses a named temporary, as
  // on a file system without O_TMPFILE (false: back to unnamed files).
  static void ForceNamedTemporaries(bool on);

 private:
  Status CreateNamed(const std::string& what);
  Status LinkUnnamed();

  UniqueFd dir_;
  UniqueFd fd_;
  std::string leaf_;
  std::string temp_name_;  // "" for an unnamed file
  bool committed_ = false;
};

// Removes leftover AtomicFile temporaries below `root` (service start-up).
// Returns how many were removed.
size_t RemoveStaleTemporaries(const std::string& root);

// Reads exactly `len` bytes of `fd` at `offset` (EINTR retried); a file
// that ends sooner is DYAD_RC_BADFIO (it shrank while being sent).
Status PreadFully(int fd, char* out, size_t len, uint64_t offset);

// mtime of a stat in ns.
uint64_t MtimeNs(const struct stat& st);

}  // namespace dyad
