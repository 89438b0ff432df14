// client_test_util.h: helpers for the client unit tests.
//
// TempDir: a private directory removed at the end of the test (short path
// under /tmp so Unix socket paths fit). EnvScrub: unsets every DYAD_*
// variable of the configuration table for one test and restores them.
// FakeService: a thread listening on a Unix socket that speaks the local
// service protocol with canned answers and records every request, so tests
// can check exactly what the client sends. Not a real service: it moves no
// data and keeps no metadata.
#pragma once

#include <poll.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/config.h"
#include "common/net.h"
#include "common/status.h"
#include "common/time.h"
#include "common/wire.h"
#include "dyad/common/dyad_envs.h"
#include "proto/protocol.h"
#include "util.h"

namespace dyad {
namespace testing_util {

class TempDir : public testutil::TempDir {
 public:
  TempDir() : testutil::TempDir("dyadcl-") {}
};

// (Creates the parent directories too.)
inline void WriteFile(const std::string& path, const std::string& data) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  testutil::WriteFile(path, data);
}

class EnvScrub {
 public:
  EnvScrub() {
    for (const ConfigEntry& e : ConfigTable()) {
      if (const char* v = ::getenv(e.name)) saved_[e.name] = v;
      ::unsetenv(e.name);
    }
    if (const char* v = ::getenv(DYAD_CHECK_ENV)) saved_[DYAD_CHECK_ENV] = v;
    ::unsetenv(DYAD_CHECK_ENV);
  }
  ~EnvScrub() {
    for (const ConfigEntry& e : ConfigTable()) ::unsetenv(e.name);
    ::unsetenv(DYAD_CHECK_ENV);
    for (const auto& [k, v] : saved_) ::setenv(k.c_str(), v.c_str(), 1);
  }

 private:
  std::map<std::string, std::string> saved_;
};

class FakeService {
 public:
  struct Request {
    int conn = 0;
    uint16_t type = 0;
    std::string payload;
  };
  using Answer = std::optional<std::pair<Status, std::string>>;  // nullopt: never reply
  using Handler = std::function<Answer(uint16_t type, const std::string& payload)>;

  explicit FakeService(std::string socket_path) : path_(std::move(socket_path)) {
    Result<SocketAddress> addr = ParseAddress(path_);
    if (addr.ok()) {
      Result<UniqueFd> fd = Listen(*addr);
      if (fd.ok()) listen_ = std::move(*fd);
    }
    acceptor_ = std::thread([this] { AcceptLoop(); });
  }
  ~FakeService() {
    stop_ = true;
    acceptor_.join();
    for (auto& t : conns_) t.join();
    ::unlink(path_.c_str());
  }

  bool listening() const { return listen_.valid(); }
  const std::string& path() const { return path_; }

  void set_producer_path(const std::string& p) {
    std::lock_guard<std::mutex> lk(mu_);
    producer_path_ = p;
  }
  void set_handler(Handler h) {
    std::lock_guard<std::mutex> lk(mu_);
    handler_ = std::move(h);
  }
  void set_close_after_reply(bool v) { close_after_reply_ = v; }
  // Close each connection as soon as a request arrives, without replying.
  void set_drop_requests(bool v) { drop_requests_ = v; }

  std::vector<Request> requests() {
    std::lock_guard<std::mutex> lk(mu_);
    return requests_;
  }
  size_t count(MsgType t) {
    std::lock_guard<std::mutex> lk(mu_);
    size_t n = 0;
    for (const auto& r : requests_) n += r.type == static_cast<uint16_t>(t);
    return n;
  }
  std::optional<Request> last(MsgType t) {
    std::lock_guard<std::mutex> lk(mu_);
    for (auto it = requests_.rbegin(); it != requests_.rend(); ++it)
      if (it->type == static_cast<uint16_t>(t)) return *it;
    return std::nullopt;
  }
  int connections() const { return nconn_.load(); }
  int disconnects() const { return ndisc_.load(); }

  // The default answers: status (with producer_path), publish OK, consume
  // "transferred", locate NOTFOUND, list empty, ping OK.
  Answer DefaultAnswer(uint16_t type, const std::string& payload) {
    switch (static_cast<MsgType>(type)) {
      case MsgType::kStatus: {
        StatusReply r;
        r.counters["requests.status"] = 1;
        {
          std::lock_guard<std::mutex> lk(mu_);
          r.info["producer_path"] = producer_path_;
        }
        r.info["rank"] = "0";
        Encoder e;
        r.EncodeTo(e);
        return std::make_pair(Status::OK(), e.Take());
      }
      case MsgType::kConsume: {
        ConsumeRequest req;
        Decoder d(payload);
        if (!req.DecodeFrom(d)) return std::make_pair(Status(DYAD_RC_BADUNPACK, "bad"), "");
        ConsumeReply rep;
        rep.record.upath = req.upath;
        rep.record.size = 7;
        rep.transferred = true;
        rep.bytes = 7;
        Encoder e;
        rep.EncodeTo(e);
        return std::make_pair(Status::OK(), e.Take());
      }
      case MsgType::kLocate:
        return std::make_pair(Status(DYAD_RC_NOTFOUND, "not published"), std::string());
      case MsgType::kList: {
        Encoder e;
        e.U32(0);
        return std::make_pair(Status::OK(), e.Take());
      }
      default:
        return std::make_pair(Status::OK(), std::string());
    }
  }

 private:
  void AcceptLoop() {
    if (!listen_.valid()) return;
    while (!stop_) {
      Result<UniqueFd> fd = Accept(listen_.get(), Deadline::AfterMs(50));
      if (!fd.ok()) continue;
      const int id = ++nconn_;
      auto shared = std::make_shared<UniqueFd>(std::move(*fd));
      conns_.emplace_back(
          [this, id, shared] { Serve(id, Channel(std::move(*shared), Trust::kLocalPeer)); });
    }
  }

  void Serve(int id, Channel ch) {
    for (;;) {
      pollfd p{ch.fd(), POLLIN, 0};
      const int n = ::poll(&p, 1, 50);
      if (stop_) return;
      if (n <= 0) continue;
      uint16_t type = 0;
      std::string payload;
      if (!ch.RecvFrame(&type, &payload, Deadline::AfterMs(5000)).ok()) {
        ++ndisc_;
        return;
      }
      Handler h;
      {
        std::lock_guard<std::mutex> lk(mu_);
        requests_.push_back({id, type, payload});
        h = handler_;
      }
      if (drop_requests_) return;
      Answer a = h ? h(type, payload) : DefaultAnswer(type, payload);
      if (!a) {
        // Never answer; wait for the client to give up.
        while (!stop_ && !ch.PeerClosed()) ::usleep(10000);
        ++ndisc_;
        return;
      }
      if (!ch.SendFrame(static_cast<uint16_t>(MsgType::kReply), EncodeReply(a->first, a->second),
                        Deadline::AfterMs(5000))
               .ok())
        return;
      if (close_after_reply_) return;
    }
  }

  std::string path_;
  UniqueFd listen_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> close_after_reply_{false};
  std::atomic<bool> drop_requests_{false};
  std::atomic<int> nconn_{0};
  std::atomic<int> ndisc_{0};
  std::thread acceptor_;
  std::vector<std::thread> conns_;  // touched by the acceptor, then the destructor
  std::mutex mu_;
  std::vector<Request> requests_;
  Handler handler_;
  std::string producer_path_;
};

}  // namespace testing_util
}  // namespace dyad
