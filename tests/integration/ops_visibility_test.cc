// ops_visibility_test.cc: an operator sees what DYAD is doing: transfers in
// flight with progress on both sides, per-transport counters, which owner
// and transport served a consume, the peers and their liveness, `dyad ls`
// sorted with files of dead owners marked, a progress bar on a terminal
// only, the counters in Prometheus' format, and a Chrome/Perfetto trace
// (DYAD_TRACE) with the spans of every process and service.
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "common/trace.h"
#include "integration/ops_util.h"
#include "service/stats.h"

namespace dyad::it {
namespace {

TEST_F(OpsTest, TransfersInFlightShowProgressOnBothSidesAndCountPerTransport) {
  const std::string name = "big/inflight.dat";
  const uint64_t size = 100 * kMiB;
  InterruptibleTransfer t = StartInterruptibleTransfer(name, size);
  if (t.state == TransferState::kTooFast) GTEST_SKIP() << "transfer too fast to observe";
  ASSERT_EQ(t.state, TransferState::kInProgress) << Output(t.files);
  bool seen_in = false, seen_out = false;
  const Deadline deadline = Deadline::AfterMs(20000);
  while ((!seen_in || !seen_out) && !deadline.expired() && !t.consumer.Exited()) {
    auto b = cluster().ServiceStatus(kB);
    auto a = cluster().ServiceStatus(kA);
    ASSERT_TRUE(a.ok() && b.ok());
    for (const TransferInfo& x : b->transfers)
      if (x.upath == name && !x.outgoing && x.peer_rank == 0 && x.transport == "tcp" &&
          x.bytes_total == size && x.bytes_done > 0 && x.bytes_done <= size)
        seen_in = true;
    for (const TransferInfo& x : a->transfers)
      if (x.upath == name && x.outgoing && x.peer_rank == 1 && x.bytes_total == size &&
          x.bytes_done != TransferInfo::kUnknownBytes && x.bytes_done > 0)
        seen_out = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(seen_in) << "the receiving service never listed the transfer with progress";
  EXPECT_TRUE(seen_out) << "the sending service never listed the transfer with progress";
  auto text = Dyad(kB, {"status"});
  if (!t.consumer.Exited()) {
    EXPECT_NE(text.output.find("transfers in flight"), std::string::npos) << text.output;
  }
  auto r = FinishWorker(t.consumer, t.files);
  ASSERT_EQ(r.size(), 1u);
  ASSERT_EQ(r[0].rc, DYAD_RC_OK) << r[0].message;
  EXPECT_EQ(Counter(kB, "transfers.in.tcp"), 1u);
  EXPECT_EQ(Counter(kB, "bytes.in.tcp"), size);
  EXPECT_EQ(Counter(kA, "transfers.out.tcp"), 1u);
  EXPECT_EQ(Counter(kA, "bytes.out.tcp"), size);
  auto after = cluster().ServiceStatus(kB);
  ASSERT_TRUE(after.ok());
  EXPECT_TRUE(after->transfers.empty());
}

TEST_F(OpsTest, ConsumeVerboseSaysWhichOwnerAndTransportServedTheFile) {
  const std::vector<ManifestEntry> files = {{"served/by.dat", 123456}};
  Produce(files);
  auto r = Dyad(kB, {"consume", "-v", PathOn(kB, "served/by.dat")});
  EXPECT_TRUE(r.status.success()) << r.output;
  EXPECT_NE(r.output.find("from rank 0 (" + cluster().node(kA).address() + ") over tcp"),
            std::string::npos)
      << r.output;
}

TEST_F(OpsTest, ConsumeDrawsAProgressBarOnATerminalOnly) {
  if (!cluster().uses_netns()) GTEST_SKIP() << "needs a rate-limited link";
  MakeSparse(PathOn(kA, "tty.dat"), 80 * kMiB);
  MakeSparse(PathOn(kA, "piped.dat"), 30 * kMiB);
  if (!cluster().LimitBandwidth(kA, "400mbit").ok()) GTEST_SKIP() << "tc not available";
  Produce({{"tty.dat", static_cast<int64_t>(80 * kMiB)},
           {"piped.dat", static_cast<int64_t>(30 * kMiB)}},
          {"--no-write"});
  // `script` runs the command on a pseudo-terminal and copies what it drew.
  auto r = cluster().RunOnNode(
      kB, {"script", "-qec", dyad_ + " consume " + PathOn(kB, "tty.dat"), "/dev/null"}, 60000);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->status.success()) << r->output;
  EXPECT_NE(r->output.find("tty.dat ["), std::string::npos) << r->output;
  EXPECT_NE(r->output.find("%"), std::string::npos) << r->output;
  EXPECT_NE(r->output.find("MiB/s"), std::string::npos) << r->output;
  auto piped = Dyad(kB, {"consume", PathOn(kB, "piped.dat")});
  EXPECT_TRUE(piped.status.success()) << piped.output;
  EXPECT_EQ(piped.output.find('%'), std::string::npos) << piped.output;
  EXPECT_EQ(piped.output.find('\r'), std::string::npos) << piped.output;
}

TEST_F(OpsTest, PeersShowLivenessAndLsMarksFilesOfADeadOwner) {
  Produce({{"z/from-a.dat", 10}, {"a/from-a.dat", 10}});
  Produce({{"m/from-b.dat", 10}}, {}, {}, kB);
  auto peers = Dyad(kA, {"peers"});
  ASSERT_TRUE(peers.status.success()) << peers.output;
  const std::regex alive0("\n0 +alive +" + cluster().node(kA).address());
  const std::regex alive1("\n1 +alive +" + cluster().node(kB).address() + " .*" +
                          std::to_string(cluster().ServicePid(kB)));
  EXPECT_TRUE(std::regex_search(peers.output, alive0)) << peers.output;
  EXPECT_TRUE(std::regex_search(peers.output, alive1)) << peers.output;

  auto ls = Dyad(kA, {"ls"});
  ASSERT_TRUE(ls.status.success()) << ls.output;
  const size_t pa = ls.output.find("a/from-a.dat"), pm = ls.output.find("m/from-b.dat"),
               pz = ls.output.find("z/from-a.dat");
  ASSERT_TRUE(pa != std::string::npos && pm != std::string::npos && pz != std::string::npos)
      << ls.output;
  EXPECT_TRUE(pa < pm && pm < pz) << "not sorted by path:\n" << ls.output;
  EXPECT_EQ(ls.output.find("(down)"), std::string::npos) << ls.output;

  ASSERT_TRUE(cluster().KillService(kB).ok());
  peers = Dyad(kA, {"peers", "--timeout", "1"});
  EXPECT_TRUE(std::regex_search(peers.output, std::regex("\n1 +down "))) << peers.output;
  ls = Dyad(kA, {"ls"});
  EXPECT_TRUE(std::regex_search(ls.output, std::regex("m/from-b.dat +1 \\(down\\)"))) << ls.output;
  EXPECT_FALSE(std::regex_search(ls.output, std::regex("from-a.dat +0 \\("))) << ls.output;
}

// Issue 26 item 10: a rank stopped with SIGTERM said `down` in `dyad peers`
// until the root restarted, and restarting it logged the warning meant for
// crashes. A clean stop now marks the registration as stopped.
TEST_F(OpsTest, Issue26Item10_CleanStopShowsStoppedAndRestartsQuietly) {
  ASSERT_TRUE(cluster().StopService(kB).ok());
  auto peers = Dyad(kA, {"peers", "--timeout", "1"});
  ASSERT_TRUE(peers.status.success()) << peers.output;
  EXPECT_TRUE(std::regex_search(peers.output, std::regex("\n1 +stopped "))) << peers.output;
  EXPECT_NE(peers.output.find("stopped cleanly"), std::string::npos) << peers.output;
  auto json = Dyad(kA, {"peers", "--json", "--timeout", "1"});
  EXPECT_NE(json.output.find("\"state\": \"stopped\""), std::string::npos) << json.output;

  ASSERT_TRUE(cluster().StartService(kB).ok());
  const std::string log = cluster().ServiceLogTail(kB, 6000);
  EXPECT_EQ(log.find("no longer answers"), std::string::npos) << log;
  EXPECT_NE(log.find("stopped cleanly"), std::string::npos) << log;
  peers = Dyad(kA, {"peers", "--timeout", "2"});
  EXPECT_TRUE(std::regex_search(peers.output, std::regex("\n1 +alive "))) << peers.output;

  // A crash still reads as down.
  ASSERT_TRUE(cluster().KillService(kB).ok());
  peers = Dyad(kA, {"peers", "--timeout", "1"});
  EXPECT_TRUE(std::regex_search(peers.output, std::regex("\n1 +down "))) << peers.output;
}

// Issue 26 item 18: the incarnation was hex in logs and `dyad peers` but
// decimal in `dyad status` and the ready file, whose listen= held the
// advertised address. One format everywhere; listen= and advertise= apart.
TEST_F(OpsTest, Issue26Item18_IncarnationInHexEverywhereAndReadyFileSaysListenAndAdvertise) {
  std::map<std::string, std::string> kv;
  std::istringstream ready(ReadText(cluster().node(kB).ready_file));
  for (std::string line; std::getline(ready, line);)
    if (const size_t eq = line.find('='); eq != std::string::npos)
      kv[line.substr(0, eq)] = line.substr(eq + 1);
  ASSERT_TRUE(kv.count("listen") && kv.count("advertise") && kv.count("incarnation"));
  EXPECT_EQ(kv["advertise"], cluster().node(kB).address());
  EXPECT_TRUE(std::regex_match(kv["incarnation"], std::regex("[0-9a-f]{16}"))) << kv["incarnation"];
  auto st = cluster().ServiceStatus(kB);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->info["incarnation"], kv["incarnation"]);
  auto peers = Dyad(kA, {"peers"});
  EXPECT_TRUE(std::regex_search(peers.output, std::regex("\n1 +alive .* " + kv["incarnation"])))
      << peers.output;
  auto status = Dyad(kB, {"status"});
  EXPECT_TRUE(std::regex_search(status.output, std::regex("incarnation +" + kv["incarnation"])))
      << status.output;
  EXPECT_NE(cluster().ServiceLogTail(kB, 100000).find("incarnation " + kv["incarnation"]),
            std::string::npos);
}

// Issue 26 item 12: DYAD_DTL_MODE=LOCAL for an owner on another node gave
// DYAD_RC_STALE/BADFIO; it now says that LOCAL reaches only this node.
TEST_F(OpsTest, Issue26Item12_LocalModeForAnotherNodesOwnerSaysSo) {
  Produce({{"far/away.dat", 1000}});
  auto r = Dyad(kB, {"consume", PathOn(kB, "far/away.dat")}, {{"DYAD_DTL_MODE", "LOCAL"}});
  EXPECT_FALSE(r.status.success()) << r.output;
  EXPECT_NE(r.output.find("DYAD_DTL_MODE=LOCAL reaches only owners on this node"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("STALE"), std::string::npos) << r.output;
  // Nothing was lost: the same consume with the service's transport works.
  auto ok = Dyad(kB, {"consume", PathOn(kB, "far/away.dat")});
  EXPECT_TRUE(ok.status.success()) << ok.output;
}

TEST_F(OpsTest, StatusPrometheusExportsEveryCounter) {
  const std::vector<ManifestEntry> files = {{"prom.dat", 54321}};
  Produce(files);
  ConsumeOk(files);
  auto r = Dyad(kB, {"status", "--prometheus"});
  ASSERT_TRUE(r.status.success()) << r.output;
  auto st = cluster().ServiceStatus(kB);
  ASSERT_TRUE(st.ok());
  std::map<std::string, std::string> type_of;  // metric -> counter|gauge
  const std::regex help("# HELP (dyad_[a-z0-9_]+) .+");
  const std::regex type("# TYPE (dyad_[a-z0-9_]+) (counter|gauge)");
  const std::regex sample("(dyad_[a-z0-9_]+)\\{([a-z_]+=\"[^\"]*\",?)+\\} [0-9]+");
  std::istringstream lines(r.output);
  std::string line, last_help;
  std::smatch m;
  while (std::getline(lines, line)) {
    if (std::regex_match(line, m, help)) {
      last_help = m[1];
    } else if (std::regex_match(line, m, type)) {
      EXPECT_EQ(m[1], last_help) << line;
      type_of[m[1]] = m[2];
    } else {
      ASSERT_TRUE(std::regex_match(line, m, sample)) << "not Prometheus text: " << line;
      EXPECT_TRUE(type_of.count(m[1])) << "no HELP/TYPE before " << line;
      EXPECT_NE(line.find("rank=\"1\""), std::string::npos) << line;
    }
  }
  // Every value the service reports is declared in the metric table and
  // exported under its name: counters with _total, gauges without.
  for (const auto& [name, value] : st->counters) {
    const MetricRow* row = ServiceStats::FindMetric(name);
    ASSERT_NE(row, nullptr) << name << " has no row in src/service/stats.h's MetricRows()";
    const bool counter = row->type == MetricType::kCounter;
    const std::string metric = std::string("dyad_") + row->prometheus + (counter ? "_total" : "");
    EXPECT_EQ(type_of[metric], counter ? "counter" : "gauge") << name << " as " << metric;
  }
  for (const auto& [metric, t] : type_of) {
    const bool total = metric.size() > 6 && metric.compare(metric.size() - 6, 6, "_total") == 0;
    EXPECT_EQ(total, t == "counter") << metric << " " << t;
  }
  EXPECT_NE(
      r.output.find("dyad_transport_received_bytes_total{rank=\"1\",transport=\"tcp\"} 54321"),
      std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("dyad_received_bytes_total{rank=\"1\"} 54321"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("# TYPE dyad_transfers_in_total counter"), std::string::npos);
  // Issue 26 item 6: values that go down are gauges.
  for (const char* gauge :
       {"dyad_cache_entries", "dyad_connections_open", "dyad_connections_handshaking",
        "dyad_requests_parked", "dyad_node_cache_bytes", "dyad_node_cache_files",
        "dyad_node_cache_budget_bytes", "dyad_publish_async_pending", "dyad_peers_dialing"})
    EXPECT_NE(r.output.find(std::string("# TYPE ") + gauge + " gauge\n"), std::string::npos)
        << gauge << "\n"
        << r.output;
  EXPECT_EQ(r.output.find("placeholder"), std::string::npos);
  EXPECT_EQ(r.output.find("DYAD counter "), std::string::npos) << r.output;
}

// Issue 26 item 6: the export passes Prometheus' own parser and linter
// (promtool check metrics: types, _total on counters only, help text on
// every metric, base units). promtool comes from Debian's `prometheus`
// package (scripts/install-deps.sh); without it this test fails.
TEST_F(OpsTest, StatusPrometheusPassesPromtoolCheckMetrics) {
  const std::string promtool = emu::FindProgram("promtool");
  ASSERT_FALSE(promtool.empty())
      << "promtool not found: install Debian's prometheus package (scripts/install-deps.sh) "
         "to check the metrics export";
  Produce({{"promtool.dat", 4096}});
  ConsumeOk({{"promtool.dat", 4096}});
  for (int node : {kA, kB}) {
    auto r = Dyad(node, {"status", "--prometheus"});
    ASSERT_TRUE(r.status.success()) << r.output;
    const std::string file = cluster().base_dir() + "/metrics-" + std::to_string(node) + ".prom";
    std::ofstream(file) << r.output;
    emu::SpawnOptions o;
    o.argv = {"/bin/sh", "-c", "exec \"$0\" check metrics < \"$1\"", promtool, file};
    auto check = emu::RunCapture(o, 30000);
    ::unlink(file.c_str());
    ASSERT_TRUE(check.ok()) << Str(check.status());
    EXPECT_TRUE(check->status.success() && check->output.empty())
        << "promtool check metrics: " << check->status.ToString() << "\n"
        << check->output << "\n--- export ---\n"
        << r.output;
  }
}

class TraceTest : public OpsTest {
 protected:
  emu::ClusterOptions Options() override {
    trace_ = "/tmp/dyad-ops-trace-" + std::to_string(::getpid()) + ".json";
    ::unlink(trace_.c_str());
    emu::ClusterOptions o;
    o.service_env["DYAD_TRACE"] = trace_;
    return o;
  }
  void TearDown() override {
    OpsTest::TearDown();
    ::unlink(trace_.c_str());
  }
  std::string trace_;
};

TEST_F(TraceTest, TraceHasTheSpansOfEveryProcessAndService) {
  const std::vector<ManifestEntry> files = {{"traced/file.dat", 70000}};
  Produce(files, {}, {{"DYAD_TRACE", trace_}});
  ConsumeOk(files, {}, {{"DYAD_TRACE", trace_}});
  std::string text = ReadText(trace_);
  ASSERT_EQ(text.rfind("[\n", 0), 0u) << text.substr(0, 200);
  // The array is left open for appenders: close it as a viewer does.
  while (!text.empty() && (text.back() == '\n' || text.back() == ',')) text.pop_back();
  auto events = nlohmann::json::parse(text + "]", nullptr, false);
  ASSERT_FALSE(events.is_discarded()) << text;
  std::set<std::string> spans, processes;
  std::map<std::string, int64_t> pid_of;
  for (const auto& e : events) {
    ASSERT_TRUE(e.contains("pid") && e["pid"].is_number()) << e.dump();
    if (e["ph"] == "M") {
      processes.insert(e["args"]["name"].get<std::string>());
      continue;
    }
    ASSERT_EQ(e["ph"], "X") << e.dump();
    ASSERT_TRUE(e["ts"].is_number() && e["dur"].is_number() && e["tid"].is_number()) << e.dump();
    const std::string key = e["cat"].get<std::string>() + "/" + e["name"].get<std::string>();
    spans.insert(key);
    pid_of[key] = e["pid"].get<int64_t>();
  }
  for (const char* want : {"client/publish", "client/consume", "service/publish", "service/consume",
                           "service/fetch", "service/serve", "service/place"})
    EXPECT_TRUE(spans.count(want)) << want << " missing from\n" << text;
  // Processes are keyed by host and pid (the emulated nodes share the host name).
  char host[256] = "";
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  EXPECT_EQ(pid_of["service/serve"], TraceProcessId(host, cluster().ServicePid(kA)));
  EXPECT_EQ(pid_of["service/fetch"], TraceProcessId(host, cluster().ServicePid(kB)));
  bool client_named = false;
  for (const std::string& p : processes) client_named |= p.rfind("dyad client: ", 0) == 0;
  EXPECT_TRUE(client_named) << text;
  bool rank0 = false, rank1 = false;
  for (const std::string& p : processes) {
    rank0 |= p.rfind("dyad-service rank 0", 0) == 0;
    rank1 |= p.rfind("dyad-service rank 1", 0) == 0;
  }
  EXPECT_TRUE(rank0 && rank1) << text;
}

// One DTL choice per node: `dyad-service -m UCX` alone moves files with UCX
// (clients that set no DYAD_DTL_MODE send no mode), which the counters and
// `dyad consume -v` show; a client's DYAD_DTL_MODE still overrides it.
class ServiceModeTest : public OpsTest {
 protected:
  emu::ClusterOptions Options() override {
    emu::ClusterOptions o;
    o.extra_service_args = {"-m", "UCX"};
    o.service_env["UCX_TLS"] = "tcp";
    o.service_env["UCX_WARN_UNUSED_ENV_VARS"] = "n";
    return o;
  }
};

TEST_F(ServiceModeTest, TheServiceModeIsTheDefaultOfItsClients) {
  Produce({{"mode/ucx.dat", 222222}, {"mode/tcp.dat", 111111}});
  auto ucx = Dyad(kB, {"consume", "-v", PathOn(kB, "mode/ucx.dat")});
  EXPECT_TRUE(ucx.status.success()) << ucx.output;
  EXPECT_NE(ucx.output.find(") over ucx"), std::string::npos) << ucx.output;
  EXPECT_EQ(Counter(kB, "transfers.in.ucx"), 1u);
  EXPECT_EQ(Counter(kB, "bytes.in.ucx"), 222222u);
  EXPECT_EQ(Counter(kA, "transfers.out.ucx"), 1u);
  auto tcp = Dyad(kB, {"consume", "-v", PathOn(kB, "mode/tcp.dat")}, {{"DYAD_DTL_MODE", "TCP"}});
  EXPECT_TRUE(tcp.status.success()) << tcp.output;
  EXPECT_NE(tcp.output.find(") over tcp"), std::string::npos) << tcp.output;
  EXPECT_EQ(Counter(kB, "transfers.in.tcp"), 1u);
  EXPECT_EQ(Counter(kB, "transfers.in.ucx"), 1u);
}

}  // namespace
}  // namespace dyad::it
