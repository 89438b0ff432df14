// dyad_stream_api.hpp: DYAD's C++ file streams, source-compatible with
// upstream DYAD's (same header path, class names, members).
//
// basic_ifstream_dyad, basic_ofstream_dyad and basic_fstream_dyad each hold
// a real std::basic_{i,o,}fstream (get_stream()) and add DYAD's two steps:
//  * opening a file under the consumer directory for reading consumes it
//    first (dyad_consume: waits until it is published and complete
//    locally); if that fails the stream is
//    left closed with failbit set, so a stale or missing copy is never read;
//  * a stream opened for writing under the producer directory holds an
//    exclusive flock() on the file while it is open (dyad-service takes a
//    shared one before serving a file), and close() or the destructor
//    flushes, fsync()s the data, releases the lock and then publishes
//    (dyad_produce). A file whose flush or sync failed is not published and
//    the stream gets badbit.
//  * a file read from a producer directory of this process (where a local
//    producer may rewrite it) is read under a shared flock(), released on
//    close.
// Paths outside the managed directories, and a process where DYAD is off,
// behave exactly as with std::fstream.
//
// How the lock and the sync reach the file: with libstdc++ (configure-time
// check, DYAD_HAS_STD_FSTREAM_FD) the stream opens the file itself with
// open(O_CLOEXEC), locks it, truncates it only under the lock, and hands the
// descriptor to a __gnu_cxx::stdio_filebuf that becomes the std stream's
// buffer, so one open file description carries the data, the lock and the
// fsync. Elsewhere (or with DYAD_STREAM_PORTABLE_LOCKING defined, uniformly
// for the whole program) a second descriptor on the same path is opened and
// locked before the std stream opens (and truncates) the file; flock()
// excludes other open file descriptions, and fsync() on any descriptor of a
// file flushes that file's data, so both guarantees hold.
//
// Threading: one stream object is used by one thread at a time, like a
// std::fstream. The DYAD context underneath is process-wide and thread-safe.
//
// Language level: C++11 and later (upstream's tutorial builds its programs
// with -std=c++11); the std::filesystem::path overloads exist whenever the
// program's standard library has std::filesystem.
#ifndef DYAD_STREAM_DYAD_STREAM_API_HPP
#define DYAD_STREAM_DYAD_STREAM_API_HPP

#include <dyad/dyad_config.hpp>
#include <dyad/stream/dyad_stream_core.hpp>

#if defined(__has_include)
#if __has_include(<dyad/stream/dyad_stream_config.hpp>)
#include <dyad/stream/dyad_stream_config.hpp>
#endif
#endif

#include <unistd.h>

// Programs built as C++17 get <filesystem> from here, as before.
#if __cplusplus >= 201703L
#include <filesystem>
#endif
#include <fstream>
#include <istream>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

// The configure-time check holds for the standard library DYAD was built
// with; a program built with another one (libc++) gets the portable path.
// Nothing in libdyad_fstream depends on the choice.
#if defined(DYAD_HAS_STD_FSTREAM_FD) && !defined(DYAD_STREAM_PORTABLE_LOCKING) && \
    defined(__GLIBCXX__) && defined(__has_include)
#if __has_include(<ext/stdio_filebuf.h>)
#include <ext/stdio_filebuf.h>
#define DYAD_STREAM_ADOPTS_FD 1
#endif
#endif

namespace dyad {

// Enabled when _Path is std::filesystem::path (upstream's helper name).
// Spelled in C++11 terms (no enable_if_t / is_same_v), and detected by the
// path's own members.
template <typename _Path, typename _Result = _Path,
          typename _Path2 = decltype(std::declval<_Path&>().make_preferred().filename())>
using dyad_if_fs_path = typename std::enable_if<std::is_same<_Path, _Path2>::value, _Result>::type;

namespace stream_detail {

// std::exchange is C++14.
template <typename T, typename U>
T take(T& slot, U&& replacement) {
  T old = std::move(slot);
  slot = std::forward<U>(replacement);
  return old;
}

// Everything the three stream classes share. `Stream` is the std stream
// held; `kDefaultMode` the default open mode; `kForcedMode` the bits the
// std class always adds (in for ifstream, out for ofstream).
template <typename CharT, typename Traits, typename Stream, std::ios_base::openmode kDefaultMode,
          std::ios_base::openmode kForcedMode>
class basic_dyad_file {
 public:
  using char_type = CharT;
  using traits_type = Traits;
  using int_type = typename Traits::int_type;
  using pos_type = typename Traits::pos_type;
  using off_type = typename Traits::off_type;
  using ios_base = std::ios_base;
  using string = std::string;
  using stream_type = Stream;
  using filebuf = std::basic_filebuf<CharT, Traits>;

  // Initializes DYAD from the environment (if not yet) and opens nothing.
  basic_dyad_file() { m_core.init(); }
  // Uses `core` as it is (upstream: a core set up by the caller).
  explicit basic_dyad_file(const dyad_stream_core& core) : m_core(core) {}
  explicit basic_dyad_file(const char* filename, ios_base::openmode mode = kDefaultMode) {
    m_core.init();
    open(filename, mode);
  }
  explicit basic_dyad_file(const string& filename, ios_base::openmode mode = kDefaultMode)
      : basic_dyad_file(filename.c_str(), mode) {}
  template <typename _Path, typename _Require = dyad_if_fs_path<_Path>>
  basic_dyad_file(const _Path& filepath, ios_base::openmode mode = kDefaultMode)
      : basic_dyad_file(filepath.c_str(), mode) {}

  basic_dyad_file(const basic_dyad_file&) = delete;
  basic_dyad_file& operator=(const basic_dyad_file&) = delete;

  basic_dyad_file(basic_dyad_file&& rhs)
      : m_core(rhs.m_core),
        m_stream(std::move(rhs.m_stream)),
        m_filename(std::move(rhs.m_filename)),
        m_sync_fd(take(rhs.m_sync_fd, -1)),
        m_publish(take(rhs.m_publish, false)) {}

  // Finishes (publishes) what this stream had open, then takes rhs's file.
  basic_dyad_file& operator=(basic_dyad_file&& rhs) {
    if (this != &rhs) {
      finish_quietly();
      m_core = rhs.m_core;
      m_stream = std::move(rhs.m_stream);
      m_filename = std::move(rhs.m_filename);
      m_sync_fd = take(rhs.m_sync_fd, -1);
      m_publish = take(rhs.m_publish, false);
    }
    return *this;
  }

  // Publishes a file still open for writing (errors cannot be reported
  // here: call close() to see them).
  ~basic_dyad_file() { finish_quietly(); }

  void swap(basic_dyad_file& rhs) {
    std::swap(m_core, rhs.m_core);
    m_stream.swap(rhs.m_stream);
    m_filename.swap(rhs.m_filename);
    std::swap(m_sync_fd, rhs.m_sync_fd);
    std::swap(m_publish, rhs.m_publish);
  }

  // Consumes first when opening for reading (not for in|out|trunc, which
  // discards the content); locks when writing under the producer directory.
  // On failure the stream is closed with failbit set; core().last_error()
  // says why when DYAD failed.
  void open(const char* filename, ios_base::openmode mode = kDefaultMode) {
    do_open(filename, mode | kForcedMode);
  }
  void open(const string& filename, ios_base::openmode mode = kDefaultMode) {
    open(filename.c_str(), mode);
  }
  template <typename _Path>
  dyad_if_fs_path<_Path, void> open(const _Path& filepath, ios_base::openmode mode = kDefaultMode) {
    open(filepath.c_str(), mode);
  }

  bool is_open() const { return m_stream.is_open(); }

  // Closes the file; when it was opened for writing under the producer
  // directory: flush, fsync, unlock, then publish. failbit when publishing
  // failed, badbit when the data could not be written or synced (then it is
  // not published). Closing a stream that is not open sets failbit, as
  // std::fstream::close does.
  void close() {
    if (!m_publish) {
      release_read_lock();
      m_stream.close();
      return;
    }
    finish();
  }

  filebuf* rdbuf() const { return m_stream.rdbuf(); }
  stream_type& get_stream() { return m_stream; }
  const stream_type& get_stream() const { return m_stream; }
  operator stream_type&() { return m_stream; }

  // Adopts `core` (upstream: for a stream built with a core).
  void init(const dyad_stream_core& core) {
    m_core = core;
    m_core.set_initialized();
    m_core.log_info("Stream core state is set");
  }
  const dyad_stream_core& core() const { return m_core; }
  // The name given to the last successful open.
  const std::string& filename() const { return m_filename; }

  // --- the std stream's state -------------------------------------------
  explicit operator bool() const { return !m_stream.fail(); }
  bool operator!() const { return m_stream.fail(); }
  bool good() const { return m_stream.good(); }
  bool eof() const { return m_stream.eof(); }
  bool fail() const { return m_stream.fail(); }
  bool bad() const { return m_stream.bad(); }
  ios_base::iostate rdstate() const { return m_stream.rdstate(); }
  void clear(ios_base::iostate state = ios_base::goodbit) { m_stream.clear(state); }
  void setstate(ios_base::iostate state) { m_stream.setstate(state); }
  ios_base::iostate exceptions() const { return m_stream.exceptions(); }
  void exceptions(ios_base::iostate except) { m_stream.exceptions(except); }
  std::locale imbue(const std::locale& loc) { return m_stream.imbue(loc); }
  std::locale getloc() const { return m_stream.getloc(); }

  // --- output (for streams that write) ----------------------------------
  template <typename T>
  auto operator<<(T&& value) -> decltype(std::declval<Stream&>() << std::forward<T>(value),
                                         std::declval<basic_dyad_file&>()) {
    m_stream << std::forward<T>(value);
    return *this;
  }
  basic_dyad_file& operator<<(
      std::basic_ostream<CharT, Traits>& (*manip)(std::basic_ostream<CharT, Traits>&)) {
    manip(m_stream);
    return *this;
  }
  basic_dyad_file& operator<<(
      std::basic_ios<CharT, Traits>& (*manip)(std::basic_ios<CharT, Traits>&)) {
    manip(m_stream);
    return *this;
  }
  basic_dyad_file& operator<<(ios_base& (*manip)(ios_base&)) {
    manip(m_stream);
    return *this;
  }
  basic_dyad_file& put(CharT c) {
    m_stream.put(c);
    return *this;
  }
  basic_dyad_file& write(const CharT* s, std::streamsize n) {
    m_stream.write(s, n);
    return *this;
  }
  basic_dyad_file& flush() {
    m_stream.flush();
    return *this;
  }
  pos_type tellp() { return m_stream.tellp(); }
  basic_dyad_file& seekp(pos_type pos) {
    m_stream.seekp(pos);
    return *this;
  }
  basic_dyad_file& seekp(off_type off, ios_base::seekdir dir) {
    m_stream.seekp(off, dir);
    return *this;
  }

  // --- input (for streams that read) ------------------------------------
  template <typename T>
  auto operator>>(T&& value) -> decltype(std::declval<Stream&>() >> std::forward<T>(value),
                                         std::declval<basic_dyad_file&>()) {
    m_stream >> std::forward<T>(value);
    return *this;
  }
  basic_dyad_file& operator>>(
      std::basic_istream<CharT, Traits>& (*manip)(std::basic_istream<CharT, Traits>&)) {
    manip(m_stream);
    return *this;
  }
  basic_dyad_file& operator>>(ios_base& (*manip)(ios_base&)) {
    manip(m_stream);
    return *this;
  }
  int_type get() { return m_stream.get(); }
  basic_dyad_file& get(CharT& c) {
    m_stream.get(c);
    return *this;
  }
  int_type peek() { return m_stream.peek(); }
  basic_dyad_file& read(CharT* s, std::streamsize n) {
    m_stream.read(s, n);
    return *this;
  }
  std::streamsize gcount() const { return m_stream.gcount(); }
  basic_dyad_file& getline(CharT* s, std::streamsize n) {
    m_stream.getline(s, n);
    return *this;
  }
  basic_dyad_file& ignore(std::streamsize n = 1, int_type delim = Traits::eof()) {
    m_stream.ignore(n, delim);
    return *this;
  }
  pos_type tellg() { return m_stream.tellg(); }
  basic_dyad_file& seekg(pos_type pos) {
    m_stream.seekg(pos);
    return *this;
  }
  basic_dyad_file& seekg(off_type off, ios_base::seekdir dir) {
    m_stream.seekg(off, dir);
    return *this;
  }

 private:
  void do_open(const char* filename, ios_base::openmode mode) {
    // As std::fstream: opening an open stream (or without a name) fails.
    if (filename == nullptr || m_stream.is_open() || m_publish || m_sync_fd >= 0) {
      m_stream.setstate(ios_base::failbit);
      return;
    }
    const bool writes = (mode & (ios_base::out | ios_base::app)) != 0;
    const bool reads = (mode & ios_base::in) != 0;
    const bool discards = writes && (mode & ios_base::trunc) != 0;
    const bool dyad_on = m_core.chk_initialized();
    if (dyad_on && reads && !discards && m_core.cmp_canonical_path_prefix(false, filename) &&
        !m_core.open_sync(filename)) {
      m_stream.setstate(ios_base::failbit);
      return;
    }
    if (dyad_on && writes && m_core.cmp_canonical_path_prefix(true, filename)) {
      if (!open_locked(filename, mode)) {
        m_stream.setstate(ios_base::failbit);
        return;
      }
      m_publish = true;
    } else {
      // A file read in a producer directory of this process can be
      // rewritten by a local producer: read it under a shared lock, which
      // such a writer's exclusive lock excludes (bounded wait).
      int read_lock = -1;
      if (dyad_on && reads && !writes && m_core.cmp_canonical_path_prefix(true, filename)) {
        read_lock = open_for_mode(filename, ios_base::in, nullptr);
        if (read_lock >= 0 && m_core.file_lock_shared(read_lock) != 0) {
          close_fd(read_lock);
          m_stream.setstate(ios_base::failbit);
          return;
        }
      }
      m_stream.open(filename, mode);  // sets failbit itself on failure
      if (!m_stream.is_open()) {
        close_fd(read_lock);
        return;
      }
      m_sync_fd = read_lock;
    }
    m_stream.clear();
    m_filename = filename;
  }

#if defined(DYAD_STREAM_ADOPTS_FD)
  // One descriptor, opened and locked here, becomes the std stream's buffer.
  bool open_locked(const char* filename, ios_base::openmode mode) {
    bool truncate = false;
    const int fd = open_for_mode(filename, mode, &truncate);
    if (fd < 0) return false;
    int keep = -1;
    if (!lock_and_truncate(m_core, fd, truncate) || (keep = dup_cloexec(fd)) < 0) {
      close_fd(fd);
      return false;
    }
    {
      __gnu_cxx::stdio_filebuf<CharT, Traits> adopted(fd, mode);
      if (!adopted.is_open()) {
        close_fd(fd);
        close_fd(keep);
        return false;
      }
      // The swap moves the locale too: keep the one the caller imbued.
      adopted.pubimbue(m_stream.rdbuf()->getloc());
      m_stream.rdbuf()->swap(adopted);
    }  // `adopted` now holds the stream's unopened buffer
    if ((mode & ios_base::ate) &&
        m_stream.rdbuf()->pubseekoff(0, ios_base::end, mode) == pos_type(off_type(-1))) {
      m_stream.rdbuf()->close();
      close_fd(keep);
      return false;
    }
    m_sync_fd = keep;
    return true;
  }
#else
  // A separate descriptor holds the lock (taken before the std stream
  // truncates the file) and serves the fsync.
  bool open_locked(const char* filename, ios_base::openmode mode) {
    bool truncate = false;
    const int fd = open_for_mode(filename, mode, &truncate);
    if (fd < 0) return false;
    if (!lock_and_truncate(m_core, fd, truncate)) {
      close_fd(fd);
      return false;
    }
    m_stream.open(filename, mode);
    // Another process may have replaced the name between the two opens;
    // then the lock and the fsync would miss the file being written.
    if (!m_stream.is_open() || !same_file(fd, filename)) {
      if (m_stream.is_open()) m_stream.rdbuf()->close();
      close_fd(fd);
      return false;
    }
    m_sync_fd = fd;
    return true;
  }
#endif

  // The close of a file opened for writing under the producer directory.
  // No stream member that may throw is used before the descriptors are
  // released, so an exceptions() mask cannot leak the lock.
  void finish() {
    bool ok = true;
    if (m_stream.is_open() && m_stream.rdbuf()->pubsync() != 0) ok = false;
    if (!sync_fd(m_sync_fd)) ok = false;
    if (m_stream.is_open() && m_stream.rdbuf()->close() == nullptr) ok = false;
    close_fd(m_sync_fd);  // releases the lock (last descriptor of the file description)
    m_sync_fd = -1;
    m_publish = false;
    if (!ok) {
      m_stream.setstate(ios_base::badbit);
    } else if (!m_core.close_sync(m_filename.c_str())) {
      m_stream.setstate(ios_base::failbit);
    }
  }

  void release_read_lock() noexcept {
    close_fd(m_sync_fd);
    m_sync_fd = -1;
  }

  void finish_quietly() noexcept {
    if (!m_publish) {
      release_read_lock();
      return;
    }
    try {
      finish();
    } catch (...) {
      // exceptions() mask on the stream: the file was handled already.
    }
  }

  dyad_stream_core m_core;
  Stream m_stream;
  std::string m_filename;
  int m_sync_fd = -1;      // holds the lock (exclusive, or shared for reading); fsync target
  bool m_publish = false;  // open for writing under the producer directory
};

}  // namespace stream_detail

//=============================================================================
// basic_ifstream_dyad: std::basic_ifstream that consumes before opening.
//=============================================================================
template <typename _CharT, typename _Traits = std::char_traits<_CharT>>
class basic_ifstream_dyad
    : public stream_detail::basic_dyad_file<_CharT, _Traits, std::basic_ifstream<_CharT, _Traits>,
                                            std::ios_base::in, std::ios_base::in> {
  using base = stream_detail::basic_dyad_file<_CharT, _Traits, std::basic_ifstream<_CharT, _Traits>,
                                              std::ios_base::in, std::ios_base::in>;

 public:
  using basic_ifstream = std::basic_ifstream<_CharT, _Traits>;
  using base::base;
};

//=============================================================================
// basic_ofstream_dyad: std::basic_ofstream that locks while writing and
// publishes on close.
//=============================================================================
template <typename _CharT, typename _Traits = std::char_traits<_CharT>>
class basic_ofstream_dyad
    : public stream_detail::basic_dyad_file<_CharT, _Traits, std::basic_ofstream<_CharT, _Traits>,
                                            std::ios_base::out, std::ios_base::out> {
  using base = stream_detail::basic_dyad_file<_CharT, _Traits, std::basic_ofstream<_CharT, _Traits>,
                                              std::ios_base::out, std::ios_base::out>;

 public:
  using basic_ofstream = std::basic_ofstream<_CharT, _Traits>;
  using base::base;
};

//=============================================================================
// basic_fstream_dyad: std::basic_fstream; consumes when opened for reading,
// locks and publishes when opened for writing.
//=============================================================================
template <typename _CharT, typename _Traits = std::char_traits<_CharT>>
class basic_fstream_dyad
    : public stream_detail::basic_dyad_file<_CharT, _Traits, std::basic_fstream<_CharT, _Traits>,
                                            std::ios_base::in | std::ios_base::out,
                                            std::ios_base::openmode{}> {
  using base = stream_detail::basic_dyad_file<_CharT, _Traits, std::basic_fstream<_CharT, _Traits>,
                                              std::ios_base::in | std::ios_base::out,
                                              std::ios_base::openmode{}>;

 public:
  using basic_fstream = std::basic_fstream<_CharT, _Traits>;
  using base::base;
};

using ifstream_dyad = basic_ifstream_dyad<char>;
using ofstream_dyad = basic_ofstream_dyad<char>;
using fstream_dyad = basic_fstream_dyad<char>;
using wifstream_dyad = basic_ifstream_dyad<wchar_t>;
using wofstream_dyad = basic_ofstream_dyad<wchar_t>;
using wfstream_dyad = basic_fstream_dyad<wchar_t>;

template <typename C, typename T, typename S, std::ios_base::openmode D, std::ios_base::openmode F>
void swap(stream_detail::basic_dyad_file<C, T, S, D, F>& a,
          stream_detail::basic_dyad_file<C, T, S, D, F>& b) {
  a.swap(b);
}

// std::getline for the DYAD streams (found by argument-dependent lookup:
// `getline(ifs, line)`; std::getline(ifs.get_stream(), line) works as well).
template <typename C, typename T, typename A, typename S, std::ios_base::openmode D,
          std::ios_base::openmode F>
std::basic_istream<C, T>& getline(stream_detail::basic_dyad_file<C, T, S, D, F>& in,
                                  std::basic_string<C, T, A>& line) {
  return std::getline(in.get_stream(), line);
}
template <typename C, typename T, typename A, typename S, std::ios_base::openmode D,
          std::ios_base::openmode F>
std::basic_istream<C, T>& getline(stream_detail::basic_dyad_file<C, T, S, D, F>& in,
                                  std::basic_string<C, T, A>& line, C delim) {
  return std::getline(in.get_stream(), line, delim);
}

}  // namespace dyad

#endif  // DYAD_STREAM_DYAD_STREAM_API_HPP
