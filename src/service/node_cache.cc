#include "service/node_cache.h"

#include <dirent.h>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/fsutil.h"
#include "common/log.h"
#include "common/net.h"
#include "common/time.h"

namespace dyad {

namespace {

std::string FileKey(const std::string& ns, const std::string& upath) {
  std::string k;
  k.reserve(ns.size() + 1 + upath.size());
  k += ns;
  k += '\0';
  k += upath;
  return k;
}

}  // namespace

CopyId IdOf(const FileRecord& rec) {
  CopyId id;
  id.owner_rank = rec.owner_rank;
  id.owner_incarnation = rec.owner_incarnation;
  id.seq = rec.seq;
  id.size = rec.size;
  id.version = rec.version;
  return id;
}

NodeCache::NodeCache(uint64_t budget_bytes, ServiceStats* stats, int64_t grace_ms)
    : budget_(budget_bytes), grace_ms_(grace_ms), stats_(stats) {}

bool NodeCache::Admit(uint64_t bytes) {
  if (budget_ == 0) return true;
  std::lock_guard<std::mutex> lk(mu_);
  if (waiting_bytes_ + bytes <= budget_) return true;
  RefreshWaitingLocked();
  return waiting_bytes_ + bytes <= budget_;
}

void NodeCache::MarkConsumedLocked(Entry& e) {
  if (e.consumed) return;
  e.consumed = true;
  waiting_bytes_ -= e.id.size;
}

// Waiting copies read since they were placed (their access time moved: the
// first read after placement updates it even under relatime, since
// placement leaves it older than the change time) count as consumed now.
void NodeCache::RefreshWaitingLocked() {
  if (waiting_bytes_ == 0) return;
  for (auto& [path, e] : by_path_) {
    if (e.consumed) continue;
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) continue;
    const uint64_t atime = static_cast<uint64_t>(st.st_atim.tv_sec) * 1000000000ull +
                           static_cast<uint64_t>(st.st_atim.tv_nsec);
    if (atime > e.atime_ns) MarkConsumedLocked(e);
  }
}

void NodeCache::NoteFetched(const std::string& ns, const std::string& path, const FileRecord& rec,
                            bool consumed) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    // Already gone (removed by someone): nothing to index.
    Forget(path);
    return;
  }
  NoteFetched(ns, path, rec, consumed, st);
}

void NodeCache::NoteFetched(const std::string& ns, const std::string& path, const FileRecord& rec,
                            bool consumed, const struct stat& st) {
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = by_path_.find(path); it != by_path_.end()) DropLocked(it);
  Entry e;
  e.ns_upath = FileKey(ns, rec.upath);
  e.id = IdOf(rec);
  e.id.size = static_cast<uint64_t>(st.st_size);
  e.mtime_ns = MtimeNs(st);
  e.atime_ns = static_cast<uint64_t>(st.st_atim.tv_sec) * 1000000000ull +
               static_cast<uint64_t>(st.st_atim.tv_nsec);
  e.ino = static_cast<uint64_t>(st.st_ino);
  e.dev = static_cast<uint64_t>(st.st_dev);
  e.used_ns = MonoNs();
  e.consumed = consumed;
  lru_.push_front(path);
  e.lru = lru_.begin();
  bytes_ += e.id.size;
  if (!consumed) waiting_bytes_ += e.id.size;
  by_file_[e.ns_upath].insert(path);
  const auto placed = by_path_.emplace(path, std::move(e)).first;
  // Stamped before a gap that began since: withdrawn now, as GapBegins did
  // for the copies indexed then.
  if (gapped_.count(ns) != 0 && Protected(path)) Unstamp(path, placed->second);
  EvictLocked(path);
}

void NodeCache::Following(const std::string& ns) {
  std::lock_guard<std::mutex> lk(mu_);
  following_.insert(ns);
}

namespace {

// DemoteStamps below the directory open at `dir` (taken over and closed),
// `shown` its path for messages. Every step is relative to a descriptor
// opened without following a symlink, so a name swapped for a link
// meanwhile never leads the walk out of the tree.
size_t DemoteStampsIn(int dir, const std::string& shown) {
  DIR* d = ::fdopendir(dir);
  if (d == nullptr) {
    ::close(dir);
    return 0;
  }
  size_t demoted = 0;
  std::vector<std::string> subdirs;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (e->d_type == DT_DIR || e->d_type == DT_UNKNOWN) subdirs.push_back(name);
    if (e->d_type != DT_REG && e->d_type != DT_UNKNOWN) continue;
    // One look by name (most files carry no revocable stamp); the file is
    // opened, and looked at again, only to change its stamp.
    const std::string full = shown + "/" + name;
    char stamp[64];
    ssize_t n = ::lgetxattr(full.c_str(), kVersionXattr, stamp, sizeof stamp);
    if (n <= 1 || !IsRevocableStamp(std::string_view(stamp, static_cast<size_t>(n)))) continue;
    UniqueFd fd(::openat(::dirfd(d), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    struct stat st;
    if (!fd.valid() || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    n = ::fgetxattr(fd.get(), kVersionXattr, stamp, sizeof stamp);
    if (n <= 1 || !IsRevocableStamp(std::string_view(stamp, static_cast<size_t>(n)))) continue;
    // The plain stamp is the revocable one without its last byte.
    if (::fsetxattr(fd.get(), kVersionXattr, stamp, static_cast<size_t>(n) - 1, 0) == 0 ||
        ::fremovexattr(fd.get(), kVersionXattr) == 0)
      ++demoted;
    else
      DYAD_LOG_WARN("cannot withdraw the stamp of '%s' from an earlier run: %s", full.c_str(),
                    std::strerror(errno));
  }
  for (const std::string& name : subdirs) {
    const int sub =
        ::openat(::dirfd(d), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sub >= 0) demoted += DemoteStampsIn(sub, shown + "/" + name);
  }
  ::closedir(d);
  return demoted;
}

}  // namespace

size_t NodeCache::DemoteStamps(const std::string& root) {
  const int dir = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  return dir < 0 ? 0 : DemoteStampsIn(dir, root);
}

NodeCache::Withdrawal NodeCache::GapBegins(const std::string& ns) {
  Withdrawal w;
  w.cache_ = this;
  std::lock_guard<std::mutex> lk(mu_);
  if (!gapped_.insert(ns).second || protected_root_.empty()) return w;
  const std::string prefix = FileKey(ns, "");
  for (auto it = by_file_.lower_bound(prefix);
       it != by_file_.end() && it->first.compare(0, prefix.size(), prefix) == 0; ++it)
    for (const std::string& path : it->second)
      if (Protected(path)) w.copies_.emplace_back(path, by_path_.at(path));
  return w;
}

void NodeCache::Withdrawal::Run() const {
  for (const auto& [path, e] : copies_) cache_->Unstamp(path, e);
}

size_t NodeCache::followed_namespaces() const {
  std::lock_guard<std::mutex> lk(mu_);
  size_t n = 0;
  for (const std::string& ns : following_) n += gapped_.count(ns) == 0 ? 1 : 0;
  return n;
}

void NodeCache::GapEnds(const std::string& ns) {
  std::lock_guard<std::mutex> lk(mu_);
  gapped_.erase(ns);
}

bool NodeCache::StampRevocable(const std::string& ns, const std::string& path) const {
  std::lock_guard<std::mutex> lk(mu_);
  return RevocableLocked(ns, path);
}

bool NodeCache::RevocableLocked(const std::string& ns, const std::string& path) const {
  return following_.count(ns) != 0 && gapped_.count(ns) == 0 && Protected(path);
}

bool NodeCache::NoteHit(const std::string& path) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = by_path_.find(path);
  if (it == by_path_.end()) return false;
  Entry& e = it->second;
  const bool prefetched = !e.consumed;
  // The client asked although the copy is here: its stamp was placed
  // before the namespace was followed, or withdrawn in a gap since ended.
  if (RevocableLocked(e.ns_upath.substr(0, e.ns_upath.find('\0')), path)) Restamp(path, e);
  MarkConsumedLocked(e);
  e.used_ns = MonoNs();
  lru_.splice(lru_.begin(), lru_, e.lru);
  stats_->Add(ServiceStats::kNodeCacheHits);
  EvictLocked(path);
  return prefetched;
}

bool NodeCache::IsCurrent(const std::string& path, const FileRecord& rec) const {
  CopyId id;
  uint64_t mtime = 0;
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = by_path_.find(path);
    if (it == by_path_.end()) return false;
    id = it->second.id;
    mtime = it->second.mtime_ns;
  }
  if (id != IdOf(rec)) return false;
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         static_cast<uint64_t>(st.st_size) == id.size && MtimeNs(st) == mtime;
}

size_t NodeCache::Supersede(const std::string& ns, const FileRecord& rec) {
  const CopyId id = IdOf(rec);
  std::lock_guard<std::mutex> lk(mu_);
  auto fit = by_file_.find(FileKey(ns, rec.upath));
  if (fit == by_file_.end()) return 0;
  std::vector<std::string> stale;
  for (const std::string& path : fit->second)
    if (by_path_.at(path).id != id) stale.push_back(path);
  // A superseded copy goes even while open: readers keep the complete old
  // version they opened (the inode lives on), and nobody new may get it.
  for (const std::string& path : stale) {
    if (Protected(path)) {
      Unstamp(path, by_path_.at(path));
      DropLocked(by_path_.find(path));
      continue;
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      DYAD_LOG_WARN("cannot remove superseded copy '%s': %s", path.c_str(), std::strerror(errno));
    DropLocked(by_path_.find(path));
    stats_->Add(ServiceStats::kNodeCacheSuperseded);
  }
  return stale.size();
}

std::set<uint32_t> NodeCache::OwnersOf(const std::string& ns, const std::string& upath) const {
  std::set<uint32_t> out;
  std::lock_guard<std::mutex> lk(mu_);
  auto fit = by_file_.find(FileKey(ns, upath));
  if (fit == by_file_.end()) return out;
  for (const std::string& path : fit->second) out.insert(by_path_.at(path).id.owner_rank);
  return out;
}

void NodeCache::Forget(const std::string& path) {
  std::lock_guard<std::mutex> lk(mu_);
  if (auto it = by_path_.find(path); it != by_path_.end()) DropLocked(it);
}

void NodeCache::Trim() {
  std::lock_guard<std::mutex> lk(mu_);
  EvictLocked(std::string());
}

bool NodeCache::OverBudget() const {
  std::lock_guard<std::mutex> lk(mu_);
  return OverBudgetLocked();
}

bool NodeCache::OverBudgetLocked() const { return budget_ != 0 && bytes_ > budget_; }

uint64_t NodeCache::bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return bytes_;
}

uint64_t NodeCache::pinned_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return pinned_bytes_;
}

size_t NodeCache::files() const {
  std::lock_guard<std::mutex> lk(mu_);
  return by_path_.size();
}

void NodeCache::DropLocked(std::unordered_map<std::string, Entry>::iterator it) {
  Entry& e = it->second;
  (e.pinned ? pinned_bytes_ : bytes_) -= e.id.size;
  if (!e.consumed) waiting_bytes_ -= e.id.size;
  lru_.erase(e.lru);
  auto fit = by_file_.find(e.ns_upath);
  if (fit != by_file_.end()) {
    fit->second.erase(it->first);
    if (fit->second.empty()) by_file_.erase(fit);
  }
  by_path_.erase(it);
}

// Least recently consumed first; copies never consumed (prefetched, waiting
// for their consumer) only once no consumed one is left to remove. Where the
// copy lives does not matter (a consumer directory that is the producer
// directory included): what is indexed is a copy of another rank's file.
void NodeCache::EvictLocked(const std::string& keep) {
  if (!OverBudgetLocked()) return;
  RefreshWaitingLocked();
  const uint64_t now = MonoNs();
  const uint64_t grace_ns = static_cast<uint64_t>(grace_ms_) * 1000000ull;
  for (bool waiting : {false, true}) {
    for (auto lit = lru_.end(); lit != lru_.begin() && bytes_ > budget_;) {
      --lit;
      const std::string& path = *lit;
      auto it = by_path_.find(path);
      Entry& e = it->second;
      if (e.pinned || e.consumed == waiting || path == keep || now - e.used_ns < grace_ns) continue;
      const Removal r = TryRemove(path, e);
      if (r == Removal::kBusy) continue;
      if (r == Removal::kDenied) {
        // Stays on disk for good: counted apart, no longer in the budget.
        e.pinned = true;
        bytes_ -= e.id.size;
        pinned_bytes_ += e.id.size;
        continue;
      }
      auto next = std::next(lit);
      DropLocked(it);  // kNotTheCopy: rewritten here, someone's own file now
      lit = next;
      if (r == Removal::kRemoved) stats_->Add(ServiceStats::kNodeCacheEvictions);
    }
  }
}

bool NodeCache::Protected(const std::string& path) const {
  return !protected_root_.empty() && RelativeTo(protected_root_, path).has_value();
}

// A superseded copy in the producer tree stays (see ProtectTree), but while
// it still is the very file placed, its version stamp goes: clients trust a
// stamped copy without a message (level 1), and this one is no longer
// current. A read-only copy whose stamp its owner may not change (no write
// permission) cannot be open for writing by anyone but root either, so it
// is removed instead, as outside the producer tree.
void NodeCache::Unstamp(const std::string& path, const Entry& e) const {
  struct stat st;
  UniqueFd fd = OpenPlaced(path, e, &st);
  if (!fd.valid()) return;
  if (::fremovexattr(fd.get(), kVersionXattr) == 0 || errno == ENODATA || errno == ENOTSUP) return;
  if ((errno == EACCES || errno == EPERM) && (st.st_mode & 0222) == 0 &&
      ::unlink(path.c_str()) == 0) {
    stats_->Add(ServiceStats::kNodeCacheSuperseded);
    return;
  }
  DYAD_LOG_WARN("cannot mark superseded copy '%s' stale: %s", path.c_str(), std::strerror(errno));
}

// Gives the copy, while it still is the very file placed, the revocable
// stamp of its version (NoteHit, under the revocation rules above).
void NodeCache::Restamp(const std::string& path, const Entry& e) const {
  struct stat st;
  UniqueFd fd = OpenPlaced(path, e, &st);
  if (!fd.valid()) return;
  FileRecord rec;
  rec.owner_rank = e.id.owner_rank;
  rec.owner_incarnation = e.id.owner_incarnation;
  rec.seq = e.id.seq;
  rec.size = e.id.size;
  rec.version = e.id.version;
  const std::string want = VersionStamp(rec, /*revocable=*/true);
  char have[64];
  const ssize_t n = ::fgetxattr(fd.get(), kVersionXattr, have, sizeof have);
  if (n > 0 && std::string_view(have, static_cast<size_t>(n)) == want) return;
  (void)::fsetxattr(fd.get(), kVersionXattr, want.data(), want.size(), 0);  // best effort
}

UniqueFd NodeCache::OpenPlaced(const std::string& path, const Entry& e, struct stat* st) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (fd.valid() && (::fstat(fd.get(), st) != 0 || !IsThePlacedFile(*st, e))) fd.reset();
  return fd;
}

bool NodeCache::IsThePlacedFile(const struct stat& st, const Entry& e) {
  return static_cast<uint64_t>(st.st_ino) == e.ino && static_cast<uint64_t>(st.st_dev) == e.dev &&
         static_cast<uint64_t>(st.st_size) == e.id.size && MtimeNs(st) == e.mtime_ns;
}

// Removes the copy unless a process holds it open (its shared flock makes
// our non-blocking exclusive one fail; a producer rewriting the path holds
// an exclusive one) or the file at `path` is no longer the one placed (a
// local program replaced or rewrote it: not a copy any more, left alone).
// A copy already gone counts as removed.
NodeCache::Removal NodeCache::TryRemove(const std::string& path, const Entry& e) const {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd.valid()) {
    if (errno == ENOENT) return Removal::kRemoved;
    if (errno == ELOOP) return Removal::kNotTheCopy;
    return errno == EACCES || errno == EPERM ? Removal::kDenied : Removal::kBusy;
  }
  if (::flock(fd.get(), LOCK_EX | LOCK_NB) != 0) return Removal::kBusy;
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Removal::kBusy;
  if (!IsThePlacedFile(st, e)) return Removal::kNotTheCopy;
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    const int err = errno;
    DYAD_LOG_WARN("cannot evict '%s': %s; its %llu bytes are pinned (node_cache.pinned_bytes)",
                  path.c_str(), std::strerror(err), static_cast<unsigned long long>(e.id.size));
    return err == EACCES || err == EPERM || err == EROFS ? Removal::kDenied : Removal::kBusy;
  }
  DYAD_LOG_DEBUG("evicted '%s'", path.c_str());
  return Removal::kRemoved;
}

}  // namespace dyad
