// wrapper.cc: libdyad_wrapper.so, the LD_PRELOAD interception library.
//
// Unmodified programs exchange files through DYAD by running with
// LD_PRELOAD=libdyad_wrapper.so and the DYAD_* variables. The library
// replaces the C library's file-opening and closing functions:
//   * a read-only open of a path under the consumer-managed directory first
//     waits until the file is published and complete locally (Consume);
//   * a write-capable open of a path under the producer-managed directory
//     takes an exclusive flock() on the file (the service's fetch takes a
//     shared one, so nobody ships a half-written file) and the last close of
//     that file in this process releases the lock and publishes it (Produce);
//   * a write-capable open of a path under the consumer-managed directory
//     (when a producer directory is configured too) is handled the same way,
//     except that the last close hands the file to this node (Adopt:
//     read-write ownership, docs/consistency.md); one that keeps the old
//     contents (no O_TRUNC, no O_CREAT) first consumes the current version;
//   * a read-only consumer descriptor carries a shared flock(), so the
//     service's byte budget never evicts a copy a process holds open;
//   * a successful rename/renameat/renameat2/link/linkat that gives a
//     regular file a name under the producer directory publishes it (under
//     the producer's LOCK_EX, as the last close would), or, when this
//     process still writes that file, renames its tracked entry so that its
//     last close publishes it under the new name (PublishNewName);
//   * a look (stat, lstat, fstatat, statx, access, faccessat, and the
//     __xstat, __lxstat, __fxstatat of programs built against glibc < 2.33)
//     that finds no file under the consumer directory brings a file that is already
//     published here (or makes a directory that holds published files)
//     and looks again (LookCommon);
//   * a listing (opendir/fdopendir, readdir/readdir64) of the consumer
//     directory or one below it returns, after the real entries, the names
//     published there that are not here yet (ListingOpen, ListingRead);
//   * a read that has waited DYAD_WAIT_NOTICE seconds (default 5 when
//     stderr is a terminal, else off; 0 turns it off) prints one line on
//     stderr, once per file, saying which file it waits for and whether a
//     file by that name is here unpublished (WaitNotices below).
// Everything else is handed to the real function untouched, after a prefix
// comparison that costs no system call for absolute names.
//
// Threading: every function may be called from any thread at once. The real
// functions are resolved once (dlsym RTLD_NEXT, published through atomics);
// the dyad::Client is created once (pthread_once) on the first intercepted
// call and leaked on purpose so that no destructor ordering at exit can pull
// it away from a late close(). A per-thread depth counter (ReentryGuard)
// makes calls the client itself makes (it opens files too) go straight to
// the C library. The descriptor table is guarded by one mutex that is never
// held across a system call that may block, and that pthread_atfork keeps
// consistent in a forked child. errno is preserved: callers see exactly the
// errno of the real call, or a DYAD-chosen errno when a managed open fails.
#undef _FORTIFY_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "client/client.h"
#include "client/producer_lock.h"
#include "common/config.h"
#include "common/fsutil.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "dyad/common/dyad_rc.h"
#include "proto/protocol.h"

// Declared by glibc only under _FORTIFY_SOURCE; the fortified open() inline
// of a program compiled with it calls these.
extern "C" {
int __open_2(const char* path, int flags);
int __open64_2(const char* path, int flags);
int __openat_2(int dirfd, const char* path, int flags);
int __openat64_2(int dirfd, const char* path, int flags);
}

namespace dyad {
namespace preload {
namespace {

// ---------------------------------------------------------------------------
// The real functions, resolved lazily and cached. A relaxed race between two
// first callers is harmless: both store the same pointer.

template <typename Fn>
Fn RealFn(std::atomic<void*>& slot, const char* name) {
  void* p = slot.load(std::memory_order_acquire);
  if (p == nullptr) {
    p = ::dlsym(RTLD_NEXT, name);
    slot.store(p, std::memory_order_release);
  }
  return reinterpret_cast<Fn>(p);
}

#define DYAD_REAL(name, type)                \
  type real_##name() {                       \
    static std::atomic<void*> slot{nullptr}; \
    return RealFn<type>(slot, #name);        \
  }

using OpenFn = int (*)(const char*, int, ...);
using OpenAtFn = int (*)(int, const char*, int, ...);
using Open2Fn = int (*)(const char*, int);
using OpenAt2Fn = int (*)(int, const char*, int);
using FopenFn = FILE* (*)(const char*, const char*);
using FreopenFn = FILE* (*)(const char*, const char*, FILE*);
using CloseFn = int (*)(int);
using FcloseFn = int (*)(FILE*);
using DupFn = int (*)(int);
using Dup2Fn = int (*)(int, int);
using Dup3Fn = int (*)(int, int, int);
using FcntlFn = int (*)(int, int, ...);
using CloseRangeFn = int (*)(unsigned, unsigned, int);
using CloseFromFn = void (*)(int);
using FlockFn = int (*)(int, int);
using RenameFn = int (*)(const char*, const char*);
using RenameAtFn = int (*)(int, const char*, int, const char*);
using RenameAt2Fn = int (*)(int, const char*, int, const char*, unsigned);
using LinkAtFn = int (*)(int, const char*, int, const char*, int);
using StatFn = int (*)(const char*, struct stat*);
using Stat64Fn = int (*)(const char*, struct stat64*);
using FstatatFn = int (*)(int, const char*, struct stat*, int);
using Fstatat64Fn = int (*)(int, const char*, struct stat64*, int);
using StatxFn = int (*)(int, const char*, int, unsigned, struct statx*);
using AccessFn = int (*)(const char*, int);
using FaccessatFn = int (*)(int, const char*, int, int);
using OpendirFn = DIR* (*)(const char*);
using FdopendirFn = DIR* (*)(int);
using ReaddirFn = struct dirent* (*)(DIR*);
using Readdir64Fn = struct dirent64* (*)(DIR*);
using RewinddirFn = void (*)(DIR*);
using ClosedirFn = int (*)(DIR*);
using TelldirFn = long (*)(DIR*);
using SeekdirFn = void (*)(DIR*, long);

DYAD_REAL(open, OpenFn)
DYAD_REAL(open64, OpenFn)
DYAD_REAL(openat, OpenAtFn)
DYAD_REAL(openat64, OpenAtFn)
DYAD_REAL(__open_2, Open2Fn)
DYAD_REAL(__open64_2, Open2Fn)
DYAD_REAL(__openat_2, OpenAt2Fn)
DYAD_REAL(__openat64_2, OpenAt2Fn)
DYAD_REAL(fopen, FopenFn)
DYAD_REAL(fopen64, FopenFn)
DYAD_REAL(freopen, FreopenFn)
DYAD_REAL(freopen64, FreopenFn)
DYAD_REAL(close, CloseFn)
DYAD_REAL(fclose, FcloseFn)
DYAD_REAL(dup, DupFn)
DYAD_REAL(dup2, Dup2Fn)
DYAD_REAL(dup3, Dup3Fn)
DYAD_REAL(fcntl, FcntlFn)
DYAD_REAL(fcntl64, FcntlFn)
DYAD_REAL(close_range, CloseRangeFn)
DYAD_REAL(closefrom, CloseFromFn)
DYAD_REAL(flock, FlockFn)
DYAD_REAL(rename, RenameFn)
DYAD_REAL(renameat, RenameAtFn)
DYAD_REAL(renameat2, RenameAt2Fn)
DYAD_REAL(link, RenameFn)
DYAD_REAL(linkat, LinkAtFn)
DYAD_REAL(stat, StatFn)
DYAD_REAL(stat64, Stat64Fn)
DYAD_REAL(lstat, StatFn)
DYAD_REAL(lstat64, Stat64Fn)
DYAD_REAL(fstatat, FstatatFn)
DYAD_REAL(fstatat64, Fstatat64Fn)
DYAD_REAL(statx, StatxFn)
DYAD_REAL(access, AccessFn)
DYAD_REAL(faccessat, FaccessatFn)
DYAD_REAL(opendir, OpendirFn)
DYAD_REAL(fdopendir, FdopendirFn)
DYAD_REAL(readdir, ReaddirFn)
DYAD_REAL(readdir64, Readdir64Fn)
DYAD_REAL(rewinddir, RewinddirFn)
DYAD_REAL(closedir, ClosedirFn)
DYAD_REAL(telldir, TelldirFn)
DYAD_REAL(seekdir, SeekdirFn)

// The stat entry points of C libraries older than glibc 2.33 (their stat,
// lstat and fstatat were inline wrappers around these). Programs built
// against such a library still call them, bound to the symbols' original
// versions. A C library that never had them (a glibc port newer than
// 2.33, such as LoongArch) leaves the pointer null and the call fails with
// ENOSYS: no program built for it calls them. A glibc that keeps them only
// as hidden compatibility symbols is not found by dlsym; dlvsym with the
// version an old program is bound to finds it. (On x86_64 glibc 2.36 they
// are still the default versions, and dlsym finds them.)
using XstatFn = int (*)(int, const char*, struct stat*);
using Xstat64Fn = int (*)(int, const char*, struct stat64*);
using FxstatatFn = int (*)(int, int, const char*, struct stat*, int);
using Fxstatat64Fn = int (*)(int, int, const char*, struct stat64*, int);

#if defined(__x86_64__) && !defined(__ILP32__)
constexpr const char* kXstatVersion = "GLIBC_2.2.5";
constexpr const char* kFxstatatVersion = "GLIBC_2.4";
#elif defined(__aarch64__)
constexpr const char* kXstatVersion = "GLIBC_2.17";
constexpr const char* kFxstatatVersion = "GLIBC_2.17";
#else
constexpr const char* kXstatVersion = nullptr;  // dlsym only
constexpr const char* kFxstatatVersion = nullptr;
#endif

// Resolved once (a missing symbol stays missing: no dlsym per call).
template <typename Fn>
Fn RealCompatFn(const char* name, const char* version) {
  void* p = ::dlsym(RTLD_NEXT, name);
  if (p == nullptr && version != nullptr) p = ::dlvsym(RTLD_NEXT, name, version);
  return reinterpret_cast<Fn>(p);
}

#define DYAD_REAL_COMPAT(name, type, version)                  \
  type real_##name() {                                         \
    static const type fn = RealCompatFn<type>(#name, version); \
    return fn;                                                 \
  }

DYAD_REAL_COMPAT(__xstat, XstatFn, kXstatVersion)
DYAD_REAL_COMPAT(__xstat64, Xstat64Fn, kXstatVersion)
DYAD_REAL_COMPAT(__lxstat, XstatFn, kXstatVersion)
DYAD_REAL_COMPAT(__lxstat64, Xstat64Fn, kXstatVersion)
DYAD_REAL_COMPAT(__fxstatat, FxstatatFn, kFxstatatVersion)
DYAD_REAL_COMPAT(__fxstatat64, Fxstatat64Fn, kFxstatatVersion)

// Calls the real compat function `fn` with `args`, or fails with ENOSYS
// when this C library does not have it.
template <typename Fn, typename... Args>
int CallCompat(Fn fn, Args... args) {
  if (fn == nullptr) {
    errno = ENOSYS;
    return -1;
  }
  return fn(args...);
}

// ---------------------------------------------------------------------------
// Re-entry guard: only the outermost intercepted call of a thread does DYAD
// work; the client's own open()/close() calls pass straight through.
// initial-exec TLS: the library is always loaded at startup (LD_PRELOAD), and
// this keeps the check to one memory access.

__attribute__((tls_model("initial-exec"))) thread_local int t_depth = 0;

class ReentryGuard {
 public:
  ReentryGuard() : outermost_(t_depth++ == 0) {}
  ~ReentryGuard() { --t_depth; }
  ReentryGuard(const ReentryGuard&) = delete;
  ReentryGuard& operator=(const ReentryGuard&) = delete;
  bool outermost() const { return outermost_; }

 private:
  bool outermost_;
};

// ---------------------------------------------------------------------------
// Process state.

std::atomic<bool> g_shutdown{false};
pthread_once_t g_init_once = PTHREAD_ONCE_INIT;
Client* g_client = nullptr;   // set once by Init(), never freed
bool g_fail_on_error = true;  // DYAD_PRELOAD_ON_ERROR
bool g_debug = false;
std::atomic<bool> g_reported{false};
int64_t g_wait_notice_ms = 0;  // DYAD_WAIT_NOTICE (0: off)
bool g_list = false;           // DYAD_PRELOAD_LIST: merge published names into listings
// Every spelling of the managed directories (as given and canonical, for
// both sides), set once by Init(): the cheap first filter of MaybeManaged.
std::string g_prefixes[4];
int g_num_prefixes = 0;

// False when the absolute `path` cannot be managed: it starts with none of
// the directories and is in normal form (no "." or ".." component, no empty
// one), which is exactly when Client::IsManaged would say no. Costs a few
// byte comparisons for most paths, which is all a non-managed open pays.
bool MaybeManaged(const char* path) {
  for (int i = 0; i < g_num_prefixes; ++i)
    if (std::strncmp(path, g_prefixes[i].data(), g_prefixes[i].size()) == 0) return true;
  return std::strstr(path, "/.") != nullptr || std::strstr(path, "//") != nullptr;
}

// One message per process (the first failure); later ones only in debug
// mode, so a program that opens thousands of files does not drown its
// output in copies of "service unreachable".
// `consequence` replaces the usual word on what happens to the call.
void Report(const std::string& what, const Status& st, const char* consequence = nullptr) {
  const bool first = !g_reported.exchange(true);
  if (!first && !g_debug) return;
  std::string msg = "dyad-preload[" + std::to_string(::getpid()) + "]: " + what + ": " +
                    st.ToString() +
                    (consequence != nullptr ? consequence
                     : g_fail_on_error ? " (failing the call; DYAD_PRELOAD_ON_ERROR=pass to bypass)"
                                       : " (continuing without DYAD: DYAD_PRELOAD_ON_ERROR=pass)") +
                    "\n";
  // write(2) rather than stdio: no locks, no buffering, fine in any state.
  ssize_t ignored = ::write(STDERR_FILENO, msg.data(), msg.size());
  (void)ignored;
}

int ErrnoFor(const Status& st) {
  switch (st.code()) {
    case DYAD_RC_TIMEOUT:
      return ETIMEDOUT;
    case DYAD_RC_NOTFOUND:
      return ENOENT;
    case DYAD_RC_PERM:
    case DYAD_RC_AUTH:
      return EACCES;
    case DYAD_RC_CANCELLED:
      return EINTR;
    case DYAD_RC_NOSPACE:
      return ENOSPC;
    default:
      return EIO;
  }
}

// Reads waiting in Consume, watched by one thread (started on the first
// such read) that prints one line per file once a read has waited
// g_wait_notice_ms: a reader hung on a file nobody publishes (written by a
// shell redirection, outside DYAD) is otherwise silent. The watcher writes
// with write(2) and stats the name (neither is intercepted); in a forked
// child it does not exist, and the child starts its own when needed.
class WaitNotices {
 public:
  struct Waiting {
    std::string name;
    std::chrono::steady_clock::time_point since;
  };
  using Token = std::list<Waiting>::iterator;

  Token Begin(const std::string& name) {
    MutexLock lk(mu_);
    if (!started_) {
      started_ = true;
      std::thread([this] { Watch(); }).detach();
    }
    waiting_.push_back(Waiting{name, std::chrono::steady_clock::now()});
    cv_.notify_one();
    return std::prev(waiting_.end());
  }
  void End(Token t) {
    MutexLock lk(mu_);
    waiting_.erase(t);
  }
  void LockForFork() ACQUIRE(mu_) { mu_.lock(); }
  void UnlockAfterFork() RELEASE(mu_) { mu_.unlock(); }
  // In the child: the parent's waits are not this process's, and the
  // watcher thread did not come along.
  void ResetInChild() RELEASE(mu_) {
    waiting_.clear();
    started_ = false;
    mu_.unlock();
  }

 private:
  void Watch() {
    const auto after = std::chrono::milliseconds(g_wait_notice_ms);
    MutexLock lk(mu_);
    for (;;) {
      if (waiting_.empty()) {
        lk.Wait(cv_);
        continue;
      }
      const auto now = std::chrono::steady_clock::now();
      auto next = now + after;
      std::vector<std::pair<std::string, int64_t>> due;
      for (const Waiting& w : waiting_) {
        if (noticed_.count(w.name) != 0) continue;
        if (now - w.since >= after) {
          noticed_.insert(w.name);
          due.emplace_back(w.name,
                           std::chrono::duration_cast<std::chrono::seconds>(now - w.since).count());
        } else if (w.since + after < next) {
          next = w.since + after;
        }
      }
      if (!due.empty()) {
        lk.Unlock();
        for (const auto& [name, secs] : due) Print(name, secs);
        lk.Lock();
        continue;
      }
      lk.WaitUntil(cv_, next);
    }
  }
  static void Print(const std::string& name, int64_t secs) {
    std::string msg = "dyad-preload[" + std::to_string(::getpid()) + "]: '" + name +
                      "' has waited " + std::to_string(secs) +
                      " s for its publication (or its transfer)";
    struct stat st;
    if (::stat(name.c_str(), &st) == 0 && S_ISREG(st.st_mode))
      msg +=
          "; a file by that name exists here but was never published (written outside "
          "DYAD? publish it with `dyad produce`)";
    msg += "; `dyad status` lists waiting reads (DYAD_WAIT_NOTICE=0 silences this)\n";
    ssize_t ignored = ::write(STDERR_FILENO, msg.data(), msg.size());
    (void)ignored;
  }

  Mutex mu_;
  std::condition_variable cv_;
  bool started_ GUARDED_BY(mu_) = false;
  std::list<Waiting> waiting_ GUARDED_BY(mu_);
  std::set<std::string> noticed_ GUARDED_BY(mu_);  // once per file
};

WaitNotices& Notices() {
  static WaitNotices* n = new WaitNotices();  // leaked: the watcher may outlive exit handlers
  return *n;
}

void AtExit();
void FlushAtExit();
void FlushPublications();
void AtForkPrepare();
void AtForkParent();
void AtForkChild();

// DYAD_WAIT_NOTICE=SECONDS: after how long a read waiting for a
// publication says so on stderr; 0 (or a bad value) turns it off. Unset:
// 5 s when stderr is a terminal (a person is watching), else off, so that
// batch jobs' error files stay as they were.
int64_t WaitNoticeMs() {
  std::optional<std::string> v = GetEnv("DYAD_WAIT_NOTICE");
  if (!v || v->empty()) return ::isatty(STDERR_FILENO) ? 5000 : 0;
  char* end = nullptr;
  const double secs = std::strtod(v->c_str(), &end);
  if (end == v->c_str() || *end != '\0' || !(secs > 0) || secs > 1e6) return 0;
  return static_cast<int64_t>(secs * 1000);
}

void Init() {
  g_debug = EnvBool("DYAD_SYNC_DEBUG", false);
  g_wait_notice_ms = WaitNoticeMs();
  if (auto v = GetEnv("DYAD_PRELOAD_ON_ERROR"); v && *v == "pass") g_fail_on_error = false;
  const auto prod = GetEnv("DYAD_PATH_PRODUCER");
  const auto cons = GetEnv("DYAD_PATH_CONSUMER");
  // Nothing managed: stay out of the way for good. One line (this once,
  // per process) says so, since a program that opens a file it expected
  // DYAD to bring gets a bare ENOENT otherwise; DYAD_PRELOAD_QUIET=1 hides
  // it. write(2): no locks or buffers, and errno is left as it was.
  if ((!prod || prod->empty()) && (!cons || cons->empty())) {
    if (!EnvBool("DYAD_PRELOAD_QUIET", false)) {
      const int saved = errno;
      const std::string msg =
          "dyad-preload[" + std::to_string(::getpid()) +
          "]: DYAD is preloaded but manages no directory: DYAD_PATH_CONSUMER and "
          "DYAD_PATH_PRODUCER are unset, so every open passes through unchanged; set "
          "DYAD_PATH_CONSUMER (to consume) or DYAD_PATH_PRODUCER (to produce) "
          "(DYAD_PRELOAD_QUIET=1 hides this line)\n";
      ssize_t ignored = ::write(STDERR_FILENO, msg.data(), msg.size());
      (void)ignored;
      errno = saved;
    }
    return;
  }
  Result<ClientConfig> config = ClientConfig::FromEnv();
  if (!config.ok()) {
    g_fail_on_error = false;  // we cannot tell managed paths apart: pass all
    Report("bad DYAD configuration, interception disabled", config.status());
    return;
  }
  Result<std::shared_ptr<Client>> client = Client::Create(std::move(*config));
  if (!client.ok()) {
    g_fail_on_error = false;
    Report("cannot initialize DYAD, interception disabled", client.status());
    return;
  }
  // Leaked: late closes during exit must still find a live client.
  auto* holder = new std::shared_ptr<Client>(std::move(*client));
  g_client = holder->get();
  g_list = EnvBool("DYAD_PRELOAD_LIST", false);
  for (const ManagedPath* dir : {&g_client->producer_path(), &g_client->consumer_path()}) {
    for (const std::string* form : {&dir->given(), &dir->canonical()}) {
      if (form->empty()) continue;
      bool seen = false;
      for (int i = 0; i < g_num_prefixes; ++i) seen = seen || g_prefixes[i] == *form;
      if (!seen) g_prefixes[g_num_prefixes++] = *form;
    }
  }
  pthread_atfork(&AtForkPrepare, &AtForkParent, &AtForkChild);
  // Registered after the client exists, so it runs before anything the
  // client's construction registered: files still open at exit get published
  // while the client is intact.
  std::atexit(&AtExit);
}

// The client, initialized on first use; null when DYAD is off.
Client* GetClient() {
  pthread_once(&g_init_once, &Init);
  return g_client;
}

// ---------------------------------------------------------------------------
// Files opened for writing under the producer directory.

struct TrackedFile {
  dev_t dev = 0;
  ino_t ino = 0;
  std::string path;               // absolute (or managed-relative) name for Produce
  int lock_fd = -1;               // our own descriptor carrying the LOCK_EX
  int refs = 0;                   // descriptors of this process open on the file
  bool owned = true;              // false in a forked child: the parent publishes
  bool adopt = false;             // a consumer file: the last close adopts it (Client::Adopt)
  bool moved_out = false;         // renamed out of the managed directories: `path` is gone
  std::vector<std::string> also;  // producer names link()ed to it meanwhile
};

class FileTable {
 public:
  // Records `fd`, just opened for writing on `path`; takes the file lock
  // when this is the first descriptor of the file in the process.
  void Add(int fd, const std::string& path);
  // Adds `newfd` as another descriptor of the file `oldfd` refers to
  // (dup), if `oldfd` is tracked.
  void AddAlias(int oldfd, int newfd);
  // Forgets `fd` (about to be closed). Returns the file when `fd` was its
  // last descriptor; the caller finishes it after the real close.
  std::unique_ptr<TrackedFile> Remove(int fd);
  // Remove() for every tracked descriptor in [first, last].
  std::vector<std::unique_ptr<TrackedFile>> RemoveRange(unsigned first, unsigned last);
  bool WritingPath(const std::string& path) {
    if (count_.load(std::memory_order_acquire) == 0) return false;
    MutexLock lock(mu_);
    for (const auto& [key, f] : by_file_)
      if (f->path == path && f->owned) return true;
    return false;
  }
  // Cheap test used by every close(): nothing tracked means nothing to do.
  bool empty() const { return count_.load(std::memory_order_acquire) == 0; }
  // True when this process holds the producer's LOCK_EX on the file `fd`
  // refers to, on a descriptor of our own (LockFile).
  bool HoldsLockOn(int fd);
  // The file (dev, ino) was just renamed (or, with `link`, linked) to
  // `path` (nullptr: a name outside the managed directories). When this
  // process writes it, the entry takes the new name (a link adds it) so
  // that its last close publishes it there, and true is returned.
  bool Renamed(dev_t dev, ino_t ino, const std::string* path, bool link);
  std::vector<std::unique_ptr<TrackedFile>> TakeAll();

  void LockForFork() ACQUIRE(mu_) { mu_.lock(); }
  void UnlockAfterFork() RELEASE(mu_) { mu_.unlock(); }
  // In a forked child: the parent owns every file open so far.
  void DisownAll() REQUIRES(mu_);

 private:
  using Key = std::pair<dev_t, ino_t>;
  mutable Mutex mu_;
  std::atomic<int> count_{0};  // descriptors in by_fd_
  std::unordered_map<int, TrackedFile*> by_fd_ GUARDED_BY(mu_);
  std::map<Key, std::unique_ptr<TrackedFile>> by_file_ GUARDED_BY(mu_);
};

FileTable& Table() {
  static FileTable* table = new FileTable();  // leaked: used until exit
  return *table;
}

// Takes the producer's exclusive lock on a file (the client library's
// bounded wait, dyad_producer.h): on a descriptor of our own when we can open
// one, so that the lock lasts exactly as long as some descriptor of the
// application is open, whatever order they close in. A lock not obtained in
// time is reported; the file is still written and published.
int LockFile(int app_fd, const std::string& path) {
  int fd = real_open()(("/proc/self/fd/" + std::to_string(app_fd)).c_str(),
                       O_RDONLY | O_CLOEXEC | O_NOCTTY);
  const int target = fd >= 0 ? fd : app_fd;  // write-only file: lock the app's
  Status st = LockProducerFile(target, LOCK_EX, g_client ? g_client->config().rpc_timeout_ms : -1);
  if (!st.ok()) Report("lock '" + path + "' for writing", st);
  return fd;
}

bool Finish(std::unique_ptr<TrackedFile> file);

// A descriptor number the kernel hands out again was closed by a path we do
// not see (a raw system call, a C library internal): that file's close
// happened, so finish it now rather than never.
void DropStale(int fd) {
  if (auto stale = Table().Remove(fd)) Finish(std::move(stale));
}

void FileTable::Add(int fd, const std::string& path) {
  DropStale(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
  const Key key{st.st_dev, st.st_ino};
  TrackedFile* file = nullptr;
  bool first = false;
  {
    MutexLock lock(mu_);
    auto it = by_file_.find(key);
    if (it == by_file_.end()) {
      auto f = std::make_unique<TrackedFile>();
      f->dev = st.st_dev;
      f->ino = st.st_ino;
      f->path = path;
      f->adopt = g_client != nullptr && !g_client->IsManaged(path, Side::kProducer);
      it = by_file_.emplace(key, std::move(f)).first;
      first = true;
    }
    file = it->second.get();
    ++file->refs;
    if (by_fd_.emplace(fd, file).second) count_.fetch_add(1, std::memory_order_acq_rel);
  }
  if (!first) return;
  // Outside the mutex: flock may wait for a fetch in progress (LOCK_SH).
  const int lock_fd = LockFile(fd, path);
  MutexLock lock(mu_);
  file->lock_fd = lock_fd;
}

bool FileTable::HoldsLockOn(int fd) {
  if (empty()) return false;
  struct stat st;
  if (::fstat(fd, &st) != 0) return false;
  MutexLock lock(mu_);
  auto it = by_file_.find(Key{st.st_dev, st.st_ino});
  return it != by_file_.end() && it->second->lock_fd >= 0 && it->second->lock_fd != fd;
}

bool FileTable::Renamed(dev_t dev, ino_t ino, const std::string* path, bool link) {
  if (empty()) return false;
  // Decided before taking the mutex: IsManaged may look at the file system.
  const bool producer = path != nullptr && g_client->IsManaged(*path, Side::kProducer);
  MutexLock lock(mu_);
  auto it = by_file_.find(Key{dev, ino});
  if (it == by_file_.end() || !it->second->owned) return false;
  TrackedFile& f = *it->second;
  if (link) {
    // Only producer names: a consumer name is adopted through `path` alone.
    if (producer && *path != f.path) f.also.push_back(*path);
  } else if (path == nullptr) {
    f.moved_out = true;
  } else {
    f.path = *path;
    f.moved_out = false;
    f.adopt = !producer;
  }
  return true;
}

void FileTable::AddAlias(int oldfd, int newfd) {
  if (newfd < 0 || empty()) return;
  if (newfd != oldfd) DropStale(newfd);
  MutexLock lock(mu_);
  auto it = by_fd_.find(oldfd);
  if (it == by_fd_.end()) return;
  ++it->second->refs;
  if (by_fd_.emplace(newfd, it->second).second) count_.fetch_add(1, std::memory_order_acq_rel);
}

std::unique_ptr<TrackedFile> FileTable::Remove(int fd) {
  MutexLock lock(mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return nullptr;
  TrackedFile* file = it->second;
  by_fd_.erase(it);
  count_.fetch_sub(1, std::memory_order_acq_rel);
  if (--file->refs > 0) return nullptr;
  auto fit = by_file_.find(Key{file->dev, file->ino});
  std::unique_ptr<TrackedFile> out = std::move(fit->second);
  by_file_.erase(fit);
  return out;
}

std::vector<std::unique_ptr<TrackedFile>> FileTable::RemoveRange(unsigned first, unsigned last) {
  std::vector<int> fds;
  {
    MutexLock lock(mu_);
    for (const auto& [fd, file] : by_fd_)
      if (static_cast<unsigned>(fd) >= first && static_cast<unsigned>(fd) <= last)
        fds.push_back(fd);
  }
  std::vector<std::unique_ptr<TrackedFile>> out;
  for (int fd : fds)
    if (auto f = Remove(fd)) out.push_back(std::move(f));
  return out;
}

std::vector<std::unique_ptr<TrackedFile>> FileTable::TakeAll() {
  MutexLock lock(mu_);
  std::vector<std::unique_ptr<TrackedFile>> out;
  for (auto& [key, f] : by_file_) out.push_back(std::move(f));
  by_file_.clear();
  by_fd_.clear();
  count_.store(0, std::memory_order_release);
  return out;
}

void FileTable::DisownAll() {
  for (auto& [key, f] : by_file_) {
    f->owned = false;
    // Our copy of the lock descriptor only; the parent's keeps the lock.
    if (f->lock_fd >= 0) real_close()(f->lock_fd);
    f->lock_fd = -1;
  }
}

// (The locks are held from one handler to the next: beyond what the
// analysis follows.)
// ---------------------------------------------------------------------------
// Directory streams of consumer directories (ListingOpen): the real entries
// first, then the names published elsewhere that are not here yet.

struct DirStream {
  struct Extra {
    std::string name;
    unsigned char type;  // DT_REG, or DT_DIR for a prefix of deeper paths
    bool shown;          // a real entry by this name was returned
  };
  std::string rel;            // the directory, relative to the consumer directory
  std::string abs;            // and as an absolute name
  std::vector<Extra> extras;  // sorted by name
  std::unordered_map<std::string, size_t> by_name;  // name -> index in extras
  bool real_done = false;                           // the real stream has ended
  size_t next_extra = 0;                            // the next extra to consider
  long position = 0;                                // entries returned since the (re)start: telldir
  struct dirent ent;                                // what readdir returns for an extra
  struct dirent64 ent64;                            // what readdir64 returns for an extra
};

// Streams keyed by DIR*: one lookup per readdir of any stream while a
// consumer-directory stream is open; none at all otherwise. A stream is used
// by one thread at a time (POSIX asks that of readdir on one DIR*), so its
// DirStream is not locked once found; the table is.
class DirTable {
 public:
  void Add(DIR* dir, std::unique_ptr<DirStream> s) {
    MutexLock lock(mu_);
    if (streams_.emplace(dir, std::move(s)).second) count_.fetch_add(1, std::memory_order_release);
  }
  DirStream* Find(DIR* dir) {
    if (count_.load(std::memory_order_acquire) == 0) return nullptr;
    MutexLock lock(mu_);
    auto it = streams_.find(dir);
    return it == streams_.end() ? nullptr : it->second.get();
  }
  std::unique_ptr<DirStream> Remove(DIR* dir) {
    if (count_.load(std::memory_order_acquire) == 0) return nullptr;
    MutexLock lock(mu_);
    auto it = streams_.find(dir);
    if (it == streams_.end()) return nullptr;
    std::unique_ptr<DirStream> s = std::move(it->second);
    streams_.erase(it);
    count_.fetch_sub(1, std::memory_order_release);
    return s;
  }
  void LockForFork() ACQUIRE(mu_) { mu_.lock(); }
  void UnlockAfterFork() RELEASE(mu_) { mu_.unlock(); }

 private:
  Mutex mu_;
  std::atomic<int> count_{0};  // streams_.size()
  std::unordered_map<DIR*, std::unique_ptr<DirStream>> streams_ GUARDED_BY(mu_);
};

DirTable& Dirs() {
  static DirTable* dirs = new DirTable();  // leaked: used until exit
  return *dirs;
}

// The names of the last listing request, for a few seconds: a walk of a
// tree (os.walk, rglob, ImageFolder, find) opens every directory of it, and
// the service answers each listing by reading every record of the
// namespace; so a listing of a directory that a recent one covered (the
// same directory or one below it) is answered from that one, and a look at
// a missing name (LookCommon) learns from it, never from a request of its
// own, whether the name is a directory of published files. Files published
// in the last kListingFreshMs may be missing from a listing.
constexpr uint64_t kListingFreshMs = 5000;

class RecentListing {
 public:
  // The published paths below `prefix` ("" or ending in '/') from a listing
  // younger than kListingFreshMs that covered it; null if none.
  std::shared_ptr<const std::vector<std::string>> Covering(const std::string& prefix) {
    MutexLock lock(mu_);
    if (!paths_ || MonoNs() - at_ns_ > kListingFreshMs * 1000000 ||
        prefix.compare(0, prefix_.size(), prefix_) != 0)
      return nullptr;
    return paths_;
  }
  // Keeps `paths` (sorted) as the listing of `prefix`, made now.
  void Keep(const std::string& prefix, std::shared_ptr<const std::vector<std::string>> paths) {
    MutexLock lock(mu_);
    prefix_ = prefix;
    at_ns_ = MonoNs();
    paths_ = std::move(paths);
  }
  // True when a fresh listing covering `prefix` (ending in '/') holds a path
  // below it.
  bool HoldsBelow(const std::string& prefix) {
    std::shared_ptr<const std::vector<std::string>> paths = Covering(prefix);
    if (!paths) return false;
    auto it = std::lower_bound(paths->begin(), paths->end(), prefix);
    return it != paths->end() && it->compare(0, prefix.size(), prefix) == 0;
  }
  void LockForFork() ACQUIRE(mu_) { mu_.lock(); }
  void UnlockAfterFork() RELEASE(mu_) { mu_.unlock(); }

 private:
  Mutex mu_;
  std::string prefix_ GUARDED_BY(mu_);
  uint64_t at_ns_ GUARDED_BY(mu_) = 0;
  std::shared_ptr<const std::vector<std::string>> paths_ GUARDED_BY(mu_);
};

RecentListing& Listings() {
  static RecentListing* listings = new RecentListing();  // leaked: used until exit
  return *listings;
}

void AtForkPrepare() NO_THREAD_SAFETY_ANALYSIS {
  Table().LockForFork();
  Dirs().LockForFork();
  Listings().LockForFork();
  if (g_wait_notice_ms > 0) Notices().LockForFork();
}
void AtForkParent() NO_THREAD_SAFETY_ANALYSIS {
  if (g_wait_notice_ms > 0) Notices().UnlockAfterFork();
  Listings().UnlockAfterFork();
  Dirs().UnlockAfterFork();
  Table().UnlockAfterFork();
}
void AtForkChild() NO_THREAD_SAFETY_ANALYSIS {
  if (g_wait_notice_ms > 0) Notices().ResetInChild();
  Table().DisownAll();
  Listings().UnlockAfterFork();
  Dirs().UnlockAfterFork();
  Table().UnlockAfterFork();
}

// The last descriptor of a written file is closed: unlock and publish.
// Returns false when publishing failed and the caller should report failure.
bool Finish(std::unique_ptr<TrackedFile> file) {
  if (file == nullptr) return true;
  ReentryGuard guard;  // the client's own opens must not come back here
  bool ok = true;
  if (file->adopt && file->owned && !file->moved_out && g_client != nullptr) {
    // Copied from our descriptor while it still holds LOCK_EX: the bytes
    // this process wrote, whatever happens to the name meanwhile.
    Status st = g_client->Adopt(file->path, file->lock_fd);
    if (!st.ok()) {
      Report("adopt '" + file->path + "'", st);
      ok = !g_fail_on_error;
    }
  }
  if (file->lock_fd >= 0) real_close()(file->lock_fd);  // releases LOCK_EX
  if (!file->owned || g_client == nullptr) return ok;
  // The file's producer names: the one it was opened (or renamed) under
  // unless it was adopted or moved out, and those it was linked to.
  if (!file->adopt && !file->moved_out) file->also.insert(file->also.begin(), file->path);
  for (const std::string& name : file->also) {
    static std::once_flag flush_at_exit;
    std::call_once(flush_at_exit, [] { std::atexit(&FlushAtExit); });
    Status st = g_client->Produce(name);
    if (st.ok()) continue;
    Report("publish '" + name + "'", st);
    ok = ok && !g_fail_on_error;
  }
  return ok;
}

void AtExit() {
  ReentryGuard guard;
  // Files a program leaves open at exit are complete now: publish them
  // (the kernel is about to close the descriptors for us).
  for (auto& f : Table().TakeAll()) Finish(std::move(f));
  FlushPublications();  // those of the files published just now
  g_shutdown.store(true, std::memory_order_release);
}

// Asynchronous publications (DYAD_ASYNC_PUBLISH) still unanswered at exit
// are waited for, bounded, so that a failure among them is reported rather
// than lost with the process (as dyad_finalize does for linked programs).
void FlushPublications() {
  if (g_client == nullptr) return;
  Status st = g_client->FlushPublications();
  if (st.ok()) return;
  const std::string msg = "dyad-preload[" + std::to_string(::getpid()) +
                          "]: asynchronous publication: " + st.ToString() + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, msg.data(), msg.size());
  (void)ignored;
}

// Registered at the first publication, so that it runs before the exit
// handlers the program registered earlier (coreutils close stderr in one).
void FlushAtExit() {
  ReentryGuard guard;
  FlushPublications();
}

// ---------------------------------------------------------------------------
// Path resolution.

bool IsAbsolute(const char* path) { return path[0] == '/'; }

// The name DYAD should see for `path` opened relative to `dirfd`: absolute,
// or (DYAD_PATH_RELATIVE, plain relative name) relative to the managed
// directory as the user meant it. False when it cannot be determined
// (then the call is passed through).
bool NameFor(int dirfd, const char* path, std::string* out) {
  if (IsAbsolute(path)) {
    *out = path;
    return true;
  }
  if (dirfd == AT_FDCWD) {
    if (g_client->config().relative_to_managed_path) {
      *out = path;
      return true;
    }
    char buf[4096];
    if (::getcwd(buf, sizeof(buf)) == nullptr) return false;
    *out = std::string(buf) + "/" + path;
    return true;
  }
  char link[64];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", dirfd);
  char buf[4096];
  const ssize_t n = ::readlink(link, buf, sizeof(buf) - 1);
  if (n <= 0 || buf[0] != '/') return false;
  *out = std::string(buf, static_cast<size_t>(n)) + "/" + path;
  return true;
}

bool WriteFlags(int flags) { return (flags & O_ACCMODE) != O_RDONLY; }

bool WriteMode(const char* mode) {
  if (mode == nullptr) return false;
  for (const char* m = mode; *m != '\0' && *m != ','; ++m)
    if (*m == 'w' || *m == 'a' || *m == '+') return true;
  return false;
}

bool IsDirectory(const std::string& name) {
  struct stat st;
  return ::stat(name.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

// What an open of a managed path needs.
enum class Action { kPass, kConsume, kProduce };

// Decides, without allocating for absolute names outside the managed
// directories, what to do with an open of `path` relative to `dirfd`.
// On kConsume/kProduce, `name` holds the name for the client. With
// `dir_later`, a directory may come back as kConsume: the caller tells it by
// the descriptor it opens (OpenCommon's probe).
Action Classify(int dirfd, const char* path, bool write, bool special, std::string* name,
                bool dir_later = false) {
  if (path == nullptr || path[0] == '\0' || special) return Action::kPass;
  if (g_shutdown.load(std::memory_order_acquire)) return Action::kPass;
  Client* c = GetClient();
  if (c == nullptr) return Action::kPass;
  const Side side = write ? Side::kProducer : Side::kConsumer;
  // A write under the consumer directory makes this node the owner, which
  // takes a producer directory to publish from.
  auto managed = [c, side, write](std::string_view n) {
    return c->IsManaged(n, side) ||
           (write && c->has_producer_path() && c->IsManaged(n, Side::kConsumer));
  };
  if (IsAbsolute(path)) {
    if (!MaybeManaged(path) || !managed(std::string_view(path))) return Action::kPass;
    *name = path;
  } else {
    if (!NameFor(dirfd, path, name) || !managed(*name)) return Action::kPass;
  }
  if (write) return Action::kProduce;
  // A directory is never published; a file this process is writing is
  // already here (reading it back must not wait for its own publication).
  if (Table().WritingPath(*name) || (!dir_later && IsDirectory(*name))) return Action::kPass;
  return Action::kConsume;
}

// A shared flock on a consumer's read descriptor: the service's evictor
// (NodeCache) never removes a copy it cannot lock exclusively, and a
// process of this node writing the file (read-write ownership) holds it
// exclusively until its close, so the reader waits for the whole new
// version (bounded, as the producer's lock; dyad_producer.h). When the
// evictor holds the file this instant, the descriptor still reads the
// complete copy (its name is about to go, its bytes are not).
void HoldCopy(int fd) {
  if (fd < 0) return;
  const int e = errno;
  Status st = LockProducerFile(fd, LOCK_SH, g_client->config().rpc_timeout_ms);
  if (!st.ok()) Report("lock a consumed file for reading", st);
  errno = e;
}

// A write-capable open of a consumer file that keeps its contents: bring
// the current version first. True when that is needed.
bool ConsumeBeforeWrite(const std::string& name, int flags) {
  return (flags & (O_TRUNC | O_CREAT)) == 0 && !g_client->IsManaged(name, Side::kProducer);
}

// Runs the consume for a read-only open. Returns 0 to go on with the real
// open, or an errno to fail it with.
int ConsumeBefore(const std::string& name) {
  Status st;
  if (g_wait_notice_ms > 0) {
    WaitNotices::Token t = Notices().Begin(name);
    st = g_client->Consume(name);
    Notices().End(t);
  } else {
    st = g_client->Consume(name);
  }
  if (st.ok()) return 0;
  Report("consume '" + name + "'", st);
  return g_fail_on_error ? ErrnoFor(st) : 0;
}

// Special opens that never go through DYAD: O_PATH handles, directories,
// unnamed temporary files.
bool SpecialFlags(int flags) {
  return (flags & O_PATH) != 0 || (flags & O_DIRECTORY) != 0 || (flags & O_TMPFILE) == O_TMPFILE;
}

bool NeedsMode(int flags) { return (flags & O_CREAT) != 0 || (flags & O_TMPFILE) == O_TMPFILE; }

// Forgets `fd` before the real close (so that its number cannot be reused
// by another thread's open while the table still names it), runs the close,
// then publishes when it was the file's last descriptor.
template <typename RealCall>
int CloseCommon(int fd, RealCall real) {
  if (Table().empty()) return real();
  ReentryGuard guard;
  if (!guard.outermost()) return real();
  std::unique_ptr<TrackedFile> last = Table().Remove(fd);
  const int rc = real();
  if (last == nullptr) return rc;
  const int e = errno;
  const bool ok = Finish(std::move(last));
  if (rc == 0 && !ok) {
    errno = EIO;  // the descriptor is closed; the publication failed
    return -1;
  }
  errno = e;
  return rc;
}

// True when a descriptor of this process other than `except` holds an
// flock (or POSIX lock) on the file `file` describes: a read descriptor of a
// consumed copy carries LOCK_SH (HoldCopy), and the program may lock files
// itself. /proc/self/fdinfo/N lists the locks held through descriptor N.
// Only asked when the producer's LOCK_EX is refused, so its cost (a scan of
// the descriptors) is paid only then.
bool LockedHere(const struct stat& file, int except) {
  DIR* dir = ::opendir("/proc/self/fdinfo");
  if (dir == nullptr) return false;
  bool found = false;
  while (!found) {
    const struct dirent* ent = ::readdir(dir);
    if (ent == nullptr) break;
    char* end = nullptr;
    const long n = std::strtol(ent->d_name, &end, 10);
    if (end == ent->d_name || *end != '\0' || n == except || n == ::dirfd(dir)) continue;
    struct stat st;
    if (::fstat(static_cast<int>(n), &st) != 0 || st.st_dev != file.st_dev ||
        st.st_ino != file.st_ino)
      continue;
    const std::string info = "/proc/self/fdinfo/" + std::string(ent->d_name);
    const int fd = real_open()(info.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char buf[4096];
    const ssize_t got = ::read(fd, buf, sizeof(buf) - 1);
    real_close()(fd);
    if (got > 0) {
      buf[got] = '\0';
      found = std::strstr(buf, "\nlock:") != nullptr;
    }
  }
  ::closedir(dir);
  return found;
}

// rename/link family: the kernel has just given a file the name `path`
// (relative to `dirfd`, as the caller named it). Under the producer
// directory (or the consumer directory, adopted, as a write-capable open
// there is) a regular file is published now, under the producer's LOCK_EX
// (its writer in another process may not be done: wait for it, bounded, as
// LockFile does); a file this process still writes takes the name instead
// and is published at its last close. A name outside moves a file this
// process writes out of DYAD's hands. Returns false when the publication
// failed and the call should report failure.
bool PublishNewName(int dirfd, const char* path, bool link) {
  std::string name;
  if (Classify(dirfd, path, /*write=*/true, false, &name) != Action::kProduce) {
    struct stat st;
    if (!link && !Table().empty() && ::fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) == 0)
      Table().Renamed(st.st_dev, st.st_ino, nullptr, false);
    return true;
  }
  // Opened as the caller named it; never a symlink, never blocking on a
  // FIFO. A file we may not read is locked through a write-only descriptor.
  constexpr int kFlags = O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;
  int fd = real_openat()(dirfd, path, O_RDONLY | kFlags);
  if (fd < 0 && errno == EACCES) fd = real_openat()(dirfd, path, O_WRONLY | kFlags);
  struct stat st;
  if (fd < 0) {
    // A symlink, a directory we cannot open for writing, a name already
    // gone again: nothing to publish. Anything else is a failure.
    const int err = errno;
    if (err == ELOOP || err == ENOENT || err == EISDIR || err == ENXIO ||
        (::fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISREG(st.st_mode)))
      return true;
    Report("publish '" + name + "'", StatusFromErrno(err, "open it to lock it"));
    return !g_fail_on_error;
  }
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      Table().Renamed(st.st_dev, st.st_ino, &name, link)) {
    real_close()(fd);
    return true;
  }
  // A lock this process holds itself (it reads the file, or locked it)
  // cannot be waited for, and excludes any writer's LOCK_EX: publish.
  Status locked;
  if (real_flock()(fd, LOCK_EX | LOCK_NB) != 0 && !(errno == EWOULDBLOCK && LockedHere(st, fd)))
    locked = LockProducerFile(fd, LOCK_EX, g_client->config().rpc_timeout_ms);
  if (!locked.ok()) {
    real_close()(fd);
    Report("publish '" + name + "'", locked.Annotate("lock it"));
    return !g_fail_on_error;
  }
  auto file = std::make_unique<TrackedFile>();
  file->dev = st.st_dev;
  file->ino = st.st_ino;
  file->path = name;
  file->lock_fd = fd;
  file->refs = 0;
  file->adopt = !g_client->IsManaged(name, Side::kProducer);
  return Finish(std::move(file));
}

// The common body of the rename and link family. `real()` performs the call;
// only a successful one is looked at (a failed one returns exactly its
// errno). The new name is `newdirfd`/`newpath`; with RENAME_EXCHANGE the old
// name has a new file too. A failed publication fails the call with EIO
// (the rename has happened), as close does, unless DYAD_PRELOAD_ON_ERROR=pass.
template <typename RealCall>
int RenameCommon(int olddirfd, const char* oldpath, int newdirfd, const char* newpath,
                 bool exchange, bool link, RealCall real) {
  ReentryGuard guard;
  if (!guard.outermost()) return real();
  const int rc = real();
  if (rc != 0 || g_shutdown.load(std::memory_order_acquire)) return rc;
  const int e = errno;
  bool ok = PublishNewName(newdirfd, newpath, link);
  if (exchange) ok = PublishNewName(olddirfd, oldpath, false) && ok;
  if (!ok) {
    errno = EIO;
    return -1;
  }
  errno = e;
  return rc;
}

// mkdir -p of `abs` (a directory under the consumer directory), mode 0755.
void MakeDirectories(const std::string& abs) {
  for (size_t slash = abs.find('/', 1);; slash = abs.find('/', slash + 1)) {
    const std::string part = abs.substr(0, slash);
    if (::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) return;
    if (slash == std::string::npos) return;
  }
}

// `name` as NameFor gives it (absolute, or with DYAD_PATH_RELATIVE relative
// to the managed directory) as the consumer directory sees it: `abs` its
// normalized absolute name, `rel` its name below the consumer directory
// ("" for the directory itself), each made once. False when it is not the
// consumer directory or below it.
bool ConsumerNames(const std::string& name, std::string* abs, std::string* rel) {
  const ManagedPath& cons = g_client->consumer_path();
  if (name.empty()) return false;
  if (name[0] == '/') {
    *abs = NormalizeAbsolute(name);
    std::optional<std::string> r = cons.Match(*abs);
    if (!r) return false;
    *rel = std::move(*r);
    return true;
  }
  // Relative to the managed directory, as the client takes such names
  // (no ".." component); "." and the like name the directory itself.
  Result<std::string> below = ValidateUpath(name);
  if (below.ok()) {
    *rel = std::move(*below);
    *abs = cons.given() + "/" + *rel;
    return true;
  }
  if (name.find_first_not_of("./") != std::string::npos || name.find("..") != std::string::npos)
    return false;
  rel->clear();
  *abs = cons.given();
  return true;
}

// A name the look calls found missing: when files are published below it
// (and DYAD_PRELOAD_LIST is on), it is made here as a directory, mkdir -p,
// and true is returned. One List request (at most one name back).
bool MadePublishedDirectory(const std::string& name) {
  if (!g_list || !g_client->has_consumer_path()) return false;
  std::string abs, rel;
  if (!ConsumerNames(name, &abs, &rel) || rel.empty() || !Listings().HoldsBelow(rel + "/"))
    return false;
  MakeDirectories(abs);
  return true;
}

// stat family: a file published elsewhere but not brought here yet is
// missing to the file system, so a program that looks before it opens
// (cp, rsync, `test -f`, Python's os.path.exists or getsize) would be told
// it does not exist. When the real call says ENOENT for a name under the
// consumer directory, a file that is already published is brought here
// (a consume that does not wait for a publication) and the call is made
// again; a directory that a recent listing shows to hold published files
// is made here (MadePublishedDirectory, RecentListing: never a listing
// request of its own); a name nobody published stays ENOENT at the cost of
// one request.
// A published file that cannot be brought fails as a managed open does
// (DYAD_PRELOAD_ON_ERROR).
template <typename RealCall>
int LookCommon(int dirfd, const char* path, RealCall real) {
  ReentryGuard guard;
  const int entry_errno = errno;
  const int rc = real();
  if (rc == 0 || errno != ENOENT || !guard.outermost() || path == nullptr) return rc;
  std::string name;
  if (Classify(dirfd, path, /*write=*/false, false, &name) != Action::kConsume) {
    errno = ENOENT;
    return rc;
  }
  std::vector<Status> results;
  Status st = g_client->ConsumeBatch({name}, &results, 0);
  if (st.ok() && results.size() == 1) st = results[0];
  if (st.ok()) {
    errno = entry_errno;  // a call that succeeds leaves errno as it was
    return real();
  }
  if (st.code() == DYAD_RC_TIMEOUT || st.code() == DYAD_RC_NOTFOUND) {
    // Not a published file: a directory holding published files is made
    // here (as a listing's opendir makes it), so `ls dir` and os.walk go in.
    if (MadePublishedDirectory(name)) {
      errno = entry_errno;
      return real();
    }
  } else {
    Report("bring '" + name + "' here for a look at it", st);
    if (g_fail_on_error) {
      errno = ErrnoFor(st);
      return -1;
    }
  }
  errno = ENOENT;
  return rc;
}

// Directory listings (opendir ... closedir): a program that finds its data
// by listing a consumer directory (ls, find, os.listdir, os.scandir, glob,
// ImageFolder) would see only the files already here. A stream of the
// consumer directory or a directory below it returns the real entries,
// then one entry per name published in that directory that the real
// entries did not show: DT_REG for a file, DT_DIR for a directory that
// holds published files deeper down. The names come from one List request
// per opendir or rewinddir; a failed request leaves the real entries only
// (reported once). Opening or looking at such a name brings the file here
// as any consumer name. Only with DYAD_PRELOAD_LIST=1: a look at each
// listed name (ls -l, a colouring ls, du) would bring every file here.

// The consumer directory or a directory below it that `path` names (relative
// names against the working directory, as opendir takes them): `abs` its
// normalized absolute name, `rel` its name relative to the consumer
// directory ("" for the directory itself). False for any other directory,
// after a prefix comparison for absolute names outside.
bool ListedDirectory(const char* path, std::string* abs, std::string* rel) {
  if (path == nullptr || path[0] == '\0') return false;
  if (g_shutdown.load(std::memory_order_acquire)) return false;
  Client* c = GetClient();
  if (c == nullptr || !g_list || !c->has_consumer_path()) return false;
  if (IsAbsolute(path) && !MaybeManaged(path)) return false;
  // Relative names as every other call takes them (NameFor: against the
  // working directory, or the managed directory with DYAD_PATH_RELATIVE).
  std::string name;
  return NameFor(AT_FDCWD, path, &name) && ConsumerNames(name, abs, rel);
}

// Asks the service for the names published in the directory `rel` and
// makes them the stream's extras. False when the request failed.
bool ListPublished(const std::string& rel, const std::string& abs, DirStream* s) {
  s->extras.clear();
  s->by_name.clear();
  const std::string prefix = rel.empty() ? std::string() : rel + "/";
  std::shared_ptr<const std::vector<std::string>> paths = Listings().Covering(prefix);
  if (!paths) {
    Result<std::vector<std::pair<std::string, FileRecord>>> listed = g_client->List(prefix, 0);
    if (!listed.ok()) {
      Report("list the files published in '" + abs + "'", listed.status(),
             " (the listing shows the files here only)");
      return false;
    }
    std::vector<std::string> upaths;
    upaths.reserve(listed->size());
    for (auto& entry : *listed) upaths.push_back(std::move(entry.second.upath));
    std::sort(upaths.begin(), upaths.end());
    paths = std::make_shared<const std::vector<std::string>>(std::move(upaths));
    Listings().Keep(prefix, paths);
  }
  std::map<std::string, unsigned char> names;
  for (auto it = std::lower_bound(paths->begin(), paths->end(), prefix); it != paths->end(); ++it) {
    const std::string& upath = *it;
    if (upath.compare(0, prefix.size(), prefix) != 0) break;
    if (upath.size() <= prefix.size()) continue;
    const size_t slash = upath.find('/', prefix.size());
    std::string name = upath.substr(
        prefix.size(), slash == std::string::npos ? std::string::npos : slash - prefix.size());
    if (name.empty() || name == "." || name == ".." || name.size() > NAME_MAX) continue;
    names.emplace(std::move(name), slash == std::string::npos ? DT_REG : DT_DIR);
  }
  s->extras.reserve(names.size());
  for (auto& [name, type] : names) {
    s->by_name.emplace(name, s->extras.size());
    s->extras.push_back({name, type, false});
  }
  return true;
}

// The stream starts over: real entries first, no extra shown yet.
void Restart(DirStream* s) {
  s->real_done = false;
  s->next_extra = 0;
  s->position = 0;
  for (DirStream::Extra& e : s->extras) e.shown = false;
}

// The body of opendir/fdopendir: `real()` opens the stream; `path` names
// the directory (nullptr: `fd` does, fdopendir).
template <typename RealCall>
DIR* ListingOpen(const char* path, int fd, RealCall real) {
  ReentryGuard guard;
  if (!guard.outermost()) return real();
  DIR* dir = real();
  if (dir == nullptr && (path == nullptr || errno != ENOENT)) return dir;
  const int real_errno = errno;
  std::string abs, rel;
  bool listed;
  if (path != nullptr) {
    listed = ListedDirectory(path, &abs, &rel);
  } else {
    std::string name;
    listed = GetClient() != nullptr && g_list && g_client->has_consumer_path() &&
             NameFor(fd, ".", &name) && ListedDirectory(name.c_str(), &abs, &rel);
  }
  if (!listed) {
    errno = real_errno;
    return dir;
  }
  auto s = std::make_unique<DirStream>();
  s->rel = rel;
  s->abs = abs;
  const bool ok = ListPublished(rel, abs, s.get());
  if (dir == nullptr) {
    // Not here: a directory that only holds files published elsewhere is
    // made here, as bringing one of its files would.
    if (!ok || s->extras.empty()) {
      errno = real_errno;
      return nullptr;
    }
    MakeDirectories(abs);
    dir = real();
    if (dir == nullptr) return nullptr;
  }
  Dirs().Add(dir, std::move(s));
  errno = real_errno;
  return dir;
}

// readdir/readdir64: the real entries, then the extras no real entry showed.
template <typename Ent, typename RealCall>
Ent* ListingRead(DIR* dir, Ent DirStream::*slot, RealCall real) {
  DirStream* s = Dirs().Find(dir);
  if (s == nullptr) return real();
  const int e = errno;
  if (!s->real_done) {
    errno = 0;
    Ent* ent = real();
    if (ent != nullptr) {
      if (!s->by_name.empty()) {
        auto it = s->by_name.find(ent->d_name);
        if (it != s->by_name.end()) s->extras[it->second].shown = true;
      }
      ent->d_off = ++s->position;  // telldir's value after this entry
      errno = e;
      return ent;
    }
    if (errno != 0) return nullptr;  // a real error ends the stream as it is
    s->real_done = true;
  }
  errno = e;
  while (s->next_extra < s->extras.size() && s->extras[s->next_extra].shown) ++s->next_extra;
  if (s->next_extra == s->extras.size()) return nullptr;
  const DirStream::Extra& x = s->extras[s->next_extra++];
  Ent& ent = s->*slot;
  std::memset(&ent, 0, sizeof(ent));
  // Nonzero (programs skip d_ino 0), stable for a name.
  ent.d_ino = static_cast<decltype(ent.d_ino)>(std::hash<std::string>()(s->rel + "/" + x.name)) | 1;
  ent.d_off = ++s->position;
  ent.d_reclen = sizeof(ent);
  ent.d_type = x.type;
  std::memcpy(ent.d_name, x.name.c_str(), x.name.size() + 1);
  return &ent;
}

// seekdir to a telldir value of a listed stream: start over and skip that
// many entries (the extras listed at opendir stay).
void ListingSeek(DIR* dir, DirStream* s, long pos) {
  real_rewinddir()(dir);
  Restart(s);
  const int e = errno;
  while (s->position < pos &&
         ListingRead(dir, &DirStream::ent64, [dir] { return real_readdir64()(dir); }) != nullptr) {
  }
  errno = e;
}

// A read-only open of a consumer file first opens the file as asked, and
// the client checks that descriptor (ConsumeOpened): a complete copy (level
// 1) then costs the open the caller wanted plus an fstat (and the copy's
// stamp, the first time: StampMemo), or nothing more in a consumer
// directory private to consumers; no second path lookup, and the copy
// checked is the very file returned. The probe opens with the caller's own
// flags, so the descriptor needs no change afterwards: a FIFO or a device
// there blocks (or not) exactly as without DYAD, and is passed through
// (DYAD publishes regular files only). Opens that could create or truncate
// never probe.
enum class Probe { kComplete, kPassThrough, kAsk };
constexpr int kProbeExcluded = O_CREAT | O_TRUNC | O_EXCL;

template <typename RealCall>
Probe ProbeOpen(int flags, RealCall real, int* fd) {
  *fd = real(flags);
  if (*fd < 0) return Probe::kAsk;
  // A consumer directory no producer writes to: what is there is complete
  // (or no regular file), without a look at it.
  if (g_client->ConsumeOpenedInPrivateDirectory()) return Probe::kComplete;
  struct stat st;
  Probe p = Probe::kAsk;
  if (::fstat(*fd, &st) == 0)
    p = !S_ISREG(st.st_mode)               ? Probe::kPassThrough
        : g_client->ConsumeOpened(*fd, st) ? Probe::kComplete
                                           : Probe::kAsk;
  if (p == Probe::kAsk) {
    real_close()(*fd);
    *fd = -1;
  }
  return p;
}

// A producer about to truncate a copy a service placed here (it carries the
// version stamp) gets a new file at that name instead of the copy's bytes
// cut short: readers of a copy complete here hold no lock (docs/preload.md,
// "Copies already here"), so truncating it in place would show a reader
// that opened it before a torn file. The new file is made beside it under a
// temporary name, with the copy's permission bits, and renamed over it (the
// name never goes missing); a reader of the old copy reads it to its end.
// Returns the new descriptor (the copy's is closed), or `fd` as it is when
// the file is no placed copy or anything fails (the caller then truncates
// in place, as before).
int ReplacePlacedCopy(int dirfd, const char* path, int fd, int flags) {
  // The caller's open succeeded: what it sees of errno is left as it was.
  const int entry_errno = errno;
  auto done = [entry_errno](int result) {
    errno = entry_errno;
    return result;
  };
  if (::fgetxattr(fd, kVersionXattr, nullptr, 0) < 0) return done(fd);  // not a placed copy
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_nlink != 1) return done(fd);
  const std::string_view whole(path);
  const size_t slash = whole.rfind('/');
  const std::string dir(slash == std::string_view::npos ? "" : whole.substr(0, slash + 1));
  const std::string leaf(slash == std::string_view::npos ? whole : whole.substr(slash + 1));
  static std::atomic<unsigned> serial{0};
  const int made = (flags & ~(O_TRUNC | O_DIRECTORY)) | O_CREAT | O_EXCL | O_NOFOLLOW;
  const mode_t mode = st.st_mode & 07777;
  for (int attempt = 0; attempt < 4; ++attempt) {
    const std::string temp = dir + "." + leaf + ".dyad-rewrite." + std::to_string(::getpid()) +
                             "." + std::to_string(serial.fetch_add(1));
    const int nfd = real_openat()(dirfd, temp.c_str(), made, mode);
    if (nfd < 0 && errno == EEXIST) continue;
    if (nfd < 0) return done(fd);
    if (::fchmod(nfd, mode) != 0 || real_renameat()(dirfd, temp.c_str(), dirfd, path) != 0) {
      ::unlinkat(dirfd, temp.c_str(), 0);
      real_close()(nfd);
      return done(fd);
    }
    real_close()(fd);
    return done(nfd);
  }
  return done(fd);
}

// The common body of every descriptor-returning open. `real(flags)` performs
// the real call (it captures the function, dirfd and mode); the flags may
// differ from the caller's by O_TRUNC (see late_truncate).
template <typename RealCall>
int OpenCommon(int dirfd, const char* path, int flags, RealCall real) {
  ReentryGuard guard;
  if (!guard.outermost()) return real(flags);
  const int entry_errno = errno;  // our checks must not change what the caller sees
  std::string name;
  const bool probe = !WriteFlags(flags) && (flags & kProbeExcluded) == 0;
  Action action = Classify(dirfd, path, WriteFlags(flags), SpecialFlags(flags), &name, probe);
  if (action == Action::kConsume && probe) {
    int fd = -1;
    const Probe p = ProbeOpen(flags, real, &fd);
    if (p != Probe::kAsk) {
      // A copy complete here is read without the shared lock (HoldCopy):
      // see docs/preload.md, "Copies already here".
      errno = entry_errno;
      return fd;
    }
    if (IsDirectory(name)) action = Action::kPass;  // the probe could not open it
  }
  if (action == Action::kConsume ||
      (action == Action::kProduce && ConsumeBeforeWrite(name, flags))) {
    if (int err = ConsumeBefore(name); err != 0) {
      errno = err;
      return -1;
    }
  }
  // A producer truncates only once it holds the lock: the service may be
  // sending the previous version of the file (under LOCK_SH) right now.
  const bool late_truncate = action == Action::kProduce && (flags & O_TRUNC) != 0;
  errno = entry_errno;
  int fd = real(late_truncate ? flags & ~O_TRUNC : flags);
  if (fd >= 0 && late_truncate) fd = ReplacePlacedCopy(dirfd, path, fd, flags);
  if (action == Action::kConsume) HoldCopy(fd);
  if (fd >= 0 && action == Action::kProduce) {
    const int e = errno;
    Table().Add(fd, name);
    if (late_truncate && ::ftruncate(fd, 0) != 0 && errno != EINVAL) {
      const int te = errno;  // the open fails as a truncating open would have
      std::unique_ptr<TrackedFile> last = Table().Remove(fd);
      real_close()(fd);
      if (last != nullptr && last->lock_fd >= 0) real_close()(last->lock_fd);
      errno = te;
      return -1;
    }
    errno = e;
  }
  return fd;
}

// fopen(path, "w...") of a managed file: the C library would truncate
// inside fopen, before we could take the lock, so do what fopen does in
// steps: open without O_TRUNC, lock, truncate, then wrap the descriptor
// (fdopen never truncates). Modes with ",ccs=" go to the real fopen.
FILE* FopenTruncateLocked(const char* path, const char* mode, const std::string& name) {
  int flags = O_CREAT;
  bool plus = false;
  for (const char* m = mode + 1; *m != '\0'; ++m) {
    if (*m == '+') plus = true;
    if (*m == 'x') flags |= O_EXCL;
    if (*m == 'e') flags |= O_CLOEXEC;
  }
  flags |= plus ? O_RDWR : O_WRONLY;
  int fd = real_open()(path, flags, 0666);
  if (fd < 0) return nullptr;
  fd = ReplacePlacedCopy(AT_FDCWD, path, fd, flags);
  Table().Add(fd, name);
  int err = 0;
  if (::ftruncate(fd, 0) != 0 && errno != EINVAL) err = errno;
  FILE* fp = err == 0 ? ::fdopen(fd, plus ? "w+" : "w") : nullptr;
  if (fp == nullptr) {
    if (err == 0) err = errno;
    std::unique_ptr<TrackedFile> last = Table().Remove(fd);
    real_close()(fd);
    if (last != nullptr && last->lock_fd >= 0) real_close()(last->lock_fd);
    errno = err;
    return nullptr;
  }
  return fp;
}

template <typename RealCall>
FILE* FopenCommon(const char* path, const char* mode, RealCall real) {
  ReentryGuard guard;
  if (!guard.outermost()) return real();
  const int entry_errno = errno;
  std::string name;
  const Action action = Classify(AT_FDCWD, path, WriteMode(mode), false, &name);
  if (action == Action::kConsume ||
      (action == Action::kProduce && mode[0] == 'r' && ConsumeBeforeWrite(name, 0))) {
    if (int err = ConsumeBefore(name); err != 0) {
      errno = err;
      return nullptr;
    }
  }
  errno = entry_errno;
  if (action == Action::kProduce && mode[0] == 'w' && std::strchr(mode, ',') == nullptr)
    return FopenTruncateLocked(path, mode, name);
  FILE* fp = real();
  if (fp != nullptr && action == Action::kConsume) HoldCopy(::fileno(fp));
  if (fp != nullptr && action == Action::kProduce) {
    const int e = errno;
    Table().Add(::fileno(fp), name);
    errno = e;
  }
  return fp;
}

int ModeArg(int flags, va_list ap) { return NeedsMode(flags) ? va_arg(ap, int) : 0; }

}  // namespace
}  // namespace preload
}  // namespace dyad

using dyad::preload::CloseCommon;
using dyad::preload::FopenCommon;
using dyad::preload::OpenCommon;
namespace dp = dyad::preload;

// ---------------------------------------------------------------------------
// The interposed C library functions.

extern "C" {

__attribute__((visibility("default"))) int open(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = static_cast<mode_t>(dp::ModeArg(flags, ap));
  va_end(ap);
  return OpenCommon(AT_FDCWD, path, flags, [&](int f) { return dp::real_open()(path, f, mode); });
}

__attribute__((visibility("default"))) int open64(const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = static_cast<mode_t>(dp::ModeArg(flags, ap));
  va_end(ap);
  return OpenCommon(AT_FDCWD, path, flags, [&](int f) { return dp::real_open64()(path, f, mode); });
}

__attribute__((visibility("default"))) int openat(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = static_cast<mode_t>(dp::ModeArg(flags, ap));
  va_end(ap);
  return OpenCommon(dirfd, path, flags,
                    [&](int f) { return dp::real_openat()(dirfd, path, f, mode); });
}

__attribute__((visibility("default"))) int openat64(int dirfd, const char* path, int flags, ...) {
  va_list ap;
  va_start(ap, flags);
  const mode_t mode = static_cast<mode_t>(dp::ModeArg(flags, ap));
  va_end(ap);
  return OpenCommon(dirfd, path, flags,
                    [&](int f) { return dp::real_openat64()(dirfd, path, f, mode); });
}

__attribute__((visibility("default"))) int __open_2(const char* path, int flags) {
  return OpenCommon(AT_FDCWD, path, flags, [&](int f) { return dp::real___open_2()(path, f); });
}

__attribute__((visibility("default"))) int __open64_2(const char* path, int flags) {
  return OpenCommon(AT_FDCWD, path, flags, [&](int f) { return dp::real___open64_2()(path, f); });
}

__attribute__((visibility("default"))) int __openat_2(int dirfd, const char* path, int flags) {
  return OpenCommon(dirfd, path, flags,
                    [&](int f) { return dp::real___openat_2()(dirfd, path, f); });
}

__attribute__((visibility("default"))) int __openat64_2(int dirfd, const char* path, int flags) {
  return OpenCommon(dirfd, path, flags,
                    [&](int f) { return dp::real___openat64_2()(dirfd, path, f); });
}

__attribute__((visibility("default"))) int creat(const char* path, mode_t mode) {
  return OpenCommon(AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC,
                    [&](int f) { return dp::real_open()(path, f, mode); });
}

__attribute__((visibility("default"))) int creat64(const char* path, mode_t mode) {
  return OpenCommon(AT_FDCWD, path, O_WRONLY | O_CREAT | O_TRUNC,
                    [&](int f) { return dp::real_open64()(path, f, mode); });
}

__attribute__((visibility("default"))) FILE* fopen(const char* path, const char* mode) {
  return FopenCommon(path, mode, [&] { return dp::real_fopen()(path, mode); });
}

__attribute__((visibility("default"))) FILE* fopen64(const char* path, const char* mode) {
  return FopenCommon(path, mode, [&] { return dp::real_fopen64()(path, mode); });
}

// freopen closes the stream's descriptor (possibly the file's last) and
// opens `path` in its place.
static FILE* FreopenCommon(const char* path, const char* mode, FILE* stream, bool is64) {
  auto real = [&] {
    return is64 ? dp::real_freopen64()(path, mode, stream) : dp::real_freopen()(path, mode, stream);
  };
  if (stream == nullptr || path == nullptr) return real();  // mode change only
  dp::ReentryGuard guard;
  if (!guard.outermost()) return real();
  const int old_fd = ::fileno(stream);
  std::unique_ptr<dp::TrackedFile> last;
  if (old_fd >= 0 && !dp::Table().empty()) last = dp::Table().Remove(old_fd);
  const int entry_errno = errno;
  std::string name;
  const dp::Action action = dp::Classify(AT_FDCWD, path, dp::WriteMode(mode), false, &name);
  if (action == dp::Action::kConsume) {
    if (int err = dp::ConsumeBefore(name); err != 0) {
      dp::real_fclose()(stream);  // freopen closes the stream on failure too
      dp::Finish(std::move(last));
      errno = err;
      return nullptr;
    }
  }
  errno = entry_errno;
  FILE* fp = real();
  const int e = errno;
  dp::Finish(std::move(last));
  if (fp != nullptr && action == dp::Action::kProduce) dp::Table().Add(::fileno(fp), name);
  errno = e;
  return fp;
}

__attribute__((visibility("default"))) FILE* freopen(const char* path, const char* mode,
                                                     FILE* stream) {
  return FreopenCommon(path, mode, stream, false);
}

__attribute__((visibility("default"))) FILE* freopen64(const char* path, const char* mode,
                                                       FILE* stream) {
  return FreopenCommon(path, mode, stream, true);
}

__attribute__((visibility("default"))) int close(int fd) {
  return CloseCommon(fd, [&] { return dp::real_close()(fd); });
}

// Directory streams (ListingOpen): a consumer directory lists the files
// published elsewhere too.
__attribute__((visibility("default"))) DIR* opendir(const char* path) {
  return dp::ListingOpen(path, -1, [&] { return dp::real_opendir()(path); });
}
__attribute__((visibility("default"))) DIR* fdopendir(int fd) {
  return dp::ListingOpen(nullptr, fd, [&] { return dp::real_fdopendir()(fd); });
}
__attribute__((visibility("default"))) struct dirent* readdir(DIR* dir) {
  return dp::ListingRead(dir, &dp::DirStream::ent, [&] { return dp::real_readdir()(dir); });
}
__attribute__((visibility("default"))) struct dirent64* readdir64(DIR* dir) {
  return dp::ListingRead(dir, &dp::DirStream::ent64, [&] { return dp::real_readdir64()(dir); });
}
__attribute__((visibility("default"))) void rewinddir(DIR* dir) {
  dp::DirStream* s = dp::Dirs().Find(dir);
  dp::real_rewinddir()(dir);
  if (s == nullptr) return;
  dp::Restart(s);
  dp::ReentryGuard guard;
  const int e = errno;
  if (guard.outermost()) dp::ListPublished(s->rel, s->abs, s);
  errno = e;
}
__attribute__((visibility("default"))) long telldir(DIR* dir) {
  dp::DirStream* s = dp::Dirs().Find(dir);
  return s == nullptr ? dp::real_telldir()(dir) : s->position;
}
__attribute__((visibility("default"))) void seekdir(DIR* dir, long pos) {
  dp::DirStream* s = dp::Dirs().Find(dir);
  if (s == nullptr) return dp::real_seekdir()(dir, pos);
  dp::ListingSeek(dir, s, pos);
}
__attribute__((visibility("default"))) int closedir(DIR* dir) {
  std::unique_ptr<dp::DirStream> s = dp::Dirs().Remove(dir);
  return dp::real_closedir()(dir);
}

// stat family (LookCommon): a published file not here yet is brought
// here when a program looks at its name.
__attribute__((visibility("default"))) int stat(const char* path, struct stat* buf) {
  return dp::LookCommon(AT_FDCWD, path, [&] { return dp::real_stat()(path, buf); });
}
__attribute__((visibility("default"))) int stat64(const char* path, struct stat64* buf) {
  return dp::LookCommon(AT_FDCWD, path, [&] { return dp::real_stat64()(path, buf); });
}
__attribute__((visibility("default"))) int lstat(const char* path, struct stat* buf) {
  return dp::LookCommon(AT_FDCWD, path, [&] { return dp::real_lstat()(path, buf); });
}
__attribute__((visibility("default"))) int lstat64(const char* path, struct stat64* buf) {
  return dp::LookCommon(AT_FDCWD, path, [&] { return dp::real_lstat64()(path, buf); });
}
__attribute__((visibility("default"))) int fstatat(int dirfd, const char* path, struct stat* buf,
                                                   int flags) {
  return dp::LookCommon(dirfd, path, [&] { return dp::real_fstatat()(dirfd, path, buf, flags); });
}
__attribute__((visibility("default"))) int fstatat64(int dirfd, const char* path,
                                                     struct stat64* buf, int flags) {
  return dp::LookCommon(dirfd, path, [&] { return dp::real_fstatat64()(dirfd, path, buf, flags); });
}
__attribute__((visibility("default"))) int statx(int dirfd, const char* path, int flags,
                                                 unsigned mask, struct statx* buf) {
  return dp::LookCommon(dirfd, path,
                        [&] { return dp::real_statx()(dirfd, path, flags, mask, buf); });
}
// The same looks as called by programs built against glibc < 2.33
// (__xstat and relatives, bound to their original symbol versions); `ver`
// goes to the real function unchanged.
__attribute__((visibility("default"))) int __xstat(int ver, const char* path, struct stat* buf) {
  return dp::LookCommon(AT_FDCWD, path,
                        [&] { return dp::CallCompat(dp::real___xstat(), ver, path, buf); });
}
__attribute__((visibility("default"))) int __xstat64(int ver, const char* path,
                                                     struct stat64* buf) {
  return dp::LookCommon(AT_FDCWD, path,
                        [&] { return dp::CallCompat(dp::real___xstat64(), ver, path, buf); });
}
__attribute__((visibility("default"))) int __lxstat(int ver, const char* path, struct stat* buf) {
  return dp::LookCommon(AT_FDCWD, path,
                        [&] { return dp::CallCompat(dp::real___lxstat(), ver, path, buf); });
}
__attribute__((visibility("default"))) int __lxstat64(int ver, const char* path,
                                                      struct stat64* buf) {
  return dp::LookCommon(AT_FDCWD, path,
                        [&] { return dp::CallCompat(dp::real___lxstat64(), ver, path, buf); });
}
__attribute__((visibility("default"))) int __fxstatat(int ver, int dirfd, const char* path,
                                                      struct stat* buf, int flags) {
  return dp::LookCommon(dirfd, path, [&] {
    return dp::CallCompat(dp::real___fxstatat(), ver, dirfd, path, buf, flags);
  });
}
__attribute__((visibility("default"))) int __fxstatat64(int ver, int dirfd, const char* path,
                                                        struct stat64* buf, int flags) {
  return dp::LookCommon(dirfd, path, [&] {
    return dp::CallCompat(dp::real___fxstatat64(), ver, dirfd, path, buf, flags);
  });
}
__attribute__((visibility("default"))) int access(const char* path, int mode) {
  return dp::LookCommon(AT_FDCWD, path, [&] { return dp::real_access()(path, mode); });
}
__attribute__((visibility("default"))) int faccessat(int dirfd, const char* path, int mode,
                                                     int flags) {
  return dp::LookCommon(dirfd, path,
                        [&] { return dp::real_faccessat()(dirfd, path, mode, flags); });
}

// flock: the producer's exclusive lock on a file this process writes is
// held on a descriptor of our own (LockFile), so a lock the program asks
// for on the same file (DYAD's C++ streams and dyad_producer_lock take it
// themselves) would wait for this very process until its bound, once per
// file. The process holds the file exclusively already: such a request is
// granted at once, and its unlock leaves our lock to the file's last close.
__attribute__((visibility("default"))) int flock(int fd, int op) {
  dp::ReentryGuard guard;
  if (guard.outermost()) {
    const int e = errno;
    if (dp::Table().HoldsLockOn(fd)) return 0;
    errno = e;
  }
  return dp::real_flock()(fd, op);
}

// glibc's fclose closes the descriptor internally (not through close()).
__attribute__((visibility("default"))) int fclose(FILE* stream) {
  if (stream == nullptr || dp::Table().empty()) return dp::real_fclose()(stream);
  const int fd = ::fileno(stream);
  return CloseCommon(fd, [&] { return dp::real_fclose()(stream); });
}

// dup family: a duplicate keeps the file open (dd writes through a dup2'ed
// standard output), and dup2/dup3 onto a tracked descriptor closes it.
__attribute__((visibility("default"))) int dup(int oldfd) {
  const int fd = dp::real_dup()(oldfd);
  if (fd >= 0 && !dp::Table().empty()) {
    const int e = errno;
    dp::Table().AddAlias(oldfd, fd);
    errno = e;
  }
  return fd;
}

static int Dup2Common(int oldfd, int newfd, int flags, bool three) {
  auto real = [&] {
    return three ? dp::real_dup3()(oldfd, newfd, flags) : dp::real_dup2()(oldfd, newfd);
  };
  if (dp::Table().empty() || oldfd == newfd) return real();
  dp::ReentryGuard guard;
  if (!guard.outermost()) return real();
  std::unique_ptr<dp::TrackedFile> last = dp::Table().Remove(newfd);
  const int fd = real();
  const int e = errno;
  if (fd >= 0) dp::Table().AddAlias(oldfd, fd);
  dp::Finish(std::move(last));
  errno = e;
  return fd;
}

// fcntl(F_DUPFD*) duplicates like dup(). The argument is read as a pointer,
// as glibc itself does, and passed on unchanged for every other command.
static int FcntlCommon(int fd, int cmd, void* arg, bool is64) {
  const int rc = is64 ? dp::real_fcntl64()(fd, cmd, arg) : dp::real_fcntl()(fd, cmd, arg);
  if (rc >= 0 && (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && !dp::Table().empty()) {
    const int e = errno;
    dp::Table().AddAlias(fd, rc);
    errno = e;
  }
  return rc;
}

__attribute__((visibility("default"))) int fcntl(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  return FcntlCommon(fd, cmd, arg, false);
}

__attribute__((visibility("default"))) int fcntl64(int fd, int cmd, ...) {
  va_list ap;
  va_start(ap, cmd);
  void* arg = va_arg(ap, void*);
  va_end(ap);
  return FcntlCommon(fd, cmd, arg, true);
}

// close_range/closefrom close many descriptors at once (Python's
// subprocess, daemons): the tracked ones among them count as closes.
__attribute__((visibility("default"))) int close_range(unsigned first, unsigned last, int flags) {
  if (dp::Table().empty() || (flags & CLOSE_RANGE_CLOEXEC) != 0)
    return dp::real_close_range()(first, last, flags);
  dp::ReentryGuard guard;
  if (!guard.outermost()) return dp::real_close_range()(first, last, flags);
  auto files = dp::Table().RemoveRange(first, last);
  const int rc = dp::real_close_range()(first, last, flags);
  const int e = errno;
  for (auto& f : files) dp::Finish(std::move(f));
  errno = e;
  return rc;
}

__attribute__((visibility("default"))) void closefrom(int lowfd) {
  if (dp::Table().empty() || lowfd < 0) return dp::real_closefrom()(lowfd);
  dp::ReentryGuard guard;
  if (!guard.outermost()) return dp::real_closefrom()(lowfd);
  auto files = dp::Table().RemoveRange(static_cast<unsigned>(lowfd), ~0u);
  dp::real_closefrom()(lowfd);
  const int e = errno;
  for (auto& f : files) dp::Finish(std::move(f));
  errno = e;
}

// rename/link family: a file renamed or linked into the producer directory
// (mv, Python's os.replace, O_TMPFILE + linkat) is published as its last
// close would have (RenameCommon). renameat2's flags pass through; with
// RENAME_EXCHANGE both names hold a new file.
__attribute__((visibility("default"))) int rename(const char* oldpath, const char* newpath) {
  return dp::RenameCommon(AT_FDCWD, oldpath, AT_FDCWD, newpath, false, false,
                          [&] { return dp::real_rename()(oldpath, newpath); });
}

__attribute__((visibility("default"))) int renameat(int olddirfd, const char* oldpath, int newdirfd,
                                                    const char* newpath) {
  return dp::RenameCommon(olddirfd, oldpath, newdirfd, newpath, false, false, [&] {
    return dp::real_renameat()(olddirfd, oldpath, newdirfd, newpath);
  });
}

__attribute__((visibility("default"))) int renameat2(int olddirfd, const char* oldpath,
                                                     int newdirfd, const char* newpath,
                                                     unsigned flags) {
  return dp::RenameCommon(
      olddirfd, oldpath, newdirfd, newpath, (flags & RENAME_EXCHANGE) != 0, false,
      [&] { return dp::real_renameat2()(olddirfd, oldpath, newdirfd, newpath, flags); });
}

__attribute__((visibility("default"))) int link(const char* oldpath, const char* newpath) {
  return dp::RenameCommon(AT_FDCWD, oldpath, AT_FDCWD, newpath, false, true,
                          [&] { return dp::real_link()(oldpath, newpath); });
}

// Also linkat(fd, "", dirfd, name, AT_EMPTY_PATH) and the
// ("/proc/self/fd/N", AT_SYMLINK_FOLLOW) form that names an O_TMPFILE file.
__attribute__((visibility("default"))) int linkat(int olddirfd, const char* oldpath, int newdirfd,
                                                  const char* newpath, int flags) {
  return dp::RenameCommon(olddirfd, oldpath, newdirfd, newpath, false, true, [&] {
    return dp::real_linkat()(olddirfd, oldpath, newdirfd, newpath, flags);
  });
}

__attribute__((visibility("default"))) int dup2(int oldfd, int newfd) {
  return Dup2Common(oldfd, newfd, 0, false);
}

__attribute__((visibility("default"))) int dup3(int oldfd, int newfd, int flags) {
  return Dup2Common(oldfd, newfd, flags, true);
}

}  // extern "C"

// Resolve the real functions before main (a constructor of another library
// may still call us earlier; RealFn resolves lazily then), and stop
// interposing once the process is tearing down its libraries.
__attribute__((constructor)) static void DyadPreloadLoad() {
  (void)dp::real_open();
  (void)dp::real_openat();
  (void)dp::real_close();
  (void)dp::real_fopen();
  (void)dp::real_fclose();
}

__attribute__((destructor)) static void DyadPreloadUnload() {
  dp::g_shutdown.store(true, std::memory_order_release);
}
