#include "common/log.h"

#include <fcntl.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <string>

namespace dyad {
namespace {

std::atomic<LogLevel> g_level{LogLevel::kInfo};
std::mutex g_mu;
std::string g_prefix = "dyad";
int g_info_fd = 2;
int g_error_fd = 2;
std::string g_info_path;  // "" = stderr
std::string g_error_path;

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
    fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return false;
  }
  std::lock_guard<std::mutex> lk(g_mu);
  const int old = *target;
  *target = fd;
  *target_path = path;
  if (old != 2 && old != *other) ::close(old);
  return true;
}

}  // namespace

std::string EscapeControlChars(std::string_view text) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      out += c;
      continue;
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

void LogSetLevel(LogLevel level) { g_level = level; }
LogLevel LogGetLevel() { return g_level; }
void LogSetPrefix(const std::string& prefix) {
  std::lock_guard<std::mutex> lk(g_mu);
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
    std::lock_guard<std::mutex> lk(g_mu);
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
  std::lock_guard<std::mutex> lk(g_mu);
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
