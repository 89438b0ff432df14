// embedded_test_root.h: a minimal root service for tests: serves the
// embedded store on 127.0.0.1 (a listener, an accept thread and one thread
// per connection that authenticates and feeds frames to EmbeddedKvsServer,
// the way dyad-service does). Stop() joins everything, bounded.
#pragma once

#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "common/wire.h"
#include "kvs/embedded/embedded_server.h"
#include "proto/auth.h"

namespace dyad {
namespace testing_embedded {

// A minimal root service: serves the embedded store on 127.0.0.1.
class TestRoot {
 public:
  static std::unique_ptr<TestRoot> Start(const std::string& secret, uint16_t port,
                                         std::string* error) {
    SocketAddress addr;
    addr.host = "127.0.0.1";
    addr.port = port;
    Result<UniqueFd> fd = Listen(addr);
    if (!fd.ok()) {
      *error = fd.status().ToString();
      return nullptr;
    }
    Result<SocketAddress> bound = BoundAddress(fd->get());
    if (!bound.ok()) {
      *error = bound.status().ToString();
      return nullptr;
    }
    std::unique_ptr<TestRoot> root(new TestRoot(secret, std::move(*fd), bound->port));
    root->accept_thread_ = std::thread(&TestRoot::AcceptLoop, root.get());
    return root;
  }

  ~TestRoot() { Stop(); }

  uint16_t port() const { return port_; }
  std::string url() const { return "embedded://127.0.0.1:" + std::to_string(port_); }
  EmbeddedKvsServer& server() { return server_; }
  int connections() const { return connections_.load(); }
  // Answers requests of `type` as a root of a release without them does
  // (its service has no route: DYAD_RC_BADREQUEST), counting them.
  void Refuse(MsgType type) { refused_type_.store(static_cast<int>(type)); }
  int refused() const { return refused_.load(); }

  // Stops accepting, cancels server-side waits, cuts every connection and
  // joins all threads. Bounded: each thread polls `stop_` every 100 ms.
  void Stop() {
    if (stopped_) return;
    stopped_ = true;
    stop_.store(true);
    server_.Shutdown();
    if (accept_thread_.joinable()) accept_thread_.join();
    listen_fd_.reset();
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (int fd : live_fds_) ::shutdown(fd, SHUT_RDWR);
      threads.swap(conn_threads_);
    }
    for (std::thread& t : threads) t.join();
  }

 private:
  TestRoot(std::string secret, UniqueFd fd, uint16_t port)
      : auth_(std::move(secret)), listen_fd_(std::move(fd)), port_(port) {}

  void AcceptLoop() {
    while (!stop_.load()) {
      Result<UniqueFd> fd = Accept(listen_fd_.get(), Deadline::AfterMs(100));
      if (!fd.ok()) {
        if (fd.status().code() != DYAD_RC_TIMEOUT)
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      std::lock_guard<std::mutex> lk(mu_);
      live_fds_.insert(fd->get());
      ++connections_;
      conn_threads_.emplace_back(&TestRoot::Serve, this, std::move(*fd));
    }
  }

  void Serve(UniqueFd fd) {
    const int raw = fd.get();
    {
      Channel ch(std::move(fd), Trust::kUnauthenticated);
      PeerIdentity peer;
      if (auth_.Accept(ch, PeerIdentity{0, 7}, Deadline::AfterMs(2000), &peer).ok()) {
        const CancelFn cancel = [&] { return stop_.load() || ch.PeerClosed(); };
        while (!stop_.load()) {
          pollfd p{ch.fd(), POLLIN, 0};
          const int n = ::poll(&p, 1, 100);
          if (n < 0 && errno == EINTR) continue;
          if (n < 0) break;
          if (n == 0) continue;
          uint16_t type = 0;
          std::string payload;
          if (!ch.RecvFrame(&type, &payload, Deadline::AfterMs(5000)).ok()) break;
          if (type == refused_type_.load()) {
            ++refused_;
            const std::string reply =
                EncodeReply(Status(DYAD_RC_BADREQUEST, "rank 0 serves no such requests"));
            if (!ch.SendFrame(static_cast<uint16_t>(MsgType::kReply), reply,
                              Deadline::AfterMs(5000))
                     .ok())
              break;
            continue;
          }
          if (!server_.Handle(type, payload, ch, cancel).ok() || ch.broken()) break;
        }
      }
      // Unregister before the Channel closes the descriptor, so Stop() never
      // shuts down a number the kernel has handed out again.
      std::lock_guard<std::mutex> lk(mu_);
      live_fds_.erase(raw);
    }
  }

  const Authenticator auth_;
  UniqueFd listen_fd_;
  const uint16_t port_;
  EmbeddedKvsServer server_;
  std::atomic<bool> stop_{false};
  bool stopped_ = false;
  std::atomic<int> connections_{0};
  std::atomic<int> refused_type_{-1};
  std::atomic<int> refused_{0};
  std::thread accept_thread_;
  std::mutex mu_;
  std::vector<std::thread> conn_threads_;  // guarded by mu_
  std::set<int> live_fds_;                 // guarded by mu_
};

}  // namespace testing_embedded
}  // namespace dyad
