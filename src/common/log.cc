#include "common/log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <string>

#include "common/thread_annotations.h"

namespace dyad {
namespace {

std::atomic<LogLevel> g_level{LogLevel::kInfo};
Mutex g_mu;
std::string g_prefix GUARDED_BY(g_mu) = "dyad";
int g_info_fd GUARDED_BY(g_mu) = 2;
int g_error_fd GUARDED_BY(g_mu) = 2;
std::string g_info_path GUARDED_BY(g_mu);  // "" = stderr
std::string g_error_path GUARDED_BY(g_mu);
// Mode of log files this process creates (the umask narrows it further).
std::atomic<unsigned> g_file_mode{0600};

const char* LevelName(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug:
      return "DEBUG";
    case LogLevel::kInfo:
      return "INFO";
    case LogLevel::kWarn:
      return "WARN";
    case LogLevel::kError:
      return "ERROR";
    default:
      return "";
  }
}

bool SetFile(int* target, std::string* target_path, const int* other, const std::string& path) {
  int fd = 2;
  if (!path.empty()) {
    const mode_t mode = static_cast<mode_t>(g_file_mode.load());
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, mode);
    if (fd < 0) return false;
    // A log of this user's that is wider than asked (a 0644 one from an
    // older version) is narrowed: logs quote paths and peers' addresses.
    struct stat st;
    if (::fstat(fd, &st) == 0 && st.st_uid == ::geteuid() && (st.st_mode & 0777 & ~mode) != 0)
      (void)::fchmod(fd, st.st_mode & 0777 & mode);
  }
  MutexLock lk(g_mu);
  const int old = *target;
  *target = fd;
  *target_path = path;
  if (old != 2 && old != *other) ::close(old);
  return true;
}

}  // namespace

namespace {

// Length of the well-formed UTF-8 sequence at text[i] and its code point
// (0 when the bytes there are not one: a stray continuation byte, an
// overlong form, a surrogate, a cut sequence).
size_t DecodeUtf8(std::string_view text, size_t i, uint32_t* cp) {
  const unsigned char c = static_cast<unsigned char>(text[i]);
  size_t n = 0;
  uint32_t v = 0, min = 0;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2, v = c & 0x1f, min = 0x80;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3, v = c & 0x0f, min = 0x800;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4, v = c & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > text.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const unsigned char b = static_cast<unsigned char>(text[i + k]);
    if ((b & 0xc0) != 0x80) return 0;
    v = (v << 6) | (b & 0x3f);
  }
  if (v < min || v > 0x10ffff || (v >= 0xd800 && v <= 0xdfff)) return 0;
  *cp = v;
  return n;
}

// Code points a terminal or an editor acts on rather than shows: the C1
// controls (U+0080-009F; U+009B is CSI, as ESC [ is), the bidirectional
// marks, embeddings, overrides and isolates (which reorder what follows,
// "Trojan Source"), and the line and paragraph separators.
bool IsInvisibleControl(uint32_t cp) {
  return (cp >= 0x80 && cp <= 0x9f) || cp == 0x200e || cp == 0x200f ||
         (cp >= 0x2028 && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

}  // namespace

std::string EscapeControlChars(std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    const unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u < 0x7f) {
      out += c;
      continue;
    }
    if (u >= 0x80) {
      uint32_t cp = 0;
      const size_t n = DecodeUtf8(text, i, &cp);
      if (n > 0 && !IsInvisibleControl(cp)) {
        out.append(text.substr(i, n));
        i += n - 1;
        continue;
      }
      if (n > 0) {
        char buf[16];
        std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
        out += buf;
        i += n - 1;
        continue;
      }
      // Not UTF-8: a lone byte. 0x80-0x9f are C1 controls to a terminal
      // in an 8-bit mode, so every such byte is escaped.
    }
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        out += "\\x";
        out += kHex[u >> 4];
        out += kHex[u & 15];
    }
  }
  return out;
}

void LogSetFileMode(unsigned mode) { g_file_mode = mode & 0777; }

Result<unsigned> ParseFileMode(const std::string& text) {
  unsigned mode = 0;
  bool ok = !text.empty() && text.size() <= 4;
  for (const char c : text) {
    if (c < '0' || c > '7') ok = false;
    mode = mode * 8 + static_cast<unsigned>(c - '0');
  }
  if (!ok || mode > 0777)
    return Status(DYAD_RC_BADREQUEST,
                  "file mode '" + text + "' is not an octal mode from 0000 to 0777 (e.g. 0600)");
  return mode;
}

void LogSetLevel(LogLevel level) { g_level = level; }
LogLevel LogGetLevel() { return g_level; }
void LogSetPrefix(const std::string& prefix) {
  MutexLock lk(g_mu);
  g_prefix = prefix;
}
bool LogSetInfoFile(const std::string& path) {
  return SetFile(&g_info_fd, &g_info_path, &g_error_fd, path);
}
bool LogSetErrorFile(const std::string& path) {
  return SetFile(&g_error_fd, &g_error_path, &g_info_fd, path);
}

bool LogReopen() {
  std::string info, error;
  {
    MutexLock lk(g_mu);
    info = g_info_path;
    error = g_error_path;
  }
  bool ok = true;
  if (!info.empty()) ok = LogSetInfoFile(info) && ok;
  if (!error.empty()) ok = LogSetErrorFile(error) && ok;
  return ok;
}

void LogMessage(LogLevel level, const char* fmt, ...) {
  if (level < g_level.load(std::memory_order_relaxed)) return;
  char body[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(body, sizeof body, fmt, ap);
  va_end(ap);

  timeval tv;
  gettimeofday(&tv, nullptr);
  tm t;
  localtime_r(&tv.tv_sec, &t);
  char ts[32];
  strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &t);

  // Messages quote what peers and clients sent (paths, names): escaping
  // control characters keeps one message on one line, so a newline in a
  // requested path cannot forge a log line.
  const std::string safe = EscapeControlChars(body);
  MutexLock lk(g_mu);
  char head[128];
  const int hn = snprintf(head, sizeof head, "%s.%03ld %s ", ts,
                          static_cast<long>(tv.tv_usec / 1000), LevelName(level));
  std::string line(head, hn > 0 ? static_cast<size_t>(std::min<int>(hn, sizeof head - 1)) : 0);
  line += EscapeControlChars(g_prefix);
  line += ": ";
  line += safe;
  line += '\n';
  const int fd = level >= LogLevel::kWarn ? g_error_fd : g_info_fd;
  ssize_t w = ::write(fd, line.data(), line.size());
  (void)w;
}

}  // namespace dyad
