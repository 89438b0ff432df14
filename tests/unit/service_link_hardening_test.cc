// service_link_hardening_test.cc: regression tests of issue 12 for the links
// between services (defects 5 and 13); the fetch-path defects are in
// service_hardening_test.cc.
// namespaces: in-process dyad-services on loopback, driven through the
// protocol the client library speaks, with a TCP relay between them where
// an attacker on the path would sit.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/fsutil.h"
#include "common/key.h"
#include "common/net.h"
#include "proto/protocol.h"
#include "service/service.h"
#include "unit/service_pair.h"
#include "util.h"

namespace dyad {
namespace {

using testing_services::CallLocal;
using testing_services::ReadAll;
using testing_services::WriteAndPublish;
using testing_services::WriteFile;

constexpr char kSecret[] = "hardening-test-secret-0123456789abcdef";

// A TCP relay on 127.0.0.1 that forwards every connection to `target` and,
// while armed, flips one bit of the byte at offset `flip_at` of the stream
// flowing back from the target (the owner's direction). Control traffic is
// a few hundred bytes per connection, so only a file transfer reaches the
// offset: the relay lets the handshake through and alters file data.
class TamperingRelay {
 public:
  TamperingRelay(SocketAddress target, uint64_t flip_at) : target_(target), flip_at_(flip_at) {}
  ~TamperingRelay() { Stop(); }

  Status Start() {
    Result<SocketAddress> any = ParseAddress("127.0.0.1:0");
    if (!any.ok()) return any.status();
    Result<UniqueFd> lfd = Listen(*any);
    if (!lfd.ok()) return lfd.status();
    listener_ = std::move(*lfd);
    Result<SocketAddress> bound = BoundAddress(listener_.get());
    if (!bound.ok()) return bound.status();
    address_ = bound->ToString();
    acceptor_ = std::thread([this] { AcceptLoop(); });
    return Status::OK();
  }
  void Stop() {
    stop_ = true;
    if (acceptor_.joinable()) acceptor_.join();
    std::lock_guard<std::mutex> lk(mu_);
    for (std::thread& t : pumps_)
      if (t.joinable()) t.join();
    pumps_.clear();
  }
  const std::string& address() const { return address_; }
  void set_armed(bool armed) { armed_ = armed; }
  int flips() const { return flips_.load(); }

 private:
  void AcceptLoop() {
    while (!stop_) {
      Result<UniqueFd> client = Accept(listener_.get(), Deadline::AfterMs(50));
      if (!client.ok()) continue;
      Result<UniqueFd> server = Connect(target_, Deadline::AfterMs(2000));
      if (!server.ok()) continue;
      auto c = std::make_shared<UniqueFd>(std::move(*client));
      auto s = std::make_shared<UniqueFd>(std::move(*server));
      std::lock_guard<std::mutex> lk(mu_);
      pumps_.emplace_back([this, c, s] { Pump(c->get(), s->get()); });
    }
  }

  // Moves bytes both ways until either side closes or the relay stops.
  void Pump(int client, int server) {
    uint64_t from_server = 0;
    char buf[65536];
    while (!stop_) {
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      for (int i = 0; i < 2; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = ::recv(p[i].fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n <= 0) return;
        if (i == 1) {
          if (armed_ && flip_at_ >= from_server && flip_at_ < from_server + n) {
            buf[flip_at_ - from_server] ^= 0x10;
            ++flips_;
          }
          from_server += static_cast<uint64_t>(n);
        }
        const int to = i == 0 ? server : client;
        if (!SendAll(to, buf, static_cast<size_t>(n))) return;
      }
    }
  }

  // send(2) with MSG_NOSIGNAL: once the consumer has refused the altered
  // data and closed its end, the relay's next write must fail with EPIPE,
  // not raise SIGPIPE and kill the test process.
  static bool SendAll(int fd, const char* p, size_t len) {
    while (len > 0) {
      const ssize_t w = ::send(fd, p, len, MSG_NOSIGNAL);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return false;
      p += w;
      len -= static_cast<size_t>(w);
    }
    return true;
  }

  const SocketAddress target_;
  const uint64_t flip_at_;
  UniqueFd listener_;
  std::string address_;
  std::thread acceptor_;
  std::mutex mu_;
  std::vector<std::thread> pumps_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> armed_{true};
  std::atomic<int> flips_{0};
};

// A free TCP port on 127.0.0.1 (bound once and released).
Result<uint16_t> FreePort() {
  Result<SocketAddress> any = ParseAddress("127.0.0.1:0");
  if (!any.ok()) return any.status();
  Result<UniqueFd> fd = Listen(*any);
  if (!fd.ok()) return fd.status();
  Result<SocketAddress> bound = BoundAddress(fd->get());
  if (!bound.ok()) return bound.status();
  return bound->port;
}

// Owner A (rank 0, the root) advertises the relay's address, so every
// fetch B makes from A crosses the relay.
class RelayedPair : public ::testing::TestWithParam<LinkProtection> {
 protected:
  static constexpr uint64_t kFileBytes = 4u << 20;
  static constexpr uint64_t kFlipAt = 1u << 20;

  void SetUp() override {
    base_ = testutil::MakeTempDir("dyad-hardening-test.");
    ASSERT_FALSE(base_.empty());
    Result<uint16_t> port = FreePort();
    ASSERT_TRUE(port.ok()) << port.status().ToString();
    SocketAddress a_addr;
    a_addr.host = "127.0.0.1";
    a_addr.port = *port;
    relay_ = std::make_unique<TamperingRelay>(a_addr, kFlipAt);
    ASSERT_TRUE(relay_->Start().ok());

    ServiceOptions oa;
    oa.rank = 0;
    oa.prod_path = base_ + "/a";
    oa.listen = a_addr.ToString();
    oa.advertise = relay_->address();
    oa.socket_path = base_ + "/a.sock";
    oa.kvs_url = "embedded";
    oa.secret = kSecret;
    oa.protection = GetParam();
    oa.rpc_timeout_ms = 5000;
    a_ = std::make_unique<Service>(oa);
    Status st = a_->Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
    ServiceOptions ob = oa;
    ob.rank = 1;
    ob.prod_path = base_ + "/b";
    ob.listen = "127.0.0.1:0";
    ob.advertise.clear();
    ob.socket_path = base_ + "/b.sock";
    ob.kvs_url = "embedded://" + a_addr.ToString();  // the store itself is reached directly
    b_ = std::make_unique<Service>(ob);
    st = b_->Start();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }

  void TearDown() override {
    if (b_) b_->Stop();
    if (a_) a_->Stop();
    b_.reset();
    a_.reset();
    if (relay_) relay_->Stop();
    if (!testutil::RemoveTree(base_)) ADD_FAILURE() << "cannot remove " << base_;
  }

  std::string Pattern(uint64_t size) {
    std::string data(size, '\0');
    for (uint64_t i = 0; i < size; ++i) data[i] = static_cast<char>((i * 131 + i / 4096) & 0xff);
    return data;
  }

  Status Publish(const std::string& upath, const std::string& data) {
    return WriteAndPublish(base_ + "/a.sock", base_ + "/a", upath, data);
  }

  Result<ConsumeReply> Consume(const std::string& upath) {
    ConsumeRequest req;
    req.ns = "t";
    req.key = GenPathKey(upath, 3, 1024);
    req.upath = upath;
    req.cons_path = CanonicalPath(base_ + "/b");
    req.timeout_ms = 20000;
    return testing_services::CallConsume(base_ + "/b.sock", req, 60000);
  }

  std::string base_;
  std::unique_ptr<TamperingRelay> relay_;
  std::unique_ptr<Service> a_, b_;
};

// Issue 12, defect 5: a relay that let the handshake through could rewrite
// file bytes, and the consumer placed the altered file with success.
TEST_P(RelayedPair, Defect5_RelayAlteringFileBytesAfterTheHandshakeFailsTheConsume) {
  const std::string data = Pattern(kFileBytes);
  ASSERT_TRUE(Publish("big.dat", data).ok());
  Result<ConsumeReply> r = Consume("big.dat");
  EXPECT_GE(relay_->flips(), 1) << "the relay never saw the file data";
  ASSERT_FALSE(r.ok()) << "an altered file was accepted";
  EXPECT_EQ(r.status().code(), DYAD_RC_AUTH) << r.status().ToString();
  EXPECT_NE(r.status().message().find("integrity"), std::string::npos) << r.status().ToString();
  // Nothing placed: no file, no temporary.
  struct stat sb;
  EXPECT_NE(::stat((base_ + "/b/big.dat").c_str(), &sb), 0);
  EXPECT_EQ(RemoveStaleTemporaries(base_ + "/b"), 0u) << "a partial transfer was left behind";

  // The same path without the attacker: the transfer goes through intact.
  relay_->set_armed(false);
  Result<ConsumeReply> again = Consume("big.dat");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->transferred);
  EXPECT_EQ(ReadAll(base_ + "/b/big.dat"), data);
}

INSTANTIATE_TEST_SUITE_P(Protected, RelayedPair,
                         testing::Values(LinkProtection::kIntegrity, LinkProtection::kEncrypt),
                         [](const testing::TestParamInfo<LinkProtection>& i) {
                           return std::string(LinkProtectionName(i.param));
                         });

// Issue 12, defect 13: a locate whose timeout is near INT64_MAX ms expired
// at once instead of waiting for the publication.
TEST(Defect13, LocateWithATimeoutNearInt64MaxWaitsForThePublication) {
  testing_services::ServicePair pair;
  Status st = pair.Start("embedded");
  ASSERT_TRUE(st.ok()) << st.ToString();
  const std::string upath = "later.dat";
  LocateRequest req;
  req.ns = "t";
  req.key = GenPathKey(upath, 3, 1024);
  req.wait = true;
  req.timeout_ms = std::numeric_limits<int64_t>::max() - 1;
  Encoder e;
  req.EncodeTo(e);
  Result<std::string> body(Status(DYAD_RC_SYSFAIL, "not run"));
  const uint64_t t0 = MonoNs();
  std::thread locator(
      [&] { body = CallLocal(pair.base + "/b.sock", MsgType::kLocate, e.data(), 20000); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_TRUE(pair.Publish(upath, "content").ok());
  locator.join();
  ASSERT_TRUE(body.ok()) << body.status().ToString() << " after " << (MonoNs() - t0) / 1000000
                         << " ms";
  EXPECT_GE(MonoNs() - t0, 250'000'000u) << "the locate returned before the publication";
}

}  // namespace
}  // namespace dyad
