#include "common/trace.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/config.h"
#include "common/time.h"

namespace dyad {

namespace {

// 0: not looked at yet, 1: being opened, 2: on, 3: off.
std::atomic<int> g_state{0};
std::atomic<int> g_fd{-1};
// The process that wrote its name into the file (a forked child names itself).
std::atomic<pid_t> g_named_pid{0};
// Set before the first span; read without a lock afterwards. Fixed size so
// that setting it never allocates where a forked child could see it half done.
char g_process_name[128] = "";

// This host's name, read once when tracing starts (fixed size, as above).
char g_host[256] = "";

void ReadHostName() {
  if (::gethostname(g_host, sizeof g_host - 1) != 0) std::snprintf(g_host, sizeof g_host, "?");
  g_host[sizeof g_host - 1] = '\0';
}

std::string ExpandPath(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'p') {
      out += std::to_string(::getpid());
      ++i;
    } else if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'h') {
      // A host name never holds '/', but keep the path one file whatever it is.
      for (const char* h = g_host; *h; ++h) out += *h == '/' ? '_' : *h;
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

// Refuses a trace file this process must not write into: one of another
// user (its owner would receive our trace, or could read it), one group or
// others may write (they could have put anything before our lines), or
// anything but a regular file.
int CheckTraceFile(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return -1;
  const char* why = nullptr;
  if (!S_ISREG(st.st_mode))
    why = "is not a regular file";
  else if (st.st_uid != ::geteuid())
    why = "belongs to another user";
  else if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
    why = "is writable by group or others";
  if (why == nullptr) return fd;
  ::close(fd);
  std::fprintf(stderr,
               "dyad: DYAD_TRACE: refusing '%s': it %s (use a private directory, e.g. "
               "$XDG_RUNTIME_DIR/dyad-%%h-%%p.json); tracing is off\n",
               path.c_str(), why);
  errno = EPERM;
  return -2;
}

// Opens `path` for appending, never through a symlink; a new file starts
// with "[" so that the array's opening bracket precedes every event whoever
// wrote first. Returns -1 with errno, or -2 when refused (already said).
int OpenTraceFile(const std::string& path) {
  // O_NONBLOCK: a FIFO planted at the path must not hang the process (it
  // is refused by the check above anyway).
  constexpr int kAppend = O_WRONLY | O_APPEND | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC;
  int fd = ::open(path.c_str(), kAppend);
  if (fd >= 0) return CheckTraceFile(fd, path);
  if (errno != ENOENT) return -1;
  // A new file is written in full under a private, unpredictable name
  // (mkostemp: O_EXCL, mode 0600) and linked into place: link() never
  // follows or replaces what is there, so whoever links first wins and
  // the others open the winner's file.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
  std::string tmp = dir + ".dyad-trace.XXXXXX";
  const int t = ::mkostemp(&tmp[0], O_CLOEXEC);
  if (t < 0) return -1;
  const bool written = ::fchmod(t, 0600) == 0 && ::write(t, "[\n", 2) == 2;
  ::close(t);
  const bool linked = written && ::link(tmp.c_str(), path.c_str()) == 0;
  const int link_errno = errno;
  ::unlink(tmp.c_str());
  if (!linked && (!written || link_errno != EEXIST)) {
    errno = written ? link_errno : EIO;
    return -1;
  }
  fd = ::open(path.c_str(), kAppend);
  if (fd < 0) return -1;
  return CheckTraceFile(fd, path);
}

bool Start() {
  int expected = 0;
  if (!g_state.compare_exchange_strong(expected, 1)) return g_state.load() == 2;
  std::optional<std::string> v = GetEnv("DYAD_TRACE");
  if (!v || v->empty()) {
    g_state.store(3);
    return false;
  }
  ReadHostName();
  const std::string path = ExpandPath(*v);
  const int fd = OpenTraceFile(path);
  if (fd == -2) {
    g_state.store(3);
    return false;
  }
  if (fd < 0) {
    std::fprintf(stderr, "dyad: DYAD_TRACE: cannot open '%s': %s; tracing is off\n", path.c_str(),
                 std::strerror(errno));
    g_state.store(3);
    return false;
  }
  g_fd.store(fd);
  g_state.store(2);
  return true;
}

void WriteLine(const std::string& line) {
  const int fd = g_fd.load(std::memory_order_relaxed);
  if (fd < 0) return;
  // One write per event: O_APPEND keeps concurrent writers' lines whole.
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    g_state.store(3);
    std::fprintf(stderr, "dyad: DYAD_TRACE: write failed (%s); tracing is off\n",
                 std::strerror(errno));
  }
}

std::string DefaultProcessName() {
  char comm[64] = "";
  const int fd = ::open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    const ssize_t n = ::read(fd, comm, sizeof comm - 1);
    ::close(fd);
    if (n > 0) comm[n - (comm[n - 1] == '\n' ? 1 : 0)] = '\0';
  }
  return std::string("dyad client: ") + comm;
}

void NameProcessOnce(pid_t pid) {
  if (g_named_pid.exchange(pid) == pid) return;
  const std::string name = g_process_name[0] ? g_process_name : DefaultProcessName();
  const std::string key = std::to_string(TraceProcessId(g_host, pid));
  // The name says host and pid: the key is only unique with high probability.
  WriteLine("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + key + ",\"tid\":" + key +
            ",\"args\":{\"name\":" +
            JsonQuote(name + " [" + g_host + " pid " + std::to_string(pid) + "]") +
            ",\"host\":" + JsonQuote(g_host) + ",\"os_pid\":" + std::to_string(pid) + "}},\n");
}

uint64_t NowUs() { return WallNs() / 1000; }

}  // namespace

namespace {
// Length of the valid UTF-8 sequence starting at s[i] (0 if invalid).
size_t Utf8Length(const std::string& s, size_t i) {
  const unsigned char c = static_cast<unsigned char>(s[i]);
  const size_t n = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
  if (n == 0 || i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return 0;
  return n;
}
}  // namespace

std::string JsonQuote(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x80 && Utf8Length(s, i) > 0) {
      const size_t n = Utf8Length(s, i);
      out.append(s, i, n);
      i += n - 1;
    } else if (c < 0x20 || c >= 0x80) {
      // Control characters, and bytes that are not UTF-8 (one code point
      // each), escaped: the file stays valid JSON whatever a path holds.
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

uint32_t TraceProcessId(const std::string& host, pid_t pid) {
  // FNV-1a of the host name picks one of 1023 buckets above Linux's
  // largest pid (2^22): the id stays a 32-bit number, as the viewers want,
  // and never equals a bare pid.
  uint32_t h = 2166136261u;
  for (const char c : host) h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  const uint32_t bucket = h % 1023 + 1;
  return (bucket << 22) | (static_cast<uint32_t>(pid) & ((1u << 22) - 1));
}

bool TraceEnabled() {
  const int s = g_state.load(std::memory_order_relaxed);
  if (s == 2) return true;
  if (s == 3 || s == 1) return false;
  return Start();
}

void TraceSetProcessName(const std::string& name) {
  std::snprintf(g_process_name, sizeof g_process_name, "%s", name.c_str());
}

TraceSpan::TraceSpan(const char* name, const char* category)
    : on_(TraceEnabled()), name_(name), category_(category) {
  if (on_) start_us_ = NowUs();
}

TraceSpan& TraceSpan::Arg(const char* key, const std::string& value) {
  if (on_) args_ += (args_.empty() ? "" : ",") + JsonQuote(key) + ":" + JsonQuote(value);
  return *this;
}

TraceSpan& TraceSpan::Arg(const char* key, uint64_t value) {
  if (on_) args_ += (args_.empty() ? "" : ",") + JsonQuote(key) + ":" + std::to_string(value);
  return *this;
}

TraceSpan& TraceSpan::Rc(const dyad::Status& st) {
  if (on_) Arg("rc", dyad_rc_name(st.code()));
  return *this;
}

TraceSpan::~TraceSpan() {
  if (!on_ || g_state.load(std::memory_order_relaxed) != 2) return;
  const uint64_t end = NowUs();
  const pid_t pid = ::getpid();
  NameProcessOnce(pid);
  const long tid = ::syscall(SYS_gettid);
  WriteLine("{\"name\":" + JsonQuote(name_) + ",\"cat\":" + JsonQuote(category_) +
            ",\"ph\":\"X\",\"ts\":" + std::to_string(start_us_) +
            ",\"dur\":" + std::to_string(end - start_us_) +
            ",\"pid\":" + std::to_string(TraceProcessId(g_host, pid)) +
            ",\"tid\":" + std::to_string(tid) + ",\"args\":{" + args_ + "}},\n");
}

}  // namespace dyad
