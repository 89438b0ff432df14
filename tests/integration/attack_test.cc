// attack_test.cc: attacks tried against built services as an outsider
// would (issue 12 audit), each checked against what docs/security.md says:
//
// * a third host floods the owner with idle unauthenticated TCP connections
//   while a real consume runs (defect 6): the flood is capped per address
//   and refused cheaply, the refusals are logged rate-limited, and the
//   consume succeeds;
// * a FIFO swapped in for a published file (defect 3): consumes on another
//   node and on the owner's own node fail within seconds, and the owner's
//   service still stops on SIGTERM.
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>

#include "integration/integration_util.h"
#include "proto/auth.h"

namespace dyad::it {
namespace {

constexpr int kAttacker = 2;  // a node that runs no DYAD client, only the flood

class AttackTest : public TwoNodeTest {
 protected:
  int NodeCount() const override { return 3; }
};

// Handshake places cut to 8 so that one attacker address can fill them all
// (with the default 64 it takes four addresses at 16 each).
class FullHandshakePlacesTest : public AttackTest {
 protected:
  emu::ClusterOptions Options() override {
    emu::ClusterOptions o;
    o.service_env = {{"DYAD_MAX_UNAUTHENTICATED", "8"}};
    return o;
  }
};

size_t CountOf(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t pos = text.find(what); pos != std::string::npos; pos = text.find(what, pos + 1)) ++n;
  return n;
}

TEST_F(AttackTest, Defect6_FloodOfIdleConnectionsWhileAConsumeRuns) {
  if (!cluster().uses_netns()) GTEST_SKIP() << "needs a third host (network namespaces)";
  const std::vector<ManifestEntry> files = {{"flood/data.bin", 8 * static_cast<int64_t>(kMiB)}};
  Produce(files);
  // 400 connections from one address that never say a word; the cap on
  // handshakes per address is 16 (DYAD_MAX_UNAUTHENTICATED_PER_PEER).
  constexpr int kFlood = 400;
  std::vector<UniqueFd> flood;
  for (int i = 0; i < kFlood; ++i) {
    Result<UniqueFd> fd =
        cluster().ConnectFrom(kAttacker, cluster().node(kA).address(), Deadline::AfterMs(2000));
    if (fd.ok()) flood.push_back(std::move(*fd));
  }
  ASSERT_GE(flood.size(), static_cast<size_t>(kFlood) * 9 / 10) << "the flood could not connect";
  ConsumeOk(files);  // B is another address: untouched by the attacker's cap
  const Deadline deadline = Deadline::AfterMs(5000);
  uint64_t refused = 0;
  while ((refused = Counter(kA, "connections.refused")) < kFlood - 16 && !deadline.expired())
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_GE(refused, static_cast<uint64_t>(kFlood - 16));
  // Rate-limited: a line every 10 s at most, not one per connection.
  const size_t lines = CountOf(cluster().ServiceLogTail(kA, 1 << 20), "connection(s) in the last");
  EXPECT_GE(lines, 1u);
  EXPECT_LE(lines, 3u);
  EXPECT_TRUE(cluster().ServiceStatus(kA).ok());
}

TEST_F(AttackTest, Defect3_FifoSwappedInAfterPublishFailsFastAndTheServiceStillStops) {
  const std::string name = "fifo/swapped.dat";
  Produce({{name, 4096}});
  ASSERT_EQ(::unlink(PathOn(kA, name).c_str()), 0);
  ASSERT_EQ(::mkfifo(PathOn(kA, name).c_str(), 0644), 0);
  for (int node : {kB, kA}) {  // another node (tcp), the owner's node (no transfer)
    SCOPED_TRACE("consumer on node " + std::to_string(node));
    const uint64_t t0 = MonoNs();
    auto r =
        Consume({{name, 4096}}, {"--no-verify"}, {{"DYAD_CONSUME_TIMEOUT", "30"}}, node, 40000);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_LT(MonoNs() - t0, 10'000'000'000ull) << "the consume hung on the FIFO";
    if (node == kB) {
      EXPECT_NE(r[0].rc, DYAD_RC_OK);
      EXPECT_FALSE(r[0].message.empty());
      struct stat sb;
      EXPECT_NE(::lstat(PathOn(kB, name).c_str(), &sb), 0) << "something was placed";
    }
  }
  // Nothing in the owner's service is stuck on the FIFO: SIGTERM stops it.
  Status stop = cluster().StopService(kA);
  EXPECT_TRUE(stop.ok()) << stop.ToString();
}

// Found by this audit: while silent connections held every handshake place,
// the service refused a real peer's new session at accept, and the consume
// that needed it failed at once with DYAD_RC_CONNLOST. Now the oldest silent
// handshake gives its place to the newcomer, which gets in.
TEST_F(FullHandshakePlacesTest, NewPeerSessionGetsInWhileSilentPeersHoldEveryPlace) {
  if (!cluster().uses_netns()) GTEST_SKIP() << "needs a third host (network namespaces)";
  const std::vector<ManifestEntry> files = {{"places/data.bin", 100000}};
  Produce(files);
  std::vector<UniqueFd> flood;
  for (int i = 0; i < 8; ++i) {
    Result<UniqueFd> fd =
        cluster().ConnectFrom(kAttacker, cluster().node(kA).address(), Deadline::AfterMs(2000));
    ASSERT_TRUE(fd.ok()) << Str(fd.status());
    flood.push_back(std::move(*fd));
  }
  (void)testutil::Eventually([&] { return Counter(kA, "connections.handshaking") >= 8; }, 3000, 20);
  ASSERT_EQ(Counter(kA, "connections.handshaking"), 8u);
  // Silent for a while, as a flood's connections are (each may stay 5 s); a
  // handshake younger than 20 ms keeps its place, so that a burst of real
  // peers larger than the cap still makes progress.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ConsumeOk(files, {}, {{"DYAD_CONSUME_TIMEOUT", "15"}});
  EXPECT_GE(Counter(kA, "connections.refused"), 1u) << "no silent handshake was displaced";
  // The handshake that made room was told so (after its challenge), as a
  // real peer in its place would need to know to dial again.
  size_t told = 0;
  for (const UniqueFd& fd : flood) {
    std::string got;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd.get(), buf, sizeof buf, MSG_DONTWAIT)) > 0)
      got.append(buf, static_cast<size_t>(n));
    if (got.find(kHandshakeBusyMessage) != std::string::npos) ++told;
  }
  EXPECT_GE(told, 1u) << "no displaced handshake was told the owner is busy";
}

}  // namespace
}  // namespace dyad::it
