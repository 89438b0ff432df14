#include "emu/pattern.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "common/net.h"

namespace dyad::emu {
namespace {

constexpr size_t kChunk = 1u << 20;

inline uint64_t Word(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

uint64_t PatternSeed(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

void FillPattern(uint64_t seed, uint64_t offset, void* buf, size_t len) {
  unsigned char* out = static_cast<unsigned char*>(buf);
  // Leading partial word.
  while (len > 0 && (offset & 7) != 0) {
    const uint64_t w = Word(seed, offset >> 3);
    *out++ = static_cast<unsigned char>(w >> (8 * (offset & 7)));
    ++offset;
    --len;
  }
  uint64_t index = offset >> 3;
  while (len >= 8) {
    const uint64_t w = Word(seed, index++);
    std::memcpy(out, &w, 8);  // little-endian hosts: byte k of the word is offset 8i+k
    out += 8;
    len -= 8;
  }
  if (len > 0) {
    const uint64_t w = Word(seed, index);
    for (size_t k = 0; k < len; ++k) out[k] = static_cast<unsigned char>(w >> (8 * k));
  }
}

Status WritePattern(int fd, uint64_t seed, uint64_t size) {
  std::unique_ptr<char[]> buf(new char[kChunk]);
  uint64_t off = 0;
  while (off < size) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunk, size - off));
    FillPattern(seed, off, buf.get(), n);
    DYAD_RETURN_IF_ERROR(WriteFully(fd, buf.get(), n));
    off += n;
  }
  return Status::OK();
}

Status VerifyPatternFile(const std::string& path, uint64_t seed, int64_t expect_size) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return StatusFromErrno(errno, "open '" + path + "'", DYAD_RC_BADFIO);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return StatusFromErrno(errno, "fstat '" + path + "'");
  if (expect_size >= 0 && st.st_size != expect_size)
    return Status(DYAD_RC_BADFIO, "'" + path + "' has " + std::to_string(st.st_size) +
                                      " bytes, expected " + std::to_string(expect_size));
  std::unique_ptr<char[]> got(new char[kChunk]);
  std::unique_ptr<char[]> want(new char[kChunk]);
  uint64_t off = 0;
  for (;;) {
    const ssize_t n = ::read(fd.get(), got.get(), kChunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return StatusFromErrno(errno, "read '" + path + "'", DYAD_RC_BADFIO);
    }
    if (n == 0) break;
    FillPattern(seed, off, want.get(), static_cast<size_t>(n));
    if (std::memcmp(got.get(), want.get(), static_cast<size_t>(n)) != 0) {
      size_t k = 0;
      while (got[k] == want[k]) ++k;
      return Status(DYAD_RC_BADFIO, "'" + path + "' differs from the expected content at byte " +
                                        std::to_string(off + k));
    }
    off += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

}  // namespace dyad::emu
