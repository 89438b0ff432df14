// dyad-scale: DYAD on 2 to 64 emulated nodes, against raw TCP between the
// same network namespaces, in one run (docs/scale.md).
//
// For each node count N (--nodes, default 2,8,32,64) one emulated cluster
// (a namespace per node on one bridge, one dyad-service each, the embedded
// root on node 0) runs two patterns, each first through DYAD and then
// through a raw TCP baseline (a small file server per node in this
// program; no DYAD at all):
//   all-to-all  every node publishes M files (--files) of --size bytes;
//               every node consumes the files of its K next nodes (--peers),
//               its consumer started before any producer. Aggregate files/s
//               (first write to last verified read), p50/p99 latency from
//               the producer closing a file (its publish call starting) to
//               the consumer's consume returning, and the root's metadata
//               operations per second (its requests.kvs counter).
//   fan-out     node 1 publishes one file of --fanout-mib MiB that every
//               other node consumes at once (an epoch start): aggregate MB/s
//               and the bytes node 1's service sent (bytes.out).
// Every received byte is verified against the deterministic pattern of its
// name. Also per N: cluster start-up seconds and the services' total RSS.
// A figure printer, never a pass/fail test (exit 1 only on a wrong byte or
// a failed consume).
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
#include "dyad/client/dyad_client.hpp"
#include "emu/netns.h"
#include "emu/pattern.h"
#include "emu/worker.h"
#include "scale_raw.h"

namespace dyad::bench {
namespace {

struct Args {
  std::vector<uint64_t> nodes = {2, 8, 32, 64};
  uint64_t files = 50;  // per producer
  uint64_t peers = 4;   // producers each consumer reads
  uint64_t size = 4096;
  uint64_t fanout_mib = 256;
  uint64_t workers = 2;  // per service pool
  std::string patterns = "all-to-all,fan-out";
  ClusterArgs cl;
};

void Usage() {
  std::printf(
      "usage: dyad-scale [--nodes 2,8,32,64] [--files M] [--peers K] [--size BYTES]\n"
      "                  [--fanout-mib MIB] [--workers W] [--patterns all-to-all,fan-out]\n"
      "                  [--quick] [--json] [--tmp DIR] [--mode MODE] [--loopback]\n"
      "All-to-all small files and a one-to-all fan-out on N emulated nodes, through DYAD\n"
      "and through raw TCP between the same namespaces (defaults: 50 files of 4096 bytes\n"
      "per node, 4 peers, a 256 MiB fan-out, 2 workers per service pool). --quick:\n"
      "nodes 2,8,32, 20 files, 16 MiB fan-out. --loopback: no namespaces, and so no raw\n"
      "baseline. Node directories under --tmp (default $TMPDIR or /tmp; /dev/shm advised).\n");
}

uint64_t NowNs() {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(SteadyClock::now().time_since_epoch())
          .count());
}
std::string FileName(int producer, uint64_t m) {
  return "n" + std::to_string(producer) + "/f" + std::to_string(m) + ".dat";
}

// --- shared pieces ---------------------------------------------------------------

// When each producer closed each file (its publish starting); the raw
// consumers also wait here, as they have no publication to wait for.
class Board {
 public:
  Board(int nodes, uint64_t files)
      : files_(files), closed_ns_(static_cast<size_t>(nodes) * files), count_(nodes) {}
  // File m of producer p is complete (its publication starts now).
  void Closed(int p, uint64_t m) { closed_ns_[Index(p, m)] = NowNs(); }
  // ... and published: raw consumers waiting for it may fetch it.
  void Published(int p, uint64_t m) {
    std::lock_guard<std::mutex> l(mu_);
    count_[p] = m + 1;
    cv_.notify_all();
  }
  bool WaitPublished(int p, uint64_t m, Deadline d) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_until(l, d.time_point(), [&] { return count_[p] > m; });
  }
  uint64_t closed_ns(int p, uint64_t m) const { return closed_ns_[Index(p, m)].load(); }

 private:
  size_t Index(int p, uint64_t m) const { return static_cast<size_t>(p) * files_ + m; }
  uint64_t files_;
  std::vector<std::atomic<uint64_t>> closed_ns_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> count_;
};

Result<client::Client> NodeClient(const emu::EmuCluster& c, int i) {
  client::Options o;
  o.producer_path = c.node(i).dmd;
  o.consumer_path = c.node(i).dmd;
  o.service_socket = c.node(i).socket;
  o.kvs_namespace = c.options().kvs_namespace;
  o.consume_timeout_ms = 120000;
  client::Client out;
  const client::Status st = client::Client::Create(o, &out);
  if (!st.ok()) return Status(st.code(), st.message());
  return out;
}

Status WriteFile(const std::string& dir, const std::string& rel, uint64_t size) {
  const std::string path = dir + "/" + rel;
  const std::string parent = path.substr(0, path.rfind('/'));
  ::mkdir(parent.substr(0, parent.rfind('/')).c_str(), 0755);
  ::mkdir(parent.c_str(), 0755);
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return StatusFromErrno(errno, "create " + path);
  return emu::WritePattern(fd.get(), emu::PatternSeed(rel), size);
}

struct Figures {
  double files_per_s = 0, p50_ms = 0, p99_ms = 0, root_ops_per_s = 0, seconds = 0;
  uint64_t files = 0, failures = 0;
};

struct Fanout {
  double mb_per_s = 0, seconds = 0;
  uint64_t producer_bytes_out = 0, failures = 0;
};

struct Row {
  int nodes = 0;
  double start_s = 0, rss_mib = 0;
  Figures dyad, raw;
  Fanout fan_dyad, fan_raw;
};

uint64_t CounterOr0(emu::EmuCluster& c, int i, const char* name) {
  Result<uint64_t> v = c.Counter(i, name);
  return v.ok() ? *v : 0;
}

Status FromClient(const client::Status& st) {
  return st.ok() ? Status::OK() : Status(st.code(), st.message());
}

// Producer i's publication of file m (`rel`): writes it, marks it closed on
// the board, publishes it.
using PublishFn = std::function<Status(int node, uint64_t m, const std::string& rel)>;
// Node j takes file `rel` (the m-th) of producer p and verifies it.
using ConsumeFn = std::function<Status(int node, int p, uint64_t m, const std::string& rel)>;

// Keeps the latest of the stamps it is given.
void StoreMax(std::atomic<uint64_t>* v, uint64_t x) {
  uint64_t prev = v->load();
  while (x > prev && !v->compare_exchange_weak(prev, x)) {
  }
}

// Runs all-to-all: consumers first (each takes its peers' files in
// publication order), then producers; every file verified by the consumer.
Figures AllToAll(int n, const Args& a, Board* board, const PublishFn& publish,
                 const ConsumeFn& consume) {
  const int k = static_cast<int>(std::min<uint64_t>(a.peers, static_cast<uint64_t>(n - 1)));
  std::vector<std::vector<double>> lat(static_cast<size_t>(n));
  std::atomic<uint64_t> failures{0}, last_ns{0};
  auto fail = [&](const char* what, int node, const Status& st) {
    if (failures.fetch_add(1) == 0)
      std::fprintf(stderr, "dyad-scale: %s on node %d: %s\n", what, node, st.ToString().c_str());
  };
  const uint64_t t0 = NowNs();
  std::vector<std::thread> threads;
  for (int j = 0; j < n; ++j) {
    threads.emplace_back([&, j] {
      for (uint64_t m = 0; m < a.files; ++m) {
        for (int d = 1; d <= k; ++d) {
          const int p = (j + d) % n;
          const uint64_t start = NowNs();
          Status st = consume(j, p, m, FileName(p, m));
          const uint64_t end = NowNs();
          if (!st.ok()) {
            fail("consume", j, st);
            continue;
          }
          const uint64_t from = std::max(start, board->closed_ns(p, m));
          lat[static_cast<size_t>(j)].push_back(static_cast<double>(end - from) / 1e6);
          StoreMax(&last_ns, end);
        }
      }
    });
  }
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      for (uint64_t m = 0; m < a.files; ++m) {
        Status st = publish(i, m, FileName(i, m));
        board->Published(i, m);  // also on failure: raw consumers must not wait for it
        if (!st.ok()) fail("publish", i, st);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  Figures f;
  std::vector<double> all;
  for (const auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  f.files = all.size();
  f.failures = failures.load();
  f.seconds = last_ns.load() > t0 ? static_cast<double>(last_ns.load() - t0) / 1e9 : 0;
  f.files_per_s = f.seconds > 0 ? static_cast<double>(f.files) / f.seconds : 0;
  f.p50_ms = emu::Percentile(all, 50);
  f.p99_ms = emu::Percentile(all, 99);
  return f;
}

Result<std::vector<client::Client>> Clients(const emu::EmuCluster& c) {
  std::vector<client::Client> out;
  for (int i = 0; i < c.size(); ++i) {
    auto cl = NodeClient(c, i);
    if (!cl.ok()) return cl.status();
    out.push_back(*cl);
  }
  return out;
}

Figures DyadAllToAll(emu::EmuCluster& c, const Args& a) {
  const int n = c.size();
  auto clients = Clients(c);
  Figures failed;
  failed.failures = 1;
  if (!clients.ok()) return failed;
  Board board(n, a.files);
  auto publish = [&](int i, uint64_t m, const std::string& rel) -> Status {
    DYAD_RETURN_IF_ERROR(WriteFile(c.node(i).dmd, rel, a.size));
    board.Closed(i, m);
    return FromClient((*clients)[static_cast<size_t>(i)].Produce(c.node(i).dmd + "/" + rel));
  };
  auto consume = [&](int j, int, uint64_t, const std::string& rel) -> Status {
    const std::string path = c.node(j).dmd + "/" + rel;
    DYAD_RETURN_IF_ERROR(FromClient((*clients)[static_cast<size_t>(j)].Consume(path)));
    return emu::VerifyPatternFile(path, emu::PatternSeed(rel), static_cast<int64_t>(a.size));
  };
  const uint64_t kvs0 = CounterOr0(c, 0, "requests.kvs");
  Figures f = AllToAll(n, a, &board, publish, consume);
  const uint64_t kvs1 = CounterOr0(c, 0, "requests.kvs");
  f.root_ops_per_s = f.seconds > 0 ? static_cast<double>(kvs1 - kvs0) / f.seconds : 0;
  return f;
}

Figures RawAllToAll(emu::EmuCluster& c, const Args& a) {
  const int n = c.size();
  const int k = static_cast<int>(std::min<uint64_t>(a.peers, static_cast<uint64_t>(n - 1)));
  std::vector<std::pair<int, int>> pairs;
  for (int j = 0; j < n; ++j)
    for (int d = 1; d <= k; ++d) pairs.emplace_back(j, (j + d) % n);
  RawMesh mesh;
  Figures failed;
  failed.failures = 1;
  if (Status st = BuildMesh(c, pairs, &mesh); !st.ok()) {
    std::fprintf(stderr, "dyad-scale: raw mesh: %s\n", st.ToString().c_str());
    return failed;
  }
  Board board(n, a.files);
  auto publish = [&](int i, uint64_t m, const std::string& rel) -> Status {
    DYAD_RETURN_IF_ERROR(WriteFile(c.node(i).dmd + "/raw", rel, a.size));
    board.Closed(i, m);
    return Status::OK();
  };
  auto consume = [&](int j, int p, uint64_t m, const std::string& rel) -> Status {
    if (!board.WaitPublished(p, m, Deadline::AfterMs(120000)))
      return Status(DYAD_RC_TIMEOUT, "raw: " + rel + " not written within 120 s");
    const std::string dest = c.node(j).dmd + "/rawin/" + rel;
    const std::string parent = dest.substr(0, dest.rfind('/'));
    ::mkdir((c.node(j).dmd + "/rawin").c_str(), 0755);
    ::mkdir(parent.c_str(), 0755);
    DYAD_RETURN_IF_ERROR(RawFetch(mesh.conns[j][p].get(), rel, dest));
    return emu::VerifyPatternFile(dest, emu::PatternSeed(rel), static_cast<int64_t>(a.size));
  };
  return AllToAll(n, a, &board, publish, consume);
}

constexpr int kFanProducer = 1;
const char* const kFanFile = "fan/epoch.dat";

// Starts `fetch(j)` for every node but the producer, lets them all reach
// their wait, then calls `start()`; returns seconds from `start()` to the
// last fetch's end.
double FanOut(int n, const std::function<void()>& start, const std::function<Status(int)>& fetch,
              uint64_t* failures) {
  std::atomic<uint64_t> last_ns{0};
  std::vector<std::thread> threads;
  std::atomic<int> failed{0};
  for (int j = 0; j < n; ++j) {
    if (j == kFanProducer) continue;
    threads.emplace_back([&, j] {
      Status st = fetch(j);
      StoreMax(&last_ns, NowNs());
      if (!st.ok() && failed.fetch_add(1) == 0)
        std::fprintf(stderr, "dyad-scale: fan-out to node %d: %s\n", j, st.ToString().c_str());
    });
  }
  // Consumers wait for the publication (DYAD) or the start signal (raw).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const uint64_t t0 = NowNs();
  start();
  for (std::thread& t : threads) t.join();
  *failures += static_cast<uint64_t>(failed.load());
  return last_ns.load() > t0 ? static_cast<double>(last_ns.load() - t0) / 1e9 : 0;
}

// Verifies every node's copy (all bytes, after the clock) and removes it.
void VerifyCopies(emu::EmuCluster& c, const std::string& sub, uint64_t size, uint64_t* failures) {
  for (int j = 0; j < c.size(); ++j) {
    if (j == kFanProducer) continue;
    const std::string path = c.node(j).dmd + sub + "/" + kFanFile;
    Status st =
        emu::VerifyPatternFile(path, emu::PatternSeed(kFanFile), static_cast<int64_t>(size));
    if (!st.ok()) {
      ++*failures;
      std::fprintf(stderr, "dyad-scale: fan-out copy on node %d: %s\n", j, st.ToString().c_str());
    }
    ::unlink(path.c_str());
  }
}

Fanout DyadFanOut(emu::EmuCluster& c, uint64_t size) {
  Fanout f;
  auto clients = Clients(c);
  if (!clients.ok() || !WriteFile(c.node(kFanProducer).dmd, kFanFile, size).ok()) {
    f.failures = 1;
    return f;
  }
  const uint64_t out0 = CounterOr0(c, kFanProducer, "bytes.out");
  auto start = [&] {
    const client::Status st =
        (*clients)[kFanProducer].Produce(c.node(kFanProducer).dmd + "/" + kFanFile);
    if (!st.ok()) std::fprintf(stderr, "dyad-scale: fan-out publish: %s\n", st.ToString().c_str());
  };
  auto fetch = [&](int j) {
    return FromClient((*clients)[static_cast<size_t>(j)].Consume(c.node(j).dmd + "/" + kFanFile));
  };
  f.seconds = FanOut(c.size(), start, fetch, &f.failures);
  f.producer_bytes_out = CounterOr0(c, kFanProducer, "bytes.out") - out0;
  f.mb_per_s = f.seconds > 0 ? static_cast<double>(size) * (c.size() - 1) / 1e6 / f.seconds : 0;
  VerifyCopies(c, "", size, &f.failures);
  ::unlink((c.node(kFanProducer).dmd + "/" + kFanFile).c_str());
  return f;
}

Fanout RawFanOut(emu::EmuCluster& c, uint64_t size) {
  Fanout f;
  std::vector<std::pair<int, int>> pairs;
  for (int j = 0; j < c.size(); ++j)
    if (j != kFanProducer) pairs.emplace_back(j, kFanProducer);
  RawMesh mesh;
  Status st = BuildMesh(c, pairs, &mesh);
  if (!st.ok() || !WriteFile(c.node(kFanProducer).dmd + "/raw", kFanFile, size).ok()) {
    std::fprintf(stderr, "dyad-scale: raw fan-out: %s\n", st.ToString().c_str());
    f.failures = 1;
    return f;
  }
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  auto start = [&] {
    std::lock_guard<std::mutex> l(mu);
    go = true;
    cv.notify_all();
  };
  auto fetch = [&](int j) -> Status {
    {
      std::unique_lock<std::mutex> l(mu);
      if (!cv.wait_for(l, std::chrono::seconds(60), [&] { return go; }))
        return Status(DYAD_RC_TIMEOUT, "raw fan-out never started");
    }
    const std::string dest = c.node(j).dmd + "/rawin/" + kFanFile;
    ::mkdir((c.node(j).dmd + "/rawin").c_str(), 0755);
    ::mkdir((c.node(j).dmd + "/rawin/fan").c_str(), 0755);
    return RawFetch(mesh.conns[j][kFanProducer].get(), kFanFile, dest);
  };
  f.seconds = FanOut(c.size(), start, fetch, &f.failures);
  f.producer_bytes_out = size * static_cast<uint64_t>(c.size() - 1);
  f.mb_per_s = f.seconds > 0 ? static_cast<double>(size) * (c.size() - 1) / 1e6 / f.seconds : 0;
  VerifyCopies(c, "/rawin", size, &f.failures);
  ::unlink((c.node(kFanProducer).dmd + "/raw/" + kFanFile).c_str());
  return f;
}

bool Wants(const Args& a, const char* pattern) {
  return ("," + a.patterns + ",").find(std::string(",") + pattern + ",") != std::string::npos;
}

// Where a run is (stderr, so that --json output stays clean).
void Progress(int n, const char* what, uint64_t t0) {
  std::fprintf(stderr, "dyad-scale: %d nodes: %s (%.1f s)\n", n, what,
               static_cast<double>(NowNs() - t0) / 1e9);
}

// One node count: start, measure the idle services, run the patterns.
bool RunNodes(int n, const Args& a, Row* row) {
  emu::ClusterOptions o;
  o.bin_dir = DYAD_BUILD_BIN_DIR;
  o.use_netns = !a.cl.loopback;
  o.tmp_parent = a.cl.tmp;
  o.mode = a.cl.mode;
  o.ready_timeout_ms = 60000;
  o.extra_service_args = {"--workers", std::to_string(a.workers)};
  const uint64_t t0 = NowNs();
  auto started = emu::EmuCluster::Start(n, o);
  if (!started.ok()) {
    std::fprintf(stderr, "dyad-scale: %d nodes: %s\n", n, started.status().ToString().c_str());
    return false;
  }
  emu::EmuCluster& c = **started;
  if (!c.uses_netns())
    std::fprintf(stderr, "dyad-scale: no network namespaces (%s); the raw baseline needs them\n",
                 emu::NetnsUnavailableReason().c_str());
  row->nodes = n;
  row->start_s = static_cast<double>(NowNs() - t0) / 1e9;
  uint64_t rss_kib = 0;
  for (int i = 0; i < n; ++i) rss_kib += SampleProc(c.ServicePid(i)).rss_kib;
  row->rss_mib = static_cast<double>(rss_kib) / 1024;
  Progress(n, "started", t0);
  if (Wants(a, "all-to-all")) {
    row->dyad = DyadAllToAll(c, a);
    Progress(n, "all-to-all through DYAD", t0);
    if (c.uses_netns() && !emu::Interrupted()) row->raw = RawAllToAll(c, a);
    Progress(n, "all-to-all through raw TCP", t0);
  }
  if (Wants(a, "fan-out") && !emu::Interrupted()) {
    row->fan_dyad = DyadFanOut(c, a.fanout_mib << 20);
    Progress(n, "fan-out through DYAD", t0);
    if (c.uses_netns() && !emu::Interrupted()) row->fan_raw = RawFanOut(c, a.fanout_mib << 20);
    Progress(n, "fan-out through raw TCP", t0);
  }
  c.Teardown();
  Progress(n, "torn down", t0);
  return true;
}

double Ratio(double x, double y) { return y > 0 ? x / y : 0; }

void PrintJson(const Args& a, const std::vector<Row>& rows) {
  std::printf(
      "{\"benchmark\":\"scale\",\"files\":%llu,\"peers\":%llu,\"size\":%llu,"
      "\"fanout_bytes\":%llu,\"workers\":%llu,\"results\":[",
      static_cast<unsigned long long>(a.files), static_cast<unsigned long long>(a.peers),
      static_cast<unsigned long long>(a.size), static_cast<unsigned long long>(a.fanout_mib << 20),
      static_cast<unsigned long long>(a.workers));
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    std::printf(
        "%s{\"nodes\":%d,\"start_s\":%.2f,\"services_rss_mib\":%.1f,"
        "\"a2a_files\":%llu,\"a2a_files_per_s\":%.0f,\"a2a_p50_ms\":%.3f,\"a2a_p99_ms\":%.3f,"
        "\"root_ops_per_s\":%.0f,\"raw_files_per_s\":%.0f,\"raw_p50_ms\":%.3f,"
        "\"raw_p99_ms\":%.3f,\"a2a_ratio\":%.3f,\"fan_mb_per_s\":%.1f,\"fan_raw_mb_per_s\":%.1f,"
        "\"fan_ratio\":%.3f,\"fan_producer_bytes_out\":%llu,\"failures\":%llu}",
        i ? "," : "", r.nodes, r.start_s, r.rss_mib, static_cast<unsigned long long>(r.dyad.files),
        r.dyad.files_per_s, r.dyad.p50_ms, r.dyad.p99_ms, r.dyad.root_ops_per_s, r.raw.files_per_s,
        r.raw.p50_ms, r.raw.p99_ms, Ratio(r.dyad.files_per_s, r.raw.files_per_s),
        r.fan_dyad.mb_per_s, r.fan_raw.mb_per_s, Ratio(r.fan_dyad.mb_per_s, r.fan_raw.mb_per_s),
        static_cast<unsigned long long>(r.fan_dyad.producer_bytes_out),
        static_cast<unsigned long long>(r.dyad.failures + r.raw.failures + r.fan_dyad.failures +
                                        r.fan_raw.failures));
  }
  std::printf("]}\n");
}

void PrintTable(const Args& a, const std::vector<Row>& rows) {
  std::printf(
      "dyad-scale: all-to-all %llu files x %llu B per node, %llu peers each; fan-out %llu MiB "
      "from node 1; --workers %llu; %u cores shared by every node\n",
      static_cast<unsigned long long>(a.files), static_cast<unsigned long long>(a.size),
      static_cast<unsigned long long>(a.peers), static_cast<unsigned long long>(a.fanout_mib),
      static_cast<unsigned long long>(a.workers), std::thread::hardware_concurrency());
  std::printf("%5s %7s %8s | %9s %8s %8s %9s %9s %6s | %8s %8s %6s %9s %5s\n", "nodes", "start",
              "rss", "files/s", "p50", "p99", "root op/s", "raw f/s", "ratio", "fan MB/s",
              "raw MB/s", "ratio", "prod sent", "fail");
  for (const Row& r : rows) {
    std::printf(
        "%5d %6.1fs %6.0fMi | %9.0f %6.2fms %6.2fms %9.0f %9.0f %6.2f | %8.0f %8.0f %6.2f %9s "
        "%5llu\n",
        r.nodes, r.start_s, r.rss_mib, r.dyad.files_per_s, r.dyad.p50_ms, r.dyad.p99_ms,
        r.dyad.root_ops_per_s, r.raw.files_per_s, Ratio(r.dyad.files_per_s, r.raw.files_per_s),
        r.fan_dyad.mb_per_s, r.fan_raw.mb_per_s, Ratio(r.fan_dyad.mb_per_s, r.fan_raw.mb_per_s),
        HumanBytes(r.fan_dyad.producer_bytes_out).c_str(),
        static_cast<unsigned long long>(r.dyad.failures + r.raw.failures + r.fan_dyad.failures +
                                        r.fan_raw.failures));
  }
}

int Run(int argc, char** argv) {
  Args a;
  auto take = [&](const std::string& s, const NextArg& next) -> OptionResult {
    if (s == "--nodes") {
      const char* v = next();
      if (!ParseU64List(v, &a.nodes)) return OptionResult::kBad;
      for (uint64_t n : a.nodes)
        if (n < 2 || n > 200) return OptionResult::kBad;
      return OptionResult::kTaken;
    }
    if (s == "--files") return TakeU64(next, &a.files, 1, 1000000);
    if (s == "--peers") return TakeU64(next, &a.peers, 1, 1000);
    if (s == "--size") return TakeU64(next, &a.size, 0, 1ull << 30);
    if (s == "--fanout-mib") return TakeU64(next, &a.fanout_mib, 1, 1ull << 20);
    if (s == "--workers") return TakeU64(next, &a.workers, 1, 1024);
    if (s == "--patterns") return TakeString(next, &a.patterns);
    if (s == "--quick") {
      a.nodes = {2, 8, 32};
      a.files = 20;
      a.fanout_mib = 16;
      return OptionResult::kTaken;
    }
    return OptionResult::kNotMine;
  };
  if (int rc = ParseArgs(argc, argv, "dyad-scale", Usage, &a.cl, take); rc >= 0) return rc;
  emu::InstallSignalTeardown();
  RaiseFdLimit();
  std::vector<Row> rows;
  bool ok = true;
  for (uint64_t n : a.nodes) {
    if (emu::Interrupted()) break;
    Row row;
    if (!RunNodes(static_cast<int>(n), a, &row)) {
      ok = false;
      continue;
    }
    rows.push_back(row);
  }
  if (a.cl.json)
    PrintJson(a, rows);
  else
    PrintTable(a, rows);
  for (const Row& r : rows)
    if (r.dyad.failures + r.raw.failures + r.fan_dyad.failures + r.fan_raw.failures) ok = false;
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace dyad::bench

int main(int argc, char** argv) { return dyad::bench::Run(argc, argv); }
