#include "transport/host_id.h"

#include <unistd.h>

#include <cstdio>

namespace dyad {
namespace {

std::string BootId() {
  std::string out;
  if (FILE* f = std::fopen("/proc/sys/kernel/random/boot_id", "re")) {
    char line[64] = {};
    if (std::fgets(line, sizeof(line), f) != nullptr) out = line;
    std::fclose(f);
  }
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string Compute() {
  std::string out = BootId();
  if (out.empty()) return out;
  for (const char* ns : {"ipc", "pid", "mnt"}) {
    char target[128] = {};
    const std::string link = std::string("/proc/self/ns/") + ns;
    const ssize_t n = ::readlink(link.c_str(), target, sizeof(target) - 1);
    if (n <= 0) return std::string();
    out += '/';
    out.append(target, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

const std::string& SameHostId() {
  static const std::string id = Compute();
  return id;
}

}  // namespace dyad
