// scale_raw.h: the raw TCP baseline of dyad-scale (header-only, bench only).
//
// A file server per emulated node (a listening socket made inside the
// node's namespace, one thread per connection) and its client: a request is
// a u32 name length and a name relative to the node's raw directory; the
// reply a u64 size (UINT64_MAX: cannot open) and the bytes (sendfile). No
// DYAD, no authentication, no integrity check on the wire: the floor that
// DYAD's figures are compared with. Names with ".." are refused. BuildMesh
// starts a server on every node and opens the consumer-to-producer
// connections a pattern needs, each from inside the consumer's namespace,
// before the clock starts.
#pragma once

#include <fcntl.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/net.h"
#include "common/status.h"
#include "emu/cluster.h"
#include "emu/netns.h"

namespace dyad::bench {

constexpr uint16_t kRawPort = 7700;

inline Status ReadExactly(int fd, void* buf, size_t len) {
  auto* p = static_cast<char*>(buf);
  while (len > 0) {
    const ssize_t n = ::recv(fd, p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status(DYAD_RC_CONNLOST, "raw: connection closed or timed out");
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::OK();
}

// Serves <node dmd>/raw from node `node`'s address, port kRawPort.
class RawServer {
 public:
  static Result<std::unique_ptr<RawServer>> Start(emu::EmuCluster& c, int node) {
    std::unique_ptr<RawServer> s(new RawServer);
    s->root_ = c.node(node).dmd + "/raw";
    auto addr = ParseAddress(c.node(node).ip + ":" + std::to_string(kRawPort));
    if (!addr.ok()) return addr.status();
    Result<UniqueFd> l(Status(DYAD_RC_SYSFAIL, "not run"));
    DYAD_RETURN_IF_ERROR(emu::RunInNetns(c.node(node).netns, [&] { l = Listen(*addr); }));
    if (!l.ok()) return l.status();
    s->listen_ = std::move(*l);
    s->accept_ = std::thread([p = s.get()] { p->AcceptLoop(); });
    return s;
  }
  ~RawServer() {
    stop_ = true;
    ::shutdown(listen_.get(), SHUT_RDWR);
    accept_.join();
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& fd : conns_) ::shutdown(fd->get(), SHUT_RDWR);
    for (std::thread& t : threads_) t.join();
  }

 private:
  RawServer() = default;
  void AcceptLoop() {
    while (!stop_) {
      Result<UniqueFd> fd = Accept(listen_.get(), Deadline::AfterMs(200));
      if (!fd.ok()) continue;
      // Closed by the destructor, after its thread is joined.
      auto owned = std::make_shared<UniqueFd>(std::move(*fd));
      std::lock_guard<std::mutex> l(mu_);
      conns_.push_back(owned);
      threads_.emplace_back([this, owned] { Serve(owned->get()); });
    }
  }
  void Serve(int fd) {
    for (;;) {
      uint32_t len = 0;
      if (!ReadExactly(fd, &len, sizeof len).ok() || len == 0 || len > 4096) return;
      std::string name(len, '\0');
      if (!ReadExactly(fd, name.data(), len).ok() || name.find("..") != std::string::npos) return;
      UniqueFd f(::open((root_ + "/" + name).c_str(), O_RDONLY | O_CLOEXEC));
      struct stat st;
      uint64_t size = UINT64_MAX;
      if (f.valid() && ::fstat(f.get(), &st) == 0) size = static_cast<uint64_t>(st.st_size);
      if (!WriteFully(fd, &size, sizeof size).ok()) return;
      off_t off = 0;
      while (size != UINT64_MAX && static_cast<uint64_t>(off) < size) {
        if (::sendfile(fd, f.get(), &off, size - static_cast<uint64_t>(off)) <= 0) return;
      }
    }
  }
  std::string root_;
  UniqueFd listen_;
  std::atomic<bool> stop_{false};
  std::thread accept_;
  std::mutex mu_;
  std::vector<std::shared_ptr<UniqueFd>> conns_;
  std::vector<std::thread> threads_;
};

// Fetches `name` over `fd` into `dest` (file -> TCP -> file, in chunks).
inline Status RawFetch(int fd, const std::string& name, const std::string& dest) {
  const uint32_t len = static_cast<uint32_t>(name.size());
  DYAD_RETURN_IF_ERROR(WriteFully(fd, &len, sizeof len));
  DYAD_RETURN_IF_ERROR(WriteFully(fd, name.data(), name.size()));
  uint64_t size = 0;
  DYAD_RETURN_IF_ERROR(ReadExactly(fd, &size, sizeof size));
  if (size == UINT64_MAX) return Status(DYAD_RC_NOTFOUND, "raw: no file " + name);
  UniqueFd out(::open(dest.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!out.valid()) return StatusFromErrno(errno, "create " + dest);
  std::vector<char> buf(1 << 20);
  while (size > 0) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(size, buf.size()));
    DYAD_RETURN_IF_ERROR(ReadExactly(fd, buf.data(), n));
    DYAD_RETURN_IF_ERROR(WriteFully(out.get(), buf.data(), n));
    size -= n;
  }
  return Status::OK();
}

// One raw server per node and, per consumer, one connection per producer
// (made from inside the consumer's namespace before the clock starts).
struct RawMesh {
  std::vector<std::unique_ptr<RawServer>> servers;
  std::vector<std::vector<UniqueFd>> conns;  // [consumer][producer], invalid where unused
};

inline Status BuildMesh(emu::EmuCluster& c, const std::vector<std::pair<int, int>>& pairs,
                        RawMesh* mesh) {
  const int n = c.size();
  for (int i = 0; i < n; ++i) {
    auto s = RawServer::Start(c, i);
    if (!s.ok()) return s.status();
    mesh->servers.push_back(std::move(*s));
  }
  mesh->conns.resize(static_cast<size_t>(n));
  for (auto& row : mesh->conns) row.resize(static_cast<size_t>(n));
  for (const auto& [j, p] : pairs) {
    auto fd =
        c.ConnectFrom(j, c.node(p).ip + ":" + std::to_string(kRawPort), Deadline::AfterMs(10000));
    if (!fd.ok()) return fd.status();
    // Bounds every raw read: a stuck server fails the run instead of hanging it.
    const timeval tv{120, 0};
    ::setsockopt(fd->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    mesh->conns[static_cast<size_t>(j)][static_cast<size_t>(p)] = std::move(*fd);
  }
  return Status::OK();
}

}  // namespace dyad::bench
