// dyad-small-files: many small files between two emulated nodes.
//
// Three phases, each with fresh file names, over the same two nodes:
//   publish    a producer on node A writes --count files of --size bytes and
//              publishes each synchronously (dyad_produce): files/s of the
//              publish calls alone, and of write+publish;
//   after      a consumer on node B, started once the producer has finished,
//              consumes every file: files/s from its first call to its last
//              return, p50/p99 of one dyad_consume call, and what one
//              consume cost each process (CPU us, context switches: the
//              consumer's getrusage, the services' /proc before and after);
//   streaming  the consumer starts first and waits; the producer then writes
//              and publishes: end-to-end files/s (producer's first write to
//              the consumer's last return) and p50/p99 latency from a
//              publish returning on A to the consume of that file returning
//              on B (the consumer takes files in order, so a consumer slower
//              than the producer shows up as growing latency).
//   chain      the baseline of "after": the same files fetched by a minimal
//              blocking-socket chain of the same two round trips plus the
//              same file creation (chain_baseline.h), on the same nodes;
//              files/s and the ratio after / chain (target >= 0.5);
//   async      on node A alone, in one run and alternated --async-reps times
//              (medians): the same write+close loop of --count files with no
//              DYAD call ("plain"), with dyad_produce and DYAD_ASYNC_PUBLISH=1,
//              and with synchronous dyad_produce; files/s of each loop (first
//              write to last return, the same per-file bookkeeping in each),
//              the ratio async/plain (target >= 0.5) and how long the async
//              producer's dyad_finalize waited for the last confirmations.
// --phases LIST (publish,after,chain,parallel,streaming,async; default all) picks
// phases (publish and after always run together; chain runs after them); --latencies FILE writes
// the streaming latencies and --call-latencies FILE the dyad_consume call times of the after phase
// (ms, one per line) for CDF plots. Every received file is verified after the timed loop. A figure
// printer, never a pass/fail test.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "chain_baseline.h"
#include "common/time.h"
#include "emu/cluster.h"
#include "emu/netns.h"
#include "emu/worker.h"

namespace dyad::bench {
namespace {

struct Args {
  uint64_t consumers = 4;  // parallel consumer processes in the "parallel" phase
  uint64_t count = 5000;
  uint64_t size = 4096;
  std::string phases = "publish,after,chain,parallel,streaming,async";
  uint64_t async_reps = 3;     // async phase: runs of each row, alternated
  std::string latencies;       // streaming latencies, ms per line
  std::string call_latencies;  // after phase: dyad_consume call times, ms per line
  ClusterArgs cl;
  bool Has(const char* phase) const { return phases.find(phase) != std::string::npos; }
};

void Usage() {
  std::printf(
      "usage: dyad-small-files [--count N] [--size BYTES] [--consumers N] [--mode MODE]\n"
      "                        [--loopback] [--tmp DIR] [--json] [--phases LIST]\n"
      "                        [--latencies FILE] [--call-latencies FILE] [--kvs URL]\n"
      "                        [--async-reps N]\n"
      "Publish rate, consume rate and latency for many small files between two emulated\n"
      "nodes (default 5000 files of 4096 bytes), and CPU time and context switches per\n"
      "consume of each process. --kvs: the services' metadata store\n"
      "(default: the embedded store hosted by the first node; flux:// inside `flux start`).\n");
}

std::vector<emu::ManifestEntry> Files(const std::string& dir, uint64_t count, uint64_t size) {
  std::vector<emu::ManifestEntry> v;
  v.reserve(count);
  char name[96];
  for (uint64_t i = 0; i < count; ++i) {
    // 100 files per directory, as simulations tend to write them.
    std::snprintf(name, sizeof name, "%s/d%03llu/f%06llu.dat", dir.c_str(),
                  static_cast<unsigned long long>(i / 100), static_cast<unsigned long long>(i));
    v.push_back({name, static_cast<int64_t>(size)});
  }
  return v;
}

// What one call cost one process, averaged over the calls of a phase.
struct ProcCost {
  bool ok = false;
  double cpu_us = 0;
  double switches = 0;     // context switches: voluntary + involuntary
  double involuntary = 0;  // ... of which preempted
};

// A consume's cost in each process of its chain: the consumer, the service
// that asks (node B), the service that owns the file (node A). For the
// chain baseline: its consumer, relay and owner.
struct Breakdown {
  ProcCost consumer, requester, owner;
  bool ok() const { return consumer.ok && requester.ok && owner.ok; }
  double cpu_us() const { return consumer.cpu_us + requester.cpu_us + owner.cpu_us; }
  double switches() const { return consumer.switches + requester.switches + owner.switches; }
};

ProcCost CostOf(const emu::LoopUsage& u, uint64_t calls) {
  ProcCost c;
  if (calls == 0) return c;
  const double n = static_cast<double>(calls);
  c.ok = true;
  c.cpu_us = static_cast<double>(u.cpu_us) / n;
  c.switches = static_cast<double>(u.voluntary + u.involuntary) / n;
  c.involuntary = static_cast<double>(u.involuntary) / n;
  return c;
}

ProcCost CostOfOutput(const std::string& output_file, uint64_t calls) {
  emu::LoopUsage u;
  return FindLoopUsage(ReadText(output_file), &u) ? CostOf(u, calls) : ProcCost{};
}

// A running service's CPU time and context switches, sampled from /proc
// before and after a phase.
class ServiceMeter {
 public:
  explicit ServiceMeter(pid_t pid) : pid_(pid), cpu_(SampleProc(pid)), sw_(SampleSwitches(pid)) {}
  ProcCost Cost(uint64_t calls) const {
    const ProcSample cpu = SampleProc(pid_);
    const SwitchSample sw = SampleSwitches(pid_);
    if (!cpu_.ok || !sw_.ok || !cpu.ok || !sw.ok) return {};
    emu::LoopUsage u;
    u.cpu_us = static_cast<int64_t>((cpu.cpu_s - cpu_.cpu_s) * 1e6);
    u.voluntary = static_cast<int64_t>(sw.voluntary - sw_.voluntary);
    u.involuntary = static_cast<int64_t>(sw.involuntary - sw_.involuntary);
    return CostOf(u, calls);
  }

 private:
  pid_t pid_;
  ProcSample cpu_;
  SwitchSample sw_;
};

struct Phase {
  double files_per_s = 0;
  double p50_ms = 0, p99_ms = 0;
  double aux_files_per_s = 0;  // publish phase: write+publish rate
  int failures = 0;
  Breakdown cost;  // after and chain: per consume
};

// The async phase: loop rates of the three rows (medians of the runs).
struct AsyncPhase {
  double plain_fps = 0, async_fps = 0, sync_fps = 0;
  double finalize_ms = 0;                      // the async producer's dyad_finalize (median)
  double async_call_us = 0, sync_call_us = 0;  // median dyad_produce call
  int failures = 0;
  bool ran = false;
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

class Runner {
 public:
  Runner(emu::EmuCluster& c, std::string dyad) : c_(c), dyad_(std::move(dyad)) {
    work_ = c_.base_dir() + "/bench";
    ::mkdir(work_.c_str(), 0755);
  }

  std::string Manifest(const std::vector<emu::ManifestEntry>& files) {
    const std::string m = work_ + "/m" + std::to_string(seq_++);
    (void)emu::WriteManifest(m, files);
    return m;
  }

  Result<emu::Process> Start(int node, const std::string& role, const std::string& manifest,
                             const std::vector<std::string>& flags,
                             const std::map<std::string, std::string>& env = {}) {
    std::vector<std::string> argv = {dyad_,
                                     "--role",
                                     role,
                                     "--manifest",
                                     manifest,
                                     "--result",
                                     manifest + "." + role,
                                     "--ready",
                                     manifest + "." + role + ".ready"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    return c_.SpawnOnNode(node, argv, env, manifest + "." + role + ".out");
  }

  Result<std::vector<emu::FileResult>> Finish(emu::Process& p, const std::string& manifest,
                                              const std::string& role, bool* success = nullptr) {
    auto st = p.Wait(Deadline::AfterMs(1800000));
    if (!st.ok()) return st.status();
    if (success != nullptr) *success = st->success();
    auto r = emu::ReadResults(manifest + "." + role);
    if (!r.ok()) return r.status();
    if (!st->success())
      std::fprintf(stderr, "%s worker: %s (see %s.%s.out)\n", role.c_str(), st->ToString().c_str(),
                   manifest.c_str(), role.c_str());
    return r;
  }

  // The `finalize_ns N` line a producer worker prints (0 when absent).
  static double FinalizeMs(const std::string& manifest) {
    FILE* f = std::fopen((manifest + ".produce.out").c_str(), "r");
    if (f == nullptr) return 0;
    char line[256];
    double ms = 0;
    unsigned long long ns = 0;
    while (std::fgets(line, sizeof line, f) != nullptr)
      if (std::sscanf(line, "finalize_ns %llu", &ns) == 1) ms = static_cast<double>(ns) / 1e6;
    std::fclose(f);
    return ms;
  }

  bool WaitReady(emu::Process& p, const std::string& manifest, const std::string& role) {
    return WaitForFile(manifest + "." + role + ".ready", p);
  }

 private:
  emu::EmuCluster& c_;
  std::string dyad_;
  std::string work_;
  int seq_ = 0;
};

// The chain baseline (chain_baseline.h): its owner on node A, its relay and
// consumer on node B, the copies under "chain/" of B's managed directory.
// False when a part did not start or the consumer did not report.
bool RunChain(emu::EmuCluster& c, const std::string& manifest, Phase* out) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return false;
  self[n] = 0;
  const std::string owner_ready = manifest + ".chain-owner";
  const std::string relay_ready = manifest + ".chain-relay";
  const std::string sock = c.node(1).run + "/chain.sock";
  const std::string chain_dir = c.node(1).dmd + "/chain";
  ::mkdir(chain_dir.c_str(), 0755);
  const std::string owner_out = manifest + ".chain-owner.out";
  const std::string relay_out = manifest + ".chain-relay.out";
  auto owner = c.SpawnOnNode(0, {self, "--chain-owner", c.node(0).dmd, c.node(0).ip, owner_ready},
                             {}, owner_out);
  if (!owner.ok() || !WaitForFile(owner_ready, *owner)) return false;
  const std::string port = ReadText(owner_ready);
  auto relay = c.SpawnOnNode(
      1, {self, "--chain-relay", chain_dir, c.node(0).ip, port, sock, relay_ready}, {}, relay_out);
  if (!relay.ok() || !WaitForFile(relay_ready, *relay)) return false;
  const std::string result = manifest + ".chain.out";
  auto cons = c.SpawnOnNode(1, {self, "--chain-consume", sock, manifest, chain_dir}, {}, result);
  if (!cons.ok()) return false;
  auto st = cons->Wait(Deadline::AfterMs(600000));
  (void)relay->Wait(Deadline::AfterMs(5000));
  (void)owner->Wait(Deadline::AfterMs(5000));
  const std::string text = ReadText(result);
  if (std::sscanf(text.c_str(), "chain %lf %lf %lf %d", &out->files_per_s, &out->p50_ms,
                  &out->p99_ms, &out->failures) != 4) {
    std::fprintf(stderr, "chain baseline: %s\n", text.c_str());
    return false;
  }
  const auto files = emu::ReadManifest(manifest);
  const uint64_t calls = files.ok() ? files->size() : 0;
  out->cost.consumer = CostOfOutput(result, calls);
  out->cost.requester = CostOfOutput(relay_out, calls);
  out->cost.owner = CostOfOutput(owner_out, calls);
  return st.ok() && st->success();
}

std::string CostJson(const ProcCost& c) {
  char b[160];
  std::snprintf(b, sizeof b, "{\"cpu_us\": %.1f, \"switches\": %.3f, \"involuntary\": %.3f}",
                c.ok ? c.cpu_us : 0.0, c.ok ? c.switches : 0.0, c.ok ? c.involuntary : 0.0);
  return b;
}

std::string BreakdownJson(const Breakdown& b) {
  return std::string("{\"ok\": ") + (b.ok() ? "true" : "false") +
         ", \"consumer\": " + CostJson(b.consumer) + ", \"requester\": " + CostJson(b.requester) +
         ", \"owner\": " + CostJson(b.owner) + ", \"cpu_us\": " + std::to_string(b.cpu_us()) +
         ", \"switches\": " + std::to_string(b.switches()) + "}";
}

void PrintBreakdownRow(const char* label, const Breakdown& b, const char* note) {
  auto cell = [](const ProcCost& c) {
    char t[32];
    if (c.ok) {
      std::snprintf(t, sizeof t, "%.0f / %.2f", c.cpu_us, c.switches);
    } else {
      std::snprintf(t, sizeof t, "-");
    }
    return std::string(t);
  };
  char total[32];
  std::snprintf(total, sizeof total, "%.0f / %.2f", b.cpu_us(), b.switches());
  std::printf("%-24s %14s %14s %14s %14s%s\n", label, cell(b.consumer).c_str(),
              cell(b.requester).c_str(), cell(b.owner).c_str(), b.ok() ? total : "-", note);
}

int Drive(const Args& a) {
  const std::string dyad = FindDemoProgram("dyad-small-files");
  if (dyad.empty()) return 2;
  auto cluster = StartBenchCluster("dyad-small-files", 2, a.cl);
  if (!cluster) return 1;
  emu::EmuCluster& c = *cluster;
  Runner run(c, dyad);
  if (!a.cl.json) {
    std::printf("dyad-small-files: %llu files of %s, link: %s\n",
                static_cast<unsigned long long>(a.count), emu::HumanBytes(a.size).c_str(),
                c.uses_netns() ? "veth pair between network namespaces" : "loopback");
    std::fflush(stdout);
  }

  // Phase 1 and 2: publish everything, then consume everything.
  Phase publish, after, parallel, streaming;
  const auto files1 = Files("after", a.count, a.size);
  const std::string m1 = run.Manifest(files1);
  const bool do_after = a.Has("publish") || a.Has("after") || a.Has("chain");
  if (do_after) {
    auto p = run.Start(0, "produce", m1, {});
    if (!p.ok()) return 1;
    auto r = run.Finish(*p, m1, "produce");
    if (!r.ok() || r->empty()) {
      std::fprintf(stderr, "producer: %s\n", r.ok() ? "no results" : r.status().ToString().c_str());
      return 1;
    }
    uint64_t call_sum = 0;
    for (const auto& x : *r) {
      call_sum += x.call_ns;
      if (x.rc != 0) ++publish.failures;
    }
    publish.files_per_s =
        call_sum ? static_cast<double>(r->size()) / (static_cast<double>(call_sum) / 1e9) : 0;
    publish.aux_files_per_s = Rate(r->size(), r->front().start_ns, r->back().end_ns);
    std::vector<double> lat;
    for (const auto& x : *r) lat.push_back(static_cast<double>(x.call_ns) / 1e6);
    publish.p50_ms = emu::Percentile(lat, 50);
    publish.p99_ms = emu::Percentile(lat, 99);
  }
  if (do_after) {
    const ServiceMeter owner(c.ServicePid(0)), requester(c.ServicePid(1));
    auto p = run.Start(1, "consume", m1, {"--no-metadata"});
    if (!p.ok()) return 1;
    auto r = run.Finish(*p, m1, "consume");
    if (!r.ok() || r->empty()) return 1;
    after.cost.owner = owner.Cost(r->size());
    after.cost.requester = requester.Cost(r->size());
    after.cost.consumer = CostOfOutput(m1 + ".consume.out", r->size());
    std::vector<double> lat;
    uint64_t first = UINT64_MAX, last = 0;
    for (const auto& x : *r) {
      lat.push_back(static_cast<double>(x.call_ns) / 1e6);
      first = std::min(first, x.start_ns);
      last = std::max(last, x.end_ns);
      if (x.rc != 0 || x.verified != 1) ++after.failures;
    }
    after.files_per_s = Rate(r->size(), first, last);
    after.p50_ms = emu::Percentile(lat, 50);
    after.p99_ms = emu::Percentile(lat, 99);
    WriteValues(a.call_latencies, lat);
  }

  // Phase 2a: the chain baseline over the same files, into another directory.
  Phase chain;
  if (a.Has("chain")) {
    if (!RunChain(c, m1, &chain)) ++chain.failures;
  }

  // Phase 2b: the same after-the-fact consumption by several consumer
  // processes at once (like data-loader workers), each taking every N-th file.
  if (a.Has("parallel")) {
    const auto files2 = Files("par", a.count, a.size);
    const std::string m2 = run.Manifest(files2);
    auto p = run.Start(0, "produce", m2, {});
    if (!p.ok()) return 1;
    auto pr = run.Finish(*p, m2, "produce");
    if (!pr.ok() || pr->empty()) return 1;
    std::vector<std::string> parts;
    std::vector<emu::Process> workers;
    for (uint64_t w = 0; w < a.consumers; ++w) {
      std::vector<emu::ManifestEntry> share;
      for (size_t i = w; i < files2.size(); i += a.consumers) share.push_back(files2[i]);
      parts.push_back(run.Manifest(share));
    }
    for (const auto& m : parts) {
      auto w = run.Start(1, "consume", m, {"--no-metadata"});
      if (!w.ok()) return 1;
      workers.push_back(std::move(*w));
    }
    std::vector<double> lat;
    uint64_t first = UINT64_MAX, last = 0, n = 0;
    for (size_t w = 0; w < workers.size(); ++w) {
      auto r = run.Finish(workers[w], parts[w], "consume");
      if (!r.ok() || r->empty()) return 1;
      for (const auto& x : *r) {
        ++n;
        lat.push_back(static_cast<double>(x.call_ns) / 1e6);
        first = std::min(first, x.start_ns);
        last = std::max(last, x.end_ns);
        if (x.rc != 0 || x.verified != 1) ++parallel.failures;
      }
    }
    parallel.files_per_s = Rate(n, first, last);
    parallel.p50_ms = emu::Percentile(lat, 50);
    parallel.p99_ms = emu::Percentile(lat, 99);
  }

  // Phase 3: consumer first, then the producer.
  const auto files3 = Files("stream", a.count, a.size);
  const std::string m3 = run.Manifest(files3);
  if (a.Has("streaming")) {
    auto cons = run.Start(1, "consume", m3, {"--no-metadata"});
    if (!cons.ok() || !run.WaitReady(*cons, m3, "consume")) return 1;
    auto prod = run.Start(0, "produce", m3, {});
    if (!prod.ok()) return 1;
    auto pr = run.Finish(*prod, m3, "produce");
    auto cr = run.Finish(*cons, m3, "consume");
    if (!pr.ok() || !cr.ok() || pr->empty() || cr->empty()) return 1;
    std::map<std::string, uint64_t> published;
    uint64_t first = UINT64_MAX, last = 0;
    for (const auto& x : *pr) {
      published[x.name] = x.end_ns;
      first = std::min(first, x.start_ns);
    }
    std::vector<double> lat;
    for (const auto& x : *cr) {
      last = std::max(last, x.end_ns);
      if (x.rc != 0 || x.verified != 1) ++streaming.failures;
      auto it = published.find(x.name);
      if (it != published.end() && x.end_ns >= it->second)
        lat.push_back(static_cast<double>(x.end_ns - it->second) / 1e6);
    }
    streaming.files_per_s = Rate(cr->size(), first, last);
    streaming.p50_ms = emu::Percentile(lat, 50);
    streaming.p99_ms = emu::Percentile(lat, 99);
    WriteValues(a.latencies, lat);
  }

  // Phase 4: asynchronous publication against a plain write+close.
  AsyncPhase async;
  if (a.Has("async")) {
    async.ran = true;
    std::vector<double> plain, asy, sync, fin, async_calls, sync_calls;
    const std::vector<std::string> deferred = {"--defer-results"};
    for (uint64_t rep = 0; rep < a.async_reps; ++rep) {
      struct Row {
        const char* tag;
        std::vector<std::string> flags;
        std::map<std::string, std::string> env;
        std::vector<double>* out;
      };
      const Row rows[] = {
          {"plain", {"--defer-results", "--no-publish"}, {}, &plain},
          {"async", deferred, {{"DYAD_ASYNC_PUBLISH", "1"}}, &asy},
          {"sync", deferred, {{"DYAD_ASYNC_PUBLISH", "0"}}, &sync},
      };
      for (const Row& row : rows) {
        const auto files =
            Files(std::string("async-") + row.tag + std::to_string(rep), a.count, a.size);
        const std::string m = run.Manifest(files);
        auto p = run.Start(0, "produce", m, row.flags, row.env);
        if (!p.ok()) return 1;
        bool success = false;
        auto r = run.Finish(*p, m, "produce", &success);
        if (!r.ok() || r->empty()) {
          ++async.failures;
          continue;
        }
        uint64_t first = UINT64_MAX, last = 0;
        for (const auto& x : *r) {
          first = std::min(first, x.start_ns);
          last = std::max(last, x.end_ns);
          if (x.rc != 0) ++async.failures;
        }
        if (!success || r->size() != files.size()) ++async.failures;
        row.out->push_back(Rate(r->size(), first, last));
        for (const auto& x : *r) {
          if (row.out == &asy) async_calls.push_back(static_cast<double>(x.call_ns) / 1e3);
          if (row.out == &sync) sync_calls.push_back(static_cast<double>(x.call_ns) / 1e3);
        }
        if (row.out == &asy) fin.push_back(Runner::FinalizeMs(m));
      }
    }
    async.plain_fps = Median(plain);
    async.async_fps = Median(asy);
    async.sync_fps = Median(sync);
    async.finalize_ms = Median(fin);
    async.async_call_us = Median(async_calls);
    async.sync_call_us = Median(sync_calls);
  }

  auto b = c.ServiceStatus(1);
  const unsigned long long transfers = b.ok() ? b->counters["transfers.in"] : 0;
  if (a.cl.json) {
    std::printf(
        "{\"bench\": \"small_files\", \"count\": %llu, \"size\": %llu, \"link\": \"%s\",\n"
        " \"publish\": {\"files_per_s\": %.1f, \"write_and_publish_files_per_s\": %.1f, "
        "\"p50_ms\": %.4f, "
        "\"p99_ms\": %.4f, \"failures\": %d},\n"
        " \"consume_after\": {\"files_per_s\": %.1f, \"p50_ms\": %.4f, \"p99_ms\": %.4f, "
        "\"failures\": %d},\n"
        " \"consume_after_cost\": %s,\n"
        " \"chain\": {\"ran\": %s, \"files_per_s\": %.1f, \"p50_ms\": %.4f, \"p99_ms\": %.4f, "
        "\"failures\": %d, \"ratio_after_chain\": %.4f, \"cost\": %s},\n"
        " \"consume_parallel\": {\"consumers\": %llu, \"files_per_s\": %.1f, \"p50_ms\": %.4f, "
        "\"p99_ms\": %.4f, \"failures\": %d},\n"
        " \"streaming\": {\"files_per_s\": %.1f, \"latency_p50_ms\": %.4f, \"latency_p99_ms\": "
        "%.4f, "
        "\"failures\": %d},\n"
        " \"async_publish\": {\"ran\": %s, \"count\": %llu, \"plain_files_per_s\": %.1f, "
        "\"async_files_per_s\": %.1f, \"sync_files_per_s\": %.1f, \"ratio_async_plain\": %.4f, "
        "\"finalize_ms\": %.3f, \"async_call_p50_us\": %.2f, \"sync_call_p50_us\": %.2f, "
        "\"runs\": %llu, \"failures\": %d},\n"
        " \"transfers_in\": %llu}\n",
        static_cast<unsigned long long>(a.count), static_cast<unsigned long long>(a.size),
        c.uses_netns() ? "veth" : "loopback", publish.files_per_s, publish.aux_files_per_s,
        publish.p50_ms, publish.p99_ms, publish.failures, after.files_per_s, after.p50_ms,
        after.p99_ms, after.failures, BreakdownJson(after.cost).c_str(),
        a.Has("chain") ? "true" : "false", chain.files_per_s, chain.p50_ms, chain.p99_ms,
        chain.failures, chain.files_per_s > 0 ? after.files_per_s / chain.files_per_s : 0.0,
        BreakdownJson(chain.cost).c_str(), static_cast<unsigned long long>(a.consumers),
        parallel.files_per_s, parallel.p50_ms, parallel.p99_ms, parallel.failures,
        streaming.files_per_s, streaming.p50_ms, streaming.p99_ms, streaming.failures,
        async.ran ? "true" : "false", static_cast<unsigned long long>(a.count), async.plain_fps,
        async.async_fps, async.sync_fps,
        async.plain_fps > 0 ? async.async_fps / async.plain_fps : 0.0, async.finalize_ms,
        async.async_call_us, async.sync_call_us, static_cast<unsigned long long>(a.async_reps),
        async.failures, transfers);
  } else {
    std::printf("\n%-44s %12s %10s %10s %8s\n", "phase", "files/s", "p50 ms", "p99 ms", "errors");
    std::printf("%-44s %12.0f %10.3f %10.3f %8d\n", "publish (dyad_produce calls, synchronous)",
                publish.files_per_s, publish.p50_ms, publish.p99_ms, publish.failures);
    std::printf("%-44s %12.0f %10s %10s %8s\n", "  write + publish, producer wall clock",
                publish.aux_files_per_s, "", "", "");
    std::printf("%-44s %12.0f %10.3f %10.3f %8d\n", "consume after producer finished (per call)",
                after.files_per_s, after.p50_ms, after.p99_ms, after.failures);
    if (a.Has("chain")) {
      std::printf("%-44s %12.0f %10.3f %10.3f %8d\n", "  minimal blocking-socket chain, same files",
                  chain.files_per_s, chain.p50_ms, chain.p99_ms, chain.failures);
      std::printf("%-44s %12.2f   (target >= 0.5)\n", "  ratio consume after / chain",
                  chain.files_per_s > 0 ? after.files_per_s / chain.files_per_s : 0.0);
    }
    const std::string par_label =
        "consume after, " + std::to_string(a.consumers) + " consumers in parallel";
    std::printf("%-44s %12.0f %10.3f %10.3f %8d\n", par_label.c_str(), parallel.files_per_s,
                parallel.p50_ms, parallel.p99_ms, parallel.failures);
    std::printf("%-44s %12.0f %10.3f %10.3f %8d\n", "streaming, consumer first (publish->consume)",
                streaming.files_per_s, streaming.p50_ms, streaming.p99_ms, streaming.failures);
    if (async.ran) {
      std::printf("\nnode A alone, medians of %llu alternated runs (loop files/s):\n",
                  static_cast<unsigned long long>(a.async_reps));
      std::printf("%-44s %12.0f\n", "write + close (no DYAD call)", async.plain_fps);
      std::printf("%-44s %12.0f   dyad_produce p50 %.1f us, dyad_finalize %.1f ms\n",
                  "write + close + publish, DYAD_ASYNC_PUBLISH=1", async.async_fps,
                  async.async_call_us, async.finalize_ms);
      std::printf("%-44s %12.0f   dyad_produce p50 %.1f us\n",
                  "write + close + publish, synchronous", async.sync_fps, async.sync_call_us);
      std::printf("%-44s %12.2f   (target >= 0.5)   errors %d\n", "ratio async / plain",
                  async.plain_fps > 0 ? async.async_fps / async.plain_fps : 0.0, async.failures);
    }
    if (do_after) {
      std::printf("\nper consume after publication: CPU us / context switches (all threads)\n");
      std::printf("%-24s %14s %14s %14s %14s\n", "", "consumer", "node B", "node A", "total");
      PrintBreakdownRow("DYAD", after.cost, "   (target <= 4 switches)");
      if (a.Has("chain")) PrintBreakdownRow("minimal chain", chain.cost, "");
    }
    std::printf("node B service: transfers.in %llu (expected %llu)\n", transfers,
                static_cast<unsigned long long>(
                    (do_after + a.Has("parallel") + a.Has("streaming")) * a.count));
  }
  return publish.failures + after.failures + chain.failures + parallel.failures +
                     streaming.failures + async.failures ==
                 0
             ? 0
             : 1;
}

int Main(int argc, char** argv) {
  // The chain baseline's roles (RunChain starts them on the nodes).
  const std::string role = argc > 1 ? argv[1] : "";
  if (role == "--chain-owner" && argc == 5) return chain::Owner(argv[2], argv[3], argv[4]);
  if (role == "--chain-relay" && argc == 7)
    return chain::Relay(argv[2], argv[3], static_cast<uint16_t>(std::strtoul(argv[4], nullptr, 10)),
                        argv[5], argv[6]);
  if (role == "--chain-consume" && argc == 5) return chain::Consumer(argv[2], argv[3], argv[4]);
  Args a;
  const int rc = ParseArgs(argc, argv, "dyad-small-files", Usage, &a.cl,
                           [&a](const std::string& s, const NextArg& next) {
                             if (s == "--count") return TakeU64(next, &a.count, 1);
                             if (s == "--size") return TakeU64(next, &a.size);
                             if (s == "--consumers") return TakeU64(next, &a.consumers, 1, 64);
                             if (s == "--phases") return TakeString(next, &a.phases);
                             if (s == "--async-reps") return TakeU64(next, &a.async_reps, 1, 99);
                             if (s == "--latencies") return TakeString(next, &a.latencies);
                             if (s == "--call-latencies")
                               return TakeString(next, &a.call_latencies);
                             return OptionResult::kNotMine;
                           });
  return rc >= 0 ? rc : Drive(a);
}

}  // namespace
}  // namespace dyad::bench

int main(int argc, char** argv) { return dyad::bench::Main(argc, argv); }
