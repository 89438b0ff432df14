// service_transfers_test.cc: the registry of transfers in flight and its
// progress probes (a sink file's size, bytes a TCP peer acknowledged).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "common/net.h"
#include "service/transfers.h"

namespace dyad {
namespace {

TEST(TransferRegistryTest, EntriesLiveAsLongAsTheirHandles) {
  TransferRegistry reg;
  {
    TransferRegistry::Entry a = reg.Begin(false, "a.dat", 3, "tcp", 100, [] { return 40ull; });
    TransferRegistry::Entry b = reg.Begin(true, "b.dat", 4, "ucx", 200, nullptr);
    std::vector<TransferInfo> s = reg.Snapshot();
    ASSERT_EQ(s.size(), 2u);
    EXPECT_EQ(s[0].upath, "a.dat");
    EXPECT_FALSE(s[0].outgoing);
    EXPECT_EQ(s[0].peer_rank, 3u);
    EXPECT_EQ(s[0].bytes_done, 40u);
    EXPECT_EQ(s[0].bytes_total, 100u);
    EXPECT_TRUE(s[1].outgoing);
    EXPECT_EQ(s[1].bytes_done, TransferInfo::kUnknownBytes);
    TransferRegistry::Entry moved = std::move(a);
    EXPECT_EQ(reg.size(), 2u);
    moved.Reset();
    EXPECT_EQ(reg.size(), 1u);
  }
  EXPECT_EQ(reg.size(), 0u);
}

TEST(TransferRegistryTest, SinkProgressFollowsTheFileItWatches) {
  char path[] = "/tmp/dyad-transfers-XXXXXX";
  UniqueFd fd(::mkstemp(path));
  ASSERT_TRUE(fd.valid());
  ::unlink(path);
  TransferRegistry::Probe probe = SinkProgress(fd.get());
  ASSERT_TRUE(probe);
  EXPECT_EQ(probe(), 0u);
  std::string data(12345, 'x');
  ASSERT_TRUE(WriteFully(fd.get(), data.data(), data.size()).ok());
  EXPECT_EQ(probe(), 12345u);
}

// Issue 28, placement at the file system's minimum: the progress probe of a
// placement costs no system call until `dyad status` asks (it used to
// duplicate the sink's descriptor: a fcntl and a close per file placed).
TEST(TransferRegistryTest, SinkProgressKeepsNoDescriptorOfItsOwn) {
  char path[] = "/tmp/dyad-transfers-XXXXXX";
  UniqueFd fd(::mkstemp(path));
  ASSERT_TRUE(fd.valid());
  ::unlink(path);
  const int before = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0);
  ASSERT_GE(before, 0);
  ::close(before);
  TransferRegistry::Probe probe = SinkProgress(fd.get());
  ASSERT_TRUE(probe);
  // The lowest free descriptor is the same: the probe opened none.
  const int after = ::fcntl(fd.get(), F_DUPFD_CLOEXEC, 0);
  EXPECT_EQ(after, before);
  ::close(after);
  fd.reset();
  EXPECT_EQ(probe(), TransferInfo::kUnknownBytes);
}

TEST(TransferRegistryTest, SessionProgressCountsAcknowledgedBytes) {
  Result<SocketAddress> any = ParseAddress("127.0.0.1:0");
  ASSERT_TRUE(any.ok());
  Result<UniqueFd> listener = Listen(*any);
  ASSERT_TRUE(listener.ok());
  Result<SocketAddress> bound = BoundAddress(listener->get());
  ASSERT_TRUE(bound.ok());
  Result<UniqueFd> client = Connect(*bound, Deadline::AfterMs(2000));
  ASSERT_TRUE(client.ok());
  Result<UniqueFd> server = Accept(listener->get(), Deadline::AfterMs(2000));
  ASSERT_TRUE(server.ok());
  const uint64_t total = 300000;
  TransferRegistry::Probe probe = SessionProgress(client->get(), total);
  ASSERT_TRUE(probe);
  EXPECT_EQ(probe(), 0u);
  std::thread reader([&] {
    std::string buf(total, '\0');
    // A data session's body flows only after the peer authenticated.
    Channel ch(std::move(*server), Trust::kAuthenticated);
    EXPECT_TRUE(ch.RecvAll(buf.data(), buf.size(), Deadline::AfterMs(5000)).ok());
  });
  std::string data(total, 'y');
  ASSERT_TRUE(WriteFully(client->get(), data.data(), data.size()).ok());
  reader.join();
  const Deadline deadline = Deadline::AfterMs(2000);
  while (probe() < total && !deadline.expired())
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(probe(), total);  // capped at the file's size
}

}  // namespace
}  // namespace dyad
