// kvs_flux_test: the flux:// store inside a real Flux instance. ctest runs
// it as `flux start --test-size=1 kvs_flux_test` (tests/flux/CMakeLists.txt);
// the instance, its namespaces and keys end with the process. Every wait is
// bounded, and every `flux` command runs under timeout(1).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <future>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "kvs/flux/flux_keys.h"
#include "kvs/flux/flux_kvs.h"
#include "kvs/kvs.h"
#include "proto/protocol.h"

namespace dyad {
namespace {

using std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

int64_t MsSince(SteadyClock::time_point t) {
  return std::chrono::duration_cast<milliseconds>(SteadyClock::now() - t).count();
}

// The `flux` program of the instance under test: the one built against,
// or DYAD_TEST_FLUX (ctest's runs against another flux-core set it).
std::string FluxProgram() {
  const char* other = std::getenv("DYAD_TEST_FLUX");
  return other != nullptr && *other ? other : DYAD_FLUX_COMMAND;
}

// Output of a `flux` command of this instance ("" and a failure if it fails).
std::string Flux(const std::string& args) {
  const std::string cmd = "timeout 20 " + FluxProgram() + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    ADD_FAILURE() << "popen " << cmd;
    return "";
  }
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = pclose(p);
  EXPECT_EQ(rc, 0) << cmd << ": " << out;
  return out;
}

// Waiters the instance's kvs-watch module holds now (lookups with
// FLUX_KVS_WAITCREATE or FLUX_KVS_WATCH that have not ended).
int KvsWatchers() {
  const std::string stats = Flux("module stats kvs-watch");
  std::smatch m;
  if (!std::regex_search(stats, m, std::regex("\"watchers\": *([0-9]+)"))) {
    ADD_FAILURE() << "no watchers in: " << stats;
    return -1;
  }
  return std::stoi(m[1]);
}

// Polls until the kvs-watch module holds `want` waiters (at most 5 s).
int KvsWatchersBecome(int want) {
  int now = -1;
  const auto start = SteadyClock::now();
  while (MsSince(start) < 5000) {
    now = KvsWatchers();
    if (now == want) break;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return now;
}

class FluxKvsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (std::getenv("FLUX_URI") == nullptr) GTEST_SKIP() << "run inside `flux start` (ctest does)";
    kvs_ = OpenStore("flux://");
  }

  std::unique_ptr<Kvs> OpenStore(const std::string& url) {
    KvsOptions o;
    o.rpc_timeout_ms = 10000;
    Result<std::unique_ptr<Kvs>> kvs = OpenKvs(url, o);
    EXPECT_TRUE(kvs.ok()) << kvs.status().ToString();
    return kvs.ok() ? std::move(*kvs) : nullptr;
  }

  std::optional<std::string> MustGet(Kvs& kvs, const std::string& ns, const std::string& key) {
    Result<std::optional<std::string>> r = kvs.Get(ns, key);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : std::nullopt;
  }

  std::unique_ptr<Kvs> kvs_;
};

// Upstream's failure: in Flux '.' is a directory separator, so
// `a.b.c.file0` then `a.b.c.file0.dat` turned file0's value into a
// directory, and `run.log` then `run` removed run.log.
TEST_F(FluxKvsTest, DottedPathsAreAllKept) {
  ASSERT_NE(kvs_, nullptr);
  const std::vector<std::pair<std::string, std::string>> puts = {
      {"a.b.c.file0", "zero"}, {"a.b.c.file0.dat", "zero-dat"}, {"run.log", "log"}, {"run", "run"}};
  for (const auto& kv : puts)
    ASSERT_TRUE(kvs_->Put("escape", kv.first, kv.second).ok()) << kv.first;
  for (const auto& kv : puts) EXPECT_EQ(MustGet(*kvs_, "escape", kv.first), kv.second) << kv.first;
  Result<std::vector<KvsEntry>> all = kvs_->List("escape", "");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  const std::vector<KvsEntry> want = {
      {"a.b.c.file0", "zero"}, {"a.b.c.file0.dat", "zero-dat"}, {"run", "run"}, {"run.log", "log"}};
  EXPECT_EQ(*all, want);
  // Removing one leaves the others.
  ASSERT_TRUE(kvs_->Remove("escape", "a.b.c.file0").ok());
  EXPECT_EQ(MustGet(*kvs_, "escape", "a.b.c.file0"), std::nullopt);
  EXPECT_EQ(MustGet(*kvs_, "escape", "a.b.c.file0.dat"), std::string("zero-dat"));
}

// What `flux kvs get` shows is the JSON the store wrote: a person can read
// a published file's record.
TEST_F(FluxKvsTest, ValuesAreReadableWithFluxKvsGet) {
  ASSERT_NE(kvs_, nullptr);
  FileRecord r;
  r.owner_rank = 1;
  r.owner_incarnation = 77;
  r.size = 12;
  r.version = 1000;
  r.published_ns = 2000;
  r.upath = "out/file0.dat";
  r.seq = 4;
  const std::string key = "0.1.2.out/file0.dat";
  ASSERT_TRUE(kvs_->Put("readable", key, r.Encode()).ok());
  ASSERT_TRUE(kvs_->Put("", "note.txt", "hello from dyad").ok());
  FluxKvs* fk = dynamic_cast<FluxKvs*>(kvs_.get());
  ASSERT_NE(fk, nullptr);
  const std::string shown = Flux("kvs get --namespace=readable " + fk->FluxKey(key));
  EXPECT_EQ(shown,
            "{\"dyad\":\"file\",\"owner_rank\":1,\"owner_incarnation\":77,\"size\":12,"
            "\"version\":1000,\"published_ns\":2000,\"upath\":\"out/file0.dat\",\"seq\":4}\n");
  FileRecord back;
  ASSERT_TRUE(FluxDecodeFileRecord(shown.substr(0, shown.size() - 1), &back));
  EXPECT_EQ(back.upath, r.upath);
  // The empty namespace is Flux's primary one.
  EXPECT_EQ(Flux("kvs get " + fk->FluxKey("note.txt")),
            "{\"dyad\":\"text\",\"text\":\"hello from dyad\"}\n");
  // The layout: dyad.<bin>.<leaf>, one directory level per part.
  EXPECT_EQ(fk->FluxKey("a.b"), "dyad." + FluxKeyBin("a.b") + ".a%2Eb");
}

TEST_F(FluxKvsTest, NamespacesAreCreatedOnDemandForTheInstanceOwner) {
  ASSERT_NE(kvs_, nullptr);
  const std::regex row("(^|\n)ondemand +" + std::to_string(getuid()) + " ");
  EXPECT_FALSE(std::regex_search(Flux("kvs namespace list"), row));
  // Reads and removals do not create it.
  EXPECT_EQ(MustGet(*kvs_, "ondemand", "k"), std::nullopt);
  EXPECT_TRUE(kvs_->Remove("ondemand", "k").ok());
  EXPECT_FALSE(std::regex_search(Flux("kvs namespace list"), row));
  ASSERT_TRUE(kvs_->Put("ondemand", "k", "v").ok());
  EXPECT_TRUE(std::regex_search(Flux("kvs namespace list"), row)) << Flux("kvs namespace list");
  // A namespace the user made first (as upstream's test does) is used as is.
  Flux("kvs namespace create premade");
  ASSERT_TRUE(kvs_->Put("premade", "k", "v2").ok());
  EXPECT_EQ(MustGet(*kvs_, "premade", "k"), std::string("v2"));
}

struct Outcomes {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Result<std::string>> results;
  KvsWaitCallback Callback() {
    return [this](Result<std::string> r) {
      std::lock_guard<std::mutex> lk(mu);
      results.push_back(std::move(r));
      cv.notify_all();
    };
  }
  bool WaitFor(size_t n, int64_t ms) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, milliseconds(ms), [&] { return results.size() >= n; });
  }
  size_t size() {
    std::lock_guard<std::mutex> lk(mu);
    return results.size();
  }
};

// A wait is a WAITCREATE lookup in the broker: at its deadline, on
// CancelWait and on Shutdown the store cancels it there too, so waits that
// ended leave no waiter behind in the instance.
TEST_F(FluxKvsTest, WaitsAreBoundedCancelledAndLeaveNoWaiterBehind) {
  ASSERT_NE(kvs_, nullptr);
  const int base = KvsWatchers();
  ASSERT_GE(base, 0);

  const auto start = SteadyClock::now();
  Result<std::string> timed = kvs_->Wait("waits", "never", Deadline::AfterMs(300));
  EXPECT_EQ(timed.status().code(), DYAD_RC_TIMEOUT) << timed.status().ToString();
  EXPECT_NE(timed.status().message().find("never"), std::string::npos);
  EXPECT_GE(MsSince(start), 290);
  EXPECT_LT(MsSince(start), 2000);

  constexpr int kWaits = 20;
  Outcomes cancelled;
  std::vector<KvsWaitTicket> tickets;
  for (int i = 0; i < kWaits; ++i) {
    Result<KvsWaitTicket> t =
        kvs_->StartWait("waits", "k" + std::to_string(i), Deadline::Never(), cancelled.Callback());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tickets.push_back(*t);
  }
  EXPECT_EQ(KvsWatchersBecome(base + kWaits), base + kWaits);
  for (KvsWaitTicket t : tickets) {
    const size_t before = cancelled.size();
    kvs_->CancelWait(t);
    EXPECT_EQ(cancelled.size(), before + 1);  // called back before CancelWait returned
  }
  for (const auto& r : cancelled.results) EXPECT_EQ(r.status().code(), DYAD_RC_CANCELLED);
  EXPECT_EQ(KvsWatchersBecome(base), base);

  Outcomes expired;
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(kvs_->StartWait("waits", "e" + std::to_string(i), Deadline::AfterMs(200),
                                expired.Callback())
                    .ok());
  }
  ASSERT_TRUE(expired.WaitFor(10, 3000));
  for (const auto& r : expired.results) EXPECT_EQ(r.status().code(), DYAD_RC_TIMEOUT);
  EXPECT_EQ(KvsWatchersBecome(base), base);

  // A blocking Wait whose caller gives up.
  std::atomic<bool> stop{false};
  auto waiter = std::async(std::launch::async, [&] {
    return kvs_->Wait("waits", "abandoned", Deadline::AfterMs(20000), [&] { return stop.load(); });
  });
  std::this_thread::sleep_for(milliseconds(100));
  const auto cancel_at = SteadyClock::now();
  stop.store(true);
  ASSERT_EQ(waiter.wait_for(milliseconds(3000)), std::future_status::ready);
  EXPECT_EQ(waiter.get().status().code(), DYAD_RC_CANCELLED);
  EXPECT_LT(MsSince(cancel_at), 500);
  EXPECT_EQ(KvsWatchersBecome(base), base);

  // Shutdown ends the waits in progress, blocking ones included.
  auto blocked = std::async(std::launch::async,
                            [&] { return kvs_->Wait("waits", "forever", Deadline::Never()); });
  EXPECT_EQ(KvsWatchersBecome(base + 1), base + 1);
  kvs_->Shutdown();
  ASSERT_EQ(blocked.wait_for(milliseconds(3000)), std::future_status::ready);
  EXPECT_EQ(blocked.get().status().code(), DYAD_RC_CANCELLED);
  EXPECT_EQ(KvsWatchersBecome(base), base);
}

// Another process's Put wakes a wait, also one begun before the namespace
// existed (the consumer starts first, as in upstream's test).
TEST_F(FluxKvsTest, PutOfAnotherStoreWakesAWaitBeforeItsNamespaceExists) {
  ASSERT_NE(kvs_, nullptr);
  std::unique_ptr<Kvs> other = OpenStore("flux://?uri=" + std::string(std::getenv("FLUX_URI")));
  ASSERT_NE(other, nullptr);
  auto waiter = std::async(std::launch::async, [&] {
    return kvs_->Wait("made-later", "a.b.c.file0.dat", Deadline::AfterMs(10000));
  });
  std::this_thread::sleep_for(milliseconds(200));
  const auto put_at = SteadyClock::now();
  ASSERT_TRUE(other->Put("made-later", "a.b.c.file0.dat", "arrived").ok());
  ASSERT_EQ(waiter.wait_for(milliseconds(5000)), std::future_status::ready);
  Result<std::string> r = waiter.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "arrived");
  EXPECT_LT(MsSince(put_at), 1000);
}

// flux-core's kvs-watch aborts the broker when two WAITCREATE lookups reach
// a namespace that does not exist yet before its first getroot answers
// (kvs-watch.c: assert nsm->commit != NULL): the store creates the
// namespace before it waits. Many waits begun at once on a new namespace,
// then a Put: every wait gets the value and the instance is still there.
TEST_F(FluxKvsTest, ConcurrentWaitsOnANewNamespaceKeepTheBrokerUp) {
  ASSERT_NE(kvs_, nullptr);
  std::unique_ptr<Kvs> other = OpenStore("flux://");
  ASSERT_NE(other, nullptr);
  // (Whether the broker's getroot answers before the second wait arrives
  // is a race: several rounds, each with a waiter that gave up first, as
  // a consumer retrying would.)
  for (int round = 0; round < 5; ++round) {
    const std::string ns = "brand-new-" + std::to_string(round);
    EXPECT_EQ(kvs_->Wait(ns, "same-key", Deadline::AfterMs(50)).status().code(), DYAD_RC_TIMEOUT);
    constexpr int kWaits = 32;
    Outcomes out;
    for (int i = 0; i < kWaits; ++i) {
      ASSERT_TRUE(kvs_->StartWait(ns, "same-key", Deadline::AfterMs(10000), out.Callback()).ok());
    }
    ASSERT_TRUE(other->Put(ns, "same-key", "for all").ok());
    ASSERT_TRUE(out.WaitFor(kWaits, 5000)) << out.size() << " of " << kWaits;
    for (const auto& r : out.results) {
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      EXPECT_EQ(*r, "for all");
    }
  }
  EXPECT_GE(KvsWatchers(), 0);  // the broker still answers
}

// The user removes the namespace (upstream's test does, at its end) while
// a wait is in progress: the wait ends with an error that says so, and a
// later Put and wait recreate it.
TEST_F(FluxKvsTest, NamespaceRemovedWhileWaiting) {
  ASSERT_NE(kvs_, nullptr);
  ASSERT_TRUE(kvs_->Put("doomed", "k", "v").ok());
  auto waiter = std::async(std::launch::async,
                           [&] { return kvs_->Wait("doomed", "never", Deadline::AfterMs(10000)); });
  std::this_thread::sleep_for(milliseconds(200));
  Flux("kvs namespace remove doomed");
  ASSERT_EQ(waiter.wait_for(milliseconds(5000)), std::future_status::ready);
  Result<std::string> r = waiter.get();
  EXPECT_EQ(r.status().code(), DYAD_RC_NOTFOUND) << r.status().ToString();
  EXPECT_NE(r.status().message().find("removed"), std::string::npos) << r.status().ToString();
  // Removal is eventually consistent: the next Put may find it still going.
  Status put;
  for (int i = 0; i < 50; ++i) {
    put = kvs_->Put("doomed", "k", "again");
    if (put.ok()) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_TRUE(put.ok()) << put.ToString();
  Result<std::string> again = kvs_->Wait("doomed", "k", Deadline::AfterMs(2000));
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, "again");
}

TEST_F(FluxKvsTest, WatchReportsDottedKeysWithTheirValues) {
  ASSERT_NE(kvs_, nullptr);
  ASSERT_TRUE(kvs_->Put("watched", "old.key", "before").ok());
  std::mutex mu;
  std::condition_variable cv;
  std::vector<KvsChange> seen;
  Result<KvsWatchTicket> t = kvs_->Watch("watched", [&](const KvsChange& c) {
    std::lock_guard<std::mutex> lk(mu);
    seen.push_back(c);
    cv.notify_all();
  });
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ASSERT_TRUE(kvs_->Put("watched", "a.b.c.file0", "0").ok());
  ASSERT_TRUE(kvs_->Put("watched", "a.b.c.file0.dat", "1").ok());
  ASSERT_TRUE(kvs_->Put("watched", "a.b.c.file0", "2").ok());
  ASSERT_TRUE(kvs_->Remove("watched", "old.key").ok());  // removals are not reported
  {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, milliseconds(5000), [&] { return seen.size() >= 3; }));
  }
  std::this_thread::sleep_for(milliseconds(200));
  kvs_->Unwatch(*t);
  std::vector<std::pair<std::string, std::string>> got;
  for (const KvsChange& c : seen) {
    EXPECT_FALSE(c.resync);
    got.emplace_back(c.key, c.value);
  }
  const std::vector<std::pair<std::string, std::string>> want = {
      {"a.b.c.file0", "0"}, {"a.b.c.file0.dat", "1"}, {"a.b.c.file0", "2"}};
  EXPECT_EQ(got, want);
}

// The user removes a watched namespace (as upstream's test does at its
// end) and makes it again: the watch says it may have missed changes, does
// not make the namespace again itself (the user's `namespace create` would
// then fail), and follows the new one once it exists.
TEST_F(FluxKvsTest, WatchFollowsANamespaceRemovedAndMadeAgain) {
  ASSERT_NE(kvs_, nullptr);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<KvsChange> seen;
  Result<KvsWatchTicket> t = kvs_->Watch("cycle", [&](const KvsChange& c) {
    std::lock_guard<std::mutex> lk(mu);
    seen.push_back(c);
    cv.notify_all();
  });
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  auto wait_for = [&](const std::function<bool()>& pred) {
    std::unique_lock<std::mutex> lk(mu);
    return cv.wait_for(lk, milliseconds(8000), pred);
  };
  ASSERT_TRUE(kvs_->Put("cycle", "k1", "1").ok());
  ASSERT_TRUE(wait_for([&] { return !seen.empty(); }));
  Flux("kvs namespace remove cycle");
  ASSERT_TRUE(wait_for([&] { return seen.back().resync; })) << "no resync after the removal";
  std::this_thread::sleep_for(milliseconds(1500));
  EXPECT_EQ(Flux("kvs namespace list").find("\ncycle "), std::string::npos)
      << "the watch made the namespace again";
  // The user makes it again (the removal may still be finishing: retried).
  bool made = false;
  for (int i = 0; i < 50 && !made; ++i) {
    made =
        std::system(
            ("timeout 20 " + FluxProgram() + " kvs namespace create cycle 2>/dev/null").c_str()) ==
        0;
    if (!made) std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_TRUE(made);
  // Once the watch follows the new namespace (a second resync), its puts
  // are reported.
  ASSERT_TRUE(wait_for([&] {
    int resyncs = 0;
    for (const KvsChange& c : seen) resyncs += c.resync ? 1 : 0;
    return resyncs >= 2;
  }));
  ASSERT_TRUE(kvs_->Put("cycle", "k2", "2").ok());
  ASSERT_TRUE(wait_for([&] { return !seen.back().resync && seen.back().key == "k2"; }));
  EXPECT_EQ(seen.back().value, "2");
  kvs_->Unwatch(*t);
}

// Many threads at once share at most kMaxPooledHandles connections: the
// others wait for one instead of opening more.
TEST_F(FluxKvsTest, ConnectionPoolIsBounded) {
  ASSERT_NE(kvs_, nullptr);
  FluxKvs* fk = dynamic_cast<FluxKvs*>(kvs_.get());
  ASSERT_NE(fk, nullptr);
  constexpr int kThreads = 100;
  std::atomic<int> failures{0};
  std::atomic<size_t> most{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 5; ++i) {
        if (!kvs_->Put("pool", std::to_string(t) + "." + std::to_string(i), "v").ok()) ++failures;
        size_t now = fk->PooledHandles();
        size_t seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LE(most.load(), FluxKvs::kMaxPooledHandles);
  EXPECT_GT(most.load(), 1u);  // (they did run at once)
  Result<std::vector<KvsEntry>> all = kvs_->List("pool", "");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), static_cast<size_t>(kThreads * 5));
}

// Each watch holds a thread and a connection: one beyond kMaxWatches is
// refused with a message naming the limit, and an Unwatch makes room.
TEST_F(FluxKvsTest, WatchesAreBounded) {
  ASSERT_NE(kvs_, nullptr);
  std::vector<KvsWatchTicket> tickets;
  for (size_t i = 0; i < FluxKvs::kMaxWatches; ++i) {
    Result<KvsWatchTicket> t = kvs_->Watch("many-watches", [](const KvsChange&) {});
    ASSERT_TRUE(t.ok()) << i << ": " << t.status().ToString();
    tickets.push_back(*t);
  }
  Result<KvsWatchTicket> refused = kvs_->Watch("many-watches", [](const KvsChange&) {});
  EXPECT_EQ(refused.status().code(), DYAD_RC_BADREQUEST);
  EXPECT_NE(refused.status().message().find("limit"), std::string::npos)
      << refused.status().ToString();
  kvs_->Unwatch(tickets.back());
  tickets.pop_back();
  Result<KvsWatchTicket> again = kvs_->Watch("many-watches", [](const KvsChange&) {});
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  tickets.push_back(*again);
  int64_t slowest = 0;
  for (KvsWatchTicket t : tickets) {
    const auto start = SteadyClock::now();
    kvs_->Unwatch(t);
    slowest = std::max(slowest, MsSince(start));
  }
  EXPECT_LT(slowest, 1000);  // each stops within its 100 ms poll and a cancel
}

// Keys someone else wrote under the store's directory with `flux kvs put`
// (not a bin, a directory where a value belongs, a value that is not the
// store's JSON) do not break List or a watch: they are skipped, or, for a
// value of the wrong form, reported as an error that names it.
TEST_F(FluxKvsTest, ForeignEntriesUnderTheTopDirectoryAreSkipped) {
  ASSERT_NE(kvs_, nullptr);
  FluxKvs* fk = dynamic_cast<FluxKvs*>(kvs_.get());
  ASSERT_NE(fk, nullptr);
  ASSERT_TRUE(kvs_->Put("foreign", "mine", "v").ok());
  std::vector<KvsChange> seen;
  std::mutex mu;
  std::condition_variable cv;
  Result<KvsWatchTicket> t = kvs_->Watch("foreign", [&](const KvsChange& c) {
    std::lock_guard<std::mutex> lk(mu);
    seen.push_back(c);
    cv.notify_all();
  });
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  const std::string bin = FluxKeyBin("mine");
  Flux("kvs put --namespace=foreign dyad.notabin=1 dyad." + bin + ".sub.deeper=2");
  ASSERT_TRUE(kvs_->Put("foreign", "later", "w").ok());
  {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, milliseconds(5000), [&] {
      for (const KvsChange& c : seen)
        if (c.key == "later") return true;
      return false;
    }));
  }
  kvs_->Unwatch(*t);
  for (const KvsChange& c : seen) EXPECT_TRUE(c.key == "later") << c.key;
  Result<std::vector<KvsEntry>> all = kvs_->List("foreign", "");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  const std::vector<KvsEntry> want = {{"later", "w"}, {"mine", "v"}};
  EXPECT_EQ(*all, want);
  // A value not in the store's form: Get says what is wrong with which key.
  Flux("kvs put --namespace=foreign " + fk->FluxKey("raw") + "=plain");
  Result<std::optional<std::string>> bad = kvs_->Get("foreign", "raw");
  EXPECT_EQ(bad.status().code(), DYAD_RC_BADMETADATA);
  EXPECT_NE(bad.status().message().find(fk->FluxKey("raw")), std::string::npos)
      << bad.status().ToString();
  // ... and List leaves it out, small or large.
  Flux("kvs put --namespace=foreign " + fk->FluxKey("raw-large") + "=" + std::string(5000, 'x'));
  all = kvs_->List("foreign", "");
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(*all, want);
}

// Two stores with different top directories share nothing.
TEST_F(FluxKvsTest, TopDirectoriesKeepStoresApart) {
  ASSERT_NE(kvs_, nullptr);
  std::unique_ptr<Kvs> other = OpenStore("flux://?dir=other-top");
  ASSERT_NE(other, nullptr);
  ASSERT_TRUE(kvs_->Put("shared", "k", "default").ok());
  ASSERT_TRUE(other->Put("shared", "k", "other").ok());
  EXPECT_EQ(MustGet(*kvs_, "shared", "k"), std::string("default"));
  EXPECT_EQ(MustGet(*other, "shared", "k"), std::string("other"));
  Result<std::vector<KvsEntry>> l = other->List("shared", "");
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->size(), 1u);
}

TEST(FluxUrl, FormsAndErrors) {
  Result<FluxUrl> u = ParseFluxUrl("flux://");
  ASSERT_TRUE(u.ok());
  EXPECT_EQ(u->uri, "");
  EXPECT_EQ(u->top, "dyad");
  u = ParseFluxUrl("flux");
  ASSERT_TRUE(u.ok());
  u = ParseFluxUrl("flux://?uri=local:///tmp/flux-x/local-0&dir=run2");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_EQ(u->uri, "local:///tmp/flux-x/local-0");
  EXPECT_EQ(u->top, "run2");
  for (const char* bad : {"flux://host", "flux://?dir=a.b", "flux://?dir=", "flux://?bogus=1"}) {
    Result<FluxUrl> b = ParseFluxUrl(bad);
    EXPECT_EQ(b.status().code(), DYAD_RC_BADREQUEST) << bad;
    EXPECT_NE(b.status().message().find(bad), std::string::npos) << b.status().message();
  }
  // An instance that is not there: a clear error at open.
  const std::string nowhere = "local:///nonexistent-dyad-test/local-0";
  Result<std::unique_ptr<Kvs>> none = OpenKvs("flux://?uri=" + nowhere, KvsOptions{});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), DYAD_RC_CONNLOST);
  EXPECT_NE(none.status().message().find(nowhere), std::string::npos) << none.status().message();
}

}  // namespace
}  // namespace dyad
