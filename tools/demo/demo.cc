// demo.cc: dyad-demo (`dyad demo`) and the worker roles it runs inside
// emulated nodes.
//
// The demo shows DYAD's core promise end to end on one machine: a consumer
// on node B asks for files that do not exist yet and blocks; a producer on
// node A writes them with ordinary write(2) calls and publishes them; the
// consumer's calls return as each file lands, complete, in B's own directory.
// Both sides are separate processes in separate network namespaces that use
// only the public C API, so what works here works between real nodes.
#include "demo.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/fsutil.h"
#include "common/net.h"
#include "common/time.h"
#include "dyad/client/dyad_client.h"
#include "dyad/core/dyad_ctx.h"
#include "emu/cluster.h"
#include "emu/netns.h"
#include "emu/pattern.h"
#include "emu/worker.h"

namespace dyad {
namespace {

using emu::FileResult;
using emu::ManifestEntry;

constexpr uint64_t kMiB = 1ull << 20;

// ---------------------------------------------------------------------------
// Worker roles: `dyad-demo --role produce|consume --manifest M --result R`.

struct RoleOptions {
  std::string role;
  std::string manifest;
  std::string result;
  std::string ready;           // touched once the context is initialized
  std::string dir;             // managed directory (default: from the environment)
  bool write = true;           // producer: create the files (else publish existing ones)
  bool verify = true;          // consumer: check the content against the pattern
  bool metadata = true;        // consumer: version from dyad_get_metadata, else from mtime
  bool publish = true;         // producer: dyad_produce each file (else write and close only)
  bool defer_results = false;  // producer: result lines after the loop, not one write per file
};

uint64_t StatVersion(const struct stat& st) {
  return static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull +
         static_cast<uint64_t>(st.st_mtim.tv_nsec);
}

Status MakeParents(const std::string& dir, const std::string& name) {
  size_t pos = 0;
  while ((pos = name.find('/', pos)) != std::string::npos) {
    const std::string sub = dir + "/" + name.substr(0, pos);
    if (::mkdir(sub.c_str(), 0755) != 0 && errno != EEXIST)
      return StatusFromErrno(errno, "mkdir '" + sub + "'");
    ++pos;
  }
  return Status::OK();
}

Status TouchFile(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return StatusFromErrno(errno, "create '" + path + "'");
  return Status::OK();
}

std::string LastError(dyad_rc_t rc) {
  const char* msg = dyad_last_error();
  std::string out = dyad_rc_name(rc);
  if (msg && *msg) out += std::string(": ") + msg;
  return out;
}

int RunRole(const RoleOptions& o) {
  auto manifest = emu::ReadManifest(o.manifest);
  if (!manifest.ok()) {
    std::fprintf(stderr, "dyad demo worker: %s\n", manifest.status().ToString().c_str());
    return 2;
  }
  UniqueFd out(::open(o.result.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (!out.valid()) {
    std::fprintf(stderr, "dyad demo worker: cannot open result file '%s': %s\n", o.result.c_str(),
                 std::strerror(errno));
    return 2;
  }
  const bool producer = o.role == "produce";
  std::string dir = o.dir;
  if (dir.empty()) {
    dir = GetEnv(producer ? "DYAD_PATH_PRODUCER" : "DYAD_PATH_CONSUMER").value_or("");
  }
  if (dir.empty()) {
    std::fprintf(stderr, "dyad demo worker: no managed directory (--dir or DYAD_PATH_%s)\n",
                 producer ? "PRODUCER" : "CONSUMER");
    return 2;
  }
  const dyad_rc_t init_rc = dyad_init_env(producer ? DYAD_COMM_SEND : DYAD_COMM_RECV, nullptr);
  if (DYAD_IS_ERROR(init_rc)) {
    std::fprintf(stderr, "dyad demo worker: dyad_init_env failed: %s\n",
                 LastError(init_rc).c_str());
    return 2;
  }
  dyad_ctx_t* ctx = dyad_ctx_get();
  if (!o.ready.empty()) {
    Status st = TouchFile(o.ready);
    if (!st.ok()) std::fprintf(stderr, "dyad demo worker: %s\n", st.ToString().c_str());
  }

  // Consumers verify after every file has been consumed, so that reading a
  // big file back does not delay (and inflate the latency of) the next one.
  std::vector<FileResult> pending;
  int failures = 0;
  auto emit = [&](const FileResult& r) -> bool {
    if (DYAD_IS_ERROR(r.rc) || r.verified == 0) ++failures;
    const std::string line = emu::FormatResult(r);
    Status st = WriteFully(out.get(), line.data(), line.size());
    if (!st.ok()) std::fprintf(stderr, "dyad demo worker: %s\n", st.ToString().c_str());
    return st.ok();
  };
  // What the loop of produce or consume calls costs this process, for the
  // benchmarks' per-call breakdown (emu::LoopUsage).
  const emu::LoopUsage loop_start = emu::UsageNow();
  for (const ManifestEntry& e : *manifest) {
    FileResult r;
    r.name = e.name;
    const std::string path = dir + "/" + e.name;
    r.start_ns = WallNs();
    if (producer) {
      if (o.write) {
        const uint64_t t0 = MonoNs();
        Status st = MakeParents(dir, e.name);
        UniqueFd fd;
        if (st.ok()) {
          fd.reset(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
          if (!fd.valid()) st = StatusFromErrno(errno, "create '" + path + "'");
        }
        if (st.ok())
          st = emu::WritePattern(fd.get(), emu::PatternSeed(e.name),
                                 e.size < 0 ? 0 : static_cast<uint64_t>(e.size));
        if (st.ok() && ::close(fd.release()) != 0)
          st = StatusFromErrno(errno, "close '" + path + "'");
        r.io_ns = MonoNs() - t0;
        if (!st.ok()) {
          r.rc = st.code();
          r.message = st.message();
        }
      }
      if (r.rc == DYAD_RC_OK && o.publish) {
        const uint64_t t0 = MonoNs();
        const dyad_rc_t rc = dyad_produce(ctx, path.c_str());
        r.call_ns = MonoNs() - t0;
        r.rc = rc;
        if (DYAD_IS_ERROR(rc)) r.message = LastError(rc);
      }
      r.end_ns = WallNs();
      struct stat st;
      if (::stat(path.c_str(), &st) == 0) {
        r.size = static_cast<uint64_t>(st.st_size);
        r.version = StatVersion(st);
      }
      if (o.defer_results) {
        pending.push_back(std::move(r));
      } else if (!emit(r)) {
        return 2;
      }
      continue;
    }
    const uint64_t t0 = MonoNs();
    const dyad_rc_t rc = dyad_consume(ctx, path.c_str());
    r.call_ns = MonoNs() - t0;
    r.end_ns = WallNs();
    r.rc = rc;
    if (DYAD_IS_ERROR(rc)) {
      r.message = LastError(rc);
    } else {
      struct stat st;
      if (::stat(path.c_str(), &st) == 0) {
        r.size = static_cast<uint64_t>(st.st_size);
        r.version = StatVersion(st);
      } else {
        r.message = std::string("consumed file is missing: ") + std::strerror(errno);
        r.verified = 0;
      }
      if (o.metadata) {
        dyad_metadata_t* md = nullptr;
        if (dyad_get_metadata(ctx, path.c_str(), false, &md) == DYAD_RC_OK && md != nullptr)
          r.version = md->version;
        dyad_free_metadata(&md);
      }
    }
    if (o.verify) {
      pending.push_back(std::move(r));
    } else if (!emit(r)) {
      return 2;
    }
  }
  std::fputs(emu::FormatLoopUsage(loop_start, emu::UsageNow()).c_str(), stdout);
  // Asynchronous publications (DYAD_ASYNC_PUBLISH) are confirmed here:
  // a failure among them fails the worker.
  const uint64_t f0 = MonoNs();
  const dyad_rc_t fin = dyad_finalize();
  const uint64_t finalize_ns = MonoNs() - f0;
  if (producer && o.publish)
    std::printf("finalize_ns %llu\n", static_cast<unsigned long long>(finalize_ns));
  std::fflush(stdout);
  if (DYAD_IS_ERROR(fin)) {
    ++failures;
    std::fprintf(stderr, "dyad demo worker: dyad_finalize: %s\n", LastError(fin).c_str());
  }
  for (size_t k = 0; k < pending.size(); ++k) {
    FileResult& r = pending[k];
    if (producer) {
      if (!emit(r)) return 2;
      continue;
    }
    if (r.rc == DYAD_RC_OK && r.message.empty()) {
      const uint64_t v0 = MonoNs();
      Status st =
          emu::VerifyPatternFile(dir + "/" + r.name, emu::PatternSeed(r.name), (*manifest)[k].size);
      r.io_ns = MonoNs() - v0;
      r.verified = st.ok() ? 1 : 0;
      if (!st.ok()) r.message = st.message();
    }
    if (!emit(r)) return 2;
  }
  return failures == 0 ? 0 : 1;
}

// ---------------------------------------------------------------------------
// The demo itself.

struct DemoOptions {
  bool keep = false;
  uint64_t big_mib = 256;
  int extra_files = 0;
  std::string mode;
  bool debug = false;
};

void PrintUsage() {
  std::printf(
      "usage: dyad demo [--big-mib N] [--files N] [--mode TCP] [--keep] [--debug]\n"
      "\n"
      "Runs two emulated nodes on this machine (network namespaces when run as root,\n"
      "loopback otherwise), each with its own directory and dyad-service. A consumer on\n"
      "node B waits for files that node A's producer then writes and publishes; every\n"
      "file is verified and a summary printed. Everything is removed at the end (and\n"
      "on Ctrl-C).\n"
      "\n"
      "  --big-mib N   size of the largest file in MiB (default 256; 0 leaves it out)\n"
      "  --files N     N extra 4 KiB files\n"
      "  --mode MODE   transport (DYAD_DTL_MODE), e.g. TCP\n"
      "  --keep        keep the node directories and logs (path printed at the end)\n"
      "  --debug       debug logging in the services\n");
}

bool ParseU64Arg(const char* text, uint64_t* out) {
  if (!text || !*text || *text == '-') return false;
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (*end != '\0' || errno) return false;
  *out = v;
  return true;
}

std::vector<ManifestEntry> DemoFiles(const DemoOptions& o) {
  std::vector<ManifestEntry> files = {
      {"empty.dat", 0},
      {"small-1k.dat", 1024},
      {"page-4k.dat", 4096},
      {"données finales.bin", static_cast<int64_t>(kMiB)},
      {"run1/step/frame-0001.dat", static_cast<int64_t>(16 * kMiB)},
  };
  // The extra small files go before the big one: the consumer takes files
  // in order, so small files queued behind a big transfer would only
  // measure that transfer.
  for (int i = 0; i < o.extra_files; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "extra/file-%05d.dat", i);
    files.push_back({name, 4096});
  }
  if (o.big_mib > 0) files.push_back({"big.bin", static_cast<int64_t>(o.big_mib * kMiB)});
  return files;
}

std::string SelfExe() {
  char buf[4096];
  const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "dyad-demo";
  buf[n] = '\0';
  return buf;
}

// Where to look first for dyad-service: beside this program in the build
// tree, <bindir> once installed (this program is in <libexecdir>/dyad).
// DYAD_SERVICE_BIN and PATH still come after (emu::FindSiblingProgram).
std::string ServiceBinDir() {
  const std::string self = SelfExe();
  const std::string dir = self.substr(0, self.rfind('/'));
  if (::access((dir + "/dyad-service").c_str(), X_OK) == 0) return dir;
  return dir + "/" DYAD_LIBEXEC_TO_BIN;
}

// Display width of a UTF-8 string (code points; good enough for a table).
size_t Utf8Width(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s)
    if ((c & 0xC0) != 0x80) ++n;
  return n;
}

std::string PadRight(const std::string& s, size_t width) {
  const size_t w = Utf8Width(s);
  return w >= width ? s : s + std::string(width - w, ' ');
}

int Fail(const std::string& what, emu::EmuCluster* cluster, const std::vector<std::string>& logs) {
  // After Ctrl-C the failures are ours (processes killed on purpose).
  if (emu::Interrupted()) return 130;
  std::fprintf(stderr, "\ndyad demo: FAILED: %s\n", what.c_str());
  for (const auto& path : logs) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid()) continue;
    char buf[4096];
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n > 0) std::fprintf(stderr, "--- %s\n%.*s\n", path.c_str(), static_cast<int>(n), buf);
  }
  if (cluster) {
    for (int i = 0; i < cluster->size(); ++i)
      std::fprintf(stderr, "%s\n", cluster->ServiceLogTail(i, 2000).c_str());
  }
  return 1;
}

int RunDemoMain(const DemoOptions& o) {
  emu::InstallSignalTeardown();
  const bool netns = emu::NetnsAvailable();
  std::printf("DYAD demo: two emulated nodes on this machine, %s\n",
              netns ? "each in its own network namespace (veth link)"
                    : ("sharing loopback (" + emu::NetnsUnavailableReason() + ")").c_str());
  std::fflush(stdout);

  emu::ClusterOptions copt;
  copt.mode = o.mode;
  copt.keep = o.keep;
  copt.debug = o.debug;
  copt.bin_dir = ServiceBinDir();
  auto started = emu::EmuCluster::Start(2, copt);
  if (!started.ok())
    return Fail("starting the emulated cluster: " + started.status().ToString(), nullptr, {});
  std::unique_ptr<emu::EmuCluster> cluster = std::move(*started);
  const emu::NodeInfo& a = cluster->node(0);
  const emu::NodeInfo& b = cluster->node(1);
  std::printf("  node A: rank 0 (metadata root), %s, files in %s\n", a.address().c_str(),
              a.dmd.c_str());
  std::printf("  node B: rank 1, %s, files in %s\n", b.address().c_str(), b.dmd.c_str());

  const std::vector<ManifestEntry> files = DemoFiles(o);
  uint64_t total_bytes = 0;
  for (const auto& f : files) total_bytes += static_cast<uint64_t>(f.size);
  const std::string manifest = cluster->base_dir() + "/manifest.txt";
  const std::string cons_result = b.log + "/consumer.results";
  const std::string prod_result = a.log + "/producer.results";
  const std::string cons_log = b.log + "/consumer.out";
  const std::string prod_log = a.log + "/producer.out";
  const std::string cons_ready = b.run + "/consumer.ready";
  const std::vector<std::string> logs = {cons_log, prod_log};
  if (Status st = emu::WriteManifest(manifest, files); !st.ok())
    return Fail(st.ToString(), cluster.get(), {});
  const std::string self = SelfExe();

  // Consumer first: it must block until the producer publishes.
  auto consumer = cluster->SpawnOnNode(1,
                                       {self, "--role", "consume", "--manifest", manifest,
                                        "--result", cons_result, "--ready", cons_ready},
                                       {}, cons_log);
  if (!consumer.ok())
    return Fail("starting the consumer: " + consumer.status().ToString(), cluster.get(), {});
  {
    const Deadline ready_by = Deadline::AfterMs(10000);
    struct stat st;
    while (::stat(cons_ready.c_str(), &st) != 0) {
      if (consumer->Exited())
        return Fail("the consumer exited early (" + consumer->exit_status()->ToString() + ")",
                    cluster.get(), logs);
      if (ready_by.expired())
        return Fail("the consumer did not start within 10 s", cluster.get(), logs);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  std::printf("\nconsumer on node B: waiting for %zu files (blocked in dyad_consume)\n",
              files.size());
  std::fflush(stdout);
  // Nothing is published yet, so the consumer must still be waiting a
  // moment later; the pause also lets a viewer see it.
  if (consumer->Wait(Deadline::AfterMs(700)).ok())
    return Fail("the consumer returned before anything was published (" +
                    consumer->exit_status()->ToString() + ")",
                cluster.get(), logs);
  std::printf("consumer on node B: still waiting after 0.7 s, as it should\n");
  std::printf("producer on node A: writing and publishing %zu files (%s)\n", files.size(),
              emu::HumanBytes(total_bytes).c_str());
  std::fflush(stdout);

  const uint64_t t_start = WallNs();
  auto producer = cluster->SpawnOnNode(
      0, {self, "--role", "produce", "--manifest", manifest, "--result", prod_result}, {},
      prod_log);
  if (!producer.ok())
    return Fail("starting the producer: " + producer.status().ToString(), cluster.get(), logs);
  const int64_t bound_ms = 60000 + static_cast<int64_t>(total_bytes / kMiB) * 200;
  auto pst = producer->Wait(Deadline::AfterMs(bound_ms));
  if (!pst.ok())
    return Fail("the producer did not finish within " + std::to_string(bound_ms / 1000) + " s",
                cluster.get(), logs);
  auto cst = consumer->Wait(Deadline::AfterMs(bound_ms));
  if (!cst.ok())
    return Fail("the consumer did not finish within " + std::to_string(bound_ms / 1000) + " s",
                cluster.get(), logs);
  const uint64_t t_end = WallNs();
  std::printf("consumer on node B: done\n\n");

  auto presults = emu::ReadResults(prod_result);
  auto cresults = emu::ReadResults(cons_result);
  if (!presults.ok()) return Fail(presults.status().ToString(), cluster.get(), logs);
  if (!cresults.ok()) return Fail(cresults.status().ToString(), cluster.get(), logs);

  // Table.
  size_t name_w = 4;
  for (const auto& f : files) name_w = std::max(name_w, Utf8Width(f.name));
  std::printf("%s  %10s  %11s  %11s  %s\n", PadRight("file", name_w).c_str(), "size", "publish ms",
              "latency ms", "verified");
  std::vector<double> latencies_ms;
  int bad = 0;
  uint64_t first_start = UINT64_MAX, last_end = 0;
  for (const auto& pr : *presults) first_start = std::min(first_start, pr.start_ns);
  for (const auto& f : files) {
    const FileResult* p = nullptr;
    const FileResult* c = nullptr;
    for (const auto& r : *presults)
      if (r.name == f.name) p = &r;
    for (const auto& r : *cresults)
      if (r.name == f.name) c = &r;
    const bool ok = p && c && p->rc == DYAD_RC_OK && c->rc == DYAD_RC_OK && c->verified == 1;
    if (!ok) ++bad;
    // From the producer's close() to the consumer's dyad_consume returning,
    // both wall clocks of this machine. (The file's mtime would be the
    // natural stamp, but the kernel sets it from a coarse clock that can
    // lag by a scheduler tick, several milliseconds.)
    double latency = -1;
    if (p && c && c->rc == DYAD_RC_OK) {
      const uint64_t closed = p->start_ns + p->io_ns;
      if (c->end_ns >= closed) {
        latency = static_cast<double>(c->end_ns - closed) / 1e6;
        latencies_ms.push_back(latency);
      }
    }
    if (c) last_end = std::max(last_end, c->end_ns);
    char pub[32] = "-", lat[32] = "-";
    if (p && p->rc == DYAD_RC_OK)
      std::snprintf(pub, sizeof pub, "%.2f", static_cast<double>(p->call_ns) / 1e6);
    if (latency >= 0) std::snprintf(lat, sizeof lat, "%.2f", latency);
    std::string verdict = ok ? "yes" : "NO";
    if (!ok) {
      if (!p)
        verdict += " (not produced)";
      else if (p->rc != DYAD_RC_OK)
        verdict += " (produce: " + p->message + ")";
      else if (!c)
        verdict += " (not consumed)";
      else if (!c->message.empty())
        verdict += " (" + c->message + ")";
    }
    std::printf("%s  %10s  %11s  %11s  %s\n", PadRight(f.name, name_w).c_str(),
                emu::HumanBytes(static_cast<uint64_t>(f.size)).c_str(), pub, lat, verdict.c_str());
  }

  const double span_s = (last_end > first_start && first_start != UINT64_MAX)
                            ? static_cast<double>(last_end - first_start) / 1e9
                            : static_cast<double>(t_end - t_start) / 1e9;
  std::printf(
      "\nfiles: %zu, bytes: %s, elapsed %.2f s (first write to last file consumed), "
      "throughput %.1f MB/s\n",
      files.size(), emu::HumanBytes(total_bytes).c_str(), span_s,
      span_s > 0 ? static_cast<double>(total_bytes) / 1e6 / span_s : 0.0);
  std::printf(
      "consume latency (file closed on A -> dyad_consume returned on B): p50 %.2f ms, p99 %.2f "
      "ms\n",
      emu::Percentile(latencies_ms, 50), emu::Percentile(latencies_ms, 99));
  auto bstat = cluster->ServiceStatus(1);
  if (bstat.ok()) {
    auto get = [&](const char* k) -> unsigned long long {
      auto it = bstat->counters.find(k);
      return it == bstat->counters.end() ? 0 : it->second;
    };
    std::printf("node B service: transfers.in %llu (%s), consume.local %llu, consume.joined %llu\n",
                get("transfers.in"), emu::HumanBytes(get("bytes.in")).c_str(), get("consume.local"),
                get("consume.joined"));
  } else {
    std::printf("node B service: status unavailable (%s)\n", bstat.status().ToString().c_str());
  }
  if (auto astat = cluster->ServiceStatus(0); astat.ok()) {
    auto it = astat->counters.find("transfers.out");
    std::printf("node A service: transfers.out %llu\n",
                it == astat->counters.end() ? 0ull : static_cast<unsigned long long>(it->second));
  }

  if (o.keep)
    std::printf("\nkept: %s (node directories, logs, worker results)\n",
                cluster->base_dir().c_str());
  if (bad > 0 || !pst->success() || !cst->success()) {
    std::string why = std::to_string(bad) + " of " + std::to_string(files.size()) + " files failed";
    if (!pst->success()) why += "; producer " + pst->ToString();
    if (!cst->success()) why += "; consumer " + cst->ToString();
    return Fail(why, cluster.get(), logs);
  }
  cluster->Teardown();
  std::printf("\nOK: every file arrived complete and verified on node B.\n");
  return 0;
}

}  // namespace

int RunDemo(int argc, char** argv) {
  std::vector<std::string> args(argv, argv + argc);
  size_t i = 1;  // argv[0] is the program

  RoleOptions role;
  DemoOptions demo;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const char* name) -> const char* {
      if (i + 1 >= args.size()) {
        std::fprintf(stderr, "dyad demo: %s needs a value\n", name);
        return nullptr;
      }
      return args[++i].c_str();
    };
    if (a == "-h" || a == "--help") {
      PrintUsage();
      return 0;
    } else if (a == "--keep") {
      demo.keep = true;
    } else if (a == "--debug") {
      demo.debug = true;
    } else if (a == "--big-mib") {
      const char* v = value("--big-mib");
      if (!v || !ParseU64Arg(v, &demo.big_mib)) return 2;
    } else if (a == "--files") {
      const char* v = value("--files");
      uint64_t n = 0;
      if (!v || !ParseU64Arg(v, &n) || n > 1000000) return 2;
      demo.extra_files = static_cast<int>(n);
    } else if (a == "--mode") {
      const char* v = value("--mode");
      if (!v) return 2;
      demo.mode = v;
    } else if (a == "--role") {
      const char* v = value("--role");
      if (!v) return 2;
      role.role = v;
    } else if (a == "--manifest") {
      const char* v = value("--manifest");
      if (!v) return 2;
      role.manifest = v;
    } else if (a == "--result") {
      const char* v = value("--result");
      if (!v) return 2;
      role.result = v;
    } else if (a == "--ready") {
      const char* v = value("--ready");
      if (!v) return 2;
      role.ready = v;
    } else if (a == "--dir") {
      const char* v = value("--dir");
      if (!v) return 2;
      role.dir = v;
    } else if (a == "--no-write") {
      role.write = false;
    } else if (a == "--no-verify") {
      role.verify = false;
    } else if (a == "--no-metadata") {
      role.metadata = false;
    } else if (a == "--no-publish") {
      role.publish = false;
    } else if (a == "--defer-results") {
      role.defer_results = true;
    } else {
      std::fprintf(stderr, "dyad demo: unknown option '%s' (see dyad demo --help)\n", a.c_str());
      return 2;
    }
  }
  if (!role.role.empty()) {
    if ((role.role != "produce" && role.role != "consume") || role.manifest.empty() ||
        role.result.empty()) {
      std::fprintf(stderr, "dyad demo: --role produce|consume needs --manifest and --result\n");
      return 2;
    }
    return RunRole(role);
  }
  return RunDemoMain(demo);
}

}  // namespace dyad
