// stream_worker.cc: a small program the stream integration tests run on an
// emulated node (tests/integration/stream_test.cc). It uses only the public
// stream header, with DYAD initialized from the node's environment, and
// exits 0 after printing "ok ..." when everything it checked held, or 1
// with the reason on stderr.
//
//   dyad_stream_worker mode                  prints "adopt" or "portable"
//   dyad_stream_worker write  PATH N [--no-close]   ofstream_dyad, N lines
//   dyad_stream_worker read   PATH N         ifstream_dyad, checks N lines
//   dyad_stream_worker wwrite PATH N         wofstream_dyad, UTF-8 locale
//   dyad_stream_worker wread  PATH N         wifstream_dyad, checks the text
//   dyad_stream_worker frw    PATH N         fstream_dyad in|out|trunc: write,
//                                            read back, close (publishes)
//   dyad_stream_worker fread  PATH N         fstream_dyad opened for input
//   dyad_stream_worker lock   PATH           the file is locked while open
//                                            and unlocked after close
//   dyad_stream_worker truncwait PATH        a writer waits for a reader's
//                                            shared lock before truncating
//
// Single-threaded.
#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include <dyad/stream/dyad_stream_api.hpp>

#include <atomic>
#include <chrono>
#include <clocale>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <locale>
#include <string>
#include <thread>

namespace {

int Fail(const std::string& what, const dyad::dyad_stream_core& core) {
  std::cerr << "FAIL: " << what;
  if (!core.last_error().empty()) std::cerr << " (dyad: " << core.last_error() << ")";
  std::cerr << std::endl;
  return 1;
}

std::string Line(int i) { return "line " + std::to_string(i) + " of the stream test"; }
std::wstring WideLine(int i) {
  return L"Gr\u00fc\u00dfe \u4e16\u754c \u2713 " + std::to_wstring(i);
}

std::locale Utf8() {
  for (const char* name : {"C.UTF-8", "C.utf8", "en_US.UTF-8"}) {
    try {
      return std::locale(name);
    } catch (const std::exception&) {
    }
  }
  std::cerr << "no UTF-8 locale" << std::endl;
  std::exit(2);
}

int Write(const char* path, int n, bool close) {
  dyad::ofstream_dyad ofs(path);
  if (!ofs.is_open()) return Fail(std::string("open ") + path, ofs.core());
  for (int i = 0; i < n; ++i) ofs << Line(i) << '\n';
  ofs.flush();
  if (!ofs) return Fail("write", ofs.core());
  if (close) {
    ofs.close();
    if (!ofs) return Fail("close/publish", ofs.core());
  }
  std::cout << "ok wrote " << n << (close ? " (closed)" : " (destructor)") << std::endl;
  return 0;  // without close: the destructor publishes
}

template <typename In>
int CheckLines(In& in, int n) {
  std::string line;
  int i = 0;
  while (getline(in, line)) {  // dyad::getline, by argument-dependent lookup
    if (i >= n || line != Line(i))
      return Fail("line " + std::to_string(i) + ": '" + line + "'", in.core());
    ++i;
  }
  if (i != n)
    return Fail("read " + std::to_string(i) + " lines, expected " + std::to_string(n), in.core());
  std::cout << "ok read " << i << std::endl;
  return 0;
}

int Read(const char* path, int n) {
  dyad::ifstream_dyad ifs(path);
  if (!ifs.is_open()) return Fail(std::string("open ") + path, ifs.core());
  return CheckLines(ifs, n);
}

int WideWrite(const char* path, int n) {
  dyad::wofstream_dyad ofs;  // imbue before open: the locale must survive open()
  ofs.imbue(Utf8());
  ofs.open(path);
  if (!ofs.is_open()) return Fail(std::string("open ") + path, ofs.core());
  for (int i = 0; i < n; ++i) ofs.get_stream() << WideLine(i) << L'\n';
  ofs.close();
  if (!ofs) return Fail("wide write/close", ofs.core());
  std::cout << "ok wrote " << n << std::endl;
  return 0;
}

int WideRead(const char* path, int n) {
  dyad::wifstream_dyad ifs;
  ifs.imbue(Utf8());
  ifs.open(path);
  if (!ifs.is_open()) return Fail(std::string("open ") + path, ifs.core());
  std::wstring line;
  int i = 0;
  while (std::getline(ifs.get_stream(), line)) {
    if (i >= n || line != WideLine(i))
      return Fail("wide line " + std::to_string(i) + " differs", ifs.core());
    ++i;
  }
  if (i != n) return Fail("read " + std::to_string(i) + " wide lines", ifs.core());
  std::cout << "ok read " << i << std::endl;
  return 0;
}

int FstreamReadWrite(const char* path, int n) {
  dyad::fstream_dyad fs(path, std::ios::in | std::ios::out | std::ios::trunc);
  if (!fs.is_open()) return Fail(std::string("open ") + path, fs.core());
  for (int i = 0; i < n; ++i) fs << Line(i) << std::endl;
  fs.seekg(0, std::ios::beg);
  if (int rc = CheckLines(fs, n)) return rc;
  fs.clear();  // getline hit end of file
  fs.close();
  if (!fs) return Fail("close/publish", fs.core());
  return 0;
}

int FstreamRead(const char* path, int n) {
  dyad::fstream_dyad fs(path, std::ios::in);
  if (!fs.is_open()) return Fail(std::string("open ") + path, fs.core());
  return CheckLines(fs, n);
}

// True when another open file description can take a shared lock now, as
// dyad-service does before it serves a file.
bool SharedLockFree(const char* path) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const bool free = ::flock(fd, LOCK_SH | LOCK_NB) == 0;
  ::close(fd);
  return free;
}

int Lock(const char* path) {
  dyad::ofstream_dyad ofs(path);
  if (!ofs.is_open()) return Fail(std::string("open ") + path, ofs.core());
  ofs << Line(0) << '\n';
  if (SharedLockFree(path)) return Fail("no exclusive lock while the stream is open", ofs.core());
  ofs.close();
  if (!ofs) return Fail("close/publish", ofs.core());
  if (!SharedLockFree(path)) return Fail("still locked after close", ofs.core());
  struct stat st;
  if (::stat(path, &st) != 0 || st.st_size != static_cast<off_t>(Line(0).size() + 1))
    return Fail("size after close", ofs.core());
  std::cout << "ok locked while open" << std::endl;
  return 0;
}

// A writer must not truncate a file someone reads under a shared lock (as
// dyad-service does while serving it): the open waits for the lock, and
// the old content stays intact until then.
int TruncateWaits(const char* path) {
  { std::ofstream(path) << "old version\n"; }
  const int reader = ::open(path, O_RDONLY | O_CLOEXEC);
  if (reader < 0 || ::flock(reader, LOCK_SH) != 0) {
    std::cerr << "FAIL: cannot lock " << path << std::endl;
    return 1;
  }
  std::atomic<int> state{0};  // 1: opened, 2: written and closed, -1: failed
  std::string error;
  std::thread writer([&] {
    dyad::ofstream_dyad ofs(path);
    if (!ofs.is_open()) {
      error = "open: " + ofs.core().last_error();
      state = -1;
      return;
    }
    state = 1;
    ofs << "new version\n";
    ofs.close();
    if (!ofs) error = "close: " + ofs.core().last_error();
    state = ofs ? 2 : -1;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int before = state.load();
  std::ifstream in(path);
  std::string seen;
  std::getline(in, seen);
  ::flock(reader, LOCK_UN);
  ::close(reader);
  writer.join();
  if (before != 0) {
    std::cerr << "FAIL: the writer opened while the file was locked" << std::endl;
    return 1;
  }
  if (seen != "old version") {
    std::cerr << "FAIL: the file was truncated before the lock: '" << seen << "'" << std::endl;
    return 1;
  }
  if (state != 2) {
    std::cerr << "FAIL: " << error << std::endl;
    return 1;
  }
  std::cout << "ok truncated only under the lock" << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: dyad_stream_worker mode|write|read|wwrite|wread|frw|fread|lock ..."
              << std::endl;
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "mode") {
#if defined(DYAD_STREAM_ADOPTS_FD)
    std::cout << "adopt" << std::endl;
#else
    std::cout << "portable" << std::endl;
#endif
    return 0;
  }
  if (argc < 3) return 2;
  const char* path = argv[2];
  const int n = argc > 3 ? std::atoi(argv[3]) : 0;
  if (cmd == "write") return Write(path, n, !(argc > 4 && std::strcmp(argv[4], "--no-close") == 0));
  if (cmd == "read") return Read(path, n);
  if (cmd == "wwrite") return WideWrite(path, n);
  if (cmd == "wread") return WideRead(path, n);
  if (cmd == "frw") return FstreamReadWrite(path, n);
  if (cmd == "fread") return FstreamRead(path, n);
  if (cmd == "lock") return Lock(path);
  if (cmd == "truncwait") return TruncateWaits(path);
  std::cerr << "unknown command " << cmd << std::endl;
  return 2;
}
