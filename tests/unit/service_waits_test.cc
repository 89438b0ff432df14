// WaitRegistry (service/waits.h), what `dyad status` and the --wait-log
// housekeeping read: Snapshot lists every wait each time it is asked;
// LongWaits hands out each wait once, and only once it is old enough, and
// neither disturbs the other. Both name a file by the waited name that this
// node holds but never published.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "service/waits.h"
#include "util.h"

namespace dyad {
namespace {

WaitRegistry::Wait Consume(const std::string& upath, const std::string& cons) {
  WaitRegistry::Wait w;
  w.kind = "consume";
  w.ns = "ns";
  w.upath = upath;
  w.cons_path = cons;
  w.pid = 42;
  return w;
}

std::vector<std::string> Paths(const std::vector<WaitInfo>& waits) {
  std::vector<std::string> out;
  for (const WaitInfo& w : waits) out.push_back(w.upath);
  return out;
}

TEST(WaitRegistry, SnapshotListsEveryWaitOldestFirstEachTime) {
  WaitRegistry waits;
  const uint64_t a = waits.Add(Consume("a", ""));
  waits.Add(Consume("b", ""));
  const std::vector<std::string> both{"a", "b"};
  EXPECT_EQ(Paths(waits.Snapshot()), both);
  EXPECT_EQ(Paths(waits.Snapshot()), both);  // asking does not use a wait up
  EXPECT_EQ(Paths(waits.LongWaits(0)), both);
  EXPECT_EQ(Paths(waits.Snapshot()), both);  // nor does LongWaits hide it
  const std::vector<WaitInfo> s = waits.Snapshot();
  EXPECT_EQ(s[0].kind, "consume");
  EXPECT_EQ(s[0].ns, "ns");
  EXPECT_EQ(s[0].pid, 42u);
  waits.Remove(a);
  EXPECT_EQ(Paths(waits.Snapshot()), std::vector<std::string>{"b"});
  EXPECT_EQ(waits.size(), 1u);
}

TEST(WaitRegistry, LongWaitsHandsEachWaitOutOnceWhenOldEnough) {
  WaitRegistry waits;
  waits.Add(Consume("old", ""));
  const uint64_t hour_ns = 3600ull * 1000000000ull;
  EXPECT_TRUE(waits.LongWaits(hour_ns).empty());  // not old enough: not handed out
  EXPECT_EQ(Paths(waits.LongWaits(0)), std::vector<std::string>{"old"});
  EXPECT_TRUE(waits.LongWaits(0).empty()) << "handed out twice";
  waits.Add(Consume("young", ""));
  EXPECT_EQ(Paths(waits.LongWaits(0)), std::vector<std::string>{"young"});
  EXPECT_TRUE(waits.LongWaits(0).empty());
  EXPECT_EQ(waits.Snapshot().size(), 2u);
}

TEST(WaitRegistry, NamesTheLocalFileOfAConsume) {
  testutil::TempDir dir;
  ASSERT_TRUE(testutil::WriteFile(dir.path() + "/here.txt", "x"));
  WaitRegistry waits;
  waits.Add(Consume("here.txt", dir.path()));
  waits.Add(Consume("missing.txt", dir.path()));
  WaitRegistry::Wait locate = Consume("here.txt", dir.path());
  locate.kind = "locate";
  waits.Add(locate);
  for (const std::vector<WaitInfo>& list : {waits.Snapshot(), waits.LongWaits(0)}) {
    ASSERT_EQ(list.size(), 3u);
    EXPECT_EQ(list[0].local, dir.path() + "/here.txt");
    EXPECT_EQ(list[1].local, "");
    EXPECT_EQ(list[2].local, "") << "a locate names no consumer directory";
  }
}

}  // namespace
}  // namespace dyad
