// The Kvs contract (kvs/kvs.h), checked once for every backend.
//
// KvsConformance runs against "memory" directly, against "embedded"
// talking over TCP to a real root (TestRoot, embedded_test_root.h: a listener, an accept
// thread and one thread per connection that authenticates and feeds frames
// to EmbeddedKvsServer, the way dyad-service does), and, when the Redis
// backend is compiled in, against "redis" talking to a real redis-server
// that each test starts on a free loopback port (tools/emu/redis_server.h), and
// against the two other Redis deployments: "redis_cluster", a real
// three-master Redis Cluster, and "redis_sentinel", a primary, a replica
// and a Redis Sentinel (tools/emu/redis_cluster.h). Those two take seconds to
// start, so one of each is shared by the tests of a process (emptied
// between tests) and ctest runs each flavour as one process
// (tests/CMakeLists.txt). When the flux store is compiled in, "flux" runs
// against the KVS of a real Flux instance: ctest starts the process inside
// `flux start --test-size=1` (KvsConformance.flux, tests/flux/CMakeLists.txt);
// outside an instance those cases are skipped. EmbeddedKvsTest covers
// what only a remote store has: authentication, malformed input, restarts
// of the root. Every wait in here is bounded.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <future>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "common/wire.h"
#include "emu/redis_server.h"
#include "kvs/embedded/embedded_kvs.h"
#include "kvs/embedded/embedded_server.h"
#include "kvs/kvs.h"
#include "kvs/memory/memory_kvs.h"
#include "proto/auth.h"
#include "proto/protocol.h"
#include "unit/embedded_test_root.h"
#include "unit/watch_log.h"
#ifdef DYAD_HAVE_REDIS
#include "emu/redis_cluster.h"
#endif

namespace dyad {
namespace {

using std::chrono::milliseconds;
using testing_embedded::TestRoot;

constexpr char kSecret[] = "conformance-secret";

int64_t MsSince(SteadyClock::time_point start) {
  return std::chrono::duration_cast<milliseconds>(SteadyClock::now() - start).count();
}

void SleepMs(int64_t ms) { std::this_thread::sleep_for(milliseconds(ms)); }

KvsOptions ClientOptions(const std::string& secret = kSecret) {
  KvsOptions o;
  o.secret = secret;
  o.self_rank = 3;
  o.self_incarnation = 99;
  o.rpc_timeout_ms = 5000;
  return o;
}

// --- the conformance suite --------------------------------------------------

// The store a parameter tests: the Redis deployments are all "redis".
std::string StoreOf(const std::string& param) {
  return param.rfind("redis_", 0) == 0 ? "redis" : param;
}

// Every store compiled in, and the Redis deployments beside one server.
std::vector<std::string> ConformanceParams() {
  std::vector<std::string> params = KvsBackendNames();
  if (std::find(params.begin(), params.end(), "redis") != params.end()) {
    params.push_back("redis_cluster");
    params.push_back("redis_sentinel");
  }
  return params;
}

#ifdef DYAD_HAVE_REDIS
// Shared by the tests of one process (see the header comment).
std::unique_ptr<emu::RedisCluster>& SharedCluster() {
  static std::unique_ptr<emu::RedisCluster> cluster;
  return cluster;
}
std::unique_ptr<emu::RedisSentinel>& SharedSentinel() {
  static std::unique_ptr<emu::RedisSentinel> group;
  return group;
}
#endif

class KvsConformance : public ::testing::TestWithParam<std::string> {
 protected:
  static void TearDownTestSuite() {
#ifdef DYAD_HAVE_REDIS
    SharedCluster().reset();
    SharedSentinel().reset();
#endif
  }

  // The URL of the shared cluster or sentinel group, started on first use;
  // "" (and a failure or skip recorded) when it cannot run here.
  std::string SharedRedisUrl() {
#ifdef DYAD_HAVE_REDIS
    if (GetParam() == "redis_cluster") {
      auto& c = SharedCluster();
      if (!c) {
        c = std::make_unique<emu::RedisCluster>();
        if (!c->available()) return "";
        const std::string error = c->Start();
        if (!error.empty()) {
          c.reset();
          ADD_FAILURE() << error;
          return "";
        }
      }
      c->FlushAll();
      return c->url();
    }
    auto& g = SharedSentinel();
    if (!g) {
      g = std::make_unique<emu::RedisSentinel>();
      if (!g->available()) return "";
      const std::string error = g->Start();
      if (!error.empty()) {
        g.reset();
        ADD_FAILURE() << error;
        return "";
      }
    }
    emu::RedisCommand(g->PrimaryPort(), {"FLUSHALL"});
    return g->url();
#else
    return "";
#endif
  }

  void SetUp() override {
    std::string url = GetParam();
    if (GetParam() == "redis_cluster" || GetParam() == "redis_sentinel") {
      url = SharedRedisUrl();
      if (HasFailure()) return;
      if (url.empty()) GTEST_SKIP() << "redis-server or redis-cli is not installed";
    }
    if (GetParam() == "embedded") {
      std::string error;
      root_ = TestRoot::Start(kSecret, 0, &error);
      ASSERT_NE(root_, nullptr) << error;
      url = root_->url();
    }
    if (GetParam() == "flux") {
      // ctest runs this flavour inside `flux start` (KvsConformance.flux,
      // tests/flux/CMakeLists.txt); each test gets a top directory of its
      // own, so it starts from an empty store.
      if (std::getenv("FLUX_URI") == nullptr) {
        GTEST_SKIP() << "needs a Flux instance: run inside `flux start` (ctest's "
                        "KvsConformance.flux does)";
      }
      static int test_number = 0;
      url = "flux://?dir=conformance" + std::to_string(++test_number);
    }
    if (GetParam() == "redis") {
      redis_ = std::make_unique<emu::RedisServer>();
      if (!redis_->available()) {
        GTEST_SKIP() << "redis-server is not installed (apt-get install redis-server); "
                        "the redis backend is compiled in but cannot be tested here";
      }
      const std::string error = redis_->Start();
      ASSERT_EQ(error, "");
      url = redis_->url();
    }
    Result<std::unique_ptr<Kvs>> kvs = OpenKvs(url, ClientOptions());
    ASSERT_TRUE(kvs.ok()) << kvs.status().ToString();
    kvs_ = std::move(*kvs);
  }

  void TearDown() override {
    kvs_.reset();
    if (root_) root_->Stop();
    redis_.reset();
  }

  std::optional<std::string> MustGet(const std::string& ns, const std::string& key) {
    Result<std::optional<std::string>> r = kvs_->Get(ns, key);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : std::nullopt;
  }

  std::unique_ptr<TestRoot> root_;
  std::unique_ptr<emu::RedisServer> redis_;
  std::unique_ptr<Kvs> kvs_;
};

TEST_P(KvsConformance, NameAndCaps) {
  const std::string store = StoreOf(GetParam());
  EXPECT_EQ(kvs_->name(), store);
  const KvsCaps caps = kvs_->caps();
  EXPECT_EQ(caps.persistent, store == "redis");
  EXPECT_EQ(caps.shared, store == "embedded" || store == "redis" || store == "flux");
  EXPECT_EQ(caps.native_wait, store == "memory" || store == "redis" || store == "flux");
  EXPECT_EQ(caps.async_wait,
            store == "memory" || store == "redis" || store == "embedded" || store == "flux");
  EXPECT_TRUE(caps.watch);
}

TEST_P(KvsConformance, PutGetOverwrite) {
  ASSERT_TRUE(kvs_->Put("ns", "a", "1").ok());
  EXPECT_EQ(MustGet("ns", "a"), std::optional<std::string>("1"));
  ASSERT_TRUE(kvs_->Put("ns", "a", "two").ok());
  EXPECT_EQ(MustGet("ns", "a"), std::optional<std::string>("two"));
  ASSERT_TRUE(kvs_->Put("ns", "empty", "").ok());
  EXPECT_EQ(MustGet("ns", "empty"), std::optional<std::string>(""));
}

TEST_P(KvsConformance, GetMissingIsNullopt) {
  EXPECT_EQ(MustGet("ns", "missing"), std::nullopt);
  EXPECT_EQ(MustGet("never-used-namespace", "x"), std::nullopt);
}

TEST_P(KvsConformance, Remove) {
  ASSERT_TRUE(kvs_->Put("ns", "k", "v").ok());
  ASSERT_TRUE(kvs_->Remove("ns", "k").ok());
  EXPECT_EQ(MustGet("ns", "k"), std::nullopt);
  // Removing what is not there is not an error (remove is idempotent).
  EXPECT_TRUE(kvs_->Remove("ns", "k").ok());
  EXPECT_TRUE(kvs_->Remove("no-such-ns", "k").ok());
  // A removed key can be put again.
  ASSERT_TRUE(kvs_->Put("ns", "k", "again").ok());
  EXPECT_EQ(MustGet("ns", "k"), std::optional<std::string>("again"));
}

TEST_P(KvsConformance, NamespacesAreDisjoint) {
  ASSERT_TRUE(kvs_->Put("ns1", "k", "one").ok());
  ASSERT_TRUE(kvs_->Put("ns2", "k", "two").ok());
  EXPECT_EQ(MustGet("ns1", "k"), std::optional<std::string>("one"));
  EXPECT_EQ(MustGet("ns2", "k"), std::optional<std::string>("two"));
  ASSERT_TRUE(kvs_->Remove("ns1", "k").ok());
  EXPECT_EQ(MustGet("ns1", "k"), std::nullopt);
  EXPECT_EQ(MustGet("ns2", "k"), std::optional<std::string>("two"));
  Result<std::vector<KvsEntry>> l = kvs_->List("ns1", "");
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(l->empty());
  // A waiter in one namespace is not woken by a put in another.
  Result<std::string> w = kvs_->Wait("ns1", "k", Deadline::AfterMs(50));
  EXPECT_EQ(w.status().code(), DYAD_RC_TIMEOUT);
}

TEST_P(KvsConformance, ListByPrefixOrderedWithLimit) {
  for (const char* k : {"b/2", "a/1", "b/10", "b/1", "c", "b", "ba"}) {
    ASSERT_TRUE(kvs_->Put("ns", k, std::string("v:") + k).ok());
  }
  ASSERT_TRUE(kvs_->Put("other", "b/3", "x").ok());

  Result<std::vector<KvsEntry>> all = kvs_->List("ns", "");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  std::vector<std::string> keys;
  for (const KvsEntry& e : *all) keys.push_back(e.first);
  EXPECT_EQ(keys, (std::vector<std::string>{"a/1", "b", "b/1", "b/10", "b/2", "ba", "c"}));

  Result<std::vector<KvsEntry>> b = kvs_->List("ns", "b/");
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(b->size(), 3u);
  EXPECT_EQ((*b)[0], KvsEntry("b/1", "v:b/1"));
  EXPECT_EQ((*b)[1], KvsEntry("b/10", "v:b/10"));
  EXPECT_EQ((*b)[2], KvsEntry("b/2", "v:b/2"));

  Result<std::vector<KvsEntry>> limited = kvs_->List("ns", "b", 2);
  ASSERT_TRUE(limited.ok());
  ASSERT_EQ(limited->size(), 2u);
  EXPECT_EQ((*limited)[0].first, "b");
  EXPECT_EQ((*limited)[1].first, "b/1");

  Result<std::vector<KvsEntry>> none = kvs_->List("ns", "zzz");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  Result<std::vector<KvsEntry>> exact = kvs_->List("ns", "c", 0);
  ASSERT_TRUE(exact.ok());
  ASSERT_EQ(exact->size(), 1u);
}

TEST_P(KvsConformance, WaitOnExistingKeyReturnsAtOnce) {
  ASSERT_TRUE(kvs_->Put("ns", "here", "value").ok());
  const auto start = SteadyClock::now();
  Result<std::string> r = kvs_->Wait("ns", "here", Deadline::AfterMs(5000));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "value");
  EXPECT_LT(MsSince(start), 200);
  // Even with a deadline already in the past, an existing key is returned.
  Result<std::string> late = kvs_->Wait("ns", "here", Deadline::AfterMs(0));
  ASSERT_TRUE(late.ok()) << late.status().ToString();
  EXPECT_EQ(*late, "value");
}

TEST_P(KvsConformance, WaitIsWokenByPut) {
  auto waiter = std::async(std::launch::async,
                           [&] { return kvs_->Wait("ns", "later", Deadline::AfterMs(5000)); });
  SleepMs(100);
  const auto put_at = SteadyClock::now();
  ASSERT_TRUE(kvs_->Put("ns", "later", "arrived").ok());
  ASSERT_EQ(waiter.wait_for(milliseconds(4000)), std::future_status::ready);
  Result<std::string> r = waiter.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "arrived");
  // Woken by the put, not by a poll or the deadline.
  EXPECT_LT(MsSince(put_at), 500);
}

TEST_P(KvsConformance, WaitTimesOut) {
  const auto start = SteadyClock::now();
  Result<std::string> r = kvs_->Wait("ns", "never", Deadline::AfterMs(300));
  const int64_t elapsed = MsSince(start);
  ASSERT_EQ(r.status().code(), DYAD_RC_TIMEOUT) << r.status().ToString();
  EXPECT_NE(r.status().message().find("never"), std::string::npos) << r.status().message();
  EXPECT_GE(elapsed, 290);
  EXPECT_LT(elapsed, 1500);

  // An already-expired deadline on a missing key fails at once.
  const auto start2 = SteadyClock::now();
  Result<std::string> r2 = kvs_->Wait("ns", "never", Deadline::AfterMs(0));
  EXPECT_EQ(r2.status().code(), DYAD_RC_TIMEOUT);
  EXPECT_LT(MsSince(start2), 500);
}

TEST_P(KvsConformance, WaitIsCancelled) {
  std::atomic<bool> stop{false};
  std::atomic<int> polls{0};
  const CancelFn cancel = [&] {
    ++polls;
    return stop.load();
  };
  auto waiter = std::async(std::launch::async, [&] {
    return kvs_->Wait("ns", "cancelled", Deadline::AfterMs(8000), cancel);
  });
  SleepMs(100);
  const auto cancel_at = SteadyClock::now();
  stop.store(true);
  ASSERT_EQ(waiter.wait_for(milliseconds(3000)), std::future_status::ready);
  Result<std::string> r = waiter.get();
  EXPECT_EQ(r.status().code(), DYAD_RC_CANCELLED) << r.status().ToString();
  // Polled at least every 250 ms.
  EXPECT_LT(MsSince(cancel_at), 600);
  EXPECT_GE(polls.load(), 1);
}

TEST_P(KvsConformance, ManyWaitersOnOneKeyAllWake) {
  constexpr int kWaiters = 16;
  std::vector<std::future<Result<std::string>>> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.push_back(std::async(
        std::launch::async, [&] { return kvs_->Wait("ns", "popular", Deadline::AfterMs(5000)); }));
  }
  SleepMs(150);
  const auto put_at = SteadyClock::now();
  ASSERT_TRUE(kvs_->Put("ns", "popular", "for everyone").ok());
  for (auto& w : waiters) {
    ASSERT_EQ(w.wait_for(milliseconds(4000)), std::future_status::ready);
    Result<std::string> r = w.get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(*r, "for everyone");
  }
  EXPECT_LT(MsSince(put_at), 1000);
}

TEST_P(KvsConformance, BinaryAndLargeValuesRoundTrip) {
  std::string binary;
  for (int i = 0; i < 512; ++i) binary.push_back(static_cast<char>(i % 256));
  const std::string key_with_nul("k\0ey", 4);
  ASSERT_TRUE(kvs_->Put("ns", key_with_nul, binary).ok());
  EXPECT_EQ(MustGet("ns", key_with_nul), std::optional<std::string>(binary));
  EXPECT_EQ(MustGet("ns", "k"), std::nullopt);  // the NUL is part of the key

  std::string big(1u << 20, '\0');
  std::mt19937 rng(12345);
  for (char& c : big) c = static_cast<char>(rng());
  ASSERT_TRUE(kvs_->Put("ns", "big", big).ok());
  EXPECT_EQ(MustGet("ns", "big"), std::optional<std::string>(big));
  Result<std::string> waited = kvs_->Wait("ns", "big", Deadline::AfterMs(2000));
  ASSERT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_TRUE(*waited == big);
  Result<std::vector<KvsEntry>> listed = kvs_->List("ns", "big");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_TRUE((*listed)[0].second == big);
}

// MultiGet answers what one Get per key would, in the keys' order: absent
// keys, other namespaces, duplicates, empty and binary values, no keys.
TEST_P(KvsConformance, MultiGetAnswersLikeOneGetPerKey) {
  ASSERT_TRUE(kvs_->Put("ns", "a", "1").ok());
  ASSERT_TRUE(kvs_->Put("ns", "empty", "").ok());
  ASSERT_TRUE(kvs_->Put("other", "b", "not this one").ok());
  const std::string binary("v\0\xff", 3);
  ASSERT_TRUE(kvs_->Put("ns", "b", binary).ok());
  Result<KvsValues> got = kvs_->MultiGet("ns", {"b", "missing", "a", "empty", "a"});
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  const KvsValues want = {binary, std::nullopt, std::string("1"), std::string(""),
                          std::string("1")};
  EXPECT_EQ(*got, want);
  Result<KvsValues> none = kvs_->MultiGet("ns", {});
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_TRUE(none->empty());
  Result<KvsValues> elsewhere = kvs_->MultiGet("never-used-namespace", {"a"});
  ASSERT_TRUE(elsewhere.ok());
  EXPECT_EQ(*elsewhere, KvsValues{std::nullopt});
}

// More keys than one request, MGET or pipeline carries (4096 on the
// embedded store, 256 per MGET on Redis), spread over a cluster's slots.
TEST_P(KvsConformance, MultiGetOfManyKeys) {
  constexpr int kKeys = 4200;
  std::vector<std::string> keys;
  KvsValues want;
  for (int i = 0; i < kKeys; ++i) {
    keys.push_back("d/" + std::to_string(i));
    if (i % 10 != 0) {  // few puts: a sentinel's wait for its replica makes each slow
      want.push_back(std::nullopt);
      continue;
    }
    want.push_back("value " + std::to_string(i));
    ASSERT_TRUE(kvs_->Put("many", keys.back(), *want.back()).ok());
  }
  Result<KvsValues> got = kvs_->MultiGet("many", keys);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), want.size());
  for (int i = 0; i < kKeys; ++i) ASSERT_EQ((*got)[i], want[i]) << keys[i];
}

// Values whose sum exceeds one frame (16 MiB) still all arrive: the
// embedded root answers as many as fit and the client asks for the rest.
TEST_P(KvsConformance, MultiGetOfValuesLargerThanAFrame) {
  std::vector<std::string> keys;
  for (int i = 0; i < 17; ++i) {
    keys.push_back("big" + std::to_string(i));
    ASSERT_TRUE(
        kvs_->Put("ns", keys.back(), std::string(1u << 20, static_cast<char>('a' + i))).ok());
  }
  Result<KvsValues> got = kvs_->MultiGet("ns", keys);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_EQ(got->size(), keys.size());
  for (int i = 0; i < 17; ++i) {
    ASSERT_TRUE((*got)[i].has_value());
    EXPECT_TRUE(*(*got)[i] == std::string(1u << 20, static_cast<char>('a' + i))) << i;
  }
}

TEST_P(KvsConformance, ConcurrentPutsFromEightThreads) {
  constexpr int kThreads = 8;
  constexpr int kPerThread = 100;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const std::string key = "t" + std::to_string(t) + "/" + std::to_string(i);
        if (!kvs_->Put("conc", key, key + "=v").ok()) ++failures;
        if (!kvs_->Put("conc-shared", "same", std::to_string(t)).ok()) ++failures;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  Result<std::vector<KvsEntry>> all = kvs_->List("conc", "");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  ASSERT_EQ(all->size(), static_cast<size_t>(kThreads * kPerThread));
  for (const KvsEntry& e : *all) EXPECT_EQ(e.second, e.first + "=v");
  EXPECT_TRUE(std::is_sorted(all->begin(), all->end()));
  std::optional<std::string> last = MustGet("conc-shared", "same");
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->size(), 1u);
}

// --- asynchronous waits (KvsCaps::async_wait) ---------------------------------

// Collects what StartWait callbacks report, from any thread.
struct AsyncOutcomes {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Result<std::string>> results;
  std::vector<std::thread::id> threads;
  KvsWaitCallback Callback() {
    return [this](Result<std::string> r) {
      std::lock_guard<std::mutex> lk(mu);
      results.push_back(std::move(r));
      threads.push_back(std::this_thread::get_id());
      cv.notify_all();
    };
  }
  bool WaitFor(size_t n, int64_t ms) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, milliseconds(ms), [&] { return results.size() >= n; });
  }
};

TEST_P(KvsConformance, StartWaitCallsBackOnceWithTheValue) {
  AsyncOutcomes out;
  Result<KvsWaitTicket> t = kvs_->StartWait("ns", "async", Deadline::AfterMs(5000), out.Callback());
  if (!kvs_->caps().async_wait) {
    EXPECT_EQ(t.status().code(), DYAD_RC_NOTSUP) << t.status().ToString();
    return;
  }
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  SleepMs(100);
  EXPECT_FALSE(out.WaitFor(1, 0));
  const auto put_at = SteadyClock::now();
  ASSERT_TRUE(kvs_->Put("ns", "async", "called back").ok());
  ASSERT_TRUE(out.WaitFor(1, 4000));
  EXPECT_LT(MsSince(put_at), 500);
  ASSERT_TRUE(out.results[0].ok()) << out.results[0].status().ToString();
  EXPECT_EQ(*out.results[0], "called back");
  // A key that exists is reported too, but never from inside StartWait.
  ASSERT_TRUE(kvs_->StartWait("ns", "async", Deadline::AfterMs(5000), out.Callback()).ok());
  ASSERT_TRUE(out.WaitFor(2, 4000));
  EXPECT_EQ(out.results[1].value(), "called back");
  EXPECT_NE(out.threads[1], std::this_thread::get_id());
  kvs_->CancelWait(*t);  // already ended: nothing happens
  SleepMs(50);
  EXPECT_EQ(out.results.size(), 2u);
}

TEST_P(KvsConformance, StartWaitTimesOutAndIsCancelled) {
  if (!kvs_->caps().async_wait) GTEST_SKIP() << "no asynchronous wait";
  AsyncOutcomes timed, cancelled;
  const auto start = SteadyClock::now();
  ASSERT_TRUE(kvs_->StartWait("ns", "nobody", Deadline::AfterMs(300), timed.Callback()).ok());
  Result<KvsWaitTicket> t =
      kvs_->StartWait("ns", "nobody", Deadline::AfterMs(8000), cancelled.Callback());
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(timed.WaitFor(1, 3000));
  EXPECT_GE(MsSince(start), 290);
  EXPECT_EQ(timed.results[0].status().code(), DYAD_RC_TIMEOUT);
  EXPECT_NE(timed.results[0].status().message().find("nobody"), std::string::npos);
  EXPECT_FALSE(cancelled.WaitFor(1, 0));
  kvs_->CancelWait(*t);
  ASSERT_TRUE(cancelled.WaitFor(1, 0));  // on this thread, before CancelWait returned
  EXPECT_EQ(cancelled.results[0].status().code(), DYAD_RC_CANCELLED);
  ASSERT_TRUE(kvs_->Put("ns", "nobody", "late").ok());
  SleepMs(100);
  EXPECT_EQ(timed.results.size(), 1u);
  EXPECT_EQ(cancelled.results.size(), 1u);
}

TEST_P(KvsConformance, ShutdownEndsStartedWaits) {
  if (!kvs_->caps().async_wait) GTEST_SKIP() << "no asynchronous wait";
  AsyncOutcomes out;
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(
        kvs_->StartWait("ns", "s" + std::to_string(i % 3), Deadline::Never(), out.Callback()).ok());
  }
  kvs_->Shutdown();
  ASSERT_TRUE(out.WaitFor(10, 2000));
  for (const auto& r : out.results) EXPECT_EQ(r.status().code(), DYAD_RC_CANCELLED);
  EXPECT_EQ(kvs_->StartWait("ns", "x", Deadline::Never(), out.Callback()).status().code(),
            DYAD_RC_CANCELLED);
}

// Every store compiled in (its row says so) and the Redis deployments;
// SetUp knows how to host those that need a server, and any other opens
// from its name.
// --- watches (KvsCaps::watch) --------------------------------------------------

using testing_kvs::WatchLog;

TEST_P(KvsConformance, WatchReportsLaterPutsOfItsNamespaceOnly) {
  ASSERT_TRUE(kvs_->Put("w", "before", "old").ok());
  WatchLog log;
  Result<KvsWatchTicket> t = kvs_->Watch("w", log.Callback());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(kvs_->Put("other", "k", "elsewhere").ok());
  ASSERT_TRUE(kvs_->Put("w", "a", std::string("v\0a", 3)).ok());
  ASSERT_TRUE(kvs_->Put("w", "b:with:colons", "").ok());
  ASSERT_TRUE(kvs_->Put("w", "a", "v2").ok());
  ASSERT_TRUE(log.WaitFor(3, 5000)) << log.size() << " changes";
  SleepMs(100);
  std::lock_guard<std::mutex> lk(log.mu);
  std::vector<std::pair<std::string, std::string>> got;
  for (const KvsChange& c : log.changes) {
    if (c.resync) continue;
    // A cluster may carry the Put made just before Watch across its bus
    // after the subscription (kvs.h); nowhere else may it be reported.
    if (GetParam() == "redis_cluster" && c.key == "before" && c.value == "old") continue;
    got.emplace_back(c.key, c.value);
  }
  const std::vector<std::pair<std::string, std::string>> want = {
      {"a", std::string("v\0a", 3)}, {"b:with:colons", ""}, {"a", "v2"}};
  // The contract orders the Puts of one key, not those of different keys
  // (a cluster carries them from different masters), and a change says
  // "this key has (had) this value": a store may report a later value for
  // an earlier Put (the embedded root reads each value when it answers a
  // poll, so two Puts of a key between two polls both report the second).
  // So each key's reports follow its Puts in order, one per Put, and the
  // last is the value it was left with.
  for (const char* key : {"a", "b:with:colons"}) {
    auto only = [&](const std::vector<std::pair<std::string, std::string>>& all) {
      std::vector<std::string> out;
      for (const auto& kv : all)
        if (kv.first == key) out.push_back(kv.second);
      return out;
    };
    const std::vector<std::string> seen = only(got), put = only(want);
    ASSERT_EQ(seen.size(), put.size()) << key;
    size_t at = 0;  // the earliest Put the next report may stand for
    for (size_t i = 0; i < seen.size(); ++i) {
      while (at < put.size() && put[at] != seen[i]) ++at;
      ASSERT_LT(at, put.size()) << key << ": report " << i << " is no value it was put with, "
                                << "or comes out of order";
      ASSERT_GE(at, i) << key;
    }
    EXPECT_EQ(seen.back(), put.back()) << key;
  }
  EXPECT_EQ(got.size(), want.size());
}

TEST_P(KvsConformance, UnwatchStopsTheCallbacks) {
  WatchLog log;
  Result<KvsWatchTicket> t = kvs_->Watch("w2", log.Callback());
  if (!t.ok()) GTEST_SKIP() << t.status().ToString();
  ASSERT_TRUE(kvs_->Put("w2", "k1", "1").ok());
  ASSERT_TRUE(log.WaitFor(1, 5000));
  kvs_->Unwatch(*t);
  const size_t seen = log.size();
  ASSERT_TRUE(kvs_->Put("w2", "k2", "2").ok());
  SleepMs(300);
  EXPECT_EQ(log.size(), seen);
  kvs_->Unwatch(*t);  // twice: nothing happens
}

INSTANTIATE_TEST_SUITE_P(Backends, KvsConformance, ::testing::ValuesIn(ConformanceParams()),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// --- memory backend only -------------------------------------------------------

TEST(MemoryKvsTest, ShutdownCancelsWaiters) {
  MemoryKvs kvs;
  ASSERT_TRUE(kvs.Put("ns", "present", "v").ok());
  auto waiter =
      std::async(std::launch::async, [&] { return kvs.Wait("ns", "absent", Deadline::Never()); });
  SleepMs(50);
  const auto start = SteadyClock::now();
  kvs.Shutdown();
  ASSERT_EQ(waiter.wait_for(milliseconds(2000)), std::future_status::ready);
  EXPECT_EQ(waiter.get().status().code(), DYAD_RC_CANCELLED);
  EXPECT_LT(MsSince(start), 100);  // woken, not polled
  EXPECT_TRUE(kvs.shut_down());
  // Later waits: an existing key is still returned, a missing one cancels.
  Result<std::string> present = kvs.Wait("ns", "present", Deadline::Never());
  ASSERT_TRUE(present.ok());
  EXPECT_EQ(*present, "v");
  EXPECT_EQ(kvs.Wait("ns", "absent", Deadline::Never()).status().code(), DYAD_RC_CANCELLED);
  EXPECT_EQ(kvs.EntryCount(), 1u);
}

// --- registry ------------------------------------------------------------------

TEST(KvsRegistryTest, OpensKnownBackendsAndExplainsOthers) {
  const std::vector<std::string> names = KvsBackendNames();
  EXPECT_NE(std::find(names.begin(), names.end(), "memory"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "embedded"), names.end());

  Result<std::unique_ptr<Kvs>> mem = OpenKvs("memory", {});
  ASSERT_TRUE(mem.ok());
  EXPECT_EQ((*mem)->name(), "memory");

  Result<std::unique_ptr<Kvs>> emb = OpenKvs("embedded://127.0.0.1:1", {});
  ASSERT_TRUE(emb.ok()) << emb.status().ToString();  // connects lazily
  EXPECT_EQ((*emb)->name(), "embedded");

  Result<std::unique_ptr<Kvs>> plain = OpenKvs("embedded", {});
  EXPECT_EQ(plain.status().code(), DYAD_RC_BADREQUEST);
  EXPECT_NE(plain.status().message().find("embedded://HOST:PORT"), std::string::npos);
  EXPECT_EQ(OpenKvs("embedded://", {}).status().code(), DYAD_RC_BADREQUEST);
  EXPECT_EQ(OpenKvs("embedded://no-port", {}).status().code(), DYAD_RC_BADREQUEST);

  Result<std::unique_ptr<Kvs>> redis = OpenKvs("redis://localhost:6379", {});
#ifdef DYAD_HAVE_REDIS
  ASSERT_TRUE(redis.ok()) << redis.status().ToString();  // connects lazily
  EXPECT_EQ((*redis)->name(), "redis");
  EXPECT_NE(std::find(names.begin(), names.end(), "redis"), names.end());
  EXPECT_EQ(OpenKvs("redis", {}).status().code(), DYAD_RC_BADREQUEST);
  EXPECT_EQ(OpenKvs("rediss://localhost:6379", {}).status().code(), DYAD_RC_NOTSUP);
#else
  EXPECT_EQ(redis.status().code(), DYAD_RC_NOTSUP);
  EXPECT_NE(redis.status().message().find("DYAD_ENABLE_REDIS"), std::string::npos);
#endif

  Result<std::unique_ptr<Kvs>> bogus = OpenKvs("etcd://x", {});
  EXPECT_EQ(bogus.status().code(), DYAD_RC_NOTSUP);
  EXPECT_NE(bogus.status().message().find("memory"), std::string::npos);
  EXPECT_NE(bogus.status().message().find("embedded://"), std::string::npos);
}

// --- embedded backend only -----------------------------------------------------

class EmbeddedKvsTest : public ::testing::Test {
 protected:
  void StartRoot(uint16_t port = 0, const std::string& secret = kSecret) {
    std::string error;
    // A port just freed may take a moment to bind again; retry briefly.
    for (int i = 0; i < 20 && !root_; ++i) {
      root_ = TestRoot::Start(secret, port, &error);
      if (!root_) SleepMs(50);
    }
    ASSERT_NE(root_, nullptr) << error;
  }

  std::unique_ptr<Kvs> OpenClient(const std::string& secret = kSecret) {
    Result<std::unique_ptr<Kvs>> kvs = OpenKvs(root_->url(), ClientOptions(secret));
    EXPECT_TRUE(kvs.ok()) << kvs.status().ToString();
    return kvs.ok() ? std::move(*kvs) : nullptr;
  }

  // A raw authenticated link to the root, for hand-made frames.
  std::unique_ptr<Channel> RawLink() {
    SocketAddress addr;
    addr.host = "127.0.0.1";
    addr.port = root_->port();
    Result<UniqueFd> fd = Connect(addr, Deadline::AfterMs(2000));
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    if (!fd.ok()) return nullptr;
    auto ch = std::make_unique<Channel>(std::move(*fd), Trust::kUnauthenticated);
    Status st =
        Authenticator(kSecret).Connect(*ch, PeerIdentity{5, 1}, Deadline::AfterMs(2000), nullptr);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return st.ok() ? std::move(ch) : nullptr;
  }

  void TearDown() override {
    if (root_) root_->Stop();
  }

  std::unique_ptr<TestRoot> root_;
};

// A root from before kKvsMultiGet refuses it; the client then reads key by
// key (same answers) and does not ask again at every call.
TEST_F(EmbeddedKvsTest, MultiGetFromARootWithoutItReadsKeyByKey) {
  StartRoot();
  root_->Refuse(MsgType::kKvsMultiGet);
  std::unique_ptr<Kvs> kvs = OpenClient();
  ASSERT_NE(kvs, nullptr);
  ASSERT_TRUE(kvs->Put("ns", "a", "1").ok());
  ASSERT_TRUE(kvs->Put("ns", "c", "3").ok());
  for (int round = 0; round < 3; ++round) {
    Result<KvsValues> got = kvs->MultiGet("ns", {"a", "b", "c"});
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, (KvsValues{std::string("1"), std::nullopt, std::string("3")}));
  }
  EXPECT_EQ(root_->refused(), 1);
}

// Malformed batched reads get an error reply; the link keeps working.
TEST_F(EmbeddedKvsTest, MalformedMultiGetGetsAnErrorReply) {
  StartRoot();
  std::unique_ptr<Channel> ch = RawLink();
  ASSERT_NE(ch, nullptr);
  // Sends one kvs.multi_get and returns the status of its reply.
  auto ask = [&ch](const std::string& payload) -> Status {
    Status sent = ch->SendFrame(static_cast<uint16_t>(MsgType::kKvsMultiGet), payload,
                                Deadline::AfterMs(2000));
    if (!sent.ok()) return sent;
    uint16_t type = 0;
    std::string reply;
    Status got = ch->RecvFrame(&type, &reply, Deadline::AfterMs(2000));
    if (!got.ok()) return got;
    Status st;
    std::string body;
    if (!DecodeReply(reply, &st, &body)) return Status(DYAD_RC_BADRPC, "undecodable reply");
    return st;
  };
  Encoder too_many;
  too_many.Str("ns").U32(kMaxMultiGetKeys + 1);
  for (const std::string& payload : {std::string("\x01"), too_many.data()})
    EXPECT_EQ(ask(payload).code(), DYAD_RC_BADUNPACK);
  KvsMultiGetRequest req;
  req.ns = "ns";
  req.keys = {"x"};
  Encoder good;
  req.EncodeTo(good);
  Status st = ask(good.data());
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST_F(EmbeddedKvsTest, WrongSecretIsRefused) {
  StartRoot();
  std::unique_ptr<Kvs> kvs = OpenClient("not-the-secret");
  ASSERT_NE(kvs, nullptr);
  Status st = kvs->Put("ns", "k", "v");
  EXPECT_EQ(st.code(), DYAD_RC_AUTH) << st.ToString();
  // Not retried until the deadline: an authentication failure is final.
  const auto start = SteadyClock::now();
  Result<std::string> w = kvs->Wait("ns", "k", Deadline::AfterMs(3000));
  EXPECT_EQ(w.status().code(), DYAD_RC_AUTH) << w.status().ToString();
  EXPECT_LT(MsSince(start), 1000);
  // Nothing was stored by the refused client.
  std::unique_ptr<Kvs> good = OpenClient();
  ASSERT_NE(good, nullptr);
  Result<std::optional<std::string>> r = good->Get("ns", "k");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, std::nullopt);
}

TEST_F(EmbeddedKvsTest, MalformedPayloadGetsErrorReplyAndServerKeepsServing) {
  StartRoot();
  std::unique_ptr<Channel> ch = RawLink();
  ASSERT_NE(ch, nullptr);
  std::string body;

  Status st = CallRpc(*ch, MsgType::kKvsPut, std::string("\x01\x02\x03", 3), &body,
                      Deadline::AfterMs(2000));
  EXPECT_EQ(st.code(), DYAD_RC_BADUNPACK) << st.ToString();
  EXPECT_FALSE(ch->broken());

  // A valid request with trailing bytes is malformed too.
  KvsRequest req;
  req.ns = "ns";
  req.key = "k";
  req.value = "v";
  Encoder e;
  req.EncodeTo(e);
  std::string trailing = e.data() + "x";
  st = CallRpc(*ch, MsgType::kKvsPut, trailing, &body, Deadline::AfterMs(2000));
  EXPECT_EQ(st.code(), DYAD_RC_BADUNPACK) << st.ToString();

  st = CallRpc(*ch, MsgType::kKvsGet, "", &body, Deadline::AfterMs(2000));
  EXPECT_EQ(st.code(), DYAD_RC_BADUNPACK) << st.ToString();

  // A string length pointing past the end of the message.
  Encoder liar;
  liar.U32(1000000).Str("x");
  st = CallRpc(*ch, MsgType::kKvsList, liar.data(), &body, Deadline::AfterMs(2000));
  EXPECT_EQ(st.code(), DYAD_RC_BADUNPACK) << st.ToString();

  // The same link still works for a good request.
  st = CallRpc(*ch, MsgType::kKvsPut, e.data(), &body, Deadline::AfterMs(2000));
  EXPECT_TRUE(st.ok()) << st.ToString();
  std::unique_ptr<Kvs> kvs = OpenClient();
  ASSERT_NE(kvs, nullptr);
  Result<std::optional<std::string>> r = kvs->Get("ns", "k");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, std::optional<std::string>("v"));

  // Garbage that is not even a frame costs that link only.
  std::unique_ptr<Channel> bad = RawLink();
  ASSERT_NE(bad, nullptr);
  const std::string junk(32, '\x7f');
  ASSERT_TRUE(bad->SendAll(junk.data(), junk.size(), Deadline::AfterMs(1000)).ok());
  uint16_t type = 0;
  std::string payload;
  EXPECT_FALSE(bad->RecvFrame(&type, &payload, Deadline::AfterMs(2000)).ok());
  EXPECT_TRUE(kvs->Put("ns", "after-junk", "ok").ok());
}

TEST_F(EmbeddedKvsTest, ClientReconnectsAfterRootRestart) {
  StartRoot();
  const uint16_t port = root_->port();
  std::unique_ptr<Kvs> kvs = OpenClient();
  ASSERT_NE(kvs, nullptr);
  ASSERT_TRUE(kvs->Put("ns", "before", "1").ok());  // leaves a pooled link

  root_->Stop();
  root_.reset();
  // With the root down a call fails promptly with a connection error.
  const auto start = SteadyClock::now();
  Status down = kvs->Put("ns", "during", "x");
  EXPECT_EQ(down.code(), DYAD_RC_CONNLOST) << down.ToString();
  EXPECT_LT(MsSince(start), 1500);

  StartRoot(port);
  ASSERT_EQ(root_->port(), port);
  Status st = kvs->Put("ns", "after", "2");
  ASSERT_TRUE(st.ok()) << st.ToString();
  Result<std::optional<std::string>> r = kvs->Get("ns", "after");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, std::optional<std::string>("2"));
  // The store lives in the root's memory: a restarted root starts empty.
  Result<std::optional<std::string>> old = kvs->Get("ns", "before");
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(*old, std::nullopt);
}

TEST_F(EmbeddedKvsTest, WaitSpansRootRestart) {
  StartRoot();
  const uint16_t port = root_->port();
  std::unique_ptr<Kvs> kvs = OpenClient();
  ASSERT_NE(kvs, nullptr);
  auto waiter = std::async(std::launch::async,
                           [&] { return kvs->Wait("ns", "survivor", Deadline::AfterMs(8000)); });
  SleepMs(150);  // the wait is now parked on the first root
  root_->Stop();
  root_.reset();
  SleepMs(300);  // the waiter sees the outage and backs off
  ASSERT_EQ(waiter.wait_for(milliseconds(0)), std::future_status::timeout);

  StartRoot(port);
  ASSERT_TRUE(kvs->Put("ns", "survivor", "made it").ok());
  ASSERT_EQ(waiter.wait_for(milliseconds(4000)), std::future_status::ready);
  Result<std::string> r = waiter.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "made it");
}

TEST_F(EmbeddedKvsTest, WaitWhileRootIsDownTimesOutWithReason) {
  StartRoot();
  std::unique_ptr<Kvs> kvs = OpenClient();
  ASSERT_NE(kvs, nullptr);
  root_->Stop();
  root_.reset();
  const auto start = SteadyClock::now();
  Result<std::string> r = kvs->Wait("ns", "k", Deadline::AfterMs(400));
  const int64_t elapsed = MsSince(start);
  EXPECT_EQ(r.status().code(), DYAD_RC_TIMEOUT) << r.status().ToString();
  EXPECT_NE(r.status().message().find("unreachable"), std::string::npos) << r.status().message();
  EXPECT_GE(elapsed, 390);
  EXPECT_LT(elapsed, 1500);
}

TEST_F(EmbeddedKvsTest, ShutdownCancelsWaits) {
  StartRoot();
  Result<std::unique_ptr<EmbeddedKvs>> kvs =
      EmbeddedKvs::Open("127.0.0.1:" + std::to_string(root_->port()), ClientOptions());
  ASSERT_TRUE(kvs.ok()) << kvs.status().ToString();
  EmbeddedKvs* client = kvs->get();
  auto waiter = std::async(std::launch::async,
                           [&] { return client->Wait("ns", "k", Deadline::AfterMs(8000)); });
  SleepMs(100);
  const auto start = SteadyClock::now();
  client->Shutdown();
  ASSERT_EQ(waiter.wait_for(milliseconds(2000)), std::future_status::ready);
  EXPECT_EQ(waiter.get().status().code(), DYAD_RC_CANCELLED);
  EXPECT_LT(MsSince(start), 600);
  // Non-wait calls keep working (a stopping service may still clean up).
  EXPECT_TRUE(client->Put("ns", "k", "v").ok());
}

TEST_F(EmbeddedKvsTest, OversizeValueIsRefusedByTheClient) {
  StartRoot();
  std::unique_ptr<Kvs> kvs = OpenClient();
  ASSERT_NE(kvs, nullptr);
  Status st = kvs->Put("ns", "huge", std::string(EmbeddedKvs::kMaxFieldBytes + 1, 'x'));
  EXPECT_EQ(st.code(), DYAD_RC_BADREQUEST) << st.ToString();
  EXPECT_TRUE(kvs->Put("ns", "fine", "x").ok());
}

TEST_F(EmbeddedKvsTest, IdleConnectionsAreBounded) {
  StartRoot();
  std::unique_ptr<Kvs> kvs = OpenClient();
  ASSERT_NE(kvs, nullptr);
  // A burst of calls from 16 threads at once needs several links (at most
  // kMaxCallsInFlight); afterwards the pooled ones serve sequential calls,
  // which open no new link.
  std::vector<std::future<bool>> callers;
  for (int i = 0; i < 16; ++i) {
    callers.push_back(std::async(std::launch::async, [&kvs, i] {
      for (int j = 0; j < 20; ++j)
        if (!kvs->Put("ns", "burst" + std::to_string(i), std::to_string(j)).ok()) return false;
      return true;
    }));
  }
  for (auto& c : callers) ASSERT_TRUE(c.get());
  const int after_burst = root_->connections();
  EXPECT_GE(after_burst, 2);
  EXPECT_LE(after_burst, 16);
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(kvs->Get("ns", "burst0").ok());
  EXPECT_EQ(root_->connections(), after_burst);
}

}  // namespace
}  // namespace dyad
