// dyad-metadata-scale: metadata operations per second from many services
// at once, per store, in one run.
//
// C clients (default 64, as 64 dyad-services would be), each with a Kvs of
// its own (its own connections, as each service holds one), each a thread
// that alternates a publish (Put of a FileRecord under a fresh gen_path_key)
// and a locate (Get of that key) for S seconds after a common start. Stores:
// embedded (the root dyad-service in its own process), redis (one
// redis-server, no persistence), redis-cluster (three masters). Printed per
// store: operations per second (puts and gets), p50/p99 latency of each,
// the CPU seconds the store's processes used meanwhile, and operations per
// store CPU-second, and the CPU seconds of the clients (this process). On
// a machine with few cores the clients and the store share them, so ops/s
// is bounded by the clients too; ops per store CPU-second is the store's
// own cost, the figure that carries over to a cluster where clients run on
// other nodes. Compare stores in one run.
//
// Usage: dyad-metadata-scale [--clients N] [--seconds S] [--stores a,b,...] [--json]
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench_stores.h"
#include "bench_util.h"
#include "common/key.h"
#include "emu/redis_server.h"
#include "kvs/kvs.h"
#include "proto/protocol.h"
#ifdef DYAD_HAVE_REDIS
#include "emu/redis_cluster.h"
#endif

namespace dyad::bench {
namespace {

struct Row {
  std::string store;
  int clients = 0;
  double seconds = 0;
  uint64_t ops = 0, errors = 0;
  double ops_per_s = 0;
  double put_p50_us = 0, put_p99_us = 0, get_p50_us = 0, get_p99_us = 0;
  double store_cpu_s = 0;
  double client_cpu_s = 0;  // this process: the clients' own cost
};

struct ClientResult {
  std::vector<double> put_us, get_us;
  uint64_t errors = 0;
  std::string first_error;  // reported on stderr

  void Fail(const Status& st) {
    if (errors++ == 0) first_error = st.ToString();
  }
};

double Percentile(std::vector<double>* v, int pct) {
  if (v->empty()) return 0;
  std::sort(v->begin(), v->end());
  return (*v)[std::min(v->size() - 1, v->size() * static_cast<size_t>(pct) / 100)];
}

double CpuOf(const std::vector<pid_t>& pids) {
  double s = 0;
  for (pid_t p : pids) s += SampleProc(p).cpu_s;
  return s;
}

// One client: opens its store, waits for the start, then publishes and
// locates until `stop`.
void Client(const std::string& url, int id, std::mutex* mu, std::condition_variable* cv,
            const bool* go, const std::atomic<bool>* stop, ClientResult* out) {
  KvsOptions o;
  o.secret = kStoreSecret;
  o.self_rank = static_cast<uint32_t>(id + 1);
  o.rpc_timeout_ms = 30000;
  Result<std::unique_ptr<Kvs>> kvs = OpenKvs(url, o);
  if (!kvs.ok()) {
    out->Fail(kvs.status());
    return;
  }
  // Connects before the clock starts.
  if (Result<std::optional<std::string>> w = (*kvs)->Get("scale", "warm-up"); !w.ok())
    out->Fail(w.status().Annotate("warm-up"));
  {
    std::unique_lock<std::mutex> lk(*mu);
    cv->wait(lk, [&] { return *go; });
  }
  FileRecord rec;
  rec.owner_rank = static_cast<uint32_t>(id);
  rec.owner_incarnation = 1;
  rec.size = 4096;
  for (uint64_t i = 0; !stop->load(std::memory_order_relaxed); ++i) {
    rec.upath = "c" + std::to_string(id) + "/f" + std::to_string(i) + ".dat";
    rec.version = i;
    rec.published_ns = WallNs();
    const std::string key = GenPathKey(rec.upath, 3, 1024);
    const auto t0 = SteadyClock::now();
    const Status put = (*kvs)->Put("scale", key, rec.Encode());
    const auto t1 = SteadyClock::now();
    Result<std::optional<std::string>> got = (*kvs)->Get("scale", key);
    const auto t2 = SteadyClock::now();
    if (!put.ok()) {
      out->Fail(put.Annotate("put"));
    } else if (!got.ok()) {
      out->Fail(got.status().Annotate("get"));
    } else if (!got->has_value()) {
      out->Fail(Status(DYAD_RC_NOTFOUND, "get: the key just put is missing"));
    }
    out->put_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    out->get_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
  }
}

Row Measure(const std::string& store, const std::string& url, const std::vector<pid_t>& pids,
            int clients, double seconds) {
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  std::atomic<bool> stop{false};
  std::vector<ClientResult> results(static_cast<size_t>(clients));
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back(Client, url, c, &mu, &cv, &go, &stop, &results[static_cast<size_t>(c)]);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // all connected
  const double cpu0 = CpuOf(pids);
  const double client_cpu0 = CpuOf({::getpid()});
  const auto start = SteadyClock::now();
  {
    std::lock_guard<std::mutex> lk(mu);
    go = true;
  }
  cv.notify_all();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  for (std::thread& t : threads) t.join();
  Row row;
  row.store = store;
  row.clients = clients;
  row.seconds = std::chrono::duration<double>(SteadyClock::now() - start).count();
  row.store_cpu_s = CpuOf(pids) - cpu0;
  row.client_cpu_s = CpuOf({::getpid()}) - client_cpu0;
  std::vector<double> puts, gets;
  for (ClientResult& r : results) {
    if (r.errors != 0 && row.errors == 0)
      std::fprintf(stderr, "%s: %llu errors, first: %s\n", store.c_str(),
                   static_cast<unsigned long long>(r.errors), r.first_error.c_str());
    row.errors += r.errors;
    puts.insert(puts.end(), r.put_us.begin(), r.put_us.end());
    gets.insert(gets.end(), r.get_us.begin(), r.get_us.end());
  }
  row.ops = puts.size() + gets.size();
  row.ops_per_s = row.ops / row.seconds;
  row.put_p50_us = Percentile(&puts, 50);
  row.put_p99_us = Percentile(&puts, 99);
  row.get_p50_us = Percentile(&gets, 50);
  row.get_p99_us = Percentile(&gets, 99);
  return row;
}

void Print(const std::vector<Row>& rows, bool json) {
  if (json) {
    std::printf("{\"benchmark\":\"metadata-scale\",\"results\":[");
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      std::printf(
          "%s{\"store\":\"%s\",\"clients\":%d,\"seconds\":%.2f,\"ops\":%llu,\"errors\":%llu,"
          "\"ops_per_s\":%.0f,\"put_p50_us\":%.1f,\"put_p99_us\":%.1f,\"get_p50_us\":%.1f,"
          "\"get_p99_us\":%.1f,\"store_cpu_s\":%.2f,\"ops_per_store_cpu_s\":%.0f,"
          "\"client_cpu_s\":%.2f}",
          i ? "," : "", r.store.c_str(), r.clients, r.seconds,
          static_cast<unsigned long long>(r.ops), static_cast<unsigned long long>(r.errors),
          r.ops_per_s, r.put_p50_us, r.put_p99_us, r.get_p50_us, r.get_p99_us, r.store_cpu_s,
          r.store_cpu_s > 0 ? r.ops / r.store_cpu_s : 0, r.client_cpu_s);
    }
    std::printf("]}\n");
    return;
  }
  std::printf("%-15s %7s %9s %9s %9s %9s %9s %9s %9s %11s %10s %6s\n", "store", "clients", "ops",
              "ops/s", "put p50", "put p99", "get p50", "get p99", "store cpu", "ops/cpu-s",
              "client cpu", "errors");
  for (const Row& r : rows) {
    std::printf("%-15s %7d %9llu %9.0f %8.0fu %8.0fu %8.0fu %8.0fu %8.2fs %11.0f %9.2fs %6llu\n",
                r.store.c_str(), r.clients, static_cast<unsigned long long>(r.ops), r.ops_per_s,
                r.put_p50_us, r.put_p99_us, r.get_p50_us, r.get_p99_us, r.store_cpu_s,
                r.store_cpu_s > 0 ? r.ops / r.store_cpu_s : 0, r.client_cpu_s,
                static_cast<unsigned long long>(r.errors));
  }
}

bool Wanted(const std::string& list, const std::string& name) {
  return ("," + list + ",").find("," + name + ",") != std::string::npos;
}

int Run(int argc, char** argv) {
  uint64_t clients = 64;
  double seconds = 3;
  std::string stores = "embedded,redis,redis-cluster";
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    uint64_t v = 0;
    if (a == "--clients" && i + 1 < argc && ParseU64(argv[i + 1], &clients) && clients > 0) {
      ++i;
    } else if (a == "--seconds" && i + 1 < argc && ParseU64(argv[i + 1], &v) && v > 0) {
      seconds = static_cast<double>(v);
      ++i;
    } else if (a == "--stores" && i + 1 < argc) {
      stores = argv[++i];
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--clients N] [--seconds S] [--stores embedded,redis,redis-cluster] "
                   "[--json]\n",
                   argv[0]);
      return 2;
    }
  }
  RaiseFdLimit();
  char tmpl[] = "/tmp/dyad-bench-mdscale.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  std::unique_ptr<EmbeddedRootProcess> root;  // forked before any thread
  std::string error;
  if (Wanted(stores, "embedded")) {
    root = EmbeddedRootProcess::Fork(dir, &error);
    if (!root) std::fprintf(stderr, "embedded root: %s\n", error.c_str());
  }
  std::vector<Row> rows;
  const int n = static_cast<int>(clients);
  if (root) rows.push_back(Measure("embedded", root->url(), {root->pid()}, n, seconds));
  root.reset();
#ifdef DYAD_HAVE_REDIS
  if (Wanted(stores, "redis")) {
    emu::RedisServer redis;
    if (redis.available() && redis.Start().empty())
      rows.push_back(Measure("redis", redis.url(), {redis.pid()}, n, seconds));
  }
  if (Wanted(stores, "redis-cluster")) {
    emu::RedisCluster cluster;
    if (cluster.available() && cluster.Start().empty()) {
      std::vector<pid_t> pids;
      for (size_t i = 0; i < cluster.size(); ++i) pids.push_back(cluster.node(i).pid());
      rows.push_back(Measure("redis-cluster/3", cluster.url(), pids, n, seconds));
    }
  }
#endif
  if (::system(("rm -rf '" + dir + "'").c_str()) != 0)
    std::fprintf(stderr, "could not remove %s\n", dir.c_str());
  if (!json) {
    std::printf(
        "dyad-metadata-scale: %d clients (one Kvs each, as %d services), %.0f s per store, "
        "put + get of FileRecords; loopback, %u cores shared by clients and store\n",
        n, n, seconds, std::thread::hardware_concurrency());
  }
  Print(rows, json);
  for (const Row& r : rows)
    if (r.errors != 0) return 1;
  return rows.empty() ? 1 : 0;
}

}  // namespace
}  // namespace dyad::bench

int main(int argc, char** argv) { return dyad::bench::Run(argc, argv); }
