// dyad-service: the per-node DYAD daemon. See docs/service.md.
#include <malloc.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include "common/backend.h"
#include "common/config.h"
#include "common/log.h"
#include "dyad_version.h"
#include "proto/auth.h"
#include "service/rank.h"
#include "service/service.h"

namespace {

// "10%" (of the file system's size) or a number of bytes with an optional
// K, M, G or T suffix (powers of 1024) into the prefetch free-space floor.
bool ParseMinFree(const std::string& text, dyad::ServiceOptions* opt) {
  if (text.empty()) return false;
  char* end = nullptr;
  const unsigned long long n = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str()) return false;
  const std::string unit(end);
  if (unit == "%") {
    if (n > 100) return false;
    opt->prefetch_min_free_pct = static_cast<uint32_t>(n);
    opt->prefetch_min_free_bytes = 0;
    return true;
  }
  unsigned shift = 0;
  if (unit == "K" || unit == "k")
    shift = 10;
  else if (unit == "M" || unit == "m")
    shift = 20;
  else if (unit == "G" || unit == "g")
    shift = 30;
  else if (unit == "T" || unit == "t")
    shift = 40;
  else if (!unit.empty())
    return false;
  if (shift != 0 && n > (~0ull >> shift)) return false;
  opt->prefetch_min_free_bytes = static_cast<uint64_t>(n) << shift;
  opt->prefetch_min_free_pct = 0;
  return true;
}

// How long a stop may take before the service exits without waiting.
constexpr int kStopGraceMs = 3000;

// glibc's allocator, left as it starts, gives freed memory of its
// per-thread arenas back to the kernel as soon as more than 128 KiB is free
// at an arena's top (madvise, with a TLB shootdown on every CPU), and takes
// it back page fault by page fault; the service's workers allocate and free
// buffers of a small file's size (read, encoded, sealed) many times a
// second. On a 2-CPU VM, node 0's service spent 0.43-0.47 CPU-s serving 512
// files of 64 KiB, 0.06-0.07 with this (DataLoader benchmark,
// docs/prefetch.md): buffers below 4 MiB come from the arenas, and up to
// 16 MiB of free memory per arena is kept for reuse. glibc's variables
// MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ still decide when set.
void TuneAllocator() {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) mallopt(M_MMAP_THRESHOLD, 4 << 20);
  if (std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr) mallopt(M_TRIM_THRESHOLD, 16 << 20);
}

// Handles signals until one stops the service (or main is done):
// SIGHUP reopens the log files (after logrotate), SIGTERM/SIGINT stop.
void TakeSignals(const sigset_t& set, dyad::Service& service, std::atomic<bool>& exiting,
                 std::atomic<int>& stop_signal) {
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0 || exiting) return;
    if (sig == SIGHUP) {
      if (dyad::LogReopen())
        DYAD_LOG_INFO("received SIGHUP: log files reopened");
      else
        DYAD_LOG_ERROR(
            "received SIGHUP: a log file could not be reopened: %s; logging to the "
            "old file",
            std::strerror(errno));
      continue;
    }
    stop_signal = sig;
    DYAD_LOG_INFO("received %s, stopping", sig == SIGINT ? "SIGINT" : "SIGTERM");
    service.Stop();
    return;
  }
}

// The exit code of a start-up that did not complete.
int StartFailure(const dyad::Status& st, const std::atomic<int>& stop_signal) {
  if (st.code() == DYAD_RC_CANCELLED && stop_signal != 0) {
    DYAD_LOG_INFO("stopped by a signal before start-up completed");
    return 0;
  }
  DYAD_LOG_ERROR("cannot start: %s", st.ToString().c_str());
  std::fprintf(stderr, "dyad-service: cannot start: %s\n", st.ToString().c_str());
  return 1;
}

// Waits for a stop already requested; `rc` once it completed. A stop is
// bounded: sockets are shut down and store waits cancelled, so every thread
// normally ends at once. One that does not is stuck where no shutdown
// reaches it (libfabric's shm provider spins forever on a lock a killed
// peer held in shared memory); exit anyway, with 3, and say so.
int AwaitStop(dyad::Service& service, int rc) {
  if (service.WaitFor(kStopGraceMs)) return rc;
  DYAD_LOG_ERROR(
      "not stopped after %d ms: a transfer is stuck inside the transport; exiting "
      "without waiting for it",
      kStopGraceMs);
  std::_Exit(3);
}

// A setting from the environment, else its default in the configuration
// table (the one place defaults are written).
std::string Setting(const char* name) {
  std::optional<std::string> v = dyad::GetEnv(name);
  if (v && !v->empty()) return *v;
  return dyad::FindConfigEntry(name)->default_value;
}

}  // namespace

int main(int argc, char** argv) {
  TuneAllocator();
  dyad::ServiceOptions opt;
  std::optional<std::string> rank_arg;
  opt.prod_path = Setting("DYAD_PATH_PRODUCER");
  opt.cons_path = Setting("DYAD_PATH_CONSUMER");
  opt.listen = Setting("DYAD_SERVICE_LISTEN");
  opt.advertise = Setting("DYAD_SERVICE_ADVERTISE");
  opt.socket_path = dyad::DefaultServiceSocket();
  opt.kvs_url = Setting("DYAD_KVS");
  opt.dtl_mode = Setting("DYAD_DTL_MODE");
  opt.debug = dyad::EnvBool("DYAD_SYNC_DEBUG", false);
  auto mux = dyad::EnvUint("DYAD_SERVICE_MUX", 1);
  opt.service_mux = mux.ok() ? static_cast<uint32_t>(*mux) : 1;
  // Connection caps (docs/security.md) and workers; malformed values keep the default.
  for (auto [name, field] :
       {std::pair<const char*, uint32_t*>{"DYAD_MAX_CONNECTIONS", &opt.max_connections},
        {"DYAD_MAX_UNAUTHENTICATED", &opt.max_unauthenticated},
        {"DYAD_MAX_UNAUTHENTICATED_PER_PEER", &opt.max_per_peer},
        {"DYAD_WORKERS", &opt.workers},
        {"DYAD_PREFETCH_CONCURRENCY", &opt.prefetch_concurrency},
        {"DYAD_PREFETCH_PER_PEER", &opt.prefetch_per_peer}}) {
    auto v = dyad::EnvUint(name, *field);
    if (v.ok() && *v > 0 && *v <= UINT32_MAX) *field = static_cast<uint32_t>(*v);
  }
  if (auto v = dyad::EnvUint("DYAD_WORKER_IDLE_MS", 30000); v.ok() && *v > 0 && *v <= 86400000)
    opt.worker_idle_ms = static_cast<int64_t>(*v);
  double rpc_timeout_s = 60;
  if (auto t = dyad::EnvTimeoutMs("DYAD_RPC_TIMEOUT", 60000); t.ok() && *t > 0)
    rpc_timeout_s = static_cast<double>(*t) / 1000.0;
  std::string info_log, error_log, secret_file;
  opt.follow_records = dyad::EnvBool("DYAD_FOLLOW_RECORDS", true);
  opt.munge = dyad::EnvBool("DYAD_MUNGE", false);
  opt.munge_socket = Setting("DYAD_MUNGE_SOCKET");
  opt.insecure = dyad::EnvBool("DYAD_INSECURE", false);
  std::string protection = Setting("DYAD_LINK_PROTECTION");
  auto cache_bytes = dyad::EnvUint("DYAD_CACHE_BYTES", 0);
  if (!cache_bytes.ok()) {
    std::fprintf(stderr, "dyad-service: %s\n", cache_bytes.status().message().c_str());
    return 2;
  }
  opt.cache_bytes = *cache_bytes;
  std::string min_free = Setting("DYAD_PREFETCH_MIN_FREE");

  CLI::App app{
      "dyad-service: the per-node DYAD daemon. Serves the node's application processes over a "
      "Unix socket (publish, locate, consume) and the other nodes' services over TCP (file "
      "fetches, and on the root the embedded metadata store).\n"};
  app.set_help_flag("-h,--help", "Show this help and exit");
  app.set_version_flag("--version", "dyad-service " DYAD_VERSION_FULL, "Show the version and exit");
  app.add_option("PRODUCER_PATH", opt.prod_path,
                 "Producer-managed directory this service serves (default $DYAD_PATH_PRODUCER)");
  app.add_flag("-d,--debug", opt.debug, "Debug logging");
  std::string modes;
  for (const std::string& m : dyad::AllDtlModes())
    if (dyad::TransportRowForMode(m, true).ok()) modes += (modes.empty() ? "" : ", ") + m;
  app.add_option("-m,--mode", opt.dtl_mode,
                 "Transport for fetches, also the default of this node's clients (a client's "
                 "DYAD_DTL_MODE overrides it): " +
                     modes + " (default " + dyad::DefaultDtlMode() + ")");
  app.add_option("-i,--info_log", info_log, "Write info and debug messages to this file");
  app.add_option("-e,--error_log", error_log, "Write warnings and errors to this file");
  app.add_option("-r,--rank", rank_arg,
                 "Rank of this service (required unless $DYAD_SERVICE_RANK or a launcher's "
                 "task rank is set: FLUX_TASK_RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, "
                 "PMI_RANK, PMIX_RANK)")
      ->type_name("N");
  app.add_option("-l,--listen", opt.listen, "TCP HOST:PORT for other services (port 0: any)")
      ->capture_default_str();
  app.add_option("-a,--advertise", opt.advertise,
                 "HOST:PORT other services use to reach this one (default: derived from --listen)");
  app.add_option("-s,--socket", opt.socket_path,
                 "Unix socket for local clients; its directory must be private (mode 0700, "
                 "created so when missing): in a shared directory such as /tmp use a "
                 "subdirectory, e.g. /tmp/dyad-$USER/dyad.sock")
      ->capture_default_str();
  app.add_option("-k,--kvs", opt.kvs_url,
                 "Metadata store: embedded (rank 0 hosts it), embedded://HOST:PORT (the root's "
                 "address), redis://[USER:PASSWORD@]HOST:PORT[/DB] (one Redis server), "
                 "redis+cluster://HOST:PORT[,HOST:PORT...] (a Redis Cluster; the addresses are "
                 "seeds), redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB] (a primary found "
                 "through Redis Sentinel), flux:// (the KVS of the Flux instance of $FLUX_URI; "
                 "flux://?uri=URI another), memory (this service only); see docs/redis.md and "
                 "docs/configuration.md")
      ->capture_default_str();
  app.add_flag("--root", opt.host_root, "Host the embedded metadata store here (any rank)");
  app.add_option("--service-mux", opt.service_mux, "Services per node")->capture_default_str();
  app.add_option("--secret-file", secret_file,
                 "Cluster secret file (mode 600, at least 128 random bits: `dyad secret init "
                 "FILE` writes one) for service-to-service authentication (default "
                 "$DYAD_SECRET_FILE, or $DYAD_SECRET)");
  app.add_flag("--munge", opt.munge,
               "Authenticate peers with MUNGE credentials of this uid as well as (or, without a "
               "secret, instead of) the cluster secret; needs munged on every node "
               "(default $DYAD_MUNGE)");
  app.add_option("--munge-socket", opt.munge_socket,
                 "munged's socket (default $DYAD_MUNGE_SOCKET, else libmunge's default)");
  app.add_option("--protection", protection,
                 "What protects the links between services after the handshake: integrity "
                 "(AES-256-GCM tag on every message and file chunk), encrypt (also encrypted), or "
                 "none (zero-copy, for a trusted fabric only); peers use the stronger of their "
                 "two settings (default $DYAD_LINK_PROTECTION, else integrity)")
      ->capture_default_str();
  app.add_flag("--insecure", opt.insecure,
               "Allow listening without any credential, on loopback too: then every process "
               "that reaches the port (on loopback: every local user) can fetch any file of the "
               "producer directory and read and write the metadata store (default "
               "$DYAD_INSECURE)");
  app.add_option("--cons-path", opt.cons_path,
                 "Consumer directory whose incomplete temporaries are removed at start "
                 "(default $DYAD_PATH_CONSUMER)");
  app.add_option("--chunk-size", opt.chunk_size, "Transfer buffer size in bytes")
      ->capture_default_str();
  app.add_option("--cache-bytes", opt.cache_bytes,
                 "Byte budget of the copies fetched into consumer directories; past it the least "
                 "recently consumed ones that no process holds open are removed, wherever they "
                 "are (a consumer directory that is the producer directory too); this node's own "
                 "files never; a file larger than the budget is refused (0: no limit; "
                 "default $DYAD_CACHE_BYTES)")
      ->capture_default_str();
  app.add_option("--prefetch-min-free", min_free,
                 "Free space a prefetch leaves in the consumer's file system: a percentage of "
                 "its size (10%) or bytes (2G, 500M); a file that would go below it is fetched "
                 "only when consumed. Consumes are refused before any byte moves when the file "
                 "does not fit at all (default $DYAD_PREFETCH_MIN_FREE, else 10%)")
      ->capture_default_str();
  double wait_log_s = 10;
  app.add_option("--wait-log", wait_log_s,
                 "Log (info) each local read or locate that has waited this many seconds for a "
                 "publication, with its file, pid, and whether the file exists here unpublished "
                 "(0: never; `dyad status` lists every wait)")
      ->check(CLI::Range(0.0, 1e6))
      ->capture_default_str();
  app.add_option("--rpc-timeout", rpc_timeout_s,
                 "Seconds bounding non-wait requests and transfers without progress")
      ->capture_default_str();
  app.add_option("--workers", opt.workers,
                 "Threads serving requests in each of the two pools, local clients and other "
                 "services (default $DYAD_WORKERS); idle connections and requests waiting for a "
                 "publication or on a slow owner hold none")
      ->check(CLI::Range(1u, 1024u))
      ->capture_default_str();
  app.add_option(
      "--ready-file", opt.ready_file,
      "Write rank/listen/socket/pid here once serving (for scripts and tests; mode 0600, "
      "or $DYAD_SERVICE_FILE_MODE, as the -i/-e logs)");
  app.footer(
      "Signals: SIGTERM/SIGINT stop the service cleanly (also while it waits for its metadata "
      "store at start-up); SIGHUP reopens the -i/-e log files (for logrotate).\n"
      "Example (two nodes):\n"
      "  node0$ dyad-service -r 0 --secret-file ~/.dyad/secret /local/dmd\n"
      "  node1$ dyad-service -r 1 -k embedded://node0:7590 --secret-file ~/.dyad/secret "
      "/local/dmd\n"
      "Security (docs/security.md): services refuse to listen without a credential (--secret-file "
      "or --munge), on loopback too, unless --insecure; the socket directory must be the service "
      "user's, mode 0700.");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help, the version, or the error
    return rc == 0 ? 0 : 2;      // usage errors exit with 2, as dyad's
  }
  auto rank = dyad::ResolveServiceRank(rank_arg, [](const char* n) { return std::getenv(n); });
  if (!rank.ok()) {
    std::fprintf(stderr, "dyad-service: %s\n", rank.status().message().c_str());
    return 2;
  }
  opt.rank = *rank;

  if (auto m = dyad::GetEnv("DYAD_SERVICE_FILE_MODE"); m && !m->empty()) {
    auto mode = dyad::ParseFileMode(*m);
    if (!mode.ok()) {
      std::fprintf(stderr, "dyad-service: DYAD_SERVICE_FILE_MODE: %s\n",
                   mode.status().message().c_str());
      return 2;
    }
    opt.file_mode = *mode;
  }
  dyad::LogSetFileMode(opt.file_mode);
  dyad::LogSetPrefix("dyad-service[rank " + std::to_string(opt.rank) + "]");
  if (opt.debug) dyad::LogSetLevel(dyad::LogLevel::kDebug);
  if (!info_log.empty() && !dyad::LogSetInfoFile(info_log)) {
    std::fprintf(stderr, "dyad-service: cannot open info log '%s'\n", info_log.c_str());
    return 1;
  }
  if (!error_log.empty() && !dyad::LogSetErrorFile(error_log)) {
    std::fprintf(stderr, "dyad-service: cannot open error log '%s'\n", error_log.c_str());
    return 1;
  }
  if (rpc_timeout_s <= 0) {
    std::fprintf(stderr, "dyad-service: --rpc-timeout must be positive\n");
    return 2;
  }
  opt.rpc_timeout_ms = static_cast<int64_t>(rpc_timeout_s * 1000);
  opt.wait_log_ms = static_cast<int64_t>(wait_log_s * 1000);
  if (!ParseMinFree(min_free, &opt)) {
    std::fprintf(stderr,
                 "dyad-service: --prefetch-min-free '%s': expected a percentage (10%%) or bytes "
                 "(2G, 500M, 1048576)\n",
                 min_free.c_str());
    return 2;
  }
  auto secret = dyad::LoadClusterSecret(secret_file);
  if (!secret.ok()) {
    std::fprintf(stderr, "dyad-service: %s\n", secret.status().ToString().c_str());
    return 1;
  }
  opt.secret = *secret;
  auto level = dyad::ParseLinkProtection(protection);
  if (!level.ok()) {
    std::fprintf(stderr, "dyad-service: --protection: %s\n", level.status().message().c_str());
    return 2;
  }
  opt.protection = *level;

  // Signals are taken synchronously by one thread (all others block them),
  // from before start-up: SIGTERM/SIGINT also end the waits of Start().
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  signal(SIGPIPE, SIG_IGN);

  dyad::Service service(opt);
  std::atomic<bool> exiting{false};
  std::atomic<int> stop_signal{0};
  std::thread signals([&] { TakeSignals(set, service, exiting, stop_signal); });
  const dyad::Status st = service.Start();
  if (st.ok()) {
    signals.join();  // returns once a signal has stopped the service
    return AwaitStop(service, 0);
  }
  exiting = true;
  service.Stop();
  pthread_kill(signals.native_handle(), SIGTERM);  // wakes the signal thread if it still waits
  signals.join();
  return AwaitStop(service, StartFailure(st, stop_signal));
}
