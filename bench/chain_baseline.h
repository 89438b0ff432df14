// chain_baseline.h: the "minimal blocking-socket chain" of dyad-small-files:
// the two round trips of a consume and the creation of the copy, with
// nothing else, as the baseline of the consume figure (issue 28).
//
// Three processes, each started on its emulated node:
//   owner    (node A) listens on TCP; for each request (a path relative to
//            its managed directory) it opens the file, reads it and sends
//            its size, mtime and bytes in one write;
//   relay    (node B) is connected to the owner (TCP_NODELAY) and listens
//            on a Unix socket; for each request of its client it asks the
//            owner, then creates the copy the way a placement does (an
//            unnamed O_TMPFILE file, write, futimens, a version xattr,
//            linkat to its name) and answers one status word;
//   consumer (node B) sends each path of a manifest and waits for the
//            answer, one after another, timing each call.
// Blocking sockets, one thread per process, no framing beyond a length, no
// authentication, no integrity, no lock, no record lookup, parent
// directories' descriptors kept open: the least a mover of these files
// does. Linked into dyad-small-files, which runs itself in these roles.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench_util.h"
#include "common/time.h"
#include "emu/worker.h"

namespace dyad::bench::chain {

// The whole of `len` bytes, or false (the peer is gone, or an error).
inline bool ReadFull(int fd, void* buf, size_t len) {
  auto* p = static_cast<char*>(buf);
  while (len > 0) {
    const ssize_t n = ::read(fd, p, len);
    if (n == 0) return false;
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

inline bool WriteFull(int fd, iovec* iov, int n) {
  while (n > 0) {
    const ssize_t w = ::writev(fd, iov, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    size_t left = static_cast<size_t>(w);
    while (n > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --n;
    }
    if (n > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return true;
}

// A request: a 32-bit length, then the path.
inline bool ReadRequest(int fd, std::string* path) {
  uint32_t len = 0;
  if (!ReadFull(fd, &len, sizeof len) || len == 0 || len > 4096) return false;
  path->resize(len);
  return ReadFull(fd, path->data(), len);
}

inline bool SendRequest(int fd, const std::string& path) {
  uint32_t len = static_cast<uint32_t>(path.size());
  iovec iov[2] = {{&len, sizeof len}, {const_cast<char*>(path.data()), path.size()}};
  return WriteFull(fd, iov, 2);
}

// The owner's answer: size (negative: -errno), mtime in ns, then the bytes.
struct Answer {
  int64_t size = 0;
  int64_t mtime_ns = 0;
};

// Writes "<text>" as the role's ready file (temporary name, then rename).
inline void Ready(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return;
  std::fputs(text.c_str(), f);
  std::fclose(f);
  ::rename(tmp.c_str(), path.c_str());
}

// owner: serves one connection, then exits.
inline int Owner(const std::string& dir, const std::string& ip, const std::string& ready) {
  const int root = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  if (root < 0 || ls < 0 || ::inet_pton(AF_INET, ip.c_str(), &sa.sin_addr) != 1 ||
      ::bind(ls, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || ::listen(ls, 4) != 0) {
    std::fprintf(stderr, "chain owner: %s\n", std::strerror(errno));
    return 1;
  }
  socklen_t sl = sizeof sa;
  ::getsockname(ls, reinterpret_cast<sockaddr*>(&sa), &sl);
  Ready(ready, std::to_string(ntohs(sa.sin_port)) + "\n");
  const int c = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
  if (c < 0) return 1;
  int one = 1;
  ::setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const emu::LoopUsage start = emu::UsageNow();
  std::string path, data;
  for (;;) {
    if (!ReadRequest(c, &path)) break;
    Answer a;
    const int fd = ::openat(root, path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat st;
    if (fd < 0 || ::fstat(fd, &st) != 0) {
      a.size = -errno;
    } else {
      data.resize(static_cast<size_t>(st.st_size));
      a.size = ReadFull(fd, data.data(), data.size()) ? st.st_size : -EIO;
      a.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
    }
    if (fd >= 0) ::close(fd);
    iovec iov[2] = {{&a, sizeof a}, {data.data(), a.size > 0 ? static_cast<size_t>(a.size) : 0}};
    if (!WriteFull(c, iov, a.size > 0 ? 2 : 1)) break;
  }
  std::fputs(emu::FormatLoopUsage(start, emu::UsageNow()).c_str(), stdout);
  return 0;
}

// The relay's directories: the descriptor of each parent made, kept open.
class Dirs {
 public:
  explicit Dirs(int root) : root_(root) {}
  int Parent(const std::string& rel) {
    const size_t slash = rel.rfind('/');
    if (slash == std::string::npos) return root_;
    const std::string parent = rel.substr(0, slash);
    auto it = fds_.find(parent);
    if (it != fds_.end()) return it->second;
    const int up = Parent(parent);
    const std::string leaf = parent.substr(parent.rfind('/') + 1);
    ::mkdirat(up, leaf.c_str(), 0755);
    const int fd = ::openat(up, leaf.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd >= 0) fds_[parent] = fd;
    return fd;
  }

 private:
  int root_;
  std::map<std::string, int> fds_;
};

// relay: one owner link, one client, then exits.
inline int Relay(const std::string& dir, const std::string& owner_ip, uint16_t owner_port,
                 const std::string& socket_path, const std::string& ready) {
  const int root = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  const int up = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(owner_port);
  if (root < 0 || up < 0 || ::inet_pton(AF_INET, owner_ip.c_str(), &sa.sin_addr) != 1 ||
      ::connect(up, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0) {
    std::fprintf(stderr, "chain relay: to the owner: %s\n", std::strerror(errno));
    return 1;
  }
  int one = 1;
  ::setsockopt(up, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const int ls = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un su{};
  su.sun_family = AF_UNIX;
  std::snprintf(su.sun_path, sizeof su.sun_path, "%s", socket_path.c_str());
  ::unlink(socket_path.c_str());
  if (ls < 0 || ::bind(ls, reinterpret_cast<sockaddr*>(&su), sizeof su) != 0 ||
      ::listen(ls, 4) != 0) {
    std::fprintf(stderr, "chain relay: %s: %s\n", socket_path.c_str(), std::strerror(errno));
    return 1;
  }
  Ready(ready, "ready\n");
  const int c = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC);
  if (c < 0) return 1;
  Dirs dirs(root);
  const emu::LoopUsage start = emu::UsageNow();
  std::string path, data;
  for (;;) {
    if (!ReadRequest(c, &path)) break;
    int32_t status = 0;
    Answer a;
    if (!SendRequest(up, path) || !ReadFull(up, &a, sizeof a)) {
      status = ECONNRESET;
    } else if (a.size < 0) {
      status = static_cast<int32_t>(-a.size);
    } else {
      data.resize(static_cast<size_t>(a.size));
      if (!ReadFull(up, data.data(), data.size())) status = ECONNRESET;
    }
    if (status == 0) {
      const int parent = dirs.Parent(path);
      const std::string leaf = path.substr(path.rfind('/') + 1);
      const int fd =
          parent < 0 ? -1 : ::openat(parent, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
      char proc[64];
      std::snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
      const timespec times[2] = {{0, UTIME_OMIT},
                                 {static_cast<time_t>(a.mtime_ns / 1000000000),
                                  static_cast<long>(a.mtime_ns % 1000000000)}};
      if (fd < 0 || ::write(fd, data.data(), data.size()) != static_cast<ssize_t>(data.size()) ||
          ::futimens(fd, times) != 0 ||
          ::fsetxattr(fd, "user.chain.version", &a, sizeof a, 0) != 0 ||
          ::linkat(AT_FDCWD, proc, parent, leaf.c_str(), AT_SYMLINK_FOLLOW) != 0)
        status = errno != 0 ? errno : EIO;
      if (fd >= 0) ::close(fd);
    }
    iovec iov[1] = {{&status, sizeof status}};
    if (!WriteFull(c, iov, 1)) break;
  }
  std::fputs(emu::FormatLoopUsage(start, emu::UsageNow()).c_str(), stdout);
  return 0;
}

// consumer: asks for every file of `manifest`, one after another; prints
// "chain <files/s> <p50 ms> <p99 ms> <failures>".
inline int Consumer(const std::string& socket_path, const std::string& manifest,
                    const std::string& dir) {
  auto files = emu::ReadManifest(manifest);
  const int s = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un su{};
  su.sun_family = AF_UNIX;
  std::snprintf(su.sun_path, sizeof su.sun_path, "%s", socket_path.c_str());
  if (!files.ok() || s < 0 || ::connect(s, reinterpret_cast<sockaddr*>(&su), sizeof su) != 0) {
    std::fprintf(stderr, "chain consumer: %s\n",
                 files.ok() ? std::strerror(errno) : files.status().ToString().c_str());
    return 1;
  }
  std::vector<double> lat;
  lat.reserve(files->size());
  int failures = 0;
  const emu::LoopUsage start = emu::UsageNow();
  const uint64_t first = MonoNs();
  uint64_t last = first;
  for (const auto& f : *files) {
    const uint64_t t0 = MonoNs();
    int32_t status = -1;
    if (!SendRequest(s, f.name) || !ReadFull(s, &status, sizeof status)) return 1;
    last = MonoNs();
    lat.push_back(static_cast<double>(last - t0) / 1e6);
    if (status != 0) ++failures;
  }
  const emu::LoopUsage end = emu::UsageNow();
  // The copies are checked after the timed loop, as the DYAD consumer's are.
  for (const auto& f : *files) {
    struct stat st;
    if (::stat((dir + "/" + f.name).c_str(), &st) != 0 || (f.size >= 0 && st.st_size != f.size))
      ++failures;
  }
  std::printf("chain %.1f %.4f %.4f %d\n", Rate(files->size(), first, last),
              emu::Percentile(lat, 50), emu::Percentile(lat, 99), failures);
  std::fputs(emu::FormatLoopUsage(start, end).c_str(), stdout);
  return failures == 0 ? 0 : 1;
}

}  // namespace dyad::bench::chain
