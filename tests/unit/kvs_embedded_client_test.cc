// EmbeddedKvs's request/reply path against a hand-made root that shapes its
// replies on the wire: the client reads a reply's start with one system
// call (reading ahead into the channel), so a reply that arrives in pieces
// must still be assembled, and bytes after a reply (a root that broke the
// one-reply-per-request rule) must keep that link out of the pool.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "common/net.h"
#include "common/wire.h"
#include "kvs/embedded/embedded_kvs.h"
#include "kvs/kvs.h"
#include "proto/auth.h"
#include "proto/protocol.h"

namespace dyad {
namespace {

constexpr char kSecret[] = "embedded-client-secret";

// How the fake root sends the reply to the n-th request of a connection.
enum class Shape { kWhole, kInPieces, kWithStrayBytes };

// A root that answers every kKvsGet with found=true and a value naming the
// connection and request ("c1-r2"), shaped by `shape(request_index)`.
class ShapingRoot {
 public:
  explicit ShapingRoot(std::function<Shape(int)> shape) : shape_(std::move(shape)) {
    SocketAddress addr;
    addr.host = "127.0.0.1";
    addr.port = 0;
    Result<UniqueFd> fd = Listen(addr);
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    if (!fd.ok()) return;
    listen_ = std::move(*fd);
    Result<SocketAddress> bound = BoundAddress(listen_.get());
    EXPECT_TRUE(bound.ok());
    if (bound.ok()) port_ = bound->port;
    thread_ = std::thread([this] { Run(); });
  }
  ~ShapingRoot() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

  std::string url() const { return "embedded://127.0.0.1:" + std::to_string(port_); }
  int connections() const { return connections_.load(); }

 private:
  // Connections are served one after another: the client under test uses
  // one at a time.
  void Run() {
    while (!stop_) {
      Result<UniqueFd> fd = Accept(listen_.get(), Deadline::AfterMs(100));
      if (!fd.ok()) continue;
      const int conn = ++connections_;
      Channel ch(std::move(*fd), Trust::kUnauthenticated);
      if (!Authenticator(kSecret)
               .Accept(ch, PeerIdentity{0, 1}, Deadline::AfterMs(2000), nullptr)
               .ok())
        continue;
      for (int req = 1; !stop_; ++req) {
        uint16_t type = 0;
        std::string payload;
        Status st = ch.RecvFrame(&type, &payload, Deadline::AfterMs(200));
        if (st.code() == DYAD_RC_TIMEOUT && !ch.broken()) {
          --req;
          continue;
        }
        if (!st.ok()) break;
        if (!Answer(ch, conn, req)) break;
      }
    }
  }

  bool Answer(Channel& ch, int conn, int req) {
    Encoder body;
    body.Bool(true).Str("c" + std::to_string(conn) + "-r" + std::to_string(req));
    std::string wire;  // the sealed reply frame as it goes on the wire
    ch.CaptureSends(&wire);
    Status st = ch.SendFrame(static_cast<uint16_t>(MsgType::kReply),
                             EncodeReply(Status::OK(), body.data()), Deadline::AfterMs(1000));
    ch.CaptureSends(nullptr);
    if (!st.ok()) return false;
    const Shape shape = shape_(req);
    if (shape == Shape::kInPieces) {
      // The header alone, then the rest after the client has surely
      // started waiting (past its spin).
      if (!ch.SendAll(wire.data(), 5, Deadline::AfterMs(1000)).ok()) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      return ch.SendAll(wire.data() + 5, wire.size() - 5, Deadline::AfterMs(1000)).ok();
    }
    if (shape == Shape::kWithStrayBytes) wire += "stray";
    return ch.SendAll(wire.data(), wire.size(), Deadline::AfterMs(1000)).ok();
  }

  const std::function<Shape(int)> shape_;
  UniqueFd listen_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread thread_;
};

std::unique_ptr<Kvs> Open(const ShapingRoot& root) {
  KvsOptions o;
  o.secret = kSecret;
  o.self_rank = 3;
  o.rpc_timeout_ms = 5000;
  Result<std::unique_ptr<Kvs>> kvs = OpenKvs(root.url(), o);
  EXPECT_TRUE(kvs.ok()) << kvs.status().ToString();
  return kvs.ok() ? std::move(*kvs) : nullptr;
}

std::string GetValue(Kvs& kvs) {
  Result<std::optional<std::string>> r = kvs.Get("ns", "k");
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() && r->has_value() ? **r : std::string("<none>");
}

TEST(EmbeddedKvsClient, RepliesArrivingInPiecesAreAssembled) {
  ShapingRoot root([](int req) { return req % 2 == 0 ? Shape::kInPieces : Shape::kWhole; });
  std::unique_ptr<Kvs> kvs = Open(root);
  ASSERT_NE(kvs, nullptr);
  EXPECT_EQ(GetValue(*kvs), "c1-r1");
  EXPECT_EQ(GetValue(*kvs), "c1-r2");  // in pieces
  EXPECT_EQ(GetValue(*kvs), "c1-r3");
  EXPECT_EQ(GetValue(*kvs), "c1-r4");  // in pieces
  EXPECT_EQ(root.connections(), 1);    // one link did it all
}

TEST(EmbeddedKvsClient, BytesAfterAReplyKeepThatLinkOutOfThePool) {
  ShapingRoot root([](int req) { return req == 2 ? Shape::kWithStrayBytes : Shape::kWhole; });
  std::unique_ptr<Kvs> kvs = Open(root);
  ASSERT_NE(kvs, nullptr);
  EXPECT_EQ(GetValue(*kvs), "c1-r1");
  // The reply itself is good; the stray bytes after it arrived with it.
  EXPECT_EQ(GetValue(*kvs), "c1-r2");
  // Read as the next reply they would desynchronise the link: a new one.
  EXPECT_EQ(GetValue(*kvs), "c2-r1");
  EXPECT_EQ(root.connections(), 2);
}

}  // namespace
}  // namespace dyad
