// EmbeddedKvs::Watch with many namespaces (kvs/embedded/embedded_watch.cc):
// one thread serves the feeds of every watched namespace, whatever their
// number, and each namespace keeps its own order, its Unwatch and its
// resync after the root restarts. The root runs in a child process, so the
// threads counted here are the client's alone.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kvs/embedded/embedded_kvs.h"
#include "kvs/kvs.h"
#include "unit/embedded_test_root.h"
#include "unit/watch_log.h"
#include "util.h"

namespace dyad {
namespace {

using testing_embedded::TestRoot;
using testing_kvs::WatchLog;
using testutil::Eventually;
using testutil::ThreadsOf;

constexpr char kSecret[] = "watch-feed-secret";
constexpr int kNamespaces = 8;

// A TestRoot in a forked child; killed (SIGKILL, as a crash) by Stop or at
// destruction, and with this process should it die first.
class ChildRoot {
 public:
  ~ChildRoot() { Stop(); }

  // Starts the root on `port` (0: any free one); "" or the reason it failed.
  std::string Start(uint16_t port) {
    int ready[2];
    if (::pipe(ready) != 0) return "pipe failed";
    const pid_t parent = ::getpid();
    pid_ = ::fork();
    if (pid_ < 0) return "fork failed";
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(1);
      ::close(ready[0]);
      std::string error;
      std::unique_ptr<TestRoot> root;
      // A port just freed may take a moment to bind again.
      for (int i = 0; i < 100 && !root; ++i) {
        root = TestRoot::Start(kSecret, port, &error);
        if (!root) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      const uint16_t bound = root ? root->port() : 0;
      if (::write(ready[1], &bound, sizeof bound) != sizeof bound) ::_exit(1);
      for (;;) ::pause();
    }
    ::close(ready[1]);
    uint16_t bound = 0;
    const ssize_t n = ::read(ready[0], &bound, sizeof bound);
    ::close(ready[0]);
    if (n != sizeof bound || bound == 0) {
      Stop();
      return "the root did not start";
    }
    port_ = bound;
    return "";
  }

  void Stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

  uint16_t port() const { return port_; }

 private:
  pid_t pid_ = -1;
  uint16_t port_ = 0;
};

std::unique_ptr<Kvs> OpenClient(uint16_t port, Runtime* runtime = nullptr) {
  KvsOptions o;
  o.runtime = runtime;
  o.secret = kSecret;
  o.self_rank = 3;
  o.self_incarnation = 1;
  o.rpc_timeout_ms = 5000;
  Result<std::unique_ptr<Kvs>> kvs = OpenKvs("embedded://127.0.0.1:" + std::to_string(port), o);
  EXPECT_TRUE(kvs.ok()) << kvs.status().ToString();
  return kvs.ok() ? std::move(*kvs) : nullptr;
}

std::string Ns(int i) { return "feed" + std::to_string(i); }

// The changes (not resyncs, not losses) a log holds, as "key=value".
std::vector<std::string> Changes(WatchLog& log) {
  std::lock_guard<std::mutex> lk(log.mu);
  std::vector<std::string> out;
  for (const KvsChange& c : log.changes)
    if (!c.resync && !c.lost) out.push_back(c.key + "=" + c.value);
  return out;
}

bool AwaitChanges(WatchLog& log, size_t n) {
  return log.WaitFor(
      [&](const KvsChange&) {
        size_t got = 0;
        for (const KvsChange& c : log.changes) got += c.resync || c.lost ? 0 : 1;
        return got >= n;
      },
      5000);
}

// The feeds of N namespaces run on one loop, and each namespace's changes
// still reach its own watchers, in order. The loop is the service's
// runtime when the store is opened with one (`runtime`): the feeds add no
// thread then. Without one it is one thread of the store's own, started by
// the first Watch and ended with the store.
void CheckFeedsShareOneLoop(Runtime* runtime) {
  ChildRoot root;
  ASSERT_EQ(root.Start(0), "");
  std::unique_ptr<Kvs> kvs = OpenClient(root.port(), runtime);
  ASSERT_NE(kvs, nullptr);
  ASSERT_TRUE(kvs->Put("warm", "k", "v").ok());
  const size_t before = ThreadsOf();

  std::vector<std::unique_ptr<WatchLog>> logs;
  std::vector<KvsWatchTicket> tickets;
  size_t with_one = 0;
  for (int i = 0; i < kNamespaces; ++i) {
    logs.push_back(std::make_unique<WatchLog>());
    Result<KvsWatchTicket> t = kvs->Watch(Ns(i), logs.back()->Callback());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tickets.push_back(*t);
    if (i == 0) with_one = ThreadsOf();
  }
  EXPECT_EQ(with_one, runtime != nullptr ? before : before + 1);
  EXPECT_EQ(ThreadsOf(), with_one) << kNamespaces << " watched namespaces";

  for (int i = 0; i < kNamespaces; ++i) {
    ASSERT_TRUE(kvs->Put(Ns(i), "a", "1").ok());
    ASSERT_TRUE(kvs->Put(Ns(i), "b", "2").ok());
    ASSERT_TRUE(kvs->Put(Ns(i), "a", "3").ok());
  }
  for (int i = 0; i < kNamespaces; ++i) {
    ASSERT_TRUE(AwaitChanges(*logs[i], 3)) << Ns(i);
    // The root reports each changed key in order with its value when the
    // reply is sent (change_feed.h), so the first "a" may already be 3.
    const std::vector<std::string> got = Changes(*logs[i]);
    ASSERT_EQ(got.size(), 3u) << Ns(i);
    EXPECT_TRUE(got[0] == "a=1" || got[0] == "a=3") << Ns(i) << ": " << got[0];
    EXPECT_EQ(got[1], "b=2") << Ns(i);
    EXPECT_EQ(got[2], "a=3") << Ns(i);
  }

  // Unwatch of one namespace is prompt and final; the others go on.
  const auto start = SteadyClock::now();
  kvs->Unwatch(tickets[3]);
  EXPECT_LT(SteadyClock::now() - start, std::chrono::milliseconds(500));
  const size_t seen = logs[3]->size();
  ASSERT_TRUE(kvs->Put(Ns(3), "c", "gone").ok());
  ASSERT_TRUE(kvs->Put(Ns(4), "c", "here").ok());
  ASSERT_TRUE(AwaitChanges(*logs[4], 4));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(logs[3]->size(), seen);

  for (int i = 0; i < kNamespaces; ++i) kvs->Unwatch(tickets[i]);

  // A later Watch of a namespace nobody watches any more starts a new feed.
  WatchLog again;
  Result<KvsWatchTicket> t = kvs->Watch(Ns(0), again.Callback());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(kvs->Put(Ns(0), "d", "4").ok());
  EXPECT_TRUE(AwaitChanges(again, 1));
  kvs->Unwatch(*t);
  EXPECT_EQ(ThreadsOf(), with_one);
  kvs.reset();
  EXPECT_TRUE(Eventually([&] { return ThreadsOf() == before; }, 5000))
      << ThreadsOf() << " threads after the store's end, " << before << " before the first Watch";
}

TEST(EmbeddedWatch, FeedsOnTheServiceRuntimeAddNoThread) {
  Runtime rt(2, 1000);
  ASSERT_TRUE(rt.Start().ok());
  CheckFeedsShareOneLoop(&rt);
  rt.Shutdown();
}

TEST(EmbeddedWatch, OneFeedThreadServesEveryWatchedNamespace) { CheckFeedsShareOneLoop(nullptr); }

// A service shuts its store down while its runtime runs, and the store's
// last owner may release it after the runtime has gone (a start-up store
// call left to finish alone on a thread of its own holds it): the store
// does not touch the runtime then. A feed and a wait were running on it.
TEST(EmbeddedWatch, AStoreShutDownOnTheServiceRuntimeMayOutliveIt) {
  ChildRoot root;
  ASSERT_EQ(root.Start(0), "");
  auto rt = std::make_unique<Runtime>(2, 1000);
  ASSERT_TRUE(rt->Start().ok());
  std::unique_ptr<Kvs> kvs = OpenClient(root.port(), rt.get());
  ASSERT_NE(kvs, nullptr);
  WatchLog log;
  Result<KvsWatchTicket> t = kvs->Watch(Ns(0), log.Callback());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  std::promise<Status> waited;
  Result<KvsWaitTicket> w =
      kvs->StartWait(Ns(1), "never", Deadline::AfterMs(60000),
                     [&waited](Result<std::string> r) { waited.set_value(r.status()); });
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(kvs->Put(Ns(0), "a", "1").ok());
  EXPECT_TRUE(AwaitChanges(log, 1));

  kvs->Shutdown();
  std::future<Status> ended = waited.get_future();
  ASSERT_EQ(ended.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(ended.get().code(), DYAD_RC_CANCELLED);
  rt->Shutdown();
  rt.reset();
  kvs->Unwatch(*t);  // what a service's record feed does at its stop
  kvs.reset();
}

// Every namespace's feed reconnects to a root that restarted (with an empty
// store) and reports a resync, then the new root's changes.
TEST(EmbeddedWatch, EveryFeedResyncsAfterTheRootRestarts) {
  ChildRoot root;
  ASSERT_EQ(root.Start(0), "");
  const uint16_t port = root.port();
  std::unique_ptr<Kvs> kvs = OpenClient(port);
  ASSERT_NE(kvs, nullptr);
  std::vector<std::unique_ptr<WatchLog>> logs;
  std::vector<KvsWatchTicket> tickets;
  for (int i = 0; i < 4; ++i) {
    logs.push_back(std::make_unique<WatchLog>());
    Result<KvsWatchTicket> t = kvs->Watch(Ns(i), logs.back()->Callback());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tickets.push_back(*t);
  }
  root.Stop();
  // Issue 28: every watcher hears of the loss at once, while the root is
  // away (the node cache withdraws the stamps of its copies then).
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(logs[i]->WaitFor([](const KvsChange& c) { return c.lost; }, 10000)) << Ns(i);
  }
  ASSERT_EQ(root.Start(port), "");
  ASSERT_EQ(root.port(), port);
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(logs[i]->WaitFor([](const KvsChange& c) { return c.resync; }, 10000)) << Ns(i);
  }
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(kvs->Put(Ns(i), "after", "restart").ok());
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(AwaitChanges(*logs[i], 1)) << Ns(i);
    EXPECT_EQ(Changes(*logs[i]), std::vector<std::string>{"after=restart"}) << Ns(i);
  }
  for (KvsWatchTicket t : tickets) kvs->Unwatch(t);
}

}  // namespace
}  // namespace dyad
