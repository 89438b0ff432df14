// log.h: the process-wide logger of DYAD services and tools.
//
// Messages go to stderr by default; the service's -i/--info_log and
// -e/--error_log options send info and error messages to files. Each line
// carries a timestamp, level, and the component ("dyad-service[rank 1]").
// Control characters in a message (newline, carriage return, escape, ...)
// are written escaped (\n, \r, \x1b), so every message is exactly one line
// whatever the peer-supplied text it quotes.
// Thread-safe: a line is written with one write(2) under a mutex.
#pragma once

#include <cstdarg>
#include <string>
#include <string_view>

namespace dyad {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void LogSetLevel(LogLevel level);
LogLevel LogGetLevel();
void LogSetPrefix(const std::string& prefix);
// Empty path: back to stderr. Returns false (and keeps the old target) if
// the file cannot be opened.
bool LogSetInfoFile(const std::string& path);
bool LogSetErrorFile(const std::string& path);
// Opens the log files again by name (SIGHUP after logrotate moved them).
// Files that cannot be reopened keep their old target; returns false then.
bool LogReopen();

// `text` with every control character (< 0x20, 0x7f) replaced by a visible
// escape: \n, \r, \t, else \xNN. Other bytes are kept as they are.
std::string EscapeControlChars(std::string_view text);

void LogMessage(LogLevel level, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

}  // namespace dyad

#define DYAD_LOG_DEBUG(...)                                      \
  do {                                                           \
    if (::dyad::LogGetLevel() <= ::dyad::LogLevel::kDebug)       \
      ::dyad::LogMessage(::dyad::LogLevel::kDebug, __VA_ARGS__); \
  } while (0)
#define DYAD_LOG_INFO(...) ::dyad::LogMessage(::dyad::LogLevel::kInfo, __VA_ARGS__)
#define DYAD_LOG_WARN(...) ::dyad::LogMessage(::dyad::LogLevel::kWarn, __VA_ARGS__)
#define DYAD_LOG_ERROR(...) ::dyad::LogMessage(::dyad::LogLevel::kError, __VA_ARGS__)
