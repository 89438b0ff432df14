// Regression tests for the defects of issue 12 on the fetch path: each test
// is named after the defect and failed on the code before the fix.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "common/fsutil.h"
#include "common/key.h"
#include "common/net.h"
#include "proto/protocol.h"
#include "service/service.h"
#include "transport/transport.h"
#include "unit/service_pair.h"
#include "util.h"

namespace dyad {
namespace {

using testing_services::CallLocal;
using testing_services::ReadAll;
using testing_services::ServicePair;
using testing_services::WriteFile;

int64_t MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                               t0)
      .count();
}

Status PublishRecord(ServicePair& p, const std::string& key, const std::string& upath,
                     const std::string& ns = "t") {
  struct stat sb;
  const std::string path = p.dir_a + "/" + upath;
  if (::stat(path.c_str(), &sb) != 0) return StatusFromErrno(errno, "stat " + path);
  PublishRequest req;
  req.ns = ns;
  req.key = key;
  req.upath = upath;
  req.prod_path = CanonicalPath(p.dir_a);
  req.size = static_cast<uint64_t>(sb.st_size);
  req.version = MtimeNs(sb);
  Encoder e;
  req.EncodeTo(e);
  return CallLocal(p.base + "/a.sock", MsgType::kPublish, e.data()).status();
}

// Defect 3: a FIFO swapped in after publication hung the consume forever.
TEST(ServiceHardening, FifoSwappedInAfterPublishFailsWithinTheBound) {
  for (uint32_t mux : {1u, 2u}) {  // another node (tcp), the same node (local)
    ServicePair p;
    ASSERT_TRUE(p.Start("embedded", "", mux).ok());
    ASSERT_TRUE(p.Publish("pipe.dat", "published bytes").ok());
    const std::string path = p.dir_a + "/pipe.dat";
    ASSERT_EQ(::unlink(path.c_str()), 0);
    ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
    const auto t0 = std::chrono::steady_clock::now();
    Result<ConsumeReply> r = p.Consume("pipe.dat", 20000);
    EXPECT_FALSE(r.ok()) << "mux " << mux;
    EXPECT_LT(MsSince(t0), 5000) << "mux " << mux << ": " << r.status().ToString();
    EXPECT_FALSE(std::filesystem::exists(p.dir_b + "/pipe.dat"));
  }
}

// Defect 7: a symlinked directory inside the consumer directory made the
// service create directories and files outside it.
TEST(ServiceHardening, ConsumerSideSymlinkedDirectoryIsNotFollowed) {
  ServicePair p;
  ASSERT_TRUE(p.Start("embedded").ok());
  ASSERT_TRUE(p.Publish("sub/deep/f.dat", "data").ok());
  const std::string outside = p.base + "/outside";
  ASSERT_TRUE(std::filesystem::create_directories(outside));
  std::filesystem::create_directories(p.dir_b);
  std::filesystem::create_directory_symlink(outside, p.dir_b + "/sub");
  Result<ConsumeReply> r = p.Consume("sub/deep/f.dat");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), DYAD_RC_PERM) << r.status().ToString();
  EXPECT_TRUE(std::filesystem::is_empty(outside));
}

// Defect 8: a record published under the key of a.dat with path b.dat made
// a consume of a.dat succeed and overwrite b.dat.
TEST(ServiceHardening, RecordWhoseKeyAndPathDifferIsRefused) {
  ServicePair p;
  ASSERT_TRUE(p.Start("embedded").ok());
  WriteFile(p.dir_a + "/b.dat", "evil");
  ASSERT_TRUE(PublishRecord(p, GenPathKey("a.dat", 3, 1024), "b.dat").ok());
  std::filesystem::create_directories(p.dir_b);
  WriteFile(p.dir_b + "/b.dat", "precious");
  Result<ConsumeReply> r = p.Consume("a.dat", 5000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), DYAD_RC_BADMETADATA) << r.status().ToString();
  EXPECT_EQ(ReadAll(p.dir_b + "/b.dat"), "precious");
}

// Defect 9: any local client could remove or overwrite membership records.
TEST(ServiceHardening, LocalClientsCannotWriteMembershipRecords) {
  ServicePair p;
  ASSERT_TRUE(p.Start("embedded").ok());
  RemoveRequest rm;
  rm.ns = kMembersNamespace;
  rm.key = MemberKey(0);
  Encoder e;
  rm.EncodeTo(e);
  Result<std::string> r = CallLocal(p.base + "/b.sock", MsgType::kRemove, e.data());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), DYAD_RC_PERM);
  WriteFile(p.dir_a + "/x", "x");
  Status pub = PublishRecord(p, MemberKey(1), "x", kMembersNamespace);
  EXPECT_EQ(pub.code(), DYAD_RC_PERM) << pub.ToString();
  // The records still resolve: a fetch between the two works.
  ASSERT_TRUE(p.Publish("after.dat", "still works").ok());
  ASSERT_TRUE(p.Consume("after.dat").ok());
}

// Defect 10: a file changed after publication was served silently as the
// published version.
TEST(ServiceHardening, FileChangedSincePublicationIsNotServed) {
  ServicePair p;
  ASSERT_TRUE(p.Start("embedded").ok());
  ASSERT_TRUE(p.Publish("v.dat", "version one").ok());
  const std::string path = p.dir_a + "/v.dat";
  struct timespec later[2] = {{0, UTIME_OMIT}, {2000000000, 0}};
  WriteFile(path, "version two, longer");
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), later, 0), 0);
  Result<ConsumeReply> r = p.Consume("v.dat", 5000);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), DYAD_RC_STALE) << r.status().ToString();
  EXPECT_FALSE(std::filesystem::exists(p.dir_b + "/v.dat"));
}

// Defect 11: file modes widened (0600 on the producer became 0644).
TEST(ServiceHardening, ModesAreCarriedOver) {
  for (uint32_t mux : {1u, 2u}) {
    ServicePair p;
    ASSERT_TRUE(p.Start("embedded", "", mux).ok());
    std::filesystem::create_directories(p.dir_a);
    WriteFile(p.dir_a + "/secret.dat", "only me");
    ASSERT_EQ(::chmod((p.dir_a + "/secret.dat").c_str(), 0600), 0);
    ASSERT_TRUE(PublishRecord(p, GenPathKey("secret.dat", 3, 1024), "secret.dat").ok());
    Result<ConsumeReply> r = p.Consume("secret.dat");
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    struct stat sb;
    ASSERT_EQ(::stat((p.dir_b + "/secret.dat").c_str(), &sb), 0);
    EXPECT_EQ(sb.st_mode & 0777, 0600u) << "mux " << mux;
  }
}

// The owner keeps its producer directory open between fetches (one openat2
// per fetch). A directory removed and made again at the same path (or
// another one renamed there) is where files are served from next; a file
// that is not there stays not found.
TEST(ServiceHardening, ProducerDirectoryMadeAgainIsServedFrom) {
  ServicePair p;
  ASSERT_TRUE(p.Start("embedded").ok());
  std::filesystem::create_directories(p.dir_a);
  WriteFile(p.dir_a + "/first.dat", "before");
  ASSERT_TRUE(PublishRecord(p, GenPathKey("first.dat", 3, 1024), "first.dat").ok());
  Result<ConsumeReply> r = p.Consume("first.dat");
  ASSERT_TRUE(r.ok()) << r.status().ToString();

  std::filesystem::remove_all(p.dir_a);
  std::filesystem::create_directories(p.dir_a);
  WriteFile(p.dir_a + "/second.dat", "after the directory was made again");
  ASSERT_TRUE(PublishRecord(p, GenPathKey("second.dat", 3, 1024), "second.dat").ok());
  r = p.Consume("second.dat", 5000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(ReadAll(p.dir_b + "/second.dat"), "after the directory was made again");

  std::filesystem::rename(p.dir_a, p.dir_a + ".old");
  std::filesystem::create_directories(p.dir_a);
  WriteFile(p.dir_a + "/third.dat", "in the directory renamed into place");
  ASSERT_TRUE(PublishRecord(p, GenPathKey("third.dat", 3, 1024), "third.dat").ok());
  r = p.Consume("third.dat", 5000);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(ReadAll(p.dir_b + "/third.dat"), "in the directory renamed into place");

  // Published, then gone from the directory now at the path: not served.
  WriteFile(p.dir_a + "/gone.dat", "x");
  ASSERT_TRUE(PublishRecord(p, GenPathKey("gone.dat", 3, 1024), "gone.dat").ok());
  std::filesystem::remove(p.dir_a + "/gone.dat");
  r = p.Consume("gone.dat", 5000);
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(std::filesystem::exists(p.dir_b + "/gone.dat"));
  std::filesystem::remove_all(p.dir_a + ".old");
}

// Defect 2: the same-node copy reopened the owner's path by name, so a
// directory swapped for a symlink between the owner's check and the copy
// made it read a file outside the producer directory.
TEST(ServiceHardening, SameNodeCopyRefusesAPathSwappedAfterTheCheck) {
  const testutil::TempDir tmp("dyad-swap.");
  ASSERT_TRUE(tmp.ok());
  const std::string base = tmp.path(), root = base + "/prod", outside = base + "/outside";
  std::filesystem::create_directories(root + "/d");
  std::filesystem::create_directories(outside);
  WriteFile(root + "/d/f", "published");
  WriteFile(outside + "/f", "someone else's secret");
  Result<std::unique_ptr<Transport>> local = CreateTransport("local", TransportOptions());
  ASSERT_TRUE(local.ok());
  Result<UniqueFd> fd = OpenBeneath(root, "d/f", O_RDONLY);
  ASSERT_TRUE(fd.ok());
  struct stat sb;
  ASSERT_EQ(::fstat(fd->get(), &sb), 0);
  FileSource src;
  src.fd = fd->get();
  src.size = static_cast<uint64_t>(sb.st_size);
  src.root = root;
  src.upath = "d/f";
  src.dev = sb.st_dev;
  src.ino = sb.st_ino;
  Result<std::string> args = (*local)->ReplyArgs(src);
  ASSERT_TRUE(args.ok());
  // Swap the directory for a symlink to the outside, then pull.
  std::filesystem::rename(root + "/d", base + "/d-old");
  std::filesystem::create_directory_symlink(outside, root + "/d");
  const std::string sink_path = base + "/sink";
  UniqueFd sink(::open(sink_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  Channel session{UniqueFd(sv[0]), Trust::kAuthenticated};
  UniqueFd other(sv[1]);
  TransferStats ts;
  Status st = (*local)->PullNow(session, src.size, *args, sink.get(), &ts);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(ReadAll(sink_path), "");
  // Same name, another file inside the root: refused by its inode.
  std::filesystem::remove(root + "/d");
  std::filesystem::create_directories(root + "/d");
  WriteFile(root + "/d/f", "published");  // a new inode
  st = (*local)->PullNow(session, src.size, *args, sink.get(), &ts);
  EXPECT_EQ(st.code(), DYAD_RC_STALE) << st.ToString();
}

// Defect 6: one thread and one descriptor per connection without limit; an
// unauthenticated flood starved real requests. Silent connections beyond
// the caps are closed at once, and a real exchange still works meanwhile.
TEST(ServiceHardening, FloodOfSilentConnectionsIsCappedAndRealWorkGoesOn) {
  ServicePair p;
  ASSERT_TRUE(p.Start("embedded").ok());
  ASSERT_TRUE(p.Publish("before.dat", "warm the pooled session").ok());
  ASSERT_TRUE(p.Consume("before.dat").ok());
  Result<SocketAddress> addr = ParseAddress(p.a->tcp_address());
  ASSERT_TRUE(addr.ok());
  std::vector<UniqueFd> flood;
  for (int i = 0; i < 200; ++i) {
    Result<UniqueFd> fd = Connect(*addr, Deadline::AfterMs(2000));
    if (fd.ok()) flood.push_back(std::move(*fd));
  }
  // Give the acceptor time to see them all.
  const Deadline deadline = Deadline::AfterMs(5000);
  uint64_t refused = 0;
  while (!deadline.expired()) {
    Encoder e;
    Result<std::string> body = CallLocal(p.base + "/a.sock", MsgType::kStatus, e.data());
    ASSERT_TRUE(body.ok()) << body.status().ToString();  // local status answers
    StatusReply r;
    Decoder d(*body);
    ASSERT_TRUE(r.DecodeFrom(d));
    refused = r.counters["connections.refused"];
    if (refused >= 200 - 16) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // All from one address: at most 16 may wait in their handshake.
  EXPECT_GE(refused, 200u - 16u);
  ASSERT_TRUE(p.Publish("during.dat", "the flood does not stop real work").ok());
  Result<ConsumeReply> r = p.Consume("during.dat");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(ReadAll(p.dir_b + "/during.dat"), "the flood does not stop real work");
}

}  // namespace
}  // namespace dyad
