// fsutil.h: path handling and file placement shared by client and service.
//
// The rules that keep DYAD safe live here:
//  * a relative path ("upath") received from anyone is checked by
//    ValidateUpath: non-empty, not absolute, no "..", no NUL;
//  * files are opened beneath a managed directory with openat2
//    RESOLVE_BENEATH, so symlinks cannot escape it;
//  * received files are written to a hidden temporary name in the target
//    directory and renamed into place only when complete (AtomicFile), so
//    a reader never sees a partial file and a crash leaves only a temporary
//    that the next service start removes.
#pragma once

#include <sys/stat.h>

#include <cstdint>
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

// Opens the directory that holds `upath` beneath `root`, creating missing
// directories when `create` (mkdir -p), never following a symlink below
// `root` (DYAD_RC_PERM when one is in the way). `leaf` gets the last
// component of `upath`.
Result<UniqueFd> OpenParentBeneath(const std::string& root, const std::string& upath, bool create,
                                   std::string* leaf);
// Creates the directories of `upath`'s parent beneath `root` (mkdir -p), as
// OpenParentBeneath.
Status MakeParentDirs(const std::string& root, const std::string& upath);

// A file being received: created under a temporary name beside the final
// path, renamed into place by Commit, removed on destruction otherwise. The
// directories come from OpenParentBeneath and every later step works on the
// directory's descriptor, so no symlink can redirect the file elsewhere.
class AtomicFile {
 public:
  AtomicFile() = default;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile();

  // Creates the temporary for `root`/`upath` (creating parent directories).
  Status Create(const std::string& root, const std::string& upath);
  int fd() const { return fd_.get(); }
  // Gives the file `mode`'s permission bits (the producer's), sets the
  // modification time to `version_ns` (the producer's mtime, so a later
  // check can tell whether the local copy is current), optionally fsyncs,
  // and renames over the final path.
  Status Commit(uint64_t version_ns, bool fsync_data, mode_t mode = 0644);
  // Removes the temporary now.
  void Abort();

 private:
  UniqueFd dir_;
  UniqueFd fd_;
  std::string leaf_;
  std::string temp_name_;
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
