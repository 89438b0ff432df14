// ops_startup_test.cc: dyad-service behaves like a daemon at start-up:
// a rank belongs to one live service, a stop signal ends every start-up
// wait within a second, credential errors (cluster secret, Redis) fail at
// once with the reason, the advertised address is one peers can reach even
// when the host name resolves to loopback, an address answered by another
// rank is reported at ERROR, SIGHUP reopens the logs, and a failed consume
// reaches the error log.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <set>

#include "emu/redis_server.h"
#include "integration/ops_util.h"

namespace dyad::it {
namespace {

constexpr uint16_t kExtraPort = 7591;

std::string OnPort(const std::string& ip, uint16_t port) { return ip + ":" + std::to_string(port); }

TEST_F(OpsTest, RankHeldByALiveServiceIsRefusedAndADeadHolderReplaced) {
  const emu::NodeInfo& b = cluster().node(kB);
  ExtraService s = NewExtra("claimant");
  Start(kA, s, ServiceArgv(s, b.rank, OnPort(cluster().node(kA).ip, kExtraPort), RootStore()));
  auto st = s.process.Wait(Deadline::AfterMs(15000));
  ASSERT_TRUE(st.ok()) << "a second service took rank 1 although its holder lives\n"
                       << ReadText(s.log);
  EXPECT_EQ(st->code, 1);
  const std::string out = ReadText(s.log);
  EXPECT_NE(out.find("rank 1 is held by a live dyad-service"), std::string::npos) << out;
  EXPECT_NE(out.find(b.address()), std::string::npos) << out;
  EXPECT_NE(out.find("pid " + std::to_string(cluster().ServicePid(kB))), std::string::npos) << out;
  EXPECT_NE(out.find("started "), std::string::npos) << out;
  EXPECT_TRUE(cluster().ServiceRunning(kB));

  // The holder dies without unregistering: the next claimant takes over.
  ASSERT_TRUE(cluster().KillService(kB).ok());
  ExtraService t = NewExtra("successor");
  Start(kA, t, ServiceArgv(t, b.rank, OnPort(cluster().node(kA).ip, kExtraPort), RootStore()));
  ASSERT_TRUE(WaitReady(t)) << ReadText(t.log);
  EXPECT_NE(ReadText(t.log).find("no longer answers"), std::string::npos) << ReadText(t.log);
  auto peers = Dyad(kA, {"peers", "--json"});
  EXPECT_NE(peers.output.find(OnPort(cluster().node(kA).ip, kExtraPort)), std::string::npos)
      << peers.output;
  t.process.Stop();
}

// The wait for a root that refuses connections (it is down).
TEST_F(OpsTest, SigtermEndsTheWaitForAnAbsentRootWithinASecond) {
  ASSERT_TRUE(cluster().KillService(kA).ok());
  ExtraService s = NewExtra("waiter");
  Start(kB, s, ServiceArgv(s, 7, OnPort(cluster().node(kB).ip, kExtraPort), RootStore()));
  ASSERT_TRUE(WaitForText(s.log, "not reachable yet", 10000)) << ReadText(s.log);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // into a back-off pause
  const uint64_t t0 = MonoNs();
  s.process.Signal(SIGTERM);
  auto st = s.process.Wait(Deadline::AfterMs(10000));
  const uint64_t took = MonoNs() - t0;
  ASSERT_TRUE(st.ok());
  EXPECT_LT(took, 1'500'000'000ull) << "SIGTERM took " << took / 1000000 << " ms\n"
                                    << ReadText(s.log);
  EXPECT_TRUE(st->success()) << st->ToString() << "\n" << ReadText(s.log);
}

// The wait inside a store call that hangs: the root's address drops every
// packet (nothing answers ARP for it), so a connection attempt would last
// until the RPC timeout.
TEST_F(OpsTest, SigtermEndsAStoreCallThatHangsWithinASecond) {
  if (!cluster().uses_netns()) GTEST_SKIP() << "needs network namespaces";
  const std::string& ip = cluster().node(kA).ip;
  const std::string silent = ip.substr(0, ip.rfind('.') + 1) + "200";
  ExtraService s = NewExtra("hanging");
  Start(kB, s,
        ServiceArgv(s, 7, OnPort(cluster().node(kB).ip, kExtraPort),
                    "embedded://" + OnPort(silent, 7590), {"--rpc-timeout", "60"}));
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  ASSERT_FALSE(s.process.Exited()) << ReadText(s.log);
  const uint64_t t0 = MonoNs();
  s.process.Signal(SIGTERM);
  auto st = s.process.Wait(Deadline::AfterMs(10000));
  const uint64_t took = MonoNs() - t0;
  ASSERT_TRUE(st.ok());
  EXPECT_LT(took, 1'500'000'000ull) << "SIGTERM took " << took / 1000000 << " ms\n"
                                    << ReadText(s.log);
}

// The thread ids of `pid` now.
std::set<std::string> TidsOf(pid_t pid) {
  std::set<std::string> out;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') out.insert(e->d_name);
  ::closedir(d);
  return out;
}

// Issue 24 (one runtime), start-up: a root that accepts connections and
// never answers, with a 2 s RPC timeout, so that every registration attempt
// ends in a store call that times out and the next attempt follows. The
// attempts' store calls share one thread (no thread per call, as the
// helper thread per call and its 50 ms polling had), and a SIGTERM while a
// call hangs ends the service at once, not when the call gives up.
TEST_F(OpsTest, StartupStoreCallsShareOneThreadAndSigtermDoesNotWaitForThem) {
  auto any = ParseAddress("127.0.0.1:0");
  ASSERT_TRUE(any.ok());
  auto silent = Listen(*any);
  ASSERT_TRUE(silent.ok()) << Str(silent.status());
  ASSERT_EQ(::fcntl(silent->get(), F_SETFL, ::fcntl(silent->get(), F_GETFL) | O_NONBLOCK), 0);
  auto bound = BoundAddress(silent->get());
  ASSERT_TRUE(bound.ok());
  ExtraService s = NewExtra("silent-root");
  emu::SpawnOptions o;  // in this process's network: the silent root is on its loopback
  o.argv =
      ServiceArgv(s, 7, "127.0.0.1:0", "embedded://" + bound->ToString(), {"--rpc-timeout", "2"});
  o.stdout_path = s.log;
  o.stderr_path = s.log;
  auto p = emu::Process::Spawn(o);
  ASSERT_TRUE(p.ok()) << Str(p.status());
  s.process = std::move(*p);
  std::vector<UniqueFd> calls;  // held open, never answered
  auto accept_all = [&] {
    for (;;) {
      UniqueFd c(::accept4(silent->get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!c.valid()) return;
      calls.push_back(std::move(c));
    }
  };
  ASSERT_TRUE(WaitForText(s.log, "not reachable yet", 15000)) << ReadText(s.log);
  accept_all();
  const size_t first_calls = calls.size();
  ASSERT_GE(first_calls, 1u) << ReadText(s.log);
  const std::set<std::string> before = TidsOf(s.process.pid());
  ASSERT_FALSE(before.empty());
  // Three more attempts, the threads sampled every 10 ms meanwhile.
  std::set<std::string> appeared;
  size_t most = before.size();
  const Deadline deadline = Deadline::AfterMs(20000);
  while (calls.size() < first_calls + 3 && !deadline.expired() && !s.process.Exited()) {
    pollfd pfd{silent->get(), POLLIN, 0};
    (void)::poll(&pfd, 1, 10);
    accept_all();
    const std::set<std::string> now = TidsOf(s.process.pid());
    most = std::max(most, now.size());
    for (const std::string& t : now)
      if (before.count(t) == 0) appeared.insert(t);
  }
  ASSERT_GE(calls.size(), first_calls + 3) << "the attempts stopped\n" << ReadText(s.log);
  EXPECT_TRUE(appeared.empty()) << appeared.size() << " threads started during "
                                << calls.size() - first_calls
                                << " attempts (before: " << before.size() << ")";
  EXPECT_LE(most, before.size()) << "threads grew during the attempts";
  // The last accepted call hangs for up to 2 s: the stop does not wait for it.
  const uint64_t t0 = MonoNs();
  s.process.Signal(SIGTERM);
  auto st = s.process.Wait(Deadline::AfterMs(10000));
  const uint64_t took = MonoNs() - t0;
  ASSERT_TRUE(st.ok()) << ReadText(s.log);
  EXPECT_LT(took, 1'000'000'000ull) << "SIGTERM took " << took / 1000000 << " ms\n"
                                    << ReadText(s.log);
  EXPECT_TRUE(st->success()) << st->ToString() << "\n" << ReadText(s.log);
  EXPECT_NE(ReadText(s.log).find("stopped by a signal before start-up completed"),
            std::string::npos)
      << ReadText(s.log);
}

// Issue 24, the stop: a clean stop marks the registration stopped in the
// store, a task that waits for the store's answer at most 2 s (with the
// cluster's --rpc-timeout above that): with the root frozen (SIGSTOP), the
// call would hang for the whole RPC timeout, and the stop goes on without
// it, its thread left to finish alone (not the pool, which the stop joins).
TEST_F(OpsTest, CleanStopWaitsForAFrozenStoreAtMostTwoSeconds) {
  Frozen root(cluster().ServicePid(kA));
  ASSERT_TRUE(root.ok);
  const uint64_t t0 = MonoNs();
  const Status st = cluster().StopService(kB, 10000);
  const uint64_t took = MonoNs() - t0;
  const std::string log = ReadText(cluster().node(kB).service_log);
  EXPECT_TRUE(st.ok()) << Str(st) << "\n" << log;
  EXPECT_LT(took, 3'500'000'000ull) << "the stop took " << took / 1000000 << " ms\n" << log;
  EXPECT_NE(log.find("could not mark rank 1 as stopped in the metadata store within"),
            std::string::npos)
      << log;
}

TEST_F(OpsTest, WrongClusterSecretFailsAtOnceWithTheReason) {
  ExtraService s = NewExtra("stranger");
  const std::string secret = s.dir + "/secret";
  WriteText(secret, "not-the-cluster-secret\n", 0600);
  std::vector<std::string> argv =
      ServiceArgv(s, 7, OnPort(cluster().node(kB).ip, kExtraPort), RootStore());
  argv[argv.size() - 2] = secret;  // --secret-file's value
  const uint64_t t0 = MonoNs();
  Start(kB, s, argv);
  auto st = s.process.Wait(Deadline::AfterMs(20000));
  ASSERT_TRUE(st.ok()) << "still running with a wrong secret\n" << ReadText(s.log);
  EXPECT_LT(MonoNs() - t0, 5'000'000'000ull) << "a refused credential was retried";
  EXPECT_EQ(st->code, 1);
  const std::string out = ReadText(s.log);
  EXPECT_NE(out.find("DYAD_RC_AUTH"), std::string::npos) << out;
  EXPECT_NE(out.find("secret"), std::string::npos) << out;
}

class RedisOpsTest : public OpsTest {
 protected:
  // A real redis-server in node A's network (the host's loopback without
  // namespaces) with `args` added to its command line.
  void StartRedis(const std::vector<std::string>& args) {
    const std::string bin = emu::FindRedisServer();
    if (bin.empty()) GTEST_SKIP() << "redis-server not installed";
    redis_dir_ = cluster().base_dir() + "/redis";
    ASSERT_EQ(::mkdir(redis_dir_.c_str(), 0755), 0);
    redis_addr_ = cluster().uses_netns() ? OnPort(cluster().node(kA).ip, 6399)
                                         : "127.0.0.1:" + std::to_string(emu::FreePort());
    emu::SpawnOptions o;
    o.argv = {bin,
              "--port",
              redis_addr_.substr(redis_addr_.rfind(':') + 1),
              "--bind",
              redis_addr_.substr(0, redis_addr_.rfind(':')),
              "--save",
              "",
              "--appendonly",
              "no",
              "--dir",
              redis_dir_,
              "--logfile",
              redis_dir_ + "/redis.log"};
    o.argv.insert(o.argv.end(), args.begin(), args.end());
    o.netns = cluster().node(kA).netns;
    auto p = emu::Process::Spawn(o);
    ASSERT_TRUE(p.ok()) << Str(p.status());
    redis_ = std::move(*p);
    const Deadline deadline = Deadline::AfterMs(5000);
    while (!cluster().ConnectFrom(kA, redis_addr_, Deadline::AfterMs(200)).ok()) {
      ASSERT_FALSE(deadline.expired()) << ReadText(redis_dir_ + "/redis.log");
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // Starts a service on `node` with store `url`; expects it to fail within
  // 5 s (the old behaviour retried credentials for 60 s). Its output.
  std::string ExpectQuickFailure(int node, const std::string& url) {
    ExtraService s = NewExtra("redis-client-" + std::to_string(seq_++));
    const std::string listen =
        cluster().uses_netns() ? OnPort(cluster().node(node).ip, kExtraPort) : "127.0.0.1:0";
    const uint64_t t0 = MonoNs();
    Start(node, s, ServiceArgv(s, 9, listen, url));
    auto st = s.process.Wait(Deadline::AfterMs(30000));
    const std::string out = ReadText(s.log);
    EXPECT_TRUE(st.ok()) << "still running\n" << out;
    if (!st.ok()) return out;
    EXPECT_EQ(st->code, 1) << out;
    EXPECT_LT(MonoNs() - t0, 5'000'000'000ull) << "a refused credential was retried\n" << out;
    return out;
  }

  std::string redis_dir_, redis_addr_;
  emu::Process redis_;
};

TEST_F(RedisOpsTest, MissingOrWrongRedisPasswordFailsAtOnce) {
  StartRedis({"--requirepass", "right-password", "--protected-mode", "no"});
  std::string out = ExpectQuickFailure(kB, "redis://" + redis_addr_);
  EXPECT_NE(out.find("NOAUTH"), std::string::npos) << out;
  EXPECT_NE(out.find("requires a password"), std::string::npos) << out;
  out = ExpectQuickFailure(kB, "redis://:wrong-password@" + redis_addr_);
  EXPECT_NE(out.find("WRONGPASS"), std::string::npos) << out;
  EXPECT_NE(out.find("password given for redis is wrong"), std::string::npos) << out;
}

TEST_F(RedisOpsTest, ProtectedModeRefusalFailsAtOnceAndSaysWhatToDo) {
  if (!cluster().uses_netns()) GTEST_SKIP() << "needs a connection from another host";
  StartRedis({"--protected-mode", "yes"});
  const std::string out = ExpectQuickFailure(kB, "redis://" + redis_addr_);
  EXPECT_NE(out.find("DENIED"), std::string::npos) << out;
  EXPECT_NE(out.find("protected mode"), std::string::npos) << out;
  EXPECT_NE(out.find("docs/redis.md"), std::string::npos) << out;
}

// A node whose host name resolves to a loopback address (common on
// clusters and in containers) still advertises an address its peers reach:
// the service runs with its own host name (UTS namespace) and /etc/hosts
// (mount namespace) mapping that name to 127.0.1.1, listening on 0.0.0.0.
TEST_F(OpsTest, HostNameResolvingToLoopbackStillAdvertisesAReachableAddress) {
  if (!cluster().uses_netns()) GTEST_SKIP() << "needs network namespaces";
  const emu::NodeInfo& b = cluster().node(kB);
  ASSERT_TRUE(cluster().StopService(kB).ok());
  ExtraService s = NewExtra("loopback-name");
  const std::string hosts = s.dir + "/hosts";
  WriteText(hosts, "127.0.0.1 localhost\n127.0.1.1 dyad-lonely-node\n");
  std::vector<std::string> argv =
      ServiceArgv(s, b.rank, "0.0.0.0:" + std::to_string(b.port), RootStore());
  argv[std::find(argv.begin(), argv.end(), "-s") - argv.begin() + 1] = b.socket;
  argv.back() = b.dmd;
  std::string cmd = "mount --bind " + hosts + " /etc/hosts && hostname dyad-lonely-node && exec";
  for (const std::string& a : argv) cmd += " '" + a + "'";
  Start(kB, s, {"unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c", cmd});
  ASSERT_TRUE(WaitReady(s)) << ReadText(s.log);
  const std::string log = ReadText(s.log);
  EXPECT_NE(log.find("resolves to 127.0.1.1"), std::string::npos) << log;
  auto status = Dyad(kB, {"status", "--json"});
  EXPECT_NE(status.output.find("\"address\": \"" + b.address() + "\""), std::string::npos)
      << status.output;
  // Files flow both ways through the advertised address.
  const std::vector<ManifestEntry> from_b = {{"lonely/out.dat", 300000}};
  Produce(from_b, {}, {}, kB);
  ConsumeOk(from_b, {}, {}, kA);
  const std::vector<ManifestEntry> to_b = {{"lonely/in.dat", 200000}};
  Produce(to_b);
  ConsumeOk(to_b);
  s.process.Stop();
}

// Rank 1 dies without unregistering and rank 2 starts on its address:
// fetching a file of rank 1 reaches rank 2, which is reported at ERROR with
// the likely causes, and the consumer gets an error instead of wrong data.
TEST_F(OpsTest, AddressAnsweredByAnotherRankIsReportedAtError) {
  const emu::NodeInfo& b = cluster().node(kB);
  const std::vector<ManifestEntry> files = {{"orphan.dat", 4096}};
  Produce(files, {}, {}, kB);
  ASSERT_TRUE(cluster().KillService(kB).ok());
  ExtraService s = NewExtra("impostor");
  std::vector<std::string> argv = ServiceArgv(s, 2, b.address(), RootStore());
  Start(kB, s, argv);
  ASSERT_TRUE(WaitReady(s)) << ReadText(s.log);
  auto r = Consume(files, {}, {{"DYAD_CONSUME_TIMEOUT", "20"}}, kA);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].rc, DYAD_RC_OK);
  const std::string log = ReadText(cluster().node(kA).service_log);
  const size_t at = log.find("ERROR");
  ASSERT_NE(at, std::string::npos) << log;
  EXPECT_NE(log.find("answered by rank 2", at), std::string::npos) << log;
  EXPECT_NE(log.find("--advertise", at), std::string::npos) << log;
  s.process.Stop();
}

TEST_F(OpsTest, SighupReopensTheLogFiles) {
  const std::string log = cluster().node(kA).service_log;
  ASSERT_EQ(::rename(log.c_str(), (log + ".1").c_str()), 0);
  ASSERT_EQ(::kill(cluster().ServicePid(kA), SIGHUP), 0);
  ASSERT_TRUE(WaitForText(log, "log files reopened", 5000));
  EXPECT_TRUE(cluster().ServiceRunning(kA));
  // Later messages go to the new file, not the rotated one.
  const std::string rotated = ReadText(log + ".1");
  const std::vector<ManifestEntry> files = {{"missing-after-rotation.dat", 10}};
  auto r = Consume(files, {}, {{"DYAD_CONSUME_TIMEOUT", "0.2"}}, kA);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_TRUE(WaitForText(log, "missing-after-rotation.dat", 5000)) << ReadText(log);
  EXPECT_EQ(ReadText(log + ".1"), rotated);
}

TEST_F(OpsTest, FailedConsumeIsLoggedAtWarn) {
  const std::vector<ManifestEntry> files = {{"vanished.dat", 1000}};
  Produce(files);
  ASSERT_EQ(::unlink(PathOn(kA, "vanished.dat").c_str()), 0);
  auto r = Consume(files);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_NE(r[0].rc, DYAD_RC_OK);
  const std::string log = ReadText(cluster().node(kB).service_log);
  EXPECT_NE(log.find("WARN dyad-service[rank 1]: consume 'vanished.dat' failed"), std::string::npos)
      << log;
}

}  // namespace
}  // namespace dyad::it
