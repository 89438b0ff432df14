// dyad-transfer: large-file throughput between two emulated nodes, DYAD
// against the raw TCP it runs on.
//
// In one run and over the same link (a veth pair between two network
// namespaces as root, loopback otherwise) it measures, per repetition:
//   raw-mem   a plain sender on node A streams N bytes from memory to a plain
//             receiver on node B that discards them (the wire's ceiling);
//   raw-file  the sender sendfile()s a file from A's directory, the
//             receiver write()s it into B's directory (the ceiling for any
//             file mover that does not skip the page cache);
//   dyad      a producer on A writes and publishes a file, a consumer on B
//             calls dyad_consume; the time of that call.
// and prints medians and the ratios DYAD / raw. A figure printer, never a
// pass/fail test. The plain sender and receiver are hidden modes of this
// program (--role send|recv), run inside the nodes.
//
// With --json it also reports the resources of the DYAD runs: peak resident
// memory (VmHWM) of both services and of the consumer, and CPU seconds per
// GiB moved (services from /proc/<pid>/stat, consumer from its rusage).
//
// After the runs it reports the owner (node A) service's counters bytes.out
// (file bytes it served) and bytes.out.direct (the part of those it wrote
// straight into the requester service's shared buffer: the UCX transport's
// same-host path, e.g. with UCX_TLS=shm,tcp), so a reader sees which path
// moved the bytes; "owner_bytes_out" and "owner_bytes_out_direct" in JSON
// (null when the service's status could not be read). It also prints the
// requester (node B) service's transport and what that transport says it
// uses (`dyad status`: e.g. the libfabric provider of -m OFI, chosen by
// FI_PROVIDER=tcp or shm); "transport" and "transport_details" in JSON.
//
// --ring N (N >= 2) measures scaling instead: N nodes, node i sends one file
// to node (i+1) mod N, all at once; aggregate MB/s of DYAD (every consumer
// started together) against the same ring of raw TCP file-to-file streams.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "common/net.h"
#include "common/time.h"
#include "emu/cluster.h"
#include "emu/netns.h"
#include "emu/pattern.h"
#include "emu/worker.h"

namespace dyad::bench {
namespace {

constexpr size_t kBuf = 4u << 20;
constexpr uint64_t kMiB = 1ull << 20;

struct Args {
  std::string role;
  std::string addr;  // recv: listen address (port 0 picks one); send: peer
  std::string file;
  std::string ready;
  std::string result;
  uint64_t bytes = 0;
  // Driver.
  uint64_t size = 1024 * kMiB;
  int reps = 3;
  int ring = 0;  // scaling mode: nodes in the ring (0 = off)
  ClusterArgs cl;
};

void Usage() {
  std::printf(
      "usage: dyad-transfer [--size BYTES | --size-mib N] [--reps N] [--mode MODE] [--loopback]\n"
      "                     [--tmp DIR] [--json] [--ring N]\n"
      "                     [--protection integrity|encrypt|none]\n"
      "Measures raw TCP (memory and file-to-file) and DYAD consume throughput between two\n"
      "emulated nodes, side by side. Default: 1 GiB, 3 repetitions. --tmp puts the node\n"
      "directories under DIR (e.g. /dev/shm for tmpfs node-local storage). --json adds\n"
      "peak RSS of services and consumer and CPU seconds per GiB. --ring N: N nodes each\n"
      "sending one file to the next at once, aggregate DYAD vs raw TCP throughput.\n"
      "--protection sets the services' link protection (default integrity: every file\n"
      "chunk authenticated; none: zero-copy sendfile/splice, no integrity).\n"
      "After the two-node runs it also prints node A's (the owner's) service counters\n"
      "bytes.out and bytes.out.direct (bytes the UCX transport wrote straight into the\n"
      "requester service's shared buffer on the same host; 0 over TCP or UCX_TLS=tcp);\n"
      "in JSON: owner_bytes_out, owner_bytes_out_direct (null if unreadable), and node B's\n"
      "transport with its details (e.g. the libfabric provider of --mode OFI, chosen by\n"
      "FI_PROVIDER): transport, transport_details.\n");
}

// --- roles -----------------------------------------------------------------

int Receive(const Args& a) {
  auto addr = ParseAddress(a.addr);
  if (!addr.ok()) return 2;
  auto lfd = Listen(*addr, 4);
  if (!lfd.ok()) {
    std::fprintf(stderr, "recv: %s\n", lfd.status().ToString().c_str());
    return 2;
  }
  auto bound = BoundAddress(lfd->get());
  if (!bound.ok() || !WriteText(a.ready, bound->ToString() + "\n").ok()) return 2;
  auto cfd = Accept(lfd->get(), Deadline::AfterMs(60000));
  if (!cfd.ok()) {
    std::fprintf(stderr, "recv: %s\n", cfd.status().ToString().c_str());
    return 2;
  }
  Channel ch(std::move(*cfd), Trust::kUnauthenticated);  // raw bytes only
  UniqueFd out;
  if (!a.file.empty()) {
    out.reset(::open(a.file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    if (!out.valid()) return 2;
  }
  std::unique_ptr<char[]> buf(new char[kBuf]);
  uint64_t got = 0;
  uint64_t t0 = 0;
  while (got < a.bytes) {
    auto n = ch.RecvSome(buf.get(), static_cast<size_t>(std::min<uint64_t>(kBuf, a.bytes - got)),
                         Deadline::AfterMs(60000));
    if (!n.ok()) {
      std::fprintf(stderr, "recv: %s after %llu bytes\n", n.status().ToString().c_str(),
                   static_cast<unsigned long long>(got));
      return 1;
    }
    if (t0 == 0) t0 = MonoNs();
    if (out.valid() && !WriteFully(out.get(), buf.get(), *n).ok()) return 1;
    got += *n;
  }
  if (out.valid() && ::close(out.release()) != 0) return 1;
  const uint64_t ns = MonoNs() - t0;
  // Tell the sender we are done, so its timing covers the whole stream too.
  const char done = 'k';
  (void)ch.SendAll(&done, 1, Deadline::AfterMs(5000));
  return WriteText(a.result, std::to_string(got) + " " + std::to_string(ns) + "\n").ok() ? 0 : 1;
}

int Send(const Args& a) {
  auto addr = ParseAddress(a.addr);
  if (!addr.ok()) return 2;
  auto fd = Connect(*addr, Deadline::AfterMs(10000));
  if (!fd.ok()) {
    std::fprintf(stderr, "send: %s\n", fd.status().ToString().c_str());
    return 2;
  }
  Channel ch(std::move(*fd), Trust::kUnauthenticated);  // raw bytes only
  const uint64_t t0 = MonoNs();
  if (!a.file.empty()) {
    UniqueFd in(::open(a.file.c_str(), O_RDONLY | O_CLOEXEC));
    if (!in.valid()) return 2;
    Status st = ch.SendFileRange(in.get(), 0, a.bytes, 60000);
    if (!st.ok()) {
      std::fprintf(stderr, "send: %s\n", st.ToString().c_str());
      return 1;
    }
  } else {
    std::unique_ptr<char[]> buf(new char[kBuf]);
    emu::FillPattern(1, 0, buf.get(), kBuf);
    uint64_t sent = 0;
    while (sent < a.bytes) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kBuf, a.bytes - sent));
      Status st = ch.SendAll(buf.get(), n, Deadline::AfterMs(60000));
      if (!st.ok()) {
        std::fprintf(stderr, "send: %s\n", st.ToString().c_str());
        return 1;
      }
      sent += n;
    }
  }
  char done = 0;
  if (!ch.RecvAll(&done, 1, Deadline::AfterMs(60000)).ok()) return 1;
  const uint64_t ns = MonoNs() - t0;
  if (!a.result.empty())
    (void)WriteText(a.result, std::to_string(a.bytes) + " " + std::to_string(ns) + "\n");
  return 0;
}

// --- driver ----------------------------------------------------------------

// Writes back the dirty pages of the file system holding `dir`.
void SyncFs(const std::string& dir) {
  UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.valid()) ::syncfs(fd.get());
}

// One raw TCP stream of a run: node `from` sends `src` (memory when empty)
// to node `to`, which writes it to `dst` (discards it when empty).
struct RawPair {
  int from = 0, to = 1;
  std::string src, dst;
};

// Runs the raw streams of `pairs` at once. `each` gets every receiver's MB/s,
// `aggregate` all bytes over the wall time from starting the senders to the
// last one's exit. False on any failure.
bool RawStreams(emu::EmuCluster& c, const std::string& dir, const std::string& tag, uint64_t bytes,
                const std::vector<RawPair>& pairs, std::vector<double>* each, double* aggregate) {
  const std::string self = SelfExe();
  std::vector<emu::Process> recvs, sends;
  std::vector<std::string> results;
  for (size_t i = 0; i < pairs.size(); ++i) {
    const RawPair& pr = pairs[i];
    const std::string stem = dir + "/raw" + tag + "-" + std::to_string(i);
    const std::string ready = stem + ".ready";
    results.push_back(stem + ".result");
    std::vector<std::string> rargv = {self,
                                      "--role",
                                      "recv",
                                      "--addr",
                                      c.node(pr.to).ip + ":0",
                                      "--bytes",
                                      std::to_string(bytes),
                                      "--ready",
                                      ready,
                                      "--result",
                                      results.back()};
    if (!pr.dst.empty()) rargv.insert(rargv.end(), {"--file", pr.dst});
    auto recv = c.SpawnOnNode(pr.to, rargv, {}, stem + ".recv.out");
    if (!recv.ok()) return false;
    recvs.push_back(std::move(*recv));
    if (!WaitForFile(ready, recvs.back())) return false;
  }
  const uint64_t t0 = MonoNs();
  for (size_t i = 0; i < pairs.size(); ++i) {
    const RawPair& pr = pairs[i];
    const std::string stem = dir + "/raw" + tag + "-" + std::to_string(i);
    std::string addr = ReadText(stem + ".ready");
    while (!addr.empty() && addr.back() == '\n') addr.pop_back();
    std::vector<std::string> sargv = {
        self, "--role", "send", "--addr", addr, "--bytes", std::to_string(bytes)};
    if (!pr.src.empty()) sargv.insert(sargv.end(), {"--file", pr.src});
    auto send = c.SpawnOnNode(pr.from, sargv, {}, stem + ".send.out");
    if (!send.ok()) return false;
    sends.push_back(std::move(*send));
  }
  bool ok = true;
  for (auto* group : {&sends, &recvs})
    for (auto& p : *group) {
      auto st = p.Wait(Deadline::AfterMs(300000));
      if (!st.ok() || !st->success()) ok = false;
    }
  const uint64_t wall = MonoNs() - t0;
  if (!ok) {
    std::fprintf(stderr, "raw run failed; see %s/raw%s-*.out\n", dir.c_str(), tag.c_str());
    return false;
  }
  for (const auto& r : results) {
    unsigned long long got = 0, ns = 0;
    if (std::sscanf(ReadText(r).c_str(), "%llu %llu", &got, &ns) != 2) return false;
    each->push_back(MBps(got, ns));
  }
  *aggregate = MBps(bytes * pairs.size(), wall);
  return true;
}

// One raw TCP run between nodes 0 and 1; MB/s measured by the receiver (0
// on failure).
double RawRun(emu::EmuCluster& c, const std::string& dir, int rep, uint64_t bytes,
              const std::string& src_file, const std::string& dst_file) {
  std::vector<double> each;
  double agg = 0;
  const std::string tag = std::to_string(rep) + (src_file.empty() ? "m" : "f");
  if (!RawStreams(c, dir, tag, bytes, {{0, 1, src_file, dst_file}}, &each, &agg)) return 0;
  return each.empty() ? 0 : each[0];
}

// Writes and publishes `name` on `node`; the publish call's ms (-1 on failure).
double Produce(emu::EmuCluster& c, const std::string& dyad, const std::string& dir, int node,
               const std::string& name, uint64_t bytes, const std::string& tag) {
  const std::string manifest = dir + "/p" + tag + ".m";
  (void)emu::WriteManifest(manifest, {{name, static_cast<int64_t>(bytes)}});
  auto p = c.RunOnNode(
      node, {dyad, "--role", "produce", "--manifest", manifest, "--result", manifest + ".r"},
      600000);
  if (!p.ok() || !p->status.success()) {
    std::fprintf(stderr, "producer failed: %s\n",
                 p.ok() ? p->output.c_str() : p.status().ToString().c_str());
    return -1;
  }
  auto pr = emu::ReadResults(manifest + ".r");
  return pr.ok() && !pr->empty() ? static_cast<double>((*pr)[0].call_ns) / 1e6 : 0;
}

// CPU seconds of every child reaped so far (ours and, through them, theirs).
double ChildrenCpuS() {
  struct rusage ru;
  if (::getrusage(RUSAGE_CHILDREN, &ru) != 0) return 0;
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return sec(ru.ru_utime) + sec(ru.ru_stime);
}

struct ConsumeJob {
  int node = 1;
  std::string name;
};

struct DyadRun {
  bool ok = false;
  std::vector<double> each_mbps;  // of every dyad_consume call
  double aggregate_mbps = 0;      // all bytes over the wall time of all consumers
  double consumer_cpu_s = 0;      // all consumer processes
  uint64_t consumer_hwm_kib = 0;  // the largest consumer's peak RSS
};

// Consumes every job's file (already published) at once, one consumer
// process per job.
DyadRun DyadConsumeAll(emu::EmuCluster& c, const std::string& dyad, const std::string& dir,
                       const std::string& tag, uint64_t bytes,
                       const std::vector<ConsumeJob>& jobs) {
  DyadRun run;
  std::vector<std::string> manifests;
  std::vector<emu::Process> procs;
  std::vector<std::unique_ptr<ProcWatcher>> watchers;
  const double cpu0 = ChildrenCpuS();
  const uint64_t t0 = MonoNs();
  for (size_t i = 0; i < jobs.size(); ++i) {
    const std::string manifest = dir + "/c" + tag + "-" + std::to_string(i) + ".m";
    if (!emu::WriteManifest(manifest, {{jobs[i].name, static_cast<int64_t>(bytes)}}).ok())
      return run;
    manifests.push_back(manifest);
    auto p = c.SpawnOnNode(jobs[i].node,
                           {dyad, "--role", "consume", "--manifest", manifest, "--result",
                            manifest + ".r", "--no-verify", "--no-metadata"},
                           {}, manifest + ".out");
    if (!p.ok()) return run;
    procs.push_back(std::move(*p));
    watchers.push_back(std::make_unique<ProcWatcher>(procs.back().pid()));
  }
  bool ok = true;
  for (size_t i = 0; i < procs.size(); ++i) {
    auto st = procs[i].Wait(Deadline::AfterMs(600000));
    const ProcSample s = watchers[i]->Stop();
    run.consumer_hwm_kib = std::max(run.consumer_hwm_kib, s.hwm_kib);
    if (!st.ok() || !st->success()) {
      std::fprintf(stderr, "consumer failed; see %s.out\n", manifests[i].c_str());
      ok = false;
    }
  }
  const uint64_t wall = MonoNs() - t0;
  run.consumer_cpu_s = ChildrenCpuS() - cpu0;
  if (!ok) return run;
  for (const auto& m : manifests) {
    auto cr = emu::ReadResults(m + ".r");
    if (!cr.ok() || cr->empty() || (*cr)[0].rc != 0) return run;
    run.each_mbps.push_back(MBps(bytes, (*cr)[0].call_ns));
  }
  run.aggregate_mbps = MBps(bytes * jobs.size(), wall);
  run.ok = true;
  return run;
}

// Consumes `name` (already published on node A) on node B; MB/s of the
// dyad_consume call (0 on failure).
double DyadConsume(emu::EmuCluster& c, const std::string& dyad, const std::string& dir,
                   const std::string& name, uint64_t bytes, int rep, DyadRun* detail) {
  *detail = DyadConsumeAll(c, dyad, dir, std::to_string(rep), bytes, {{1, name}});
  return detail->ok ? detail->each_mbps[0] : 0;
}

std::string LinkName(const emu::EmuCluster& c, const Args& a) {
  return c.uses_netns()
             ? "veth pair between network namespaces"
             : "loopback (" +
                   (a.cl.loopback ? std::string("--loopback") : emu::NetnsUnavailableReason()) +
                   ")";
}

// --ring: scaling over nodes.
int DriveRing(const Args& a) {
  const std::string dyad = FindDemoProgram("dyad-transfer");
  if (dyad.empty()) return 2;
  auto cluster = StartBenchCluster("dyad-transfer", a.ring, a.cl);
  if (!cluster) return 1;
  emu::EmuCluster& c = *cluster;
  const int n = a.ring;
  const std::string work = c.base_dir() + "/bench";
  ::mkdir(work.c_str(), 0755);
  if (!a.cl.json) {
    std::printf("dyad-transfer --ring %d: %s per node, %d repetitions, link: %s\n", n,
                emu::HumanBytes(a.size).c_str(), a.reps, LinkName(c, a).c_str());
    std::fflush(stdout);
  }
  std::vector<double> raw, dy;
  for (int rep = 0; rep < a.reps; ++rep) {
    std::vector<std::string> names;
    for (int i = 0; i < n; ++i) {
      names.push_back("ring/r" + std::to_string(rep) + "n" + std::to_string(i) + ".bin");
      if (Produce(c, dyad, work, i, names.back(), a.size,
                  std::to_string(rep) + "-" + std::to_string(i)) < 0)
        return 1;
    }
    auto run_raw = [&] {
      std::vector<RawPair> pairs;
      for (int i = 0; i < n; ++i)
        pairs.push_back({i, (i + 1) % n, c.node(i).dmd + "/" + names[i],
                         c.node((i + 1) % n).dmd + "/raw-copy" + std::to_string(i) + ".bin"});
      SyncFs(c.base_dir());
      std::vector<double> each;
      double agg = 0;
      raw.push_back(
          RawStreams(c, work, "ring" + std::to_string(rep), a.size, pairs, &each, &agg) ? agg : 0);
      for (const auto& p : pairs) ::unlink(p.dst.c_str());
    };
    auto run_dyad = [&] {
      std::vector<ConsumeJob> jobs;
      for (int i = 0; i < n; ++i) jobs.push_back({(i + 1) % n, names[i]});
      SyncFs(c.base_dir());
      DyadRun r = DyadConsumeAll(c, dyad, work, "ring" + std::to_string(rep), a.size, jobs);
      dy.push_back(r.ok ? r.aggregate_mbps : 0);
      for (int i = 0; i < n; ++i) ::unlink((c.node((i + 1) % n).dmd + "/" + names[i]).c_str());
    };
    if (rep % 2 == 0) {
      run_raw();
      run_dyad();
    } else {
      run_dyad();
      run_raw();
    }
    for (int i = 0; i < n; ++i) ::unlink((c.node(i).dmd + "/" + names[i]).c_str());
    if (!a.cl.json) {
      std::printf("  rep %d: raw TCP ring %8.1f MB/s   dyad ring %8.1f MB/s\n", rep + 1, raw.back(),
                  dy.back());
      std::fflush(stdout);
    }
  }
  const double m_raw = emu::Median(raw), m_dy = emu::Median(dy);
  if (a.cl.json) {
    std::printf(
        "{\"bench\": \"transfer_ring\", \"nodes\": %d, \"bytes\": %llu, \"reps\": %d, "
        "\"link\": \"%s\",\n \"raw_aggregate_mbps\": %s, \"dyad_aggregate_mbps\": %s,\n"
        " \"median\": {\"raw_aggregate_mbps\": %.1f, \"dyad_aggregate_mbps\": %.1f},\n"
        " \"ratio_dyad_raw\": %.3f}\n",
        n, static_cast<unsigned long long>(a.size), a.reps, c.uses_netns() ? "veth" : "loopback",
        JsonList(raw).c_str(), JsonList(dy).c_str(), m_raw, m_dy, m_raw > 0 ? m_dy / m_raw : 0.0);
  } else {
    std::printf("\nmedian aggregate: raw TCP ring %.1f MB/s, DYAD ring %.1f MB/s, ratio %.2f\n",
                m_raw, m_dy, m_raw > 0 ? m_dy / m_raw : 0.0);
  }
  return m_dy > 0 ? 0 : 1;
}

int Drive(const Args& a) {
  if (a.ring >= 2) return DriveRing(a);
  const std::string dyad = FindDemoProgram("dyad-transfer");
  if (dyad.empty()) return 2;
  auto cluster = StartBenchCluster("dyad-transfer", 2, a.cl);
  if (!cluster) return 1;
  emu::EmuCluster& c = *cluster;
  const std::string work = c.base_dir() + "/bench";
  ::mkdir(work.c_str(), 0755);
  if (!a.cl.json) {
    std::printf("dyad-transfer: %s per run, %d repetitions, link: %s\n",
                emu::HumanBytes(a.size).c_str(), a.reps, LinkName(c, a).c_str());
    std::fflush(stdout);
  }
  std::vector<double> mem, file, dy, pub, cpu_per_gib, svc_cpu, cons_cpu;
  uint64_t consumer_hwm = 0;
  for (int rep = 0; rep < a.reps; ++rep) {
    const std::string name = "bench/rep" + std::to_string(rep) + ".bin";
    const std::string src = c.node(0).dmd + "/" + name;
    // Produce first: its file is also the raw file-to-file source, so both
    // senders read the same page-cached bytes.
    const double pub_ms = Produce(c, dyad, work, 0, name, a.size, std::to_string(rep));
    if (pub_ms < 0) return 1;
    pub.push_back(pub_ms);
    // Each timed run starts with the page cache's dirty data written back,
    // and the order alternates between repetitions: otherwise whichever runs
    // second pays for the first one's writeback.
    const std::string dst = c.node(1).dmd + "/raw-copy.bin";
    auto run_mem = [&] {
      SyncFs(c.base_dir());
      mem.push_back(RawRun(c, work, rep, a.size, "", ""));
    };
    auto run_file = [&] {
      SyncFs(c.base_dir());
      file.push_back(RawRun(c, work, rep, a.size, src, dst));
      ::unlink(dst.c_str());
    };
    auto run_dyad = [&] {
      SyncFs(c.base_dir());
      const ProcSample a0 = SampleProc(c.ServicePid(0)), b0 = SampleProc(c.ServicePid(1));
      DyadRun detail;
      dy.push_back(DyadConsume(c, dyad, work, name, a.size, rep, &detail));
      const ProcSample a1 = SampleProc(c.ServicePid(0)), b1 = SampleProc(c.ServicePid(1));
      const double svc = (a1.cpu_s - a0.cpu_s) + (b1.cpu_s - b0.cpu_s);
      svc_cpu.push_back(svc);
      cons_cpu.push_back(detail.consumer_cpu_s);
      cpu_per_gib.push_back((svc + detail.consumer_cpu_s) /
                            (static_cast<double>(a.size) / static_cast<double>(1ull << 30)));
      consumer_hwm = std::max(consumer_hwm, detail.consumer_hwm_kib);
      ::unlink((c.node(1).dmd + "/" + name).c_str());
    };
    if (rep % 2 == 0) {
      run_mem();
      run_file();
      run_dyad();
    } else {
      run_dyad();
      run_file();
      run_mem();
    }
    ::unlink(src.c_str());
    if (!a.cl.json) {
      std::printf("  rep %d: raw-mem %8.1f MB/s   raw-file %8.1f MB/s   dyad %8.1f MB/s\n", rep + 1,
                  mem.back(), file.back(), dy.back());
      std::fflush(stdout);
    }
  }
  const double m_mem = emu::Median(mem), m_file = emu::Median(file), m_dy = emu::Median(dy);
  const ProcSample svc_a = SampleProc(c.ServicePid(0)), svc_b = SampleProc(c.ServicePid(1));
  auto counters = c.ServiceStatus(1);
  // What moved the bytes on the requester's side (e.g. which provider).
  const std::string transport = counters.ok() ? counters->info["transport"] : "";
  const std::string details = counters.ok() ? counters->info["transport.details"] : "";
  // The owner's side: how many file bytes it served, and how many of them
  // went through the same-host direct path.
  auto owner = c.ServiceStatus(0);
  auto owner_counter = [&](const char* name) -> std::string {
    if (!owner.ok()) return "null";
    auto it = owner->counters.find(name);
    return it == owner->counters.end() ? std::string("null") : std::to_string(it->second);
  };
  if (a.cl.json) {
    std::printf(
        "{\"bench\": \"transfer\", \"bytes\": %llu, \"reps\": %d, \"link\": \"%s\", \"mode\": "
        "\"%s\",\n"
        " \"raw_mem_mbps\": %s, \"raw_file_mbps\": %s, \"dyad_mbps\": %s,\n"
        " \"median\": {\"raw_mem_mbps\": %.1f, \"raw_file_mbps\": %.1f, \"dyad_mbps\": %.1f},\n"
        " \"ratio_dyad_raw_mem\": %.3f, \"ratio_dyad_raw_file\": %.3f, \"publish_ms_median\": "
        "%.3f,\n"
        " \"resources\": {\"service_hwm_kib\": [%llu, %llu], \"consumer_hwm_kib\": %llu,\n"
        "  \"service_cpu_s\": %s, \"consumer_cpu_s\": %s, \"cpu_s_per_gib_median\": %.4f},\n"
        " \"owner_bytes_out\": %s, \"owner_bytes_out_direct\": %s,\n"
        " \"transport\": %s, \"transport_details\": %s}\n",
        static_cast<unsigned long long>(a.size), a.reps, c.uses_netns() ? "veth" : "loopback",
        a.cl.mode.empty() ? "default" : a.cl.mode.c_str(), JsonList(mem).c_str(),
        JsonList(file).c_str(), JsonList(dy).c_str(), m_mem, m_file, m_dy,
        m_mem > 0 ? m_dy / m_mem : 0.0, m_file > 0 ? m_dy / m_file : 0.0, emu::Median(pub),
        static_cast<unsigned long long>(svc_a.hwm_kib),
        static_cast<unsigned long long>(svc_b.hwm_kib),
        static_cast<unsigned long long>(consumer_hwm), JsonList(svc_cpu).c_str(),
        JsonList(cons_cpu).c_str(), emu::Median(cpu_per_gib), owner_counter("bytes.out").c_str(),
        owner_counter("bytes.out.direct").c_str(), JsonString(transport).c_str(),
        JsonString(details).c_str());
  } else {
    std::printf("\nmedian of %d       MB/s\n", a.reps);
    std::printf("  raw TCP, memory      %8.1f\n", m_mem);
    std::printf("  raw TCP, file->file  %8.1f\n", m_file);
    std::printf("  DYAD consume         %8.1f\n", m_dy);
    std::printf("ratio DYAD / raw TCP (memory):       %.2f\n", m_mem > 0 ? m_dy / m_mem : 0.0);
    std::printf("ratio DYAD / raw TCP (file->file):   %.2f\n", m_file > 0 ? m_dy / m_file : 0.0);
    std::printf("publish (dyad_produce) median:       %.3f ms\n", emu::Median(pub));
    std::printf("peak RSS: services %s / %s, consumer %s; CPU per GiB moved %.3f s\n",
                emu::HumanBytes(svc_a.hwm_kib * 1024).c_str(),
                emu::HumanBytes(svc_b.hwm_kib * 1024).c_str(),
                emu::HumanBytes(consumer_hwm * 1024).c_str(), emu::Median(cpu_per_gib));
    if (counters.ok()) {
      // How often the consume's worker gave up waiting on the owner (a
      // wait of 100 ms in all per stint; docs/service.md).
      std::printf("node B service: transfers.in %llu, bytes.in %s, consume.parked_for_owner %llu\n",
                  static_cast<unsigned long long>(counters->counters["transfers.in"]),
                  emu::HumanBytes(counters->counters["bytes.in"]).c_str(),
                  static_cast<unsigned long long>(counters->counters["consume.parked_for_owner"]));
      std::printf("node B transport: %s%s%s\n", transport.c_str(), details.empty() ? "" : ": ",
                  details.c_str());
    }
    if (owner.ok())
      std::printf("node A service: bytes.out %s, bytes.out.direct %s, fetch.parked_for_room %llu\n",
                  emu::HumanBytes(owner->counters["bytes.out"]).c_str(),
                  emu::HumanBytes(owner->counters["bytes.out.direct"]).c_str(),
                  static_cast<unsigned long long>(owner->counters["fetch.parked_for_room"]));
    else
      std::printf("node A service: status unavailable (%s)\n", owner.status().ToString().c_str());
  }
  return 0;
}

int Main(int argc, char** argv) {
  Args a;
  uint64_t mib = 0, reps = 0, ring = 0;
  const int rc = ParseArgs(argc, argv, "dyad-transfer", Usage, &a.cl,
                           [&](const std::string& s, const NextArg& next) {
                             if (s == "--role") return TakeString(next, &a.role);
                             if (s == "--addr") return TakeString(next, &a.addr);
                             if (s == "--file") return TakeString(next, &a.file);
                             if (s == "--ready") return TakeString(next, &a.ready);
                             if (s == "--result") return TakeString(next, &a.result);
                             if (s == "--bytes") return TakeU64(next, &a.bytes);
                             if (s == "--size") return TakeU64(next, &a.size, 1);
                             if (s == "--size-mib") {
                               const OptionResult r = TakeU64(next, &mib, 1);
                               a.size = mib * kMiB;
                               return r;
                             }
                             if (s == "--reps") {
                               const OptionResult r = TakeU64(next, &reps, 1, 100);
                               a.reps = static_cast<int>(reps);
                               return r;
                             }
                             if (s == "--ring") {
                               const OptionResult r = TakeU64(next, &ring, 2, 16);
                               a.ring = static_cast<int>(ring);
                               return r;
                             }
                             return OptionResult::kNotMine;
                           });
  if (rc >= 0) return rc;
  if (a.role == "recv") return Receive(a);
  if (a.role == "send") return Send(a);
  return Drive(a);
}

}  // namespace
}  // namespace dyad::bench

int main(int argc, char** argv) { return dyad::bench::Main(argc, argv); }
