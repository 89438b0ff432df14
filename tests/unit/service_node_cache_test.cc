// The node cache's index on real files: versions, the byte budget and its
// eviction order, the open-file protection (a reader's shared flock), and
// superseded copies.
#include "service/node_cache.h"

#include "common/fsutil.h"
#include "util.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

namespace dyad {
namespace {

class NodeCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testutil::MakeTempDir("dyad-node-cache.");
    ASSERT_FALSE(dir_.empty());
  }
  void TearDown() override { testutil::RemoveTree(dir_); }

  // A copy of `size` bytes at dir_/name, and its record (seq `seq`).
  FileRecord Place(const std::string& name, size_t size, uint64_t seq = 1) {
    std::ofstream(Path(name), std::ios::binary) << std::string(size, 'x');
    struct stat st;
    EXPECT_EQ(::stat(Path(name).c_str(), &st), 0);
    FileRecord r;
    r.owner_rank = 3;
    r.owner_incarnation = 77;
    r.seq = seq;
    r.size = size;
    r.version = MtimeNs(st);
    r.upath = name;
    return r;
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }
  bool Exists(const std::string& name) const { return ::access(Path(name).c_str(), F_OK) == 0; }

  std::string dir_;
  ServiceStats stats_;
};

TEST_F(NodeCacheTest, CurrentOnlyForTheExactVersion) {
  NodeCache cache(0, &stats_);
  FileRecord r = Place("f", 10, 5);
  EXPECT_FALSE(cache.IsCurrent(Path("f"), r));  // not placed by DYAD
  cache.NoteFetched("ns", Path("f"), r);
  EXPECT_TRUE(cache.IsCurrent(Path("f"), r));
  FileRecord same_time = r;  // a rewrite with equal size and mtime
  same_time.seq = 6;
  EXPECT_FALSE(cache.IsCurrent(Path("f"), same_time));
  FileRecord other_owner = r;
  other_owner.owner_rank = 4;
  EXPECT_FALSE(cache.IsCurrent(Path("f"), other_owner));
  // Rewritten behind DYAD's back: no longer the placed copy.
  std::ofstream(Path("f"), std::ios::binary) << std::string(11, 'y');
  EXPECT_FALSE(cache.IsCurrent(Path("f"), r));
}

TEST_F(NodeCacheTest, EvictsLeastRecentlyConsumedPastTheGrace) {
  NodeCache cache(250, &stats_, /*grace_ms=*/0);
  cache.NoteFetched("ns", Path("a"), Place("a", 100));
  cache.NoteFetched("ns", Path("b"), Place("b", 100));
  cache.NoteHit(Path("a"));  // b is now the least recently consumed
  cache.NoteFetched("ns", Path("c"), Place("c", 100));
  EXPECT_TRUE(Exists("a"));
  EXPECT_FALSE(Exists("b"));
  EXPECT_TRUE(Exists("c"));
  EXPECT_EQ(cache.bytes(), 200u);
  EXPECT_EQ(stats_.Get(ServiceStats::kNodeCacheEvictions), 1u);
  EXPECT_EQ(stats_.Get(ServiceStats::kNodeCacheHits), 1u);
}

TEST_F(NodeCacheTest, NeverRemovesAFileHeldOpen) {
  NodeCache cache(150, &stats_, /*grace_ms=*/0);
  cache.NoteFetched("ns", Path("a"), Place("a", 100));
  int fd = ::open(Path("a").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::flock(fd, LOCK_SH), 0);  // what a reader through DYAD holds
  cache.NoteFetched("ns", Path("b"), Place("b", 100));
  EXPECT_TRUE(Exists("a"));  // in use: over budget rather than pulled away
  EXPECT_TRUE(Exists("b"));  // just placed
  EXPECT_EQ(cache.bytes(), 200u);
  ::close(fd);
  cache.NoteFetched("ns", Path("c"), Place("c", 10));
  EXPECT_FALSE(Exists("a"));
  EXPECT_EQ(cache.bytes(), 110u);
}

TEST_F(NodeCacheTest, GraceKeepsJustConsumedCopies) {
  NodeCache cache(150, &stats_, /*grace_ms=*/60000);
  cache.NoteFetched("ns", Path("a"), Place("a", 100));
  cache.NoteFetched("ns", Path("b"), Place("b", 100));
  EXPECT_TRUE(Exists("a"));
  EXPECT_EQ(stats_.Get(ServiceStats::kNodeCacheEvictions), 0u);
}

TEST_F(NodeCacheTest, PrefetchedCopiesGoLastAndBoundAdmission) {
  NodeCache cache(250, &stats_, /*grace_ms=*/0);
  EXPECT_TRUE(cache.Admit(250));
  EXPECT_FALSE(cache.Admit(251));
  cache.NoteFetched("ns", Path("p"), Place("p", 100), /*consumed=*/false);
  EXPECT_FALSE(cache.Admit(151));
  EXPECT_TRUE(cache.Admit(150));
  cache.NoteFetched("ns", Path("a"), Place("a", 100));
  cache.NoteFetched("ns", Path("b"), Place("b", 100));  // over: a goes, not p
  EXPECT_TRUE(Exists("p"));
  EXPECT_FALSE(Exists("a"));
  cache.NoteHit(Path("p"));
  EXPECT_TRUE(cache.Admit(250));
}

// Prefetched copies are mostly read through the level-1 shortcut, which the
// service never sees: a read (access time) ends their wait too.
TEST_F(NodeCacheTest, AReadPrefetchedCopyStopsWaiting) {
  NodeCache cache(150, &stats_, /*grace_ms=*/0);
  FileRecord r = Place("p", 100);
  struct timespec old[2] = {{1000, 0}, {0, UTIME_OMIT}};  // as placed: atime < ctime
  ASSERT_EQ(::utimensat(AT_FDCWD, Path("p").c_str(), old, 0), 0);
  cache.NoteFetched("ns", Path("p"), r, /*consumed=*/false);
  EXPECT_FALSE(cache.Admit(100));
  char c;
  int fd = ::open(Path("p").c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::read(fd, &c, 1), 1);
  ::close(fd);
  struct stat st;
  ASSERT_EQ(::stat(Path("p").c_str(), &st), 0);
  if (st.st_atim.tv_sec == 1000) GTEST_SKIP() << "this file system does not record reads (noatime)";
  EXPECT_TRUE(cache.Admit(100));
}

TEST_F(NodeCacheTest, SupersedeRemovesOtherVersionsOnly) {
  NodeCache cache(0, &stats_);
  ASSERT_EQ(::mkdir(Path("c2").c_str(), 0755), 0);
  FileRecord r = Place("f", 10, 1);
  cache.NoteFetched("ns", Path("f"), r);
  FileRecord r2 = Place("c2/f", 10, 1);
  r2.upath = "f";
  cache.NoteFetched("other-ns", Path("c2/f"), r2);
  EXPECT_EQ(cache.Supersede("ns", r), 0u);  // the same version: kept
  FileRecord newer = r;
  newer.seq = 2;
  EXPECT_EQ(cache.Supersede("ns", newer), 1u);
  EXPECT_FALSE(Exists("f"));
  EXPECT_TRUE(Exists("c2/f"));  // another namespace's file
  EXPECT_EQ(cache.files(), 1u);
}

// Issue 26 item 1: with one managed directory (the consumer directory is
// the producer directory, ProtectTree), copies placed there are evicted
// like anywhere else; a file a local program rewrote at a copy's path is
// not the copy any more and stays.
TEST_F(NodeCacheTest, FieldReadyCopiesInTheProducerTreeAreEvicted) {
  NodeCache cache(150, &stats_, /*grace_ms=*/0);
  cache.ProtectTree(dir_);
  cache.NoteFetched("ns", Path("a"), Place("a", 100));
  cache.NoteFetched("ns", Path("b"), Place("b", 100));
  EXPECT_FALSE(Exists("a"));
  EXPECT_TRUE(Exists("b"));
  EXPECT_EQ(stats_.Get(ServiceStats::kNodeCacheEvictions), 1u);
  // b rewritten here (a local producer): dropped from the index, kept.
  std::ofstream(Path("b"), std::ios::binary) << std::string(120, 'p');
  cache.NoteFetched("ns", Path("c"), Place("c", 100));
  EXPECT_TRUE(Exists("b"));
  EXPECT_TRUE(Exists("c"));
  EXPECT_EQ(cache.bytes(), 100u);
  EXPECT_EQ(cache.files(), 1u);
  EXPECT_EQ(stats_.Get(ServiceStats::kNodeCacheEvictions), 1u);
}

// Issue 28: with one managed directory clients take a stamped copy as
// current without a message (level 1), so a superseded copy the producer
// tree keeps loses its version stamp; a file a local program rewrote at a
// copy's path is not the copy any more and keeps whatever it has.
TEST_F(NodeCacheTest, SupersededCopyInTheProducerTreeLosesItsStamp) {
  NodeCache cache(0, &stats_);
  cache.ProtectTree(dir_);
  auto stamp = [this](const std::string& name, const FileRecord& r) {
    const std::string v = VersionStamp(r);
    return ::setxattr(Path(name).c_str(), kVersionXattr, v.data(), v.size(), 0) == 0;
  };
  auto stamped = [this](const std::string& name) {
    return ::getxattr(Path(name).c_str(), kVersionXattr, nullptr, 0) > 0;
  };
  FileRecord s = Place("s", 10);
  if (!stamp("s", s)) GTEST_SKIP() << "no user xattrs here";
  cache.NoteFetched("ns", Path("s"), s);
  FileRecord t = Place("t", 10);
  ASSERT_TRUE(stamp("t", t));
  cache.NoteFetched("ns", Path("t"), t);
  std::ofstream(Path("t"), std::ios::binary) << std::string(12, 'p');  // same inode, stamp kept
  for (FileRecord newer : {s, t}) {
    newer.seq = 2;
    newer.version += 1000;
    EXPECT_EQ(cache.Supersede("ns", newer), 1u);
  }
  EXPECT_TRUE(Exists("s"));
  EXPECT_FALSE(stamped("s"));
  EXPECT_TRUE(Exists("t"));
  EXPECT_TRUE(stamped("t"));
  EXPECT_EQ(cache.files(), 0u);
}

// Issue 28: a copy in the producer tree gets a revocable stamp only while
// every publication of its namespace reaches the cache; when the feed
// breaks, the stamps of the namespace's copies go at once, and so does the
// stamp of a copy indexed during the gap.
TEST_F(NodeCacheTest, GapWithdrawsTheStampsOfTheNamespace) {
  NodeCache cache(0, &stats_);
  cache.ProtectTree(dir_);
  const std::string outside = testutil::MakeTempDir("dyad-node-cache-private.");
  ASSERT_FALSE(outside.empty());
  EXPECT_FALSE(cache.StampRevocable("ns", Path("a")));  // not followed yet
  cache.Following("ns");
  EXPECT_TRUE(cache.StampRevocable("ns", Path("a")));
  EXPECT_FALSE(cache.StampRevocable("other", Path("a")));
  EXPECT_FALSE(cache.StampRevocable("ns", outside + "/a"));  // private: level 1 needs no stamp
  testutil::RemoveTree(outside);

  auto place = [&](const std::string& name, const std::string& ns) {
    FileRecord r = Place(name, 10);
    const std::string v = VersionStamp(r, true);
    if (::setxattr(Path(name).c_str(), kVersionXattr, v.data(), v.size(), 0) != 0) return false;
    cache.NoteFetched(ns, Path(name), r);
    return true;
  };
  auto stamped = [this](const std::string& name) {
    return ::getxattr(Path(name).c_str(), kVersionXattr, nullptr, 0) > 0;
  };
  if (!place("a", "ns")) GTEST_SKIP() << "no user xattrs here";
  ASSERT_TRUE(place("b", "other"));
  // The gap counts at once; the stamps go when its withdrawal runs (the
  // service runs it off its loop), and not while the cache's lock is held:
  // another copy is indexed meanwhile.
  const NodeCache::Withdrawal withdrawal = cache.GapBegins("ns");
  EXPECT_EQ(withdrawal.size(), 1u);
  EXPECT_FALSE(cache.StampRevocable("ns", Path("e")));
  EXPECT_TRUE(stamped("a"));
  ASSERT_TRUE(place("e", "other"));
  withdrawal.Run();
  EXPECT_FALSE(stamped("a"));
  EXPECT_TRUE(stamped("b"));  // another namespace
  EXPECT_TRUE(stamped("e"));
  EXPECT_TRUE(cache.GapBegins("ns").empty());  // the gap began already
  EXPECT_FALSE(cache.StampRevocable("ns", Path("c")));
  ASSERT_TRUE(place("c", "ns"));  // stamped before the gap was known to it
  EXPECT_FALSE(stamped("c"));
  cache.GapEnds("ns");
  EXPECT_TRUE(cache.StampRevocable("ns", Path("d")));
  ASSERT_TRUE(place("d", "ns"));
  EXPECT_TRUE(stamped("d"));
  EXPECT_TRUE(Exists("a"));  // never removed from the producer tree
  EXPECT_EQ(cache.files(), 5u);
}

// A service starting again cannot withdraw the revocable stamps an earlier
// run left (its index is empty): DemoteStamps makes each the plain stamp of
// its version, in subdirectories too, without following a symlink out of
// the tree or waiting on a FIFO, and leaves other files alone.
TEST_F(NodeCacheTest, DemoteStampsLeavesOnlyPlainStamps) {
  ASSERT_EQ(::mkdir(Path("sub").c_str(), 0755), 0);
  const testutil::TempDir out("dyad-node-cache-outside.");  // removed also on failure
  ASSERT_TRUE(out.ok());
  const std::string& outside = out.path();
  auto stamp = [](const std::string& path, const std::string& v) {
    return ::setxattr(path.c_str(), kVersionXattr, v.data(), v.size(), 0) == 0;
  };
  auto read = [](const std::string& path) {
    char b[64];
    const ssize_t n = ::getxattr(path.c_str(), kVersionXattr, b, sizeof b);
    return n < 0 ? std::string() : std::string(b, static_cast<size_t>(n));
  };
  const FileRecord a = Place("a", 10);
  if (!stamp(Path("a"), VersionStamp(a, true))) GTEST_SKIP() << "no user xattrs here";
  const FileRecord b = Place("sub/b", 20);
  ASSERT_TRUE(stamp(Path("sub/b"), VersionStamp(b, true)));
  const FileRecord c = Place("c", 30);
  ASSERT_TRUE(stamp(Path("c"), VersionStamp(c, false)));  // plain already
  Place("d", 5);                                          // no stamp
  const std::string target = outside + "/t";
  std::ofstream(target) << "t";
  ASSERT_TRUE(stamp(target, VersionStamp(a, true)));
  ASSERT_EQ(::symlink(target.c_str(), Path("link").c_str()), 0);
  ASSERT_EQ(::symlink(outside.c_str(), Path("linkdir").c_str()), 0);  // a directory outside
  ASSERT_EQ(::mkfifo(Path("fifo").c_str(), 0644), 0);

  EXPECT_EQ(NodeCache::DemoteStamps(dir_), 2u);
  EXPECT_EQ(read(Path("a")), VersionStamp(a, false));
  EXPECT_EQ(read(Path("sub/b")), VersionStamp(b, false));
  EXPECT_EQ(read(Path("c")), VersionStamp(c, false));
  EXPECT_EQ(read(Path("d")), "");
  EXPECT_TRUE(IsRevocableStamp(read(target)));  // outside the tree: untouched
  EXPECT_EQ(NodeCache::DemoteStamps(dir_), 0u);
}

// Issue 26 item 1: the cache returns under budget without another consume
// once the grace period is over (Trim, the service's timer).
TEST_F(NodeCacheTest, FieldReadyTrimEvictsAfterTheGrace) {
  NodeCache cache(150, &stats_, /*grace_ms=*/300);
  cache.NoteFetched("ns", Path("a"), Place("a", 100));
  cache.NoteFetched("ns", Path("b"), Place("b", 100));
  EXPECT_EQ(cache.bytes(), 200u);  // both within the grace period
  cache.Trim();
  EXPECT_EQ(cache.bytes(), 200u);
  ::usleep(400 * 1000);
  cache.Trim();
  EXPECT_EQ(cache.bytes(), 100u);
  EXPECT_FALSE(Exists("a"));
}

// Issue 26 item 1: a copy that cannot be removed (a read-only directory;
// for root, a read-only bind mount) is counted apart and no longer holds
// the budget.
TEST_F(NodeCacheTest, FieldReadyUnremovableCopiesArePinnedApart) {
  NodeCache cache(150, &stats_, /*grace_ms=*/0);
  ASSERT_EQ(::mkdir(Path("ro").c_str(), 0755), 0);
  FileRecord r = Place("ro/a", 100);
  const std::string ro = Path("ro");
  bool mounted = false;
  if (::geteuid() == 0) {
    mounted = ::mount(ro.c_str(), ro.c_str(), nullptr, MS_BIND, nullptr) == 0;
    if (!mounted) GTEST_SKIP() << "cannot bind-mount: " << std::strerror(errno);
    if (::mount(nullptr, ro.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) != 0) {
      ::umount2(ro.c_str(), MNT_DETACH);
      GTEST_SKIP() << "cannot remount read-only: " << std::strerror(errno);
    }
  } else {
    ASSERT_EQ(::chmod(ro.c_str(), 0555), 0);
  }
  cache.NoteFetched("ns", Path("ro/a"), r);
  cache.NoteFetched("ns", Path("b"), Place("b", 100));
  if (mounted)
    ::umount2(ro.c_str(), MNT_DETACH);
  else
    ::chmod(ro.c_str(), 0755);
  EXPECT_TRUE(Exists("ro/a"));
  EXPECT_EQ(cache.pinned_bytes(), 100u);
  EXPECT_EQ(cache.bytes(), 100u);
  EXPECT_EQ(cache.files(), 2u);
}

TEST(FileRecordSeq, OldRecordsDecodeAndNewOnesRoundTrip) {
  FileRecord r;
  r.owner_rank = 1;
  r.upath = "x";
  FileRecord out;
  ASSERT_TRUE(FileRecord::Decode(r.Encode(), &out));  // seq 0: the old layout
  EXPECT_EQ(out.seq, 0u);
  r.seq = 42;
  ASSERT_TRUE(FileRecord::Decode(r.Encode(), &out));
  EXPECT_EQ(out.seq, 42u);
  std::string bad = r.Encode() + "z";
  EXPECT_FALSE(FileRecord::Decode(bad, &out));
}

}  // namespace
}  // namespace dyad
