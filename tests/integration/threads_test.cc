// A service's threads are bounded and lazy (docs/architecture.md): idle, it
// runs at most six; serving requests starts workers up to --workers per
// pool; idle connections add none.

#include <dirent.h>

#include <algorithm>
#include <string>
#include <vector>

#include "integration/integration_util.h"

namespace dyad::it {
namespace {

// The most threads seen in a 1.5 s window, once two windows in a row agree
// (threads started by earlier work have ended), within 15 s. A window is
// longer than the service's 1 s housekeeping tick, which may start a pool
// thread that comes and goes with the 300 ms idle bound set below, so it
// is always counted.
size_t SettledThreadsOf(pid_t pid) {
  auto window = [pid] {
    size_t most = 0;
    for (int i = 0; i < 15; ++i) {
      most = std::max(most, testutil::ThreadsOf(pid));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return most;
  };
  size_t last = window();
  const Deadline deadline = Deadline::AfterMs(15000);
  while (!deadline.expired()) {
    const size_t now = window();
    if (now == last) return now;
    last = now;
  }
  return last;
}

constexpr size_t kIdleServiceThreads = 6;  // docs/architecture.md

// How many of `pid`'s threads are called `name` (/proc/PID/task/*/comm).
size_t ThreadsNamed(pid_t pid, const std::string& name) {
  size_t n = 0;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string comm = testutil::ReadAll(dir + "/" + e->d_name + "/comm");
    while (!comm.empty() && comm.back() == '\n') comm.pop_back();
    n += comm == name ? 1 : 0;
  }
  ::closedir(d);
  return n;
}

class ThreadsTest : public TwoNodeTest {
 protected:
  // Workers end after 300 ms without work (default 30 s), so the test sees
  // the idle service soon after the start-up's own requests.
  emu::ClusterOptions Options() override {
    emu::ClusterOptions o;
    o.service_env["DYAD_WORKER_IDLE_MS"] = "300";
    return o;
  }
};

TEST_F(ThreadsTest, IdleServiceRunsAtMostSixThreadsAndIdleConnectionsAddNone) {
  for (int node = 0; node < 2; ++node) {
    const size_t idle = SettledThreadsOf(cluster().ServicePid(node));
    EXPECT_GT(idle, 0u);
    EXPECT_LE(idle, kIdleServiceThreads) << "node " << node << " (root: " << (node == 0) << ")";
  }
  // Work starts workers, up to the pools' bound (--workers, default 8), and
  // they end once idle.
  const std::vector<ManifestEntry> files = {{"t1.dat", 4096}, {"t2.dat", 70000}};
  Produce(files);
  ConsumeOk(files);
  const pid_t b = cluster().ServicePid(1);
  EXPECT_LE(testutil::ThreadsOf(b), kIdleServiceThreads + 2 * 8);
  const size_t busy = SettledThreadsOf(b);
  EXPECT_LE(busy, kIdleServiceThreads);
  // 300 idle local clients and 100 idle TCP connections: no new thread.
  std::vector<UniqueFd> idle_conns;
  SocketAddress unix_addr;
  unix_addr.is_unix = true;
  unix_addr.host = cluster().node(1).socket;
  for (int i = 0; i < 300; ++i) {
    auto fd = Connect(unix_addr, Deadline::AfterMs(5000));
    ASSERT_TRUE(fd.ok()) << Str(fd.status());
    idle_conns.push_back(std::move(*fd));
  }
  auto tcp = ParseAddress(cluster().node(1).address());
  ASSERT_TRUE(tcp.ok());
  for (int i = 0; i < 100; ++i) {
    if (cluster().uses_netns()) break;  // this process is outside the nodes' namespaces
    auto fd = Connect(*tcp, Deadline::AfterMs(5000));
    ASSERT_TRUE(fd.ok()) << Str(fd.status());
    idle_conns.push_back(std::move(*fd));
  }
  EXPECT_LE(SettledThreadsOf(b), busy) << idle_conns.size() << " idle connections";
  idle_conns.clear();
  // The service still serves.
  const std::vector<ManifestEntry> after = {{"t3.dat", 1000}};
  Produce(after);
  ConsumeOk(after);
}

// One runtime: once a consume has been served, the root (its store's
// change feeds and deadlines) and the consuming service (its store client's
// feed of the namespace it now follows, and its waits) each run one event
// loop, the service's: the store keeps none of its own.
TEST_F(ThreadsTest, TheRootAndAFollowingServiceRunOneLoopEach) {
  const std::vector<ManifestEntry> files = {{"loops/a.dat", 4096}};
  Produce(files);
  ConsumeOk(files);
  for (int node = 0; node < 2; ++node) {
    const pid_t pid = cluster().ServicePid(node);
    (void)SettledThreadsOf(pid);
    EXPECT_EQ(ThreadsNamed(pid, "dyad-loop"), 1u)
        << "node " << node << " (root: " << (node == 0) << ")";
  }
}

}  // namespace
}  // namespace dyad::it
