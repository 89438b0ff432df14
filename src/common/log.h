// log.h: the process-wide logger of DYAD services and tools.
//
// Messages go to stderr by default; the service's -i/--info_log and
// -e/--error_log options send info and error messages to files. Each line
// carries a timestamp, level, and the component ("dyad-service[rank 1]").
// Control characters in a message (newline, carriage return, escape, C1
// controls, bidirectional overrides; EscapeControlChars) are written
// escaped (\n, \r, \x1b, \u202e), so every message is exactly one line and
// shows what it says, whatever the peer-supplied text it quotes. Log files
// are created 0600 (LogSetFileMode).
// Thread-safe: a line is written with one write(2) under a mutex.
#pragma once

#include <cstdarg>
#include <string>
#include <string_view>

#include "common/status.h"

namespace dyad {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void LogSetLevel(LogLevel level);
LogLevel LogGetLevel();
void LogSetPrefix(const std::string& prefix);
// Empty path: back to stderr. Returns false (and keeps the old target) if
// the file cannot be opened.
bool LogSetInfoFile(const std::string& path);
bool LogSetErrorFile(const std::string& path);
// Mode of the log files opened from now on (default 0600; the umask
// narrows it further). An existing log of this user's that is wider is
// narrowed to it when opened.
void LogSetFileMode(unsigned mode);
// "0600", "640", ...: an octal mode up to 0777 (DYAD_SERVICE_FILE_MODE).
Result<unsigned> ParseFileMode(const std::string& text);
// Opens the log files again by name (SIGHUP after logrotate moved them).
// Files that cannot be reopened keep their old target; returns false then.
bool LogReopen();

// `text` with everything a terminal or an editor would act on instead of
// showing replaced by a visible escape: C0 controls and DEL (\n, \r, \t,
// else \xNN), bytes that are not well-formed UTF-8 (\xNN: a lone 0x9b is
// CSI to an 8-bit terminal), and the code points U+0080-009F (C1
// controls), U+200E/200F, U+2028-202E and U+2066-2069 (bidirectional
// controls and line separators) as \uXXXX. Other UTF-8 is kept.
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
