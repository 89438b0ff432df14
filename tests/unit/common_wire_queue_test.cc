// WireQueue (common/wire_queue.h): a response's bytes sent as the socket
// takes them, over a real socket pair, with a reader that is late, slow or
// gone.
#include "common/wire_queue.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <thread>

#include "common/fsutil.h"

namespace dyad {
namespace {

class WireQueueTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    int small = 64 << 10;  // a socket that fills quickly
    ::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof small);
    ::setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    sender_ = std::make_unique<Channel>(UniqueFd(sv[0]), Trust::kLocalPeer);
    reader_ = UniqueFd(sv[1]);
    char tmpl[] = "/tmp/dyad-wire-queue.XXXXXX";
    const int fd = ::mkstemp(tmpl);
    ASSERT_GE(fd, 0);
    file_ = UniqueFd(fd);
    path_ = tmpl;
    file_bytes_.resize(1u << 20);
    for (size_t i = 0; i < file_bytes_.size(); ++i) file_bytes_[i] = static_cast<char>(i * 13);
    ASSERT_TRUE(WriteFully(fd, file_bytes_.data(), file_bytes_.size()).ok());
  }
  void TearDown() override {
    if (!path_.empty()) ::unlink(path_.c_str());
  }

  // Reads everything until the sender closes (or `want` bytes).
  std::string ReadAllOf(size_t want) {
    std::string got;
    char buf[1 << 16];
    while (got.size() < want) {
      const ssize_t n = ::read(reader_.get(), buf, sizeof buf);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }

  // Pumps until all is sent, an error, or no room for `stall_ms` (the
  // waiting a caller does between pumps).
  Result<WireQueue::Pumped> PumpFor(WireQueue& q, int64_t stall_ms) {
    for (;;) {
      Result<WireQueue::Pumped> p = q.Pump(*sender_);
      if (!p.ok() || *p == WireQueue::Pumped::kAllSent) return p;
      pollfd room{sender_->fd(), POLLOUT, 0};
      if (::poll(&room, 1, static_cast<int>(stall_ms)) == 0) return p;
    }
  }

  std::unique_ptr<Channel> sender_;
  UniqueFd reader_;
  UniqueFd file_;
  std::string path_;
  std::string file_bytes_;
};

TEST_F(WireQueueTest, MemoryAndFileRangesArriveInOrder) {
  WireQueue q;
  q.Bytes("head:");
  q.FileRange(file_.get(), 100, 500000);
  q.Bytes(":tail");
  EXPECT_TRUE(q.has_file());
  const std::string want = "head:" + file_bytes_.substr(100, 500000) + ":tail";
  std::string got;
  std::thread reader([&] { got = ReadAllOf(want.size()); });
  Result<WireQueue::Pumped> p = PumpFor(q, 5000);
  reader.join();
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p, WireQueue::Pumped::kAllSent);
  EXPECT_TRUE(q.empty());
  EXPECT_EQ(q.sent(), want.size());
  EXPECT_TRUE(got == want);
}

// Nobody reads: Pump returns at once when the socket is full, with the rest
// still queued, and later Pumps, once the reader is there, send exactly the
// rest.
TEST_F(WireQueueTest, StallKeepsTheRestForTheNextPump) {
  WireQueue q;
  q.FileRange(file_.get(), 0, file_bytes_.size());
  const auto t0 = std::chrono::steady_clock::now();
  Result<WireQueue::Pumped> p = q.Pump(*sender_);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1)) << "Pump waited";
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p, WireQueue::Pumped::kStalled);
  EXPECT_FALSE(q.empty());
  EXPECT_LT(q.sent(), file_bytes_.size());
  std::string got;
  std::thread reader([&] { got = ReadAllOf(file_bytes_.size()); });
  p = PumpFor(q, 5000);
  reader.join();
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(*p, WireQueue::Pumped::kAllSent);
  EXPECT_TRUE(got == file_bytes_);
}

// The reader hangs up: an error (never SIGPIPE), the channel is broken,
// and later Pumps refuse at once.
TEST_F(WireQueueTest, ReaderGoneIsAnErrorAndBreaksTheChannel) {
  WireQueue q;
  q.FileRange(file_.get(), 0, file_bytes_.size());
  reader_.reset();
  Result<WireQueue::Pumped> p = PumpFor(q, 1000);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), DYAD_RC_CONNLOST) << p.status().ToString();
  EXPECT_TRUE(sender_->broken());
  q.Bytes("more");
  EXPECT_FALSE(PumpFor(q, 1000).ok());
}

// A file that shrank below the range queued fails the send.
TEST_F(WireQueueTest, FileShorterThanItsRangeFails) {
  ASSERT_EQ(::ftruncate(file_.get(), 1000), 0);
  WireQueue q;
  q.FileRange(file_.get(), 0, 5000);
  std::thread reader([&] { (void)ReadAllOf(5000); });
  Result<WireQueue::Pumped> p = PumpFor(q, 1000);
  sender_.reset();  // lets the reader see the end
  reader.join();
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), DYAD_RC_BADFIO) << p.status().ToString();
}

}  // namespace
}  // namespace dyad
