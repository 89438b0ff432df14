// dyad_stream_core.hpp: the DYAD side of the C++ stream wrappers, as in
// upstream DYAD (same class name and members).
//
// A dyad_stream_core is a thin handle on the process-wide DYAD context
// (dyad_ctx_get()): init() initializes that context from the environment
// (the dyad_ctx_init() -> dyad_init_env() chain of the C API) unless it is
// already initialized, init(const dyad_params&) calls dyad_init() with
// explicit settings, open_sync() consumes a file (dyad_consume) and
// close_sync() publishes one (dyad_produce). Paths outside the managed
// directories are not DYAD's business: both return true doing nothing.
// finalize() releases the process-wide context (every stream is affected);
// the destructor leaves it alone.
//
// Threading: the context is thread-safe; one dyad_stream_core object is used
// by one thread at a time (it is a small value, copy it per thread). No
// exception leaves these members except std::bad_alloc.
#ifndef DYAD_STREAM_DYAD_STREAM_CORE_HPP
#define DYAD_STREAM_DYAD_STREAM_CORE_HPP

#include <dyad/common/dyad_rc.h>
#include <dyad/dyad_config.hpp>
#include <dyad/stream/dyad_params.hpp>

#include <ios>
#include <string>

extern "C" {
struct dyad_ctx;
}

namespace dyad {

class DYAD_DLL_EXPORTED dyad_stream_core {
 public:
  dyad_stream_core();
  ~dyad_stream_core();

  // Initializes the process's context from the DYAD_* environment variables
  // when it is not initialized yet (or always, with `reinit`). A failed
  // initialization prints one line on stderr and leaves DYAD off: the
  // streams then behave exactly like std::fstream.
  void init(const bool reinit = false);
  // Initializes the process's context with explicit settings (dyad_init).
  // p.m_reinit replaces a context that is already initialized.
  void init(const dyad_params& p);
  // With DYAD_SYNC_DEBUG (or dyad_params::m_debug): one line on stderr.
  void log_info(const std::string& msg_head) const;

  // dyad_finalize(): releases the process-wide context.
  void finalize();

  // True when DYAD is on and has a producer (consumer) managed directory.
  bool is_dyad_producer() const;
  bool is_dyad_consumer() const;

  // dyad_consume(path): returns once the file is complete locally; false on
  // failure (see last_rc()/last_error()). True without DYAD, without a
  // consumer directory, or for a path outside it.
  bool open_sync(const char* path);
  // dyad_produce(path): publishes a complete, closed file; false on failure.
  // True without DYAD, without a producer directory, or for a path outside.
  bool close_sync(const char* path);

  // Adopts the process's current context (for a core given to a stream).
  void set_initialized();
  bool chk_initialized() const;

  // DYAD_FSYNC_WRITE of the current context.
  bool chk_fsync_write() const;
  // True when `path` is under the producer (is_prod) or consumer directory.
  bool cmp_canonical_path_prefix(bool is_prod, const char* const __restrict__ path);

  // flock() locks, the kind dyad-service honours before serving a file.
  // Waits are bounded by DYAD_RPC_TIMEOUT (default 60 s). 0, or -1 with
  // errno (ETIMEDOUT when the wait expired).
  int file_lock_exclusive(int fd) const;
  int file_lock_shared(int fd) const;
  int file_unlock(int fd) const;

  // Extensions over upstream: the outcome of the last open_sync/close_sync.
  dyad_rc_t last_rc() const { return m_last_rc; }
  const std::string& last_error() const { return m_last_error; }

 private:
  void adopt_context();
  bool record(dyad_rc_t rc, const char* what, const char* path);

  struct dyad_ctx* m_ctx = nullptr;
  bool m_initialized = false;
  bool m_is_prod = false;
  bool m_is_cons = false;
  dyad_rc_t m_last_rc = DYAD_RC_OK;
  std::string m_last_error;
};

// Helpers of the stream templates (dyad_stream_api.hpp); not part of the
// upstream API. Every function sets errno on failure and never throws.
namespace stream_detail {

// open(2) flags equivalent to a std::filebuf open mode, never with O_TRUNC
// (the caller truncates once it holds the lock) and always with O_CLOEXEC.
// Sets *truncate when the mode asks for truncation. -1 (errno EINVAL) for a
// mode std::filebuf refuses.
DYAD_DLL_EXPORTED int open_flags_for_mode(std::ios_base::openmode mode, bool* truncate);
// Opens `path` as a stream opened with `mode` would (without truncating).
DYAD_DLL_EXPORTED int open_for_mode(const char* path, std::ios_base::openmode mode, bool* truncate);
// Takes the exclusive lock (bounded) and truncates when asked; false with
// errno on failure (the fd stays open).
DYAD_DLL_EXPORTED bool lock_and_truncate(const dyad_stream_core& core, int fd, bool truncate);
// fsync(fd); success also when the file kind cannot be synced (EINVAL).
DYAD_DLL_EXPORTED bool sync_fd(int fd);
// A close-on-exec duplicate of fd (same open file description, same lock).
DYAD_DLL_EXPORTED int dup_cloexec(int fd);
// True when fd and path name the same file.
DYAD_DLL_EXPORTED bool same_file(int fd, const char* path);
// close(fd), ignoring EINTR; no-op for fd < 0.
DYAD_DLL_EXPORTED void close_fd(int fd);

}  // namespace stream_detail
}  // namespace dyad

#endif  // DYAD_STREAM_DYAD_STREAM_CORE_HPP
