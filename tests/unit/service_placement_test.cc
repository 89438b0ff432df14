// service_placement_test.cc: Placement's end of a transfer (issue 28,
// "placement at the cost of the file system's minimum"), on copies of this
// service's own files into a separate consumer directory (the route that
// needs no peer): the copy carries the producer's mode, its version as
// mtime and the version stamp, a new version replaces it, nothing else is
// left in the directory, and Room's free-space figure is cached without
// ever admitting more than the file system holds.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <string>

#include "common/fsutil.h"
#include "common/net.h"
#include "common/runtime.h"
#include "service/node_cache.h"
#include "service/placement.h"
#include "service/stats.h"
#include "util.h"

namespace dyad {
namespace {

class PlacementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    prod_ = dir_.path() + "/prod";
    cons_ = dir_.path() + "/cons";
    ASSERT_EQ(::mkdir(prod_.c_str(), 0755), 0);
    ASSERT_EQ(::mkdir(cons_.c_str(), 0755), 0);
    ASSERT_TRUE(rt_.Start().ok());
  }
  void TearDown() override {
    place_.reset();
    if (mounted_) ::umount2(cons_.c_str(), MNT_DETACH);
  }

  void MakePlacement() {
    PlacementConfig cfg;
    cfg.rank = 0;
    cfg.prod_real = CanonicalPath(prod_);
    place_ = std::make_unique<Placement>(cfg, nullptr, nullptr, &stats_, nullptr, &cache_);
    place_->SetRuntime(&rt_);
  }

  // Writes the producer's file and returns its record (owned by rank 0).
  FileRecord Produce(const std::string& upath, size_t size, mode_t mode = 0644, uint64_t seq = 1) {
    const std::string path = prod_ + "/" + upath;
    EXPECT_TRUE(MakeParentDirs(prod_, upath).ok());
    ::unlink(path.c_str());
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode));
    EXPECT_TRUE(fd.valid());
    std::string data(size, static_cast<char>('a' + seq % 26));
    EXPECT_TRUE(WriteFully(fd.get(), data.data(), data.size()).ok());
    EXPECT_EQ(::fchmod(fd.get(), mode), 0);
    struct stat st;
    EXPECT_EQ(::fstat(fd.get(), &st), 0);
    FileRecord rec;
    rec.owner_rank = 0;
    rec.owner_incarnation = 42;
    rec.seq = seq;
    rec.size = size;
    rec.version = MtimeNs(st);
    rec.upath = upath;
    return rec;
  }

  Result<ConsumeReply> Place(const FileRecord& rec) {
    PlacementRequest req;
    req.record = rec;
    req.cons_root = CanonicalPath(cons_);
    req.ns = "t";
    return rt_.RunSync(place_->Place(req, Deadline::AfterMs(10000), &rt_.stopping()));
  }

  testutil::TempDir dir_{"dyad-place."};
  std::string prod_, cons_;
  bool mounted_ = false;
  Runtime rt_{2, 1000};
  ServiceStats stats_;
  NodeCache cache_{0, &stats_};
  std::unique_ptr<Placement> place_;
};

// The copy is the producer's file, stamped with its version (mtime and the
// extended attribute clients check), indexed as current; a republication
// replaces it in one step; nothing but the copies is ever in the directory.
TEST_F(PlacementTest, CopyIsStampedAndANewVersionReplacesIt) {
  MakePlacement();
  const FileRecord v1 = Produce("d/f.dat", 5000, 0640, 1);
  Result<ConsumeReply> r = Place(v1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->transferred);
  const std::string copy = cons_ + "/d/f.dat";
  struct stat st;
  ASSERT_EQ(::stat(copy.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 5000);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(MtimeNs(st), v1.version);
  char buf[128];
  const ssize_t n = ::getxattr(copy.c_str(), kVersionXattr, buf, sizeof buf);
  if (n >= 0) EXPECT_EQ(std::string(buf, n), VersionStamp(v1));
  EXPECT_TRUE(place_->IsCurrentCopy(CanonicalPath(cons_) + "/d/f.dat", v1));

  UniqueFd reader(::open(copy.c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(reader.valid());
  const FileRecord v2 = Produce("d/f.dat", 7000, 0644, 2);
  r = Place(v2);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(::stat(copy.c_str(), &st), 0);
  EXPECT_EQ(st.st_size, 7000);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  EXPECT_TRUE(place_->IsCurrentCopy(CanonicalPath(cons_) + "/d/f.dat", v2));
  EXPECT_FALSE(place_->IsCurrentCopy(CanonicalPath(cons_) + "/d/f.dat", v1));
  struct stat old;
  ASSERT_EQ(::fstat(reader.get(), &old), 0);
  EXPECT_EQ(old.st_size, 5000) << "the reader's open copy changed under it";
  EXPECT_EQ(RemoveStaleTemporaries(cons_), 0u);
}

// Room reads the file system's free space once for a burst of placements,
// not once per file (it was one statvfs per placement).
TEST_F(PlacementTest, RoomAsksTheFileSystemOncePerBurst) {
  MakePlacement();
  for (int i = 0; i < 40; ++i) {
    Result<ConsumeReply> r = Place(Produce("burst/f" + std::to_string(i), 4096));
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  EXPECT_GE(place_->fs_checks(), 1u);
  // A slow machine may cross the refresh period a few times.
  EXPECT_LE(place_->fs_checks(), 10u);
}

// The cached figure never admits what the file system cannot hold: bytes
// placed since the last statvfs count as used, and a refusal is decided on
// a fresh statvfs (2 MiB file system: 1.5 MiB placed, then 1 MiB refused at
// once, without a byte written, then 256 KiB admitted).
TEST_F(PlacementTest, CachedFreeSpaceCountsWhatWasPlacedSince) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  mounted_ = ::mount("tmpfs", cons_.c_str(), "tmpfs", 0, "size=2m") == 0;
  ASSERT_TRUE(mounted_) << "mount tmpfs on " << cons_;
  MakePlacement();
  Result<ConsumeReply> r = Place(Produce("big/one.bin", 1536u << 10));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const uint64_t checks = place_->fs_checks();
  r = Place(Produce("big/two.bin", 1u << 20));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), DYAD_RC_NOSPACE) << r.status().ToString();
  EXPECT_NE(r.status().message().find("bytes free"), std::string::npos) << r.status().ToString();
  EXPECT_GT(place_->fs_checks(), checks) << "refused on a cached figure";
  struct stat st;
  EXPECT_NE(::stat((cons_ + "/big/two.bin").c_str(), &st), 0);
  r = Place(Produce("big/three.bin", 256u << 10));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
}

}  // namespace
}  // namespace dyad
