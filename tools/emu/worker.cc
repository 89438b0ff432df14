#include "emu/worker.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/net.h"

namespace dyad::emu {
namespace {

std::vector<std::string> SplitTabs(const std::string& line) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    const size_t tab = line.find('\t', start);
    if (tab == std::string::npos) {
      out.push_back(line.substr(start));
      return out;
    }
    out.push_back(line.substr(start, tab - start));
    start = tab + 1;
  }
}

bool ParseI64(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (*end != '\0' || errno != 0) return false;
  *out = v;
  return true;
}

bool ParseU64(const std::string& s, uint64_t* out) {
  if (s.empty() || s[0] == '-') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (*end != '\0' || errno != 0) return false;
  *out = v;
  return true;
}

Result<std::vector<std::string>> ReadLines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return StatusFromErrno(errno, "open '" + path + "'");
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

}  // namespace

std::string EscapeField(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '%':
        out += "%25";
        break;
      case '\t':
        out += "%09";
        break;
      case '\n':
        out += "%0A";
        break;
      case '\r':
        out += "%0D";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string UnescapeField(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      const std::string hex = s.substr(i + 1, 2);
      char* end = nullptr;
      const long v = std::strtol(hex.c_str(), &end, 16);
      if (hex.size() == 2 && *end == '\0') {
        out += static_cast<char>(v);
        i += 2;
        continue;
      }
    }
    out += s[i];
  }
  return out;
}

Status WriteManifest(const std::string& path, const std::vector<ManifestEntry>& entries) {
  std::string text;
  for (const auto& e : entries) text += std::to_string(e.size) + "\t" + EscapeField(e.name) + "\n";
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return StatusFromErrno(errno, "create '" + path + "'");
  return WriteFully(fd.get(), text.data(), text.size());
}

Result<std::vector<ManifestEntry>> ReadManifest(const std::string& path) {
  auto lines = ReadLines(path);
  if (!lines.ok()) return lines.status();
  std::vector<ManifestEntry> out;
  for (const auto& line : *lines) {
    const auto f = SplitTabs(line);
    ManifestEntry e;
    if (f.size() != 2 || !ParseI64(f[0], &e.size))
      return Status(DYAD_RC_BADREQUEST, "malformed manifest line in '" + path + "': " + line);
    e.name = UnescapeField(f[1]);
    out.push_back(std::move(e));
  }
  return out;
}

std::string FormatResult(const FileResult& r) {
  std::ostringstream o;
  o << r.rc << '\t' << r.size << '\t' << r.start_ns << '\t' << r.end_ns << '\t' << r.call_ns << '\t'
    << r.io_ns << '\t' << r.version << '\t' << r.verified << '\t' << EscapeField(r.name) << '\t'
    << EscapeField(r.message) << '\n';
  return o.str();
}

Result<std::vector<FileResult>> ReadResults(const std::string& path) {
  auto lines = ReadLines(path);
  if (!lines.ok()) return lines.status();
  std::vector<FileResult> out;
  for (const auto& line : *lines) {
    const auto f = SplitTabs(line);
    FileResult r;
    int64_t rc = 0, verified = 0;
    if (f.size() != 10 || !ParseI64(f[0], &rc) || !ParseU64(f[1], &r.size) ||
        !ParseU64(f[2], &r.start_ns) || !ParseU64(f[3], &r.end_ns) || !ParseU64(f[4], &r.call_ns) ||
        !ParseU64(f[5], &r.io_ns) || !ParseU64(f[6], &r.version) || !ParseI64(f[7], &verified))
      return Status(DYAD_RC_BADREQUEST, "malformed result line in '" + path + "': " + line);
    r.rc = static_cast<int>(rc);
    r.verified = static_cast<int>(verified);
    r.name = UnescapeField(f[8]);
    r.message = UnescapeField(f[9]);
    out.push_back(std::move(r));
  }
  return out;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::ceil(p / 100.0 * static_cast<double>(values.size()));
  size_t idx = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  if (idx >= values.size()) idx = values.size() - 1;
  return values[idx];
}

double Median(std::vector<double> values) { return Percentile(std::move(values), 50); }

LoopUsage UsageNow() {
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  auto us = [](const struct timeval& t) {
    return static_cast<int64_t>(t.tv_sec) * 1000000 + static_cast<int64_t>(t.tv_usec);
  };
  LoopUsage u;
  u.cpu_us = us(ru.ru_utime) + us(ru.ru_stime);
  u.voluntary = ru.ru_nvcsw;
  u.involuntary = ru.ru_nivcsw;
  return u;
}

std::string FormatLoopUsage(const LoopUsage& start, const LoopUsage& now) {
  char line[96];
  std::snprintf(line, sizeof line, "loop_usage %lld %lld %lld\n",
                static_cast<long long>(now.cpu_us - start.cpu_us),
                static_cast<long long>(now.voluntary - start.voluntary),
                static_cast<long long>(now.involuntary - start.involuntary));
  return line;
}

bool FindLoopUsage(const std::string& text, LoopUsage* out) {
  static const char kKey[] = "loop_usage ";
  bool found = false;
  for (size_t at = text.find(kKey); at != std::string::npos; at = text.find(kKey, at + 1)) {
    if (at != 0 && text[at - 1] != '\n') continue;
    long long c = 0, v = 0, i = 0;
    if (std::sscanf(text.c_str() + at + std::strlen(kKey), "%lld %lld %lld", &c, &v, &i) != 3)
      continue;
    *out = LoopUsage{c, v, i};
    found = true;
  }
  return found;
}

}  // namespace dyad::emu
