// util.h: what most tests need and used to write out themselves: a
// temporary directory removed with everything in it at the end of its
// scope, a whole file read or written in one call, and a bounded wait for a
// condition. Unit and integration tests include it as "util.h"; the shared
// helpers (tests/unit/service_pair.h, client_test_util.h,
// tests/integration/integration_util.h, ops_util.h) bring these names into
// their own namespaces.
//
// Threading: every function is safe to call from any thread; a TempDir
// belongs to the thread that owns its scope.
#pragma once

#include <dirent.h>
#include <stdlib.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace dyad {
namespace testutil {

// Threads of process `pid` (entries of /proc/PID/task; 0: this process);
// 0 if it is gone.
inline size_t ThreadsOf(pid_t pid = 0) {
  const std::string dir =
      pid == 0 ? std::string("/proc/self/task") : "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  size_t n = 0;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++n;
  ::closedir(d);
  return n;
}

// Removes `path` and everything under it; nothing when it is empty or gone.
// Directories a test made unwritable or unsearchable are opened up first.
inline bool RemoveTree(const std::string& path) {
  namespace fs = std::filesystem;
  if (path.empty()) return true;
  std::error_code ec;
  fs::remove_all(path, ec);
  if (!ec) return true;
  ec.clear();
  if (fs::is_directory(fs::symlink_status(path, ec))) {
    fs::permissions(path, fs::perms::owner_all, fs::perm_options::add, ec);
    for (auto it = fs::recursive_directory_iterator(path, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      std::error_code ignored;
      if (it->is_directory(ignored) && !it->is_symlink(ignored))
        fs::permissions(it->path(), fs::perms::owner_all, fs::perm_options::add, ignored);
    }
  }
  ec.clear();
  fs::remove_all(path, ec);
  return !ec;
}

// A fresh private directory (mkdtemp: mode 0700) named
// <parent>/<prefix>XXXXXX, or "" when it could not be made. Short by
// default, so the Unix socket paths tests put inside stay under the
// 108-byte limit.
inline std::string MakeTempDir(const std::string& prefix = "dyad-test.",
                               const std::string& parent = "/tmp") {
  std::string tmpl = parent + "/" + prefix + "XXXXXX";
  if (::mkdtemp(tmpl.data()) == nullptr) return std::string();
  return tmpl;
}

// A temporary directory for one scope (a test, a fixture): created at
// construction, removed recursively at destruction, also when the test
// failed. path() is "" when it could not be made; tests ASSERT on ok().
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "dyad-test.", const std::string& parent = "/tmp")
      : path_(MakeTempDir(prefix, parent)) {}
  ~TempDir() { RemoveTree(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  TempDir(TempDir&& o) noexcept : path_(std::exchange(o.path_, std::string())) {}
  TempDir& operator=(TempDir&&) = delete;

  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  // `rel` inside the directory.
  std::string Sub(const std::string& rel) const { return path_ + "/" + rel; }

 private:
  std::string path_;
};

// The names in directory `dir` ("." and ".." left out), in the order the
// directory lists them; empty when it cannot be read.
inline std::vector<std::string> NamesIn(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") out.push_back(n);
  }
  ::closedir(d);
  return out;
}

// The whole content of `path`, or "" when it cannot be read.
inline std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
// (The name the integration tests use for log files and the like.)
inline std::string ReadText(const std::string& path) { return ReadAll(path); }

// Replaces the content of `path` with `data` (creates the file, not its
// directories); false when it cannot be written.
inline bool WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
  out.close();
  return static_cast<bool>(out);
}

// Polls `pred` every `poll_ms` until it is true or `timeout_ms` passed;
// returns its last answer (checked once more at the deadline).
template <typename F>
bool Eventually(F pred, int64_t timeout_ms = 10000, int64_t poll_ms = 10) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
  return pred();
}

}  // namespace testutil
}  // namespace dyad
