// dyad_stream_core.cc: dyad_stream_core and the non-template helpers of the
// C++ stream wrappers (see include/dyad/stream/dyad_stream_core.hpp).
//
// Everything here goes through the C API (dyad_init, dyad_consume, ...) on
// the process-wide context, so the streams behave exactly like a C program
// with the same settings. Only the managed-path test and a few settings are
// read from the context's client directly, through the public C++ client
// (dyad/client/dyad_client.hpp).
#include <dyad/stream/dyad_stream_core.hpp>

#include <dyad/client/dyad_client.h>
#include <dyad/client/dyad_producer.h>
#include <dyad/core/dyad_ctx.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dyad/client/dyad_client.hpp>

#include <cstdio>

namespace dyad {
namespace {

using client::Client;
using client::Side;

// The client behind the process's context; empty (not valid()) when DYAD
// is off.
Client CurrentClient() {
  Client c;
  dyad_ctx_t* ctx = dyad_ctx_get();
  if (ctx != nullptr) (void)Client::FromContext(ctx, &c);
  return c;
}

const char* DtlName(const dyad_params& p) {
  if (!p.m_dtl_mode_name.empty()) return p.m_dtl_mode_name.c_str();
  // The default value (also what dyad_params reads from an unset
  // DYAD_DTL_MODE) chooses nothing: the local service's own mode applies.
  if (p.m_dtl_mode == DYAD_DTL_DEFAULT) return nullptr;
  if (p.m_dtl_mode >= 0 && p.m_dtl_mode < DYAD_DTL_END) return dyad_dtl_mode_name[p.m_dtl_mode];
  return "DTL_UNKNOWN";  // dyad_init refuses it with DYAD_RC_BADDTLMODE
}

const char* OrNull(const std::string& s) { return s.empty() ? nullptr : s.c_str(); }

}  // namespace

dyad_stream_core::dyad_stream_core() = default;

// The context is process-wide and shared with every other stream and C
// call; a stream going away must not switch DYAD off for the others.
dyad_stream_core::~dyad_stream_core() = default;

void dyad_stream_core::adopt_context() {
  m_ctx = dyad_ctx_get();
  m_initialized = m_ctx != nullptr;
  const Client c = m_initialized ? CurrentClient() : Client();
  m_is_prod = c.has_producer_path();
  m_is_cons = c.has_consumer_path();
}

void dyad_stream_core::init(const bool reinit) {
  if (reinit) {
    dyad_finalize();
  } else if (dyad_ctx_get() != nullptr) {
    adopt_context();
    return;
  }
  // dyad_ctx_init reports a failure on stderr and leaves DYAD off, which is
  // what a stream constructor wants: never throw, behave like std::fstream.
  dyad_ctx_init(DYAD_COMM_RECV, nullptr);
  adopt_context();
}

void dyad_stream_core::init(const dyad_params& p) {
  const dyad_rc_t rc = dyad_init(p.m_debug, p.m_check, p.m_shared_storage, p.m_reinit,
                                 p.m_async_publish, p.m_fsync_write, p.m_key_depth, p.m_key_bins,
                                 p.m_service_mux, OrNull(p.m_kvs_namespace),
                                 OrNull(p.m_prod_managed_path), OrNull(p.m_cons_managed_path),
                                 p.m_relative_to_managed_path, DtlName(p), DYAD_COMM_RECV, nullptr);
  if (DYAD_IS_ERROR(rc)) {
    m_last_rc = rc;
    m_last_error = dyad_last_error();
    std::fprintf(stderr, "dyad: stream initialization failed (%s): %s\n", dyad_rc_name(rc),
                 m_last_error.c_str());
  }
  adopt_context();
}

void dyad_stream_core::log_info(const std::string& msg_head) const {
  const Client c = m_initialized ? CurrentClient() : Client();
  if (!c.valid()) return;
  const client::Options o = c.options();
  if (!o.debug) return;
  std::fprintf(stderr, "dyad[%d]: %s: producer=%s consumer=%s\n", static_cast<int>(::getpid()),
               msg_head.c_str(), o.producer_path.c_str(), o.consumer_path.c_str());
}

void dyad_stream_core::finalize() {
  dyad_finalize();
  m_ctx = nullptr;
  m_initialized = false;
  m_is_prod = m_is_cons = false;
}

// Asked of the context each time: another part of the program may have
// re-initialized it with other directories since this core was set up.
bool dyad_stream_core::is_dyad_producer() const {
  return m_initialized && CurrentClient().has_producer_path();
}

bool dyad_stream_core::is_dyad_consumer() const {
  return m_initialized && CurrentClient().has_consumer_path();
}

bool dyad_stream_core::record(dyad_rc_t rc, const char* what, const char* path) {
  m_last_rc = rc;
  if (!DYAD_IS_ERROR(rc)) {
    m_last_error.clear();
    return true;
  }
  m_last_error = std::string(what) + " '" + (path ? path : "(null)") + "': " + dyad_last_error();
  return false;
}

// As upstream: a process without a consumer (producer) directory has
// nothing to consume (publish); the C calls would report
// DYAD_RC_BADMANAGEDPATH instead, which would fail ordinary opens.
bool dyad_stream_core::open_sync(const char* path) {
  if (!is_dyad_consumer()) return record(DYAD_RC_OK, "consume", path);
  return record(dyad_consume(dyad_ctx_get(), path), "consume", path);
}

bool dyad_stream_core::close_sync(const char* path) {
  if (!is_dyad_producer()) return record(DYAD_RC_OK, "produce", path);
  return record(dyad_produce(dyad_ctx_get(), path), "produce", path);
}

void dyad_stream_core::set_initialized() { adopt_context(); }

bool dyad_stream_core::chk_initialized() const {
  return m_initialized && dyad_ctx_get() != nullptr;
}

bool dyad_stream_core::chk_fsync_write() const {
  const Client c = m_initialized ? CurrentClient() : Client();
  return c.valid() && c.options().fsync_write;
}

bool dyad_stream_core::cmp_canonical_path_prefix(bool is_prod,
                                                 const char* const __restrict__ path) {
  if (path == nullptr || !m_initialized) return false;
  return CurrentClient().IsManaged(path, is_prod ? Side::kProducer : Side::kConsumer);
}

// The producer's lock of the client library (dyad_producer.h), bounded by
// the context's RPC timeout; -1 with errno set on failure.
int dyad_stream_core::file_lock_exclusive(int fd) const {
  return dyad_producer_lock(m_ctx, fd) == DYAD_RC_OK ? 0 : -1;
}

int dyad_stream_core::file_lock_shared(int fd) const {
  return dyad_producer_lock_shared(m_ctx, fd) == DYAD_RC_OK ? 0 : -1;
}

int dyad_stream_core::file_unlock(int fd) const {
  return dyad_producer_unlock(fd) == DYAD_RC_OK ? 0 : -1;
}

namespace stream_detail {

int open_flags_for_mode(std::ios_base::openmode mode, bool* truncate) {
  using std::ios_base;
  // The table of [filebuf.members] (C fopen modes), without binary and ate.
  const ios_base::openmode m =
      mode & (ios_base::in | ios_base::out | ios_base::trunc | ios_base::app);
  int flags = -1;
  bool trunc = false;
  if (m == ios_base::out || m == (ios_base::out | ios_base::trunc)) {
    flags = O_WRONLY | O_CREAT;  // "w"
    trunc = true;
  } else if (m == ios_base::app || m == (ios_base::out | ios_base::app)) {
    flags = O_WRONLY | O_CREAT | O_APPEND;  // "a"
  } else if (m == ios_base::in) {
    flags = O_RDONLY;  // "r"
  } else if (m == (ios_base::in | ios_base::out)) {
    flags = O_RDWR;  // "r+"
  } else if (m == (ios_base::in | ios_base::out | ios_base::trunc)) {
    flags = O_RDWR | O_CREAT;  // "w+"
    trunc = true;
  } else if (m == (ios_base::in | ios_base::app) ||
             m == (ios_base::in | ios_base::out | ios_base::app)) {
    flags = O_RDWR | O_CREAT | O_APPEND;  // "a+"
  }
  if (flags < 0) {
    errno = EINVAL;
    return -1;
  }
  if (truncate) *truncate = trunc;
  return flags | O_CLOEXEC;
}

int open_for_mode(const char* path, std::ios_base::openmode mode, bool* truncate) {
  const int flags = open_flags_for_mode(mode, truncate);
  if (flags < 0) return -1;
  int fd;
  do {
    fd = ::open(path, flags, 0666);
  } while (fd < 0 && errno == EINTR);
  return fd;
}

bool lock_and_truncate(const dyad_stream_core& core, int fd, bool truncate) {
  if (core.file_lock_exclusive(fd) != 0) return false;
  // Truncating only now, under the lock, means a reader that honours the
  // lock never sees the file emptied and half rewritten.
  if (truncate) {
    struct stat st;
    if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && ::ftruncate(fd, 0) != 0) return false;
  }
  return true;
}

bool sync_fd(int fd) {
  if (fd < 0) return true;
  while (::fsync(fd) != 0) {
    if (errno == EINTR) continue;
    return errno == EINVAL || errno == EROFS;  // pipes, special files
  }
  return true;
}

int dup_cloexec(int fd) { return ::fcntl(fd, F_DUPFD_CLOEXEC, 0); }

bool same_file(int fd, const char* path) {
  struct stat a, b;
  if (::fstat(fd, &a) != 0 || ::stat(path, &b) != 0) return false;
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

void close_fd(int fd) {
  if (fd >= 0) ::close(fd);  // Linux releases the fd even on EINTR: no retry
}

}  // namespace stream_detail
}  // namespace dyad
