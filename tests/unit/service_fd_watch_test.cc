// The service's FdWatcher and the blocking driver of a Resumable, on real
// descriptors: a watch of two descriptors fires once for whichever is ready
// first, a writable interest fires for a socket with room, deadlines and
// cancellation, and RunBlocking waits on a Wait's extra descriptor.
#include <gtest/gtest.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "service/fd_watch.h"
#include "service/resumable.h"

namespace dyad {
namespace {

using Event = FdWatcher::Event;

// Records the events of one watch and lets the test wait for them.
class Fired {
 public:
  FdWatcher::Callback Callback() {
    return [this](Event ev) {
      std::lock_guard<std::mutex> lk(mu_);
      events_.push_back(ev);
      cv_.notify_all();
    };
  }
  // The events seen once at least `n` arrived (or after 5 s).
  std::vector<Event> WaitFor(size_t n) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait_for(lk, std::chrono::seconds(5), [&] { return events_.size() >= n; });
    return events_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Event> events_;
};

struct SocketPair {
  SocketPair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0); }
  ~SocketPair() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  int fds[2] = {-1, -1};
};

class FdWatcherTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(watcher_.Start().ok()); }
  FdWatcher watcher_;
};

TEST_F(FdWatcherTest, EitherOfTwoDescriptorsFiresOnce) {
  SocketPair a, b;
  Fired fired;
  Result<uint64_t> t =
      watcher_.Watch({FdWatcher::Interest{a.fds[0], POLLIN}, FdWatcher::Interest{b.fds[0], POLLIN}},
                     Deadline::AfterMs(10000), fired.Callback());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_TRUE(fired.WaitFor(0).empty()) << "fired with nothing to read";
  ASSERT_EQ(::write(b.fds[1], "x", 1), 1);
  EXPECT_EQ(fired.WaitFor(1), std::vector<Event>{Event::kReady});
  // The other descriptor was unregistered with it: no second event.
  ASSERT_EQ(::write(a.fds[1], "y", 1), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(fired.WaitFor(1).size(), 1u);
  EXPECT_EQ(watcher_.pending(), 0u);
  EXPECT_FALSE(watcher_.Cancel(*t));
}

TEST_F(FdWatcherTest, WritableInterestFiresForRoom) {
  SocketPair s;
  Fired fired;
  ASSERT_TRUE(watcher_
                  .Watch({FdWatcher::Interest{s.fds[0], POLLOUT}, FdWatcher::Interest{}},
                         Deadline::AfterMs(10000), fired.Callback())
                  .ok());
  EXPECT_EQ(fired.WaitFor(1), std::vector<Event>{Event::kReady});
}

TEST_F(FdWatcherTest, SameDescriptorTwiceIsOneRegistration) {
  SocketPair s;
  Fired fired;
  Result<uint64_t> t =
      watcher_.Watch({FdWatcher::Interest{s.fds[0], POLLIN}, FdWatcher::Interest{s.fds[0], POLLIN}},
                     Deadline::AfterMs(10000), fired.Callback());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_EQ(::write(s.fds[1], "x", 1), 1);
  EXPECT_EQ(fired.WaitFor(1), std::vector<Event>{Event::kReady});
}

TEST_F(FdWatcherTest, DeadlineCancelAndStop) {
  SocketPair s;
  Fired timed, cancelled, stopped;
  ASSERT_TRUE(watcher_.Watch(s.fds[0], Deadline::AfterMs(30), timed.Callback()).ok());
  Result<uint64_t> c = watcher_.Watch(-1, Deadline::AfterMs(10000), cancelled.Callback());
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(timed.WaitFor(1), std::vector<Event>{Event::kTimeout});
  EXPECT_TRUE(watcher_.Cancel(*c));
  SocketPair other;
  ASSERT_TRUE(watcher_.Watch(other.fds[0], Deadline::Never(), stopped.Callback()).ok());
  watcher_.Stop();
  EXPECT_EQ(stopped.WaitFor(1), std::vector<Event>{Event::kStopped});
  EXPECT_TRUE(cancelled.WaitFor(0).empty());
  EXPECT_FALSE(watcher_.Watch(-1, Deadline::AfterMs(10), Fired().Callback()).ok());
}

// Waits for an event fd only (no session), as a transport's completion.
class EventOp : public Resumable {
 public:
  explicit EventOp(int efd) : efd_(efd) {}
  bool Step(Wait* wait) override {
    uint64_t v = 0;
    if (::read(efd_, &v, sizeof v) == sizeof v) return true;
    if (expired_) return true;
    wait->fd = efd_;
    wait->deadline = Deadline::AfterMs(5000);
    ++steps;
    return false;
  }
  void Expired() override { expired_ = true; }
  void Abandon(const Status&) override { expired_ = true; }
  int steps = 0;

 private:
  int efd_;
  bool expired_ = false;
};

TEST(RunBlockingTest, WaitsForTheExtraDescriptor) {
  const int efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  ASSERT_GE(efd, 0);
  EventOp op(efd);
  std::thread signal([efd] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    const uint64_t one = 1;
    (void)!::write(efd, &one, sizeof one);
  });
  const auto t0 = std::chrono::steady_clock::now();
  RunBlocking(op);
  const auto took = std::chrono::steady_clock::now() - t0;
  signal.join();
  ::close(efd);
  // It slept on the descriptor: few steps, and it did not end before the
  // signal or by its 5 s deadline.
  EXPECT_LE(op.steps, 3);
  EXPECT_GE(took, std::chrono::milliseconds(90));
  EXPECT_LT(took, std::chrono::milliseconds(4000));
}

}  // namespace
}  // namespace dyad
