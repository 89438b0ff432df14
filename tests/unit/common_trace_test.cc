// common_trace_test.cc: DYAD_TRACE writes a trace the Chrome/Perfetto
// viewers read: one file shared by concurrent processes (forked children,
// threads), each event whole on its own line, complete events with
// microsecond ts/dur, a process name per pid, and arguments escaped.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "common/trace.h"
#include "util.h"

namespace dyad {
namespace {

using testutil::ReadAll;

TEST(TraceTest, JsonQuoteEscapesWhatWouldBreakTheFile) {
  EXPECT_EQ(JsonQuote("plain/path.dat"), "\"plain/path.dat\"");
  EXPECT_EQ(JsonQuote("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(JsonQuote(std::string("new\nline\t\x01", 10)), "\"new\\u000aline\\u0009\\u0001\"");
  EXPECT_EQ(JsonQuote("donn\xc3\xa9"
                      "es"),
            "\"donn\xc3\xa9"
            "es\"");  // UTF-8 kept
  auto parsed =
      nlohmann::json::parse(JsonQuote("bytes \xff\xfe \xc3 and \xc3\xa9"), nullptr, false);
  ASSERT_FALSE(parsed.is_discarded());
  EXPECT_EQ(parsed.get<std::string>(), "bytes \xc3\xbf\xc3\xbe \xc3\x83 and \xc3\xa9");
}

// The whole test runs with DYAD_TRACE set before the first span of this
// process (the setting is read once).
TEST(TraceTest, ProcessesAndThreadsShareOneValidTrace) {
  const testutil::TempDir dir("dyad-trace-test-");
  ASSERT_TRUE(dir.ok());
  const std::string path = dir.Sub("trace.json");
  ASSERT_EQ(::setenv("DYAD_TRACE", path.c_str(), 1), 0);
  ASSERT_TRUE(TraceEnabled());
  TraceSetProcessName("trace test parent");
  constexpr int kChildren = 4, kThreads = 3, kSpans = 50;
  std::vector<pid_t> children;
  for (int c = 0; c < kChildren; ++c) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([] {
          for (int i = 0; i < kSpans; ++i) {
            TraceSpan s("consume", "client");
            s.Arg("path", "dir/\"quoted\"\n" + std::to_string(i)).Arg("bytes", uint64_t{7});
          }
        });
      for (auto& t : threads) t.join();
      ::_exit(0);
    }
    children.push_back(pid);
  }
  {
    TraceSpan s("publish", "client");
    s.Arg("path", "parent.dat").Rc(Status(DYAD_RC_TIMEOUT, "late"));
  }
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::string text = ReadAll(path);
  ASSERT_EQ(text.rfind("[\n", 0), 0u);
  while (!text.empty() && (text.back() == '\n' || text.back() == ',')) text.pop_back();
  auto events = nlohmann::json::parse(text + "]", nullptr, false);
  ASSERT_FALSE(events.is_discarded()) << text.substr(0, 2000);
  std::map<int64_t, int> spans_per_pid;
  std::map<int64_t, std::string> names;
  for (const auto& e : events) {
    if (e["ph"] == "M") {
      names[e["pid"].get<int64_t>()] = e["args"]["name"].get<std::string>();
      continue;
    }
    EXPECT_EQ(e["ph"], "X");
    EXPECT_TRUE(e["ts"].is_number_unsigned() && e["dur"].is_number_unsigned());
    spans_per_pid[e["pid"].get<int64_t>()]++;
    if (e["name"] == "publish") {
      EXPECT_EQ(e["args"]["rc"], "DYAD_RC_TIMEOUT");
    } else {
      EXPECT_EQ(e["args"]["bytes"], 7);
    }
  }
  // Processes are keyed by host and pid (TraceProcessId), and named with both.
  char host[256] = "";
  ASSERT_EQ(::gethostname(host, sizeof host - 1), 0);
  const int64_t self = TraceProcessId(host, ::getpid());
  EXPECT_NE(self, ::getpid());
  EXPECT_EQ(spans_per_pid[self], 1);
  EXPECT_EQ(names[self],
            "trace test parent [" + std::string(host) + " pid " + std::to_string(::getpid()) + "]");
  for (pid_t pid : children) {
    EXPECT_EQ(spans_per_pid[TraceProcessId(host, pid)], kThreads * kSpans) << pid;
    EXPECT_EQ(names.count(TraceProcessId(host, pid)), 1u)
        << "child " << pid << " did not name itself";
  }
}

}  // namespace
}  // namespace dyad
