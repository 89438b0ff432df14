// dyad-waits: how promptly many parked waits are woken, per metadata store.
//
// For each store and wait mode, two scenarios: N waits on N distinct keys
// ("distinct"), then M waits on one key ("one key"), all started before
// anything is published; then one publisher Puts the keys one after
// another. A wait's wake-up latency is from the start of the Put of its key
// to its return (or callback). Every woken value is checked.
// Modes: "threads", one thread per blocking Kvs::Wait; "async",
// Kvs::StartWait (no thread per wait: how a dyad-service parks a consume
// on every store that has it, KvsCaps::async_wait). Stores: memory
// (in-process floor), embedded (the root dyad-service in its own process;
// this process is a client of it, as a non-root service is: its async
// waits share one change feed per namespace, see
// src/kvs/embedded/embedded_waits.h), redis (one redis-server),
// redis-cluster (three masters). Also printed: threads and resident memory
// of this process, and of the store's process, while the waits are parked.
//
// In threads mode the embedded store also holds one root connection per
// parked wait, so that mode runs at most --embedded-waits (default 5,000)
// waits there; async mode runs the full counts.
//
// Usage: dyad-waits [--distinct N] [--shared M] [--embedded-waits N]
//                   [--modes threads,async] [--stores a,b,...] [--json]
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench_stores.h"
#include "bench_util.h"
#include "common/log.h"
#include "emu/redis_server.h"
#include "kvs/kvs.h"
#ifdef DYAD_HAVE_REDIS
#include "emu/redis_cluster.h"
#endif

namespace dyad::bench {
namespace {

// A scenario that has not finished by then is ended (the store shut down,
// its waits cancelled) and its unfinished waits counted as errors.
constexpr int64_t kScenarioMs = 120000;

struct Row {
  std::string store, mode, scenario;
  int waits = 0;
  double park_ms = 0, p50_ms = 0, p99_ms = 0, max_ms = 0, all_ms = 0;
  int errors = 0;
  int threads = 0, store_threads = 0;
  double rss_mib = 0, store_rss_mib = 0;
};

double Ms(SteadyClock::time_point a, SteadyClock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

struct Store {
  std::string name;
  std::unique_ptr<Kvs> kvs;
  pid_t pid = 0;  // the store's own process (0: in this one)
};

// One scenario: `waits` waits over `keys` keys (keys == waits: one each;
// keys == 1: all on one), parked, then published.
Row RunScenario(Store& s, const std::string& mode, int keys, int waits, int run) {
  Row row;
  row.store = s.name;
  row.mode = mode;
  row.scenario = keys == 1 ? "one key" : "distinct";
  row.waits = waits;
  const std::string ns = "waits-" + std::to_string(run);
  auto key_of = [&](int i) { return "k" + std::to_string(keys == 1 ? 0 : i); };
  std::vector<SteadyClock::time_point> woke(static_cast<size_t>(waits));
  std::vector<SteadyClock::time_point> put_at(static_cast<size_t>(keys));
  std::atomic<int> done{0};
  std::atomic<int> errors{0};
  auto finish = [&](int i, const Result<std::string>& r) {
    woke[static_cast<size_t>(i)] = SteadyClock::now();
    if (!r.ok() || *r != "v" + key_of(i)) ++errors;
    ++done;
  };
  std::vector<std::thread> threads;
  const auto park_start = SteadyClock::now();
  for (int i = 0; i < waits; ++i) {
    if (mode == "threads") {
      threads.emplace_back(
          [&, i] { finish(i, s.kvs->Wait(ns, key_of(i), Deadline::AfterMs(kScenarioMs))); });
    } else if (!s.kvs
                    ->StartWait(ns, key_of(i), Deadline::AfterMs(kScenarioMs),
                                [&, i](Result<std::string> r) { finish(i, r); })
                    .ok()) {
      ++errors;
      ++done;
    }
  }
  row.park_ms = Ms(park_start, SteadyClock::now());
  ::usleep(static_cast<useconds_t>(1000000 + waits * 200));
  row.threads = ThreadsOf(::getpid());
  row.rss_mib = SampleProc(::getpid()).rss_kib / 1024.0;
  if (s.pid > 0) {
    row.store_threads = ThreadsOf(s.pid);
    row.store_rss_mib = SampleProc(s.pid).rss_kib / 1024.0;
  }
  for (int k = 0; k < keys; ++k) {
    put_at[static_cast<size_t>(k)] = SteadyClock::now();
    const std::string key = "k" + std::to_string(k);
    if (!s.kvs->Put(ns, key, "v" + key).ok()) ++errors;
  }
  const Deadline scenario_end = Deadline::AfterMs(kScenarioMs);
  while (done.load() < waits && !scenario_end.expired()) ::usleep(10000);
  const int unfinished = waits - done.load();
  // Pending waits would outlive this frame: end them all (bounded: every
  // store's Shutdown ends its waits within 250 ms).
  if (unfinished > 0) s.kvs->Shutdown();
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 1000 && done.load() < waits; ++i) ::usleep(10000);
  row.errors = errors.load() + unfinished;
  std::vector<double> lat;
  for (int i = 0; i < waits && unfinished == 0; ++i)
    lat.push_back(Ms(put_at[static_cast<size_t>(keys == 1 ? 0 : i)], woke[static_cast<size_t>(i)]));
  if (!lat.empty()) {
    const double last = *std::max_element(lat.begin(), lat.end());
    row.all_ms = keys == 1 ? last : Ms(put_at[0], *std::max_element(woke.begin(), woke.end()));
    std::sort(lat.begin(), lat.end());
    row.p50_ms = lat[lat.size() / 2];
    row.p99_ms = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
    row.max_ms = last;
  }
  return row;
}

void Print(const std::vector<Row>& rows, bool json) {
  if (json) {
    std::printf("{\"benchmark\":\"waits\",\"results\":[");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf(
          "%s{\"store\":\"%s\",\"mode\":\"%s\",\"scenario\":\"%s\",\"waits\":%d,\"park_ms\":%.1f,"
          "\"p50_ms\":%.2f,\"p99_ms\":%.2f,\"max_ms\":%.2f,\"all_woken_ms\":%.1f,\"errors\":%d,"
          "\"threads\":%d,\"rss_mib\":%.1f,\"store_threads\":%d,\"store_rss_mib\":%.1f}",
          i ? "," : "", r.store.c_str(), r.mode.c_str(), r.scenario.c_str(), r.waits, r.park_ms,
          r.p50_ms, r.p99_ms, r.max_ms, r.all_ms, r.errors, r.threads, r.rss_mib, r.store_threads,
          r.store_rss_mib);
    }
    std::printf("]}\n");
    return;
  }
  std::printf("%-13s %-7s %-8s %6s %8s %8s %8s %8s %9s %4s %7s %7s %8s %8s\n", "store", "mode",
              "scenario", "waits", "park ms", "p50 ms", "p99 ms", "max ms", "all ms", "err",
              "threads", "RSS MiB", "st.thr", "st.MiB");
  for (const Row& r : rows) {
    std::printf("%-13s %-7s %-8s %6d %8.0f %8.2f %8.2f %8.2f %9.1f %4d %7d %7.0f %8d %8.0f\n",
                r.store.c_str(), r.mode.c_str(), r.scenario.c_str(), r.waits, r.park_ms, r.p50_ms,
                r.p99_ms, r.max_ms, r.all_ms, r.errors, r.threads, r.rss_mib, r.store_threads,
                r.store_rss_mib);
  }
}

bool Wanted(const std::string& list, const std::string& name) {
  return ("," + list + ",").find("," + name + ",") != std::string::npos;
}

int Run(int argc, char** argv) {
  uint64_t distinct = 10000, shared = 1000;
  // Blocking embedded waits: one root connection each (threads mode only).
  uint64_t embedded_waits = 5000;
  std::string stores = "memory,embedded,redis,redis-cluster";
  std::string modes = "threads,async";
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--distinct" && i + 1 < argc && ParseU64(argv[i + 1], &distinct)) {
      ++i;
    } else if (a == "--shared" && i + 1 < argc && ParseU64(argv[i + 1], &shared)) {
      ++i;
    } else if (a == "--embedded-waits" && i + 1 < argc && ParseU64(argv[i + 1], &embedded_waits)) {
      ++i;
    } else if (a == "--stores" && i + 1 < argc) {
      stores = argv[++i];
    } else if (a == "--modes" && i + 1 < argc) {
      modes = argv[++i];
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--distinct N] [--shared M] [--embedded-waits N] "
                   "[--modes threads,async] [--stores %s] [--json]\n",
                   argv[0], "memory,embedded,redis,redis-cluster");
      return 2;
    }
  }
  RaiseFdLimit();
  LogSetLevel(LogLevel::kError);  // thousands of waits would log thousands of retries
  char tmpl[] = "/tmp/dyad-bench-waits.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  std::unique_ptr<EmbeddedRootProcess> root;  // forked before any thread
  std::string error;
  if (Wanted(stores, "embedded")) {
    root = EmbeddedRootProcess::Fork(dir, &error);
    if (!root) std::fprintf(stderr, "embedded root: %s\n", error.c_str());
  }
  std::vector<Row> rows;
  int run = 0;
  auto bench = [&](const std::string& name, const std::string& url, pid_t pid) {
    KvsOptions o;
    o.secret = kStoreSecret;
    o.rpc_timeout_ms = 60000;
    Result<std::unique_ptr<Kvs>> kvs = OpenKvs(url, o);
    if (!kvs.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), kvs.status().ToString().c_str());
      return;
    }
    Store s{name, std::move(*kvs), pid};
    for (const char* mode : {"threads", "async"}) {
      if (!Wanted(modes, mode)) continue;
      if (std::string(mode) == "async" && !s.kvs->caps().async_wait) continue;
      // Blocking embedded waits hold a root connection each.
      const bool capped = name == "embedded" && std::string(mode) == "threads";
      const uint64_t n = capped ? std::min(distinct, embedded_waits) : distinct;
      const uint64_t m = capped ? std::min(shared, embedded_waits) : shared;
      rows.push_back(RunScenario(s, mode, static_cast<int>(n), static_cast<int>(n), ++run));
      rows.push_back(RunScenario(s, mode, 1, static_cast<int>(m), ++run));
    }
  };
  if (Wanted(stores, "memory")) bench("memory", "memory", 0);
  if (root) bench("embedded", root->url(), root->pid());
#ifdef DYAD_HAVE_REDIS
  if (Wanted(stores, "redis")) {
    emu::RedisServer redis("maxclients 50000\n");
    if (redis.available() && redis.Start().empty()) bench("redis", redis.url(), redis.pid());
  }
  if (Wanted(stores, "redis-cluster")) {
    emu::RedisCluster cluster;
    if (cluster.available() && cluster.Start().empty())
      bench("redis-cluster", cluster.url(), cluster.node(0).pid());
  }
#endif
  root.reset();
  if (::system(("rm -rf '" + dir + "'").c_str()) != 0)
    std::fprintf(stderr, "could not remove %s\n", dir.c_str());
  if (!json) {
    std::printf(
        "dyad-waits: %llu waits on distinct keys, %llu on one key (embedded threads mode: "
        "at most %llu); fd limit %llu; store columns: its process (redis-cluster: one of "
        "three masters)\n",
        static_cast<unsigned long long>(distinct), static_cast<unsigned long long>(shared),
        static_cast<unsigned long long>(embedded_waits),
        static_cast<unsigned long long>(FdLimit()));
  }
  Print(rows, json);
  for (const Row& r : rows)
    if (r.errors != 0) return 1;
  return rows.empty() ? 1 : 0;
}

}  // namespace
}  // namespace dyad::bench

int main(int argc, char** argv) { return dyad::bench::Run(argc, argv); }
