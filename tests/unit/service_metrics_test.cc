// service_metrics_test.cc: the metric table (src/service/stats.h) that
// `dyad status --prometheus` exports (issue 26 item 6): one row per value,
// with a real help sentence, a Prometheus name that follows the
// conventions, and a line in docs/operations.md. The export itself is
// checked against a live service and promtool in ops_visibility_test.cc.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "service/stats.h"

namespace dyad {
namespace {

std::string ReadDoc(const std::string& rel) {
  std::ifstream in(std::string(DYAD_SOURCE_DIR) + "/" + rel);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

TEST(Issue26Item6, EveryRowHasARealHelpAndAConventionalName) {
  std::set<std::string> names, metrics;
  const std::regex prom("[a-z][a-z0-9]*(_[a-z0-9]+)*");
  for (const MetricRow& r : MetricRows()) {
    const std::string name = r.name, help = r.help, metric = r.prometheus;
    EXPECT_TRUE(names.insert(name).second) << "two rows for " << name;
    EXPECT_TRUE(metrics.insert(metric).second) << "two rows export " << metric;
    EXPECT_TRUE(std::regex_match(metric, prom)) << metric;
    EXPECT_FALSE(metric.size() >= 6 && metric.compare(metric.size() - 6, 6, "_total") == 0)
        << metric << ": _total is added to counters on export";
    EXPECT_GT(help.size(), 15u) << name;
    EXPECT_EQ(help.back(), '.') << name;
    EXPECT_EQ(help.find("DYAD counter"), std::string::npos) << name;
    // A value in bytes says so last in its Prometheus name.
    if (name.find("bytes") != std::string::npos || name == "node_cache.budget") {
      EXPECT_EQ(metric.compare(metric.size() - 6, 6, "_bytes"), 0) << metric;
    }
  }
  // Every fixed counter has its row.
  for (int i = 0; i < ServiceStats::kNumCounters; ++i) {
    const char* n = ServiceStats::Name(static_cast<ServiceStats::Counter>(i));
    EXPECT_NE(ServiceStats::FindMetric(n), nullptr) << n;
  }
}

TEST(Issue26Item6, LevelsThatGoDownAreGauges) {
  for (const char* g :
       {"requests.parked", "connections.open", "connections.handshaking", "node_cache.bytes",
        "node_cache.files", "node_cache.budget", "prefetch.pending", "prefetch.deferred",
        "prefetch.declarations", "publish.async_pending", "cache.entries",
        "consume.waiting_on_owner", "peers.dialing", "peers.waiting_on_dial"})
    EXPECT_TRUE(ServiceStats::IsGauge(g)) << g;
  for (const char* c : {"requests.publish", "bytes.in", "transfers.out.tcp", "errors",
                        "prefetch.queued", "node_cache.evictions", "connections.refused"})
    EXPECT_FALSE(ServiceStats::IsGauge(c)) << c;
}

TEST(Issue26Item6, PerTransportValuesFindTheirFamily) {
  std::string transport;
  const MetricRow* r = ServiceStats::FindMetric("bytes.in.ucx", &transport);
  ASSERT_NE(r, nullptr);
  EXPECT_STREQ(r->name, "bytes.in.<transport>");
  EXPECT_EQ(transport, "ucx");
  transport.clear();
  r = ServiceStats::FindMetric("bytes.out.direct", &transport);
  ASSERT_NE(r, nullptr);
  EXPECT_STREQ(r->prometheus, "sent_direct_bytes");
  EXPECT_TRUE(transport.empty());
  EXPECT_EQ(ServiceStats::FindMetric("no.such.metric"), nullptr);
  EXPECT_EQ(ServiceStats::Help("no.such.metric"), "");
}

TEST(Issue26Item6, OperationsDocListsEveryMetric) {
  const std::string doc = ReadDoc("docs/operations.md");
  ASSERT_FALSE(doc.empty());
  for (const MetricRow& r : MetricRows()) {
    const std::string metric =
        std::string("dyad_") + r.prometheus + (r.type == MetricType::kCounter ? "_total" : "");
    const std::string line = "| `" + std::string(r.name) + "` | `" + metric;
    EXPECT_NE(doc.find(line), std::string::npos) << "docs/operations.md lacks: " << line;
  }
}

}  // namespace
}  // namespace dyad
