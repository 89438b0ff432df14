// The service's runtime (common/runtime.h) on real descriptors: a wait
// ends when its descriptor is ready, at its deadline, or when its Stop
// fires, whichever comes first, and reports which; thousands of waits hold
// no thread; a blocking call goes to the bounded pool and resumes on the
// loop; RunSync runs a task to its end for a caller outside the loop.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "common/runtime.h"
#include "util.h"

namespace dyad {
namespace {

struct SocketPair {
  UniqueFd a, b;
  SocketPair() {
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    a.reset(fds[0]);
    b.reset(fds[1]);
  }
};

class RuntimeTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(rt_.Start().ok()); }
  void TearDown() override { rt_.Shutdown(); }
  Runtime rt_{2, 1000};
};

TEST_F(RuntimeTest, WaitEndsWhenReadableAtDeadlineOrStop) {
  SocketPair s;
  // Readable: bytes arrive after the wait began.
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    ASSERT_EQ(::write(s.b.get(), "x", 1), 1);
  });
  EXPECT_EQ(rt_.RunSync(WaitReady(s.a.get(), POLLIN, Deadline::AfterMs(5000), nullptr)),
            Ready::kReady);
  writer.join();
  char c;
  ASSERT_EQ(::read(s.a.get(), &c, 1), 1);

  // Nothing arrives: the deadline.
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(rt_.RunSync(WaitReady(s.a.get(), POLLIN, Deadline::AfterMs(100), nullptr)),
            Ready::kTimeout);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(90));

  // A Stop fired from another thread ends the wait at once, with its reason.
  Stop stop(rt_.executor(), &rt_.stopping());
  std::thread firer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    stop.Fire(Status(DYAD_RC_CANCELLED, "the requester went away"));
  });
  EXPECT_EQ(rt_.RunSync(WaitReady(s.a.get(), POLLIN, Deadline::Never(), &stop)), Ready::kStopped);
  firer.join();
  EXPECT_EQ(stop.why().message(), "the requester went away");
  // A Stop that fired ends later waits at once.
  EXPECT_EQ(rt_.RunSync(WaitReady(s.a.get(), POLLIN, Deadline::Never(), &stop)), Ready::kStopped);
}

TEST_F(RuntimeTest, EitherOfTwoDescriptorsAndWritableRoom) {
  SocketPair s, t;
  ASSERT_EQ(::write(t.b.get(), "y", 1), 1);
  EXPECT_EQ(rt_.RunSync(
                WaitReady(s.a.get(), POLLIN, Deadline::AfterMs(5000), nullptr, t.a.get(), POLLIN)),
            Ready::kReady);
  // An empty socket has room.
  EXPECT_EQ(rt_.RunSync(WaitReady(s.a.get(), POLLOUT, Deadline::AfterMs(5000), nullptr)),
            Ready::kReady);
  // A hang-up counts as ready.
  s.b.reset();
  EXPECT_EQ(rt_.RunSync(WaitReady(s.a.get(), POLLIN, Deadline::AfterMs(5000), nullptr)),
            Ready::kReady);
}

TEST_F(RuntimeTest, ChannelWaitsKeepOneRegistration) {
  SocketPair s;
  Channel ch(std::move(s.a), Trust::kUnauthenticated);
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(::write(s.b.get(), "z", 1), 1);
    EXPECT_EQ(rt_.RunSync(WaitReady(ch, POLLIN, Deadline::AfterMs(5000), nullptr)), Ready::kReady);
    char c;
    ASSERT_EQ(::read(ch.fd(), &c, 1), 1);
  }
  EXPECT_TRUE(ch.attachment() != nullptr);
  EXPECT_EQ(rt_.RunSync(WaitReady(ch, POLLIN, Deadline::AfterMs(50), nullptr)), Ready::kTimeout);
}

// A channel that outlives the runtime whose loop it waited on (a pooled
// link of a store client, a test's channel) is left by the loop's end: it
// still works as a channel, waits on another loop, and ends cleanly (run
// under valgrind, the old code read the destroyed loop's memory here).
TEST(RuntimeEnd, ChannelOutlivesTheLoopItWaitedOn) {
  SocketPair s;
  Channel ch(std::move(s.a), Trust::kUnauthenticated);
  for (int round = 0; round < 2; ++round) {
    Runtime rt(1, 1000);
    ASSERT_TRUE(rt.Start().ok());
    ASSERT_EQ(::write(s.b.get(), "z", 1), 1);
    EXPECT_EQ(rt.RunSync(WaitReady(ch, POLLIN, Deadline::AfterMs(5000), nullptr)), Ready::kReady);
    char c;
    ASSERT_EQ(::read(ch.fd(), &c, 1), 1);
    ASSERT_TRUE(ch.attachment() != nullptr);
    rt.Shutdown();
  }  // each runtime ends with the channel still registered with its loop
  ASSERT_EQ(::write(s.b.get(), "y", 1), 1);
  char c;
  EXPECT_EQ(::read(ch.fd(), &c, 1), 1);
  ch.attachment().reset();
}

// A thousand waits on silent peers hold no thread; the service's stop
// ends them all.
TEST_F(RuntimeTest, ThousandWaitsHoldNoThreadAndEndAtTheStop) {
  std::vector<std::unique_ptr<SocketPair>> pairs;
  std::atomic<int> stopped{0};
  const size_t before = testutil::ThreadsOf();
  for (int i = 0; i < 1000; ++i) {
    pairs.push_back(std::make_unique<SocketPair>());
    rt_.Spawn([](int fd, Stop* stop, std::atomic<int>* n) -> Task<void> {
      if (co_await WaitReady(fd, POLLIN, Deadline::Never(), stop) == Ready::kStopped) ++*n;
    }(pairs.back()->a.get(), &rt_.stopping(), &stopped));
  }
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (rt_.tasks() != 1000 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(rt_.tasks(), 1000u);
  EXPECT_LE(testutil::ThreadsOf(), before + 1);
  rt_.Shutdown();
  EXPECT_EQ(stopped.load(), 1000);
  EXPECT_EQ(rt_.tasks(), 0u);
}

TEST_F(RuntimeTest, OffloadRunsOnThePoolAndResumesOnTheLoop) {
  const std::thread::id caller = std::this_thread::get_id();
  struct Seen {
    std::thread::id pool, after;
    int value = 0;
  };
  Seen seen = rt_.RunSync([](Runtime* rt) -> Task<Seen> {
    Seen s;
    s.value = co_await rt->Offload([&s] {
      s.pool = std::this_thread::get_id();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // blocks: not on the loop
      return 42;
    });
    s.after = std::this_thread::get_id();
    co_return s;
  }(&rt_));
  EXPECT_EQ(seen.value, 42);
  EXPECT_NE(seen.pool, caller);
  EXPECT_NE(seen.pool, seen.after);
  EXPECT_NE(seen.after, caller);
}

TEST_F(RuntimeTest, RendezvousDeliversFromAnyThreadOrTimesOut) {
  auto r = std::make_shared<Rendezvous<int>>(rt_.executor());
  std::thread t([r] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    r->Deliver(7);
    r->Deliver(8);  // the first wins
  });
  std::optional<int> got = rt_.RunSync(r->Take(Deadline::AfterMs(5000), nullptr));
  t.join();
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(*got, 7);
  auto never = std::make_shared<Rendezvous<int>>(rt_.executor());
  EXPECT_FALSE(rt_.RunSync(never->Take(Deadline::AfterMs(50), nullptr)).has_value());
  never->Deliver(1);  // late: a later Take gets it
  EXPECT_EQ(rt_.RunSync(never->Take(Deadline::AfterMs(5000), nullptr)).value_or(0), 1);
}

// Frames as the peer sends them: header and payload, back to back.
std::string Frames(const std::vector<std::string>& payloads) {
  std::string out;
  for (const std::string& p : payloads) {
    char hdr[kFrameHeaderSize];
    EncodeFrameHeader(hdr, 7, static_cast<uint32_t>(p.size()));
    out.append(hdr, kFrameHeaderSize);
    out += p;
  }
  return out;
}

// Item 3 of the feed brief: the service reads what a link holds into the
// channel in one read (ReadInto) and takes whole frames from it, so three
// requests sent together cost one read, not a header and a payload read
// each; the read ends like any wait (deadline, Stop), and a hang-up is
// reported, not waited on.
TEST_F(RuntimeTest, ReadIntoTakesEveryFrameThereInOneReadAndEndsLikeAWait) {
  SocketPair s;
  Channel ch(std::move(s.a), Trust::kAuthenticated);
  const std::string wire = Frames({"first", "second", std::string(3000, 'x')});
  ASSERT_EQ(::write(s.b.get(), wire.data(), wire.size()), static_cast<ssize_t>(wire.size()));
  Status error;
  ASSERT_EQ(rt_.RunSync(ReadInto(ch, 16u << 10, Deadline::AfterMs(5000), nullptr, &error)),
            Ready::kReady);
  ASSERT_TRUE(error.ok()) << error.ToString();
  // All three frames came with the one read: the socket is empty now.
  char probe;
  EXPECT_EQ(::recv(ch.fd(), &probe, 1, MSG_DONTWAIT | MSG_PEEK), -1);
  std::vector<std::string> got;
  Channel::PartialFrame f;
  while (ch.has_unread()) {
    uint16_t type = 0;
    std::string payload;
    Result<bool> r = ch.RecvFrameNow(&f, &type, &payload);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(*r);
    EXPECT_EQ(type, 7);
    got.push_back(payload);
    f.Reset();
  }
  EXPECT_EQ(got, (std::vector<std::string>{"first", "second", std::string(3000, 'x')}));

  // At most `max` bytes at once (a link still in its handshake).
  ASSERT_EQ(::write(s.b.get(), "0123456789", 10), 10);
  ASSERT_EQ(rt_.RunSync(ReadInto(ch, 4, Deadline::AfterMs(5000), nullptr, &error)), Ready::kReady);
  EXPECT_EQ(ch.TakeUnread(), "0123");
  ASSERT_EQ(rt_.RunSync(ReadInto(ch, 100, Deadline::AfterMs(5000), nullptr, &error)),
            Ready::kReady);
  EXPECT_EQ(ch.TakeUnread(), "456789");

  // Nothing comes: the deadline; a Stop from another thread.
  EXPECT_EQ(rt_.RunSync(ReadInto(ch, 100, Deadline::AfterMs(50), nullptr, &error)),
            Ready::kTimeout);
  Stop stop(rt_.executor(), &rt_.stopping());
  std::thread firer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    stop.Fire(Status(DYAD_RC_CANCELLED, "stopping"));
  });
  EXPECT_EQ(rt_.RunSync(ReadInto(ch, 100, Deadline::Never(), &stop, &error)), Ready::kStopped);
  firer.join();
  EXPECT_TRUE(error.ok());
  EXPECT_FALSE(ch.has_unread());

  // Bytes sent after a wait gave up are read by the next one, not lost.
  ASSERT_EQ(::write(s.b.get(), "late", 4), 4);
  ASSERT_EQ(rt_.RunSync(ReadInto(ch, 100, Deadline::AfterMs(5000), nullptr, &error)),
            Ready::kReady);
  EXPECT_EQ(ch.TakeUnread(), "late");

  // The peer hangs up: reported at once.
  s.b.reset();
  ASSERT_EQ(rt_.RunSync(ReadInto(ch, 100, Deadline::AfterMs(5000), nullptr, &error)),
            Ready::kReady);
  EXPECT_EQ(error.code(), DYAD_RC_CONNLOST) << error.ToString();
}

// A blocking reader that reads ahead (Channel::SetReadAhead, the client's
// link to its service) takes a reply's header and payload, and the frame
// behind it, with one recv; without it nothing past the frame is read.
TEST(ChannelReadAhead, OneRecvTakesTheFramesThereAndTheRestStaysUnread) {
  for (size_t ahead : {size_t{0}, size_t{4096}}) {
    SocketPair s;
    Channel ch(std::move(s.a), Trust::kLocalPeer);
    ch.SetReadAhead(ahead);
    const std::string wire = Frames({"reply", "next"});
    ASSERT_EQ(::write(s.b.get(), wire.data(), wire.size()), static_cast<ssize_t>(wire.size()));
    uint16_t type = 0;
    std::string payload;
    ASSERT_TRUE(ch.RecvFrame(&type, &payload, Deadline::AfterMs(5000)).ok());
    EXPECT_EQ(payload, "reply");
    EXPECT_EQ(ch.has_unread(), ahead > 0) << ahead;
    char probe;
    EXPECT_EQ(::recv(ch.fd(), &probe, 1, MSG_DONTWAIT | MSG_PEEK), ahead > 0 ? -1 : 1) << ahead;
    ASSERT_TRUE(ch.RecvFrame(&type, &payload, Deadline::AfterMs(5000)).ok());
    EXPECT_EQ(payload, "next");
    EXPECT_FALSE(ch.has_unread());
  }
}

}  // namespace
}  // namespace dyad
