// common_atomic_file_test.cc: AtomicFile, the atomic placement of a copy
// (issue 28, "placement at the cost of the file system's minimum"): a file
// written without a name (O_TMPFILE) and linked under its final name when
// complete, or linked beside it and renamed over an old version; the
// named-temporary fallback for file systems without O_TMPFILE; the stamps
// (mode, version as mtime, extended attribute, size check); symlinks in
// the way are refused or replaced, never followed.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <set>
#include <string>

#include "common/fsutil.h"
#include "common/net.h"
#include "util.h"

namespace dyad {
namespace {

std::set<std::string> Entries(const std::string& dir) {
  std::set<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string n = e->d_name;
    if (n != "." && n != "..") out.insert(n);
  }
  ::closedir(d);
  return out;
}

std::string Read(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return "<missing>";
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd.get(), buf, sizeof buf)) > 0;) out.append(buf, n);
  return out;
}

Status Put(AtomicFile& f, const std::string& data) {
  return WriteFully(f.fd(), data.data(), data.size());
}

class AtomicFileTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    ASSERT_TRUE(dir_.ok());
    root_ = dir_.path() + "/root";
    ASSERT_EQ(::mkdir(root_.c_str(), 0755), 0);
    AtomicFile::ForceNamedTemporaries(named());
  }
  void TearDown() override { AtomicFile::ForceNamedTemporaries(false); }
  bool named() const { return GetParam(); }

  testutil::TempDir dir_{"dyad-atomic."};
  std::string root_;
};

// While the bytes arrive, nothing readable has the final name; with
// O_TMPFILE nothing at all is in the directory (nothing to sweep after a
// crash). Commit stamps the producer's mode and version and links it.
TEST_P(AtomicFileTest, NewFileAppearsCompleteWithItsModeAndVersion) {
  AtomicFile f;
  ASSERT_TRUE(f.Create(root_, "sub/a.dat").ok());
  EXPECT_EQ(f.unnamed(), !named());
  ASSERT_TRUE(Put(f, "hello").ok());
  const std::set<std::string> during = Entries(root_ + "/sub");
  EXPECT_EQ(during.count("a.dat"), 0u);
  EXPECT_EQ(during.size(), named() ? 1u : 0u) << "entries while writing";
  AtomicFile::CommitOptions o;
  o.version_ns = 1234567890123456789ull;
  o.mode = 0640 | S_ISUID;  // set-id bits from a peer are dropped
  o.expect_size = 5;
  struct stat placed;
  o.placed = &placed;
  ASSERT_TRUE(f.Commit(o).ok());
  EXPECT_EQ(Read(root_ + "/sub/a.dat"), "hello");
  EXPECT_EQ(Entries(root_ + "/sub"), std::set<std::string>{"a.dat"});
  struct stat st;
  ASSERT_EQ(::stat((root_ + "/sub/a.dat").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0640u);
  EXPECT_EQ(MtimeNs(st), 1234567890123456789ull);
  EXPECT_EQ(placed.st_ino, st.st_ino);
  EXPECT_EQ(MtimeNs(placed), MtimeNs(st));
  EXPECT_EQ(placed.st_size, 5);
}

// The mode is the producer's whatever this process's umask is now (the
// permission change is skipped only when the file already has that mode).
TEST_P(AtomicFileTest, ModeIsExactUnderAnyUmask) {
  for (const mode_t mask : {mode_t{077}, mode_t{0}, mode_t{022}}) {
    const mode_t old = ::umask(mask);
    for (const mode_t want : {mode_t{0644}, mode_t{0600}, mode_t{0666}}) {
      AtomicFile f;
      const std::string name = "m" + std::to_string(mask) + "-" + std::to_string(want);
      ASSERT_TRUE(f.Create(root_, name).ok());
      AtomicFile::CommitOptions o;
      o.mode = want;
      struct stat placed;
      o.placed = &placed;
      ASSERT_TRUE(f.Commit(o).ok());
      struct stat st;
      ASSERT_EQ(::stat((root_ + "/" + name).c_str(), &st), 0);
      EXPECT_EQ(st.st_mode & 07777, want) << "umask " << mask;
      EXPECT_EQ(placed.st_mode & 07777, want);
    }
    ::umask(old);
  }
}

// The version stamp travels with the file (where user attributes exist).
TEST_P(AtomicFileTest, ExtendedAttributeIsSetBeforeTheFileHasItsName) {
  AtomicFile f;
  ASSERT_TRUE(f.Create(root_, "x.dat").ok());
  ASSERT_TRUE(Put(f, "x").ok());
  AtomicFile::CommitOptions o;
  o.xattr_name = "user.dyad.test";
  o.xattr_value = "v1";
  ASSERT_TRUE(f.Commit(o).ok());
  char buf[16];
  const ssize_t n = ::getxattr((root_ + "/x.dat").c_str(), "user.dyad.test", buf, sizeof buf);
  if (n < 0 && (errno == ENOTSUP || errno == EOPNOTSUPP)) GTEST_SKIP() << "no user xattrs here";
  ASSERT_EQ(n, 2);
  EXPECT_EQ(std::string(buf, 2), "v1");
}

// A new version replaces the old copy in one step: a reader holding the
// old one open keeps the complete old bytes, a new open gets the new ones,
// and no temporary is left.
TEST_P(AtomicFileTest, NewVersionReplacesTheOldCopyAtomically) {
  {
    AtomicFile f;
    ASSERT_TRUE(f.Create(root_, "v.dat").ok());
    ASSERT_TRUE(Put(f, "old version").ok());
    ASSERT_TRUE(f.Commit(1000000000ull, false).ok());
  }
  UniqueFd reader(::open((root_ + "/v.dat").c_str(), O_RDONLY | O_CLOEXEC));
  ASSERT_TRUE(reader.valid());
  AtomicFile f;
  ASSERT_TRUE(f.Create(root_, "v.dat").ok());
  ASSERT_TRUE(Put(f, "new").ok());
  EXPECT_EQ(Read(root_ + "/v.dat"), "old version");
  ASSERT_TRUE(f.Commit(2000000000ull, false).ok());
  EXPECT_EQ(Read(root_ + "/v.dat"), "new");
  char buf[32];
  const ssize_t n = ::pread(reader.get(), buf, sizeof buf, 0);
  EXPECT_EQ(std::string(buf, n > 0 ? n : 0), "old version");
  EXPECT_EQ(Entries(root_), std::set<std::string>{"v.dat"});
}

// Fewer bytes than the record announced: nothing is placed, nothing left.
TEST_P(AtomicFileTest, WrongSizeIsNeverPlaced) {
  AtomicFile f;
  ASSERT_TRUE(f.Create(root_, "short.dat").ok());
  ASSERT_TRUE(Put(f, "abc").ok());
  AtomicFile::CommitOptions o;
  o.expect_size = 10;
  const Status st = f.Commit(o);
  EXPECT_EQ(st.code(), DYAD_RC_STALE) << st.ToString();
  f.Abort();
  EXPECT_TRUE(Entries(root_).empty());
}

TEST_P(AtomicFileTest, AbortLeavesNothing) {
  {
    AtomicFile f;
    ASSERT_TRUE(f.Create(root_, "gone.dat").ok());
    ASSERT_TRUE(Put(f, "partial").ok());
  }  // destroyed uncommitted
  EXPECT_TRUE(Entries(root_).empty());
}

// A symlink planted at the final name is replaced, never written through.
TEST_P(AtomicFileTest, SymlinkAtTheFinalNameIsReplacedNotFollowed) {
  const std::string outside = dir_.path() + "/outside.txt";
  {
    UniqueFd o(::open(outside.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    ASSERT_TRUE(o.valid());
    ASSERT_TRUE(WriteFully(o.get(), "precious", 8).ok());
  }
  ASSERT_EQ(::symlink(outside.c_str(), (root_ + "/link.dat").c_str()), 0);
  AtomicFile f;
  ASSERT_TRUE(f.Create(root_, "link.dat").ok());
  ASSERT_TRUE(Put(f, "copy").ok());
  ASSERT_TRUE(f.Commit(0, false).ok());
  struct stat st;
  ASSERT_EQ(::lstat((root_ + "/link.dat").c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  EXPECT_EQ(Read(outside), "precious");
  EXPECT_EQ(Read(root_ + "/link.dat"), "copy");
}

// A symlink among the directories (to a directory outside, or within) is
// refused: the copy goes to real directories beneath the root only.
TEST_P(AtomicFileTest, SymlinkedDirectoryIsRefused) {
  const std::string elsewhere = dir_.path() + "/elsewhere";
  ASSERT_EQ(::mkdir(elsewhere.c_str(), 0755), 0);
  ASSERT_EQ(::symlink(elsewhere.c_str(), (root_ + "/d").c_str()), 0);
  AtomicFile f;
  const Status st = f.Create(root_, "d/f.dat");
  EXPECT_EQ(st.code(), DYAD_RC_PERM) << st.ToString();
  EXPECT_TRUE(Entries(elsewhere).empty());
}

// Directories that do not exist yet are made (mkdir -p beneath the root).
TEST_P(AtomicFileTest, MissingDirectoriesAreCreated) {
  AtomicFile f;
  ASSERT_TRUE(f.Create(root_, "a/b/c/deep.dat").ok());
  ASSERT_TRUE(Put(f, "deep").ok());
  ASSERT_TRUE(f.Commit(0, false).ok());
  EXPECT_EQ(Read(root_ + "/a/b/c/deep.dat"), "deep");
}

// Many placements, one directory: every temporary name is unique (the
// process's random prefix and a counter), none is left behind.
TEST_P(AtomicFileTest, ManyPlacementsLeaveOnlyTheirFiles) {
  for (int i = 0; i < 50; ++i) {
    for (int round = 0; round < 2; ++round) {  // the second replaces the first
      AtomicFile f;
      ASSERT_TRUE(f.Create(root_, "f" + std::to_string(i)).ok());
      ASSERT_TRUE(Put(f, std::to_string(round)).ok());
      ASSERT_TRUE(f.Commit(0, false).ok());
    }
  }
  const std::set<std::string> e = Entries(root_);
  EXPECT_EQ(e.size(), 50u);
  for (const std::string& n : e) EXPECT_NE(n.rfind(kPartPrefix, 0), 0u) << n;
  EXPECT_EQ(Read(root_ + "/f7"), "1");
  EXPECT_EQ(RemoveStaleTemporaries(root_), 0u);
}

INSTANTIATE_TEST_SUITE_P(Placement, AtomicFileTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? std::string("NamedTemporary") : std::string("Unnamed");
                         });

// A crash while a named temporary is written leaves it; the service's start
// removes it (RemoveStaleTemporaries). An unnamed file leaves nothing.
TEST(AtomicFileCrash, OnlyNamedTemporariesCanBeLeftAndTheSweepRemovesThem) {
  testutil::TempDir dir("dyad-atomic.");
  ASSERT_TRUE(dir.ok());
  const std::string root = dir.path();
  ASSERT_EQ(::mkdir((root + "/sub").c_str(), 0755), 0);
  const std::string stale = root + "/sub/" + kPartPrefix + "f.dat.0123456789abcdef0";
  { UniqueFd fd(::open(stale.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600)); }
  EXPECT_EQ(RemoveStaleTemporaries(root), 1u);
  EXPECT_TRUE(Entries(root + "/sub").empty());
}

}  // namespace
}  // namespace dyad
