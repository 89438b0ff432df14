// preload_helper.cc: small programs the preload integration tests run under
// LD_PRELOAD=libdyad_wrapper.so, each exercising one way real programs open
// files (tests/integration/preload_test.cc).
//
//   write-openat DIR NAME SIZE [HOLD_MS]  openat(dirfd, NAME, O_RDWR|O_CREAT),
//       write SIZE bytes, read them back through the same descriptor, keep
//       the file open HOLD_MS more, close.
//   fork-produce DIR N SIZE   fork N children, each writes DIR/fork<i>.dat
//       with fopen("wb"); the parent writes DIR/parent.dat after the forks.
//   write-threads DIR N SIZE  N threads at once, each writes DIR/thr<i>.dat
//       through open(O_WRONLY|O_CREAT|O_TRUNC)/write/close.
//   read-threads FILE...      one thread per file: open(O_RDONLY), read all,
//       print "<file> <size> <fnv1a64>" (in argument order).
//   write-twice DIR NAME SIZE  opens DIR/NAME for writing twice (open and
//       fopen "r+") plus an fcntl(F_DUPFD) duplicate, writes half through
//       each, closes them in turn and prints "ok" after each close.
//   write-noclose DIR NAME SIZE  writes DIR/NAME and exits without closing.
//   probe DIR                 prints the result and errno of opens outside
//       DYAD (missing file, O_CREAT|O_EXCL on an existing one, ...).
//   write-rename SRC DST SIZE  opens SRC for writing, writes half of DST's
//       content, rename(SRC, DST), writes the rest through the same
//       descriptor, waits 300 ms, closes; prints "renamed" and "closed rc=R".
//   tmpfile-link DIR NAME SIZE proc|empty  open(DIR, O_TMPFILE), writes
//       NAME's content, names it DIR/NAME with linkat (the
//       /proc/self/fd/N + AT_SYMLINK_FOLLOW form, or fd "" AT_EMPTY_PATH),
//       closes; prints "linkat rc=R errno=E".
//   calls OP SRC DST [OP SRC DST]...  one call per triple, OP one of rename,
//       renameat (directory descriptors of both names' directories and
//       their last components), noreplace / exchange (renameat2 with
//       RENAME_NOREPLACE / RENAME_EXCHANGE), link, linkat, trunc (open
//       DST with O_WRONLY|O_TRUNC, then close it; SRC unused); prints
//       "OP rc=R errno=E" (E is "kept" when a successful call left errno).
//   list DIR opendir|fdopendir  reads DIR's stream to its end, printing
//       "<name> <REG|DIR|OTHER>" per entry but . and .. ("ino0" appended
//       when d_ino is 0); then seeks to every telldir value it saw and
//       checks the next entry ("seek ok" or "seek bad at I"), rewinds and
//       reads it again ("rewind ok" or "rewind bad").
//
// File content is a function of the name, so tests can verify bytes.
// Threading: read-threads starts one thread per file; the rest is serial.
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

uint64_t Fnv(const unsigned char* p, size_t n, uint64_t h = 1469598103934665603ull) {
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::vector<unsigned char> Content(const std::string& name, size_t size) {
  std::vector<unsigned char> v(size);
  uint64_t x = Fnv(reinterpret_cast<const unsigned char*>(name.data()), name.size());
  for (size_t i = 0; i < size; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    v[i] = static_cast<unsigned char>(x >> 56);
  }
  return v;
}

bool WriteAll(int fd, const unsigned char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

int WriteOpenat(const std::string& dir, const std::string& name, size_t size, int hold_ms) {
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0) return std::perror("open dir"), 1;
  const int fd = ::openat(dfd, name.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return std::perror("openat"), 1;
  const auto data = Content(name, size);
  if (!WriteAll(fd, data.data(), data.size())) return std::perror("write"), 1;
  std::vector<unsigned char> back(size);
  if (::pread(fd, back.data(), size, 0) != static_cast<ssize_t>(size) || back != data) {
    std::fprintf(stderr, "read-back mismatch\n");
    return 1;
  }
  if (hold_ms > 0) ::usleep(static_cast<useconds_t>(hold_ms) * 1000);
  if (::close(fd) != 0) return std::perror("close"), 1;
  ::close(dfd);
  return 0;
}

int WriteStdio(const std::string& path, const std::string& name, size_t size) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return std::perror("fopen"), 1;
  const auto data = Content(name, size);
  if (std::fwrite(data.data(), 1, data.size(), f) != data.size()) return std::perror("fwrite"), 1;
  if (std::fclose(f) != 0) return std::perror("fclose"), 1;
  return 0;
}

int ForkProduce(const std::string& dir, int n, size_t size) {
  std::vector<pid_t> kids;
  for (int i = 0; i < n; ++i) {
    const pid_t pid = ::fork();
    if (pid < 0) return std::perror("fork"), 1;
    if (pid == 0) {
      const std::string name = "fork" + std::to_string(i) + ".dat";
      std::fflush(nullptr);
      ::_exit(WriteStdio(dir + "/" + name, name, size + static_cast<size_t>(i)));
    }
    kids.push_back(pid);
  }
  int rc = WriteStdio(dir + "/parent.dat", "parent.dat", size);
  for (pid_t pid : kids) {
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = 1;
  }
  return rc;
}

int WriteThreads(const std::string& dir, int n, size_t size) {
  std::vector<std::thread> threads;
  std::vector<int> rc(static_cast<size_t>(n), 0);
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      const std::string name = "thr" + std::to_string(i) + ".dat";
      const int fd = ::open((dir + "/" + name).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const auto data = Content(name, size);
      if (fd < 0 || !WriteAll(fd, data.data(), data.size()) || ::close(fd) != 0) rc[i] = 1;
    });
  }
  for (auto& t : threads) t.join();
  for (int r : rc)
    if (r != 0) return 1;
  return 0;
}

int ReadThreads(const std::vector<std::string>& files) {
  std::vector<std::string> lines(files.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < files.size(); ++i) {
    threads.emplace_back([&, i] {
      const int fd = ::open(files[i].c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        lines[i] = files[i] + " error " + std::strerror(errno);
        return;
      }
      unsigned char buf[65536];
      uint64_t h = 1469598103934665603ull, total = 0;
      for (;;) {
        const ssize_t r = ::read(fd, buf, sizeof(buf));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        h = Fnv(buf, static_cast<size_t>(r), h);
        total += static_cast<uint64_t>(r);
      }
      ::close(fd);
      char out[64];
      std::snprintf(out, sizeof(out), " %" PRIu64 " %016" PRIx64, total, h);
      lines[i] = files[i] + out;
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  return 0;
}

int WriteNoClose(const std::string& dir, const std::string& name, size_t size) {
  const int fd = ::open((dir + "/" + name).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return std::perror("open"), 1;
  const auto data = Content(name, size);
  if (!WriteAll(fd, data.data(), data.size())) return std::perror("write"), 1;
  std::exit(0);  // the descriptor is left for the kernel to close
}

int WriteTwice(const std::string& dir, const std::string& name, size_t size) {
  const std::string path = dir + "/" + name;
  const auto data = Content(name, size);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return std::perror("open"), 1;
  const int dupfd = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
  if (dupfd < 0) return std::perror("fcntl"), 1;
  FILE* f = std::fopen(path.c_str(), "r+");
  if (f == nullptr) return std::perror("fopen"), 1;
  const size_t half = size / 2;
  if (!WriteAll(fd, data.data(), half)) return std::perror("write"), 1;
  if (::close(fd) != 0) return std::perror("close"), 1;
  std::printf("closed first\n");
  std::fflush(stdout);
  if (std::fseek(f, static_cast<long>(half), SEEK_SET) != 0 ||
      std::fwrite(data.data() + half, 1, size - half, f) != size - half)
    return std::perror("fwrite"), 1;
  if (std::fclose(f) != 0) return std::perror("fclose"), 1;
  std::printf("closed second\n");
  std::fflush(stdout);
  ::usleep(300000);  // a consumer must still wait: the duplicate is open
  if (::close(dupfd) != 0) return std::perror("close dup"), 1;
  std::printf("closed last\n");
  return 0;
}

void Show(const char* what, int rc) {
  std::printf("%s rc=%d errno=%s\n", what, rc < 0 ? -1 : 0, rc < 0 ? strerrorname_np(errno) : "-");
  if (rc >= 0) ::close(rc);
}

int Probe(const std::string& dir) {
  const std::string missing = dir + "/missing-file";
  const std::string existing = dir + "/existing-file";
  const int fd = ::open(existing.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd >= 0) ::close(fd);
  errno = 0;
  Show("open-missing", ::open(missing.c_str(), O_RDONLY));
  Show("openat-missing", ::openat(AT_FDCWD, missing.c_str(), O_RDONLY));
  Show("excl-existing", ::open(existing.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644));
  Show("open-existing", ::open(existing.c_str(), O_RDONLY));
  Show("open-dir-as-file", ::open(dir.c_str(), O_WRONLY));
  FILE* f = std::fopen(missing.c_str(), "r");
  std::printf("fopen-missing %s errno=%s\n", f ? "ok" : "null", f ? "-" : strerrorname_np(errno));
  if (f) std::fclose(f);
  errno = 1234;  // a successful open must leave errno alone
  const int ok = ::open(existing.c_str(), O_RDONLY);
  std::printf("errno-after-success %d\n", errno);
  if (ok >= 0) ::close(ok);
  errno = 0;
  const int bad = ::close(-1);
  const int bad_errno = errno;
  std::printf("close-bad rc=%d errno=%s\n", bad, strerrorname_np(bad_errno));
  return 0;
}

// The content of the file named by the last component of `path`.
std::string BaseName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

int WriteRename(const std::string& src, const std::string& dst, size_t size) {
  const auto data = Content(BaseName(dst), size);
  const int fd = ::open(src.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return std::perror("open"), 1;
  const size_t half = size / 2;
  if (!WriteAll(fd, data.data(), half)) return std::perror("write"), 1;
  if (::rename(src.c_str(), dst.c_str()) != 0) return std::perror("rename"), 1;
  std::printf("renamed\n");
  std::fflush(stdout);
  if (!WriteAll(fd, data.data() + half, size - half)) return std::perror("write"), 1;
  ::usleep(300000);  // a consumer of DST must still wait: the file is open
  const int rc = ::close(fd);
  std::printf("closed rc=%d%s%s\n", rc,
              rc == 0 ? "" : " errno=", rc == 0 ? "" : strerrorname_np(errno));
  return 0;
}

int TmpfileLink(const std::string& dir, const std::string& name, size_t size,
                const std::string& form) {
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return std::perror("open O_TMPFILE"), 1;
  const auto data = Content(name, size);
  if (!WriteAll(fd, data.data(), data.size())) return std::perror("write"), 1;
  const std::string dst = dir + "/" + name;
  int rc;
  if (form == "empty") {
    rc = ::linkat(fd, "", AT_FDCWD, dst.c_str(), AT_EMPTY_PATH);
  } else {
    const std::string proc = "/proc/self/fd/" + std::to_string(fd);
    rc = ::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, dst.c_str(), AT_SYMLINK_FOLLOW);
  }
  std::printf("linkat rc=%d errno=%s\n", rc, rc == 0 ? "-" : strerrorname_np(errno));
  if (::close(fd) != 0) return std::perror("close"), 1;
  return 0;
}

int Calls(const std::vector<std::string>& args) {
  for (size_t i = 0; i + 3 <= args.size(); i += 3) {
    const std::string& op = args[i];
    const std::string &src = args[i + 1], &dst = args[i + 2];
    const int sdir = ::open(DirName(src).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const int ddir = ::open(DirName(dst).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    const std::string sbase = BaseName(src), dbase = BaseName(dst);
    errno = 1234;
    int rc = -2;
    if (op == "rename") rc = ::rename(src.c_str(), dst.c_str());
    if (op == "renameat") rc = ::renameat(sdir, sbase.c_str(), ddir, dbase.c_str());
    if (op == "noreplace")
      rc = ::renameat2(AT_FDCWD, src.c_str(), AT_FDCWD, dst.c_str(), RENAME_NOREPLACE);
    if (op == "exchange")
      rc = ::renameat2(AT_FDCWD, src.c_str(), AT_FDCWD, dst.c_str(), RENAME_EXCHANGE);
    if (op == "link") rc = ::link(src.c_str(), dst.c_str());
    if (op == "linkat") rc = ::linkat(sdir, sbase.c_str(), ddir, dbase.c_str(), 0);
    if (op == "trunc") {
      const int fd = ::open(dst.c_str(), O_WRONLY | O_TRUNC | O_CLOEXEC);
      rc = fd >= 0 ? 0 : -1;
      const int open_errno = errno;  // what the open left, not the close
      if (fd >= 0) ::close(fd);
      errno = open_errno;
    }
    if (rc == -2) return std::fprintf(stderr, "unknown call %s\n", op.c_str()), 2;
    std::printf("%s rc=%d errno=%s\n", op.c_str(), rc,
                rc == 0 ? (errno == 1234 ? "kept" : "changed") : strerrorname_np(errno));
    if (sdir >= 0) ::close(sdir);
    if (ddir >= 0) ::close(ddir);
  }
  return 0;
}

// One pass over a directory stream: names in stream order.
std::vector<std::string> ReadNames(DIR* dir, std::vector<long>* tells) {
  std::vector<std::string> names;
  while (const struct dirent* e = ::readdir(dir)) {
    names.emplace_back(e->d_name);
    if (tells != nullptr) tells->push_back(::telldir(dir));
  }
  return names;
}

int List(const std::string& path, const std::string& how) {
  DIR* dir = nullptr;
  if (how == "fdopendir") {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) dir = ::fdopendir(fd);
  } else {
    dir = ::opendir(path.c_str());
  }
  if (dir == nullptr)
    return std::fprintf(stderr, "open %s: %s\n", path.c_str(), strerror(errno)), 1;
  std::vector<std::string> names;
  std::vector<long> tells;
  while (const struct dirent* e = ::readdir(dir)) {
    names.emplace_back(e->d_name);
    tells.push_back(::telldir(dir));
    if (names.back() == "." || names.back() == "..") continue;
    std::printf("%s %s%s\n", e->d_name,
                e->d_type == DT_REG   ? "REG"
                : e->d_type == DT_DIR ? "DIR"
                                      : "OTHER",
                e->d_ino == 0 ? " ino0" : "");
  }
  bool seek_ok = true;
  for (size_t i = 0; i < tells.size() && seek_ok; ++i) {
    ::seekdir(dir, tells[i]);
    const struct dirent* e = ::readdir(dir);
    const bool want_end = i + 1 == names.size();
    seek_ok = want_end ? e == nullptr : (e != nullptr && names[i + 1] == e->d_name);
    if (!seek_ok) std::printf("seek bad at %zu\n", i);
  }
  if (seek_ok) std::printf("seek ok\n");
  ::rewinddir(dir);
  std::printf(ReadNames(dir, nullptr) == names ? "rewind ok\n" : "rewind bad\n");
  ::closedir(dir);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  const std::string cmd = argv[1];
  if (cmd == "write-openat" && argc >= 5)
    return WriteOpenat(argv[2], argv[3], std::strtoull(argv[4], nullptr, 10),
                       argc >= 6 ? std::atoi(argv[5]) : 0);
  if (cmd == "fork-produce" && argc == 5)
    return ForkProduce(argv[2], std::atoi(argv[3]), std::strtoull(argv[4], nullptr, 10));
  if (cmd == "write-threads" && argc == 5)
    return WriteThreads(argv[2], std::atoi(argv[3]), std::strtoull(argv[4], nullptr, 10));
  if (cmd == "read-threads" && argc >= 3)
    return ReadThreads(std::vector<std::string>(argv + 2, argv + argc));
  if (cmd == "write-noclose" && argc == 5)
    return WriteNoClose(argv[2], argv[3], std::strtoull(argv[4], nullptr, 10));
  if (cmd == "write-twice" && argc == 5)
    return WriteTwice(argv[2], argv[3], std::strtoull(argv[4], nullptr, 10));
  if (cmd == "probe" && argc == 3) return Probe(argv[2]);
  if (cmd == "list" && argc == 4) return List(argv[2], argv[3]);
  if (cmd == "write-rename" && argc == 5)
    return WriteRename(argv[2], argv[3], std::strtoull(argv[4], nullptr, 10));
  if (cmd == "tmpfile-link" && argc == 6)
    return TmpfileLink(argv[2], argv[3], std::strtoull(argv[4], nullptr, 10), argv[5]);
  if (cmd == "calls" && argc >= 5 && (argc - 2) % 3 == 0)
    return Calls(std::vector<std::string>(argv + 2, argv + argc));
  std::fprintf(stderr, "usage: see preload_helper.cc\n");
  return 2;
}
