#include "common/trace.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
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

std::string ExpandPath(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'p') {
      out += std::to_string(::getpid());
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

// Opens `path` for appending; a new file starts with "[" so that the
// array's opening bracket precedes every event whoever wrote first.
int OpenTraceFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd >= 0 || errno != ENOENT) return fd;
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int t = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (t < 0) return -1;
  const bool written = ::write(t, "[\n", 2) == 2;
  ::close(t);
  if (written && ::link(tmp.c_str(), path.c_str()) != 0 && errno != EEXIST) {
    ::unlink(tmp.c_str());
    return -1;
  }
  ::unlink(tmp.c_str());
  return ::open(path.c_str(), O_WRONLY | O_APPEND | O_CLOEXEC);
}

bool Start() {
  int expected = 0;
  if (!g_state.compare_exchange_strong(expected, 1)) return g_state.load() == 2;
  std::optional<std::string> v = GetEnv("DYAD_TRACE");
  if (!v || v->empty()) {
    g_state.store(3);
    return false;
  }
  const std::string path = ExpandPath(*v);
  const int fd = OpenTraceFile(path);
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
  WriteLine("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
            ",\"tid\":" + std::to_string(pid) + ",\"args\":{\"name\":" + JsonQuote(name) + "}},\n");
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
            ",\"dur\":" + std::to_string(end - start_us_) + ",\"pid\":" + std::to_string(pid) +
            ",\"tid\":" + std::to_string(tid) + ",\"args\":{" + args_ + "}},\n");
}

}  // namespace dyad
