// EmbeddedKvsServer::Handle() in isolation: requests go in as frames over a
// socketpair and the reply frame is decoded by hand, which pins the reply
// body formats documented in proto/protocol.h and the error replies for
// malformed or foreign input.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <future>
#include <limits>
#include <string>
#include <thread>

#include "common/net.h"
#include "common/wire.h"
#include "kvs/embedded/embedded_server.h"
#include "kvs/memory/memory_kvs.h"
#include "proto/protocol.h"

namespace dyad {
namespace {

using std::chrono::milliseconds;

int64_t MsSince(SteadyClock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(SteadyClock::now() - start).count();
}

struct Reply {
  Status status;
  std::string body;
};

// A connected pair: `server_end` is what Handle() writes to.
class Link {
 public:
  Link() {
    int fds[2] = {-1, -1};
    ok_ = ::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0;
    server_end = std::make_unique<Channel>(UniqueFd(fds[0]), Trust::kAuthenticated);
    client_end = std::make_unique<Channel>(UniqueFd(fds[1]), Trust::kAuthenticated);
  }
  bool ok() const { return ok_; }

  Reply Read() {
    Reply r;
    uint16_t type = 0;
    std::string payload;
    Status st = client_end->RecvFrame(&type, &payload, Deadline::AfterMs(5000));
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(type, static_cast<uint16_t>(MsgType::kReply));
    EXPECT_TRUE(DecodeReply(payload, &r.status, &r.body));
    return r;
  }

  std::unique_ptr<Channel> server_end;
  std::unique_ptr<Channel> client_end;

 private:
  bool ok_ = false;
};

std::string Request(const std::string& ns, const std::string& key, const std::string& value = {},
                    int64_t timeout_ms = 0, uint32_t limit = 0) {
  KvsRequest r;
  r.ns = ns;
  r.key = key;
  r.value = value;
  r.timeout_ms = timeout_ms;
  r.limit = limit;
  Encoder e;
  r.EncodeTo(e);
  return e.Take();
}

uint16_t T(MsgType t) { return static_cast<uint16_t>(t); }

class EmbeddedServerTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(link_.ok()); }

  Reply Call(MsgType type, const std::string& payload, const CancelFn& cancel = nullptr) {
    Status sent = server_.Handle(T(type), payload, *link_.server_end, cancel);
    EXPECT_TRUE(sent.ok()) << sent.ToString();
    return link_.Read();
  }

  EmbeddedKvsServer server_;
  Link link_;
};

TEST(EmbeddedServerHandles, OnlyStoreMessages) {
  for (MsgType t : {MsgType::kKvsPut, MsgType::kKvsGet, MsgType::kKvsWait, MsgType::kKvsRemove,
                    MsgType::kKvsList}) {
    EXPECT_TRUE(EmbeddedKvsServer::Handles(T(t)));
  }
  for (MsgType t : {MsgType::kReply, MsgType::kChallenge, MsgType::kPublish, MsgType::kFetch}) {
    EXPECT_FALSE(EmbeddedKvsServer::Handles(T(t)));
  }
  EXPECT_FALSE(EmbeddedKvsServer::Handles(0));
  EXPECT_FALSE(EmbeddedKvsServer::Handles(65535));
}

TEST_F(EmbeddedServerTest, ReplyBodiesFollowTheProtocol) {
  Reply put = Call(MsgType::kKvsPut, Request("ns", "k", std::string("v\0w", 3)));
  ASSERT_TRUE(put.status.ok()) << put.status.ToString();
  EXPECT_TRUE(put.body.empty());

  Reply get = Call(MsgType::kKvsGet, Request("ns", "k"));
  ASSERT_TRUE(get.status.ok());
  Decoder d(get.body);
  EXPECT_TRUE(d.Bool());
  EXPECT_EQ(d.Str(), std::string("v\0w", 3));
  EXPECT_TRUE(d.done());

  Reply missing = Call(MsgType::kKvsGet, Request("ns", "nope"));
  ASSERT_TRUE(missing.status.ok());
  Decoder dm(missing.body);
  EXPECT_FALSE(dm.Bool());
  EXPECT_EQ(dm.Str(), "");
  EXPECT_TRUE(dm.done());

  ASSERT_TRUE(Call(MsgType::kKvsPut, Request("ns", "k2", "x")).status.ok());
  ASSERT_TRUE(Call(MsgType::kKvsPut, Request("ns", "j", "y")).status.ok());
  Reply list = Call(MsgType::kKvsList, Request("ns", "k"));
  ASSERT_TRUE(list.status.ok());
  Decoder dl(list.body);
  ASSERT_EQ(dl.U32(), 2u);
  EXPECT_EQ(dl.Str(), "k");
  EXPECT_EQ(dl.Str(), std::string("v\0w", 3));
  EXPECT_EQ(dl.Str(), "k2");
  EXPECT_EQ(dl.Str(), "x");
  EXPECT_TRUE(dl.done());

  Reply limited = Call(MsgType::kKvsList, Request("ns", "", {}, 0, 1));
  Decoder dll(limited.body);
  EXPECT_EQ(dll.U32(), 1u);
  EXPECT_EQ(dll.Str(), "j");

  Reply removed = Call(MsgType::kKvsRemove, Request("ns", "k"));
  ASSERT_TRUE(removed.status.ok());
  EXPECT_TRUE(removed.body.empty());
  EXPECT_EQ(server_.store()->EntryCount(), 2u);
}

TEST_F(EmbeddedServerTest, WaitReplies) {
  ASSERT_TRUE(server_.store()->Put("ns", "there", "v").ok());
  Reply at_once = Call(MsgType::kKvsWait, Request("ns", "there", {}, 0));
  ASSERT_TRUE(at_once.status.ok()) << at_once.status.ToString();
  Decoder d(at_once.body);
  EXPECT_TRUE(d.Bool());
  EXPECT_EQ(d.Str(), "v");
  EXPECT_TRUE(d.done());

  const auto start = SteadyClock::now();
  Reply timed_out = Call(MsgType::kKvsWait, Request("ns", "absent", {}, 100));
  EXPECT_EQ(timed_out.status.code(), DYAD_RC_TIMEOUT) << timed_out.status.ToString();
  EXPECT_TRUE(timed_out.body.empty());
  EXPECT_GE(MsSince(start), 95);
  EXPECT_LT(MsSince(start), 1000);
}

TEST_F(EmbeddedServerTest, UnboundedWaitRequestsAreStillCancellable) {
  // A negative or huge timeout is clamped, not taken as "forever"; either
  // way the cancel callback ends it promptly.
  for (int64_t timeout : {int64_t{-1}, std::numeric_limits<int64_t>::max()}) {
    std::atomic<bool> stop{false};
    auto handled = std::async(std::launch::async, [&] {
      return server_.Handle(T(MsgType::kKvsWait), Request("ns", "absent", {}, timeout),
                            *link_.server_end, [&] { return stop.load(); });
    });
    std::this_thread::sleep_for(milliseconds(100));
    EXPECT_EQ(handled.wait_for(milliseconds(0)), std::future_status::timeout);
    stop.store(true);
    ASSERT_EQ(handled.wait_for(milliseconds(2000)), std::future_status::ready);
    EXPECT_TRUE(handled.get().ok());
    EXPECT_EQ(link_.Read().status.code(), DYAD_RC_CANCELLED);
  }
}

TEST_F(EmbeddedServerTest, WaitIsWokenByAPutFromAnotherConnection) {
  auto waited = std::async(
      std::launch::async, [&] { return Call(MsgType::kKvsWait, Request("ns", "soon", {}, 3000)); });
  std::this_thread::sleep_for(milliseconds(50));
  Link other;
  ASSERT_TRUE(other.ok());
  ASSERT_TRUE(
      server_.Handle(T(MsgType::kKvsPut), Request("ns", "soon", "now"), *other.server_end, nullptr)
          .ok());
  EXPECT_TRUE(other.Read().status.ok());
  ASSERT_EQ(waited.wait_for(milliseconds(2000)), std::future_status::ready);
  Reply r = waited.get();
  ASSERT_TRUE(r.status.ok()) << r.status.ToString();
  Decoder d(r.body);
  EXPECT_TRUE(d.Bool());
  EXPECT_EQ(d.Str(), "now");
}

TEST_F(EmbeddedServerTest, ShutdownCancelsServerSideWaits) {
  auto waited = std::async(std::launch::async, [&] {
    return Call(MsgType::kKvsWait, Request("ns", "absent", {}, 5000));
  });
  std::this_thread::sleep_for(milliseconds(50));
  const auto start = SteadyClock::now();
  server_.Shutdown();
  ASSERT_EQ(waited.wait_for(milliseconds(2000)), std::future_status::ready);
  EXPECT_EQ(waited.get().status.code(), DYAD_RC_CANCELLED);
  EXPECT_LT(MsSince(start), 200);
}

TEST_F(EmbeddedServerTest, MalformedAndForeignRequestsGetErrorReplies) {
  EXPECT_EQ(Call(MsgType::kKvsPut, "").status.code(), DYAD_RC_BADUNPACK);
  EXPECT_EQ(Call(MsgType::kKvsGet, "\x05").status.code(), DYAD_RC_BADUNPACK);
  const std::string good = Request("ns", "k", "v");
  EXPECT_EQ(Call(MsgType::kKvsPut, good.substr(0, good.size() - 1)).status.code(),
            DYAD_RC_BADUNPACK);
  EXPECT_EQ(Call(MsgType::kKvsPut, good + "extra").status.code(), DYAD_RC_BADUNPACK);
  Encoder huge_len;
  huge_len.U32(0xffffffffu);
  EXPECT_EQ(Call(MsgType::kKvsWait, huge_len.data()).status.code(), DYAD_RC_BADUNPACK);

  Reply foreign = Call(MsgType::kFetch, good);
  EXPECT_EQ(foreign.status.code(), DYAD_RC_BADRPC);
  EXPECT_NE(foreign.status.message().find("fetch"), std::string::npos);
  Status sent = server_.Handle(4242, good, *link_.server_end, nullptr);
  ASSERT_TRUE(sent.ok());
  EXPECT_EQ(link_.Read().status.code(), DYAD_RC_BADRPC);

  // Nothing was stored, and the link still carries good requests.
  EXPECT_EQ(server_.store()->EntryCount(), 0u);
  EXPECT_TRUE(Call(MsgType::kKvsPut, good).status.ok());
  EXPECT_EQ(server_.store()->EntryCount(), 1u);
}

TEST_F(EmbeddedServerTest, ListTooLargeForOneFrameIsRefusedNotTruncated) {
  const std::string mib(1u << 20, 'z');
  for (int i = 0; i < 17; ++i) {
    ASSERT_TRUE(server_.store()->Put("big", "k" + std::to_string(i), mib).ok());
  }
  Reply r = Call(MsgType::kKvsList, Request("big", ""));
  EXPECT_EQ(r.status.code(), DYAD_RC_BADPACK) << r.status.ToString();
  EXPECT_TRUE(r.body.empty());
  // A 4 MiB reply outgrows the socket buffer: read it while it is sent.
  auto sent = std::async(std::launch::async, [&] {
    return server_.Handle(T(MsgType::kKvsList), Request("big", "", {}, 0, 4), *link_.server_end,
                          nullptr);
  });
  Reply some = link_.Read();
  EXPECT_TRUE(sent.get().ok());
  ASSERT_TRUE(some.status.ok()) << some.status.ToString();
  Decoder d(some.body);
  EXPECT_EQ(d.U32(), 4u);
}

TEST_F(EmbeddedServerTest, SharedStoreAndDeadPeer) {
  auto store = std::make_shared<MemoryKvs>();
  ASSERT_TRUE(store->Put("ns", "local", "direct").ok());
  EmbeddedKvsServer shared(store);
  EXPECT_EQ(shared.store(), store);

  Link link;
  ASSERT_TRUE(link.ok());
  ASSERT_TRUE(
      shared.Handle(T(MsgType::kKvsGet), Request("ns", "local"), *link.server_end, nullptr).ok());
  const Reply got = link.Read();
  Decoder d(got.body);
  EXPECT_TRUE(d.Bool());
  EXPECT_EQ(d.Str(), "direct");

  // A peer that went away: the request is still performed, the failed
  // reply is reported to the caller (no signal, no crash).
  link.client_end.reset();
  Status sent =
      shared.Handle(T(MsgType::kKvsPut), Request("ns", "orphan", "v"), *link.server_end, nullptr);
  EXPECT_FALSE(sent.ok());
  EXPECT_EQ(sent.code(), DYAD_RC_CONNLOST) << sent.ToString();
  Result<std::optional<std::string>> orphan = store->Get("ns", "orphan");
  ASSERT_TRUE(orphan.ok());
  EXPECT_EQ(*orphan, std::optional<std::string>("v"));
}

}  // namespace
}  // namespace dyad
