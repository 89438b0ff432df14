// module.cc: dyad.so, the Flux broker module.
//
// `flux module load dyad.so [OPTIONS] [PRODUCER_PATH]` on a broker:
//  * agrees with the other modules of the instance on a cluster secret
//    (secret.cc) and writes it to a 0600 file in the instance's private run
//    directory;
//  * runs this broker's dyad-service as a supervised child of the broker
//    (supervisor.h) on the socket derived from the broker's local-uri
//    (FluxServiceSocket), an ephemeral TCP port, the module's store (flux://
//    by default) and that secret, and returns from the load only once the
//    service is ready;
//  * serves `dyad.fetch` in upstream DYAD's FLUX_RPC format for files
//    beneath the producer directory, owner only;
//  * answers `flux module stats dyad` (dyad.stats-get) with the child's state
//    and the service's counters.
// `flux module remove dyad` stops the service (SIGTERM, then SIGKILL).
#include <dlfcn.h>
#include <fcntl.h>
#include <flux/core.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <list>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "common/config.h"
#include "common/fsutil.h"
#include "common/trace.h"
#include "flux/fetch_file.h"
#include "flux/module_options.h"
#include "flux/secret.h"
#include "flux/supervisor.h"

namespace dyad {
namespace {

constexpr double kLockWaitS = 60;                          // a producer's lock, at most
constexpr double kStatusTimeoutS = 2;                      // stats-get's round trip to the service
constexpr size_t kMaxStatsJobs = 8;                        // stats round trips in flight at once
constexpr const char* kRootKey = "dyadmod.embedded-root";  // -k embedded: rank 0's address

struct Module;

// One dyad.fetch in progress: a chunk per reactor turn, so concurrent
// fetches interleave and the module never blocks its reactor.
struct FetchOp {
  Module* m = nullptr;
  const flux_msg_t* msg = nullptr;
  std::string upath;
  FetchFile file;
  flux_watcher_t* timer = nullptr;
  bool locked = false;
  double lock_deadline = 0;
  double lock_backoff = 0.001;
  std::list<std::unique_ptr<FetchOp>>::iterator self;
};

// A dyad.stats-get whose status round trip runs on its own thread.
struct StatsJob {
  const flux_msg_t* msg = nullptr;
  std::thread thread;
  std::string service_part;
  std::atomic<bool> done{false};
};

struct Module {
  flux_t* h = nullptr;
  uint32_t rank = 0;
  ModuleOptions opt;
  std::string uri;
  std::string socket;
  std::string producer;  // canonical producer directory
  std::string secret_file;
  std::string ready_file;
  std::unique_ptr<Supervisor> sup;
  flux_msg_handler_t** handlers = nullptr;
  std::list<std::unique_ptr<FetchOp>> fetches;
  std::list<std::unique_ptr<StatsJob>> stats_jobs;
  int stats_efd = -1;  // a finished round trip wakes the reactor
  flux_watcher_t* stats_w = nullptr;
  uint64_t fetch_requests = 0, fetch_served = 0, fetch_bytes = 0, fetch_refused = 0,
           fetch_errors = 0, fetch_lock_waits = 0;
};

void FinishFetch(FetchOp* op) {
  Module* m = op->m;
  flux_watcher_destroy(op->timer);
  flux_msg_decref(op->msg);
  m->fetches.erase(op->self);  // destroys op
}

void FailFetch(FetchOp* op, int errnum, const std::string& why) {
  ++op->m->fetch_errors;
  flux_log(op->m->h, LOG_ERR, "dyad.fetch '%s': %s", op->upath.c_str(), why.c_str());
  if (flux_respond_error(op->m->h, op->msg, errnum, why.c_str()) < 0)
    flux_log_error(op->m->h, "dyad.fetch: flux_respond_error");
  FinishFetch(op);
}

// Callbacks run on the broker's module thread from C code: an exception
// must never unwind into libflux (it would end the broker). Each logs and
// answers what it can instead.
void FetchStep(flux_reactor_t* r, flux_watcher_t* w, int, void* arg);

void FetchStepUnguarded(flux_reactor_t* r, flux_watcher_t* w, void* arg) {
  auto* op = static_cast<FetchOp*>(arg);
  Module* m = op->m;
  if (!op->locked) {
    if (!op->file.TryLockShared()) {
      if (flux_reactor_now(r) >= op->lock_deadline)
        return FailFetch(op, ETIMEDOUT,
                         "'" + op->upath + "' stayed locked by its producer for " +
                             std::to_string(static_cast<int>(kLockWaitS)) + " s");
      if (op->lock_backoff == 0.001) ++m->fetch_lock_waits;
      flux_timer_watcher_reset(w, op->lock_backoff, 0);
      op->lock_backoff = std::min(op->lock_backoff * 2, 0.05);
      flux_watcher_start(w);
      return;
    }
    op->locked = true;
  }
  std::string chunk;
  Status st = op->file.Next(&chunk, static_cast<size_t>(m->opt.fetch_chunk));
  if (!st.ok()) return FailFetch(op, EIO, st.message());
  if (chunk.empty()) {
    // End of stream, as upstream's consumers expect it.
    ++m->fetch_served;
    if (flux_respond_error(m->h, op->msg, ENODATA, nullptr) < 0)
      flux_log_error(m->h, "dyad.fetch: flux_respond_error");
    return FinishFetch(op);
  }
  if (flux_respond_raw(m->h, op->msg, chunk.data(), static_cast<int>(chunk.size())) < 0) {
    const int err = errno;
    return FailFetch(op, err, std::string("flux_respond_raw: ") + std::strerror(err));
  }
  m->fetch_bytes += chunk.size();
  flux_timer_watcher_reset(w, 0, 0);
  flux_watcher_start(w);
}

void OnFetchUnguarded(flux_t* h, const flux_msg_t* msg, void* arg) {
  auto* m = static_cast<Module*>(arg);
  ++m->fetch_requests;
  uint32_t rolemask = 0;
  const char* upath = nullptr;
  auto refuse = [&](int errnum, const std::string& why) {
    ++m->fetch_refused;
    flux_log(h, LOG_WARNING, "dyad.fetch refused: %s", why.c_str());
    if (flux_respond_error(h, msg, errnum, why.c_str()) < 0)
      flux_log_error(h, "dyad.fetch: flux_respond_error");
  };
  if (flux_msg_get_rolemask(msg, &rolemask) < 0 || (rolemask & FLUX_ROLE_OWNER) == 0)
    return refuse(EPERM, "dyad.fetch is for the instance owner only");
  if (flux_request_unpack(msg, nullptr, "{s:s}", "upath", &upath) < 0)
    return refuse(EPROTO, "dyad.fetch needs {\"upath\": PATH}");
  if (!flux_msg_is_streaming(msg))
    return refuse(EPROTO, "dyad.fetch is a streaming RPC (FLUX_RPC_STREAMING)");
  int errnum = 0;
  Result<FetchFile> f = FetchFile::Open(m->producer, upath, &errnum);
  if (!f.ok()) return refuse(errnum, f.status().message());
  auto op = std::make_unique<FetchOp>();
  op->m = m;
  op->msg = flux_msg_incref(msg);
  op->upath = upath;
  op->file = std::move(*f);
  flux_reactor_t* r = flux_get_reactor(h);
  op->lock_deadline = flux_reactor_now(r) + kLockWaitS;
  op->timer = flux_timer_watcher_create(r, 0, 0, FetchStep, op.get());
  if (op->timer == nullptr) {
    flux_msg_decref(op->msg);
    return refuse(errno, "cannot create a timer");
  }
  FetchOp* raw = op.get();
  m->fetches.push_back(std::move(op));
  raw->self = std::prev(m->fetches.end());
  flux_watcher_start(raw->timer);
}

void FetchStep(flux_reactor_t* r, flux_watcher_t* w, int, void* arg) {
  auto* op = static_cast<FetchOp*>(arg);
  try {
    FetchStepUnguarded(r, w, arg);
  } catch (const std::exception& e) {
    FailFetch(op, ENOMEM, std::string("dyad.fetch: ") + e.what());
  }
}

void OnFetch(flux_t* h, flux_msg_handler_t*, const flux_msg_t* msg, void* arg) {
  try {
    OnFetchUnguarded(h, msg, arg);
  } catch (const std::exception& e) {
    flux_log(h, LOG_ERR, "dyad.fetch: %s", e.what());
    flux_respond_error(h, msg, ENOMEM, e.what());
  }
}

// The module's part of dyad.stats-get (module thread; no closing brace).
std::string ModulePart(Module* m) {
  const Supervisor::Snapshot s = m->sup->Get();
  std::ostringstream j;
  j << "{\"rank\":" << m->rank << ",\"socket\":" << JsonQuote(m->socket)
    << ",\"producer_path\":" << JsonQuote(m->producer) << ",\"store\":" << JsonQuote(m->opt.kvs)
    << ",\"service\":{\"state\":" << JsonQuote(s.state) << ",\"pid\":" << s.pid
    << ",\"starts\":" << s.starts << ",\"restarts\":" << s.restarts << ",\"exits\":" << s.exits
    << ",\"last_exit\":" << JsonQuote(s.last_exit) << ",\"up_since\":" << std::fixed << s.up_since
    << "}";
  j.unsetf(std::ios::fixed);
  j << ",\"fetch\":{\"requests\":" << m->fetch_requests << ",\"served\":" << m->fetch_served
    << ",\"bytes\":" << m->fetch_bytes << ",\"refused\":" << m->fetch_refused
    << ",\"errors\":" << m->fetch_errors << ",\"lock_waits\":" << m->fetch_lock_waits
    << ",\"in_progress\":" << m->fetches.size() << "}";
  return j.str();
}

// The service's own counters and identity, by a status round trip over its
// socket, bounded (kStatusTimeoutS); a service that is down shows why
// instead. Runs on a thread of its own, never on the module's reactor.
std::string ServicePart(const std::string& socket) {
  std::ostringstream j;
  try {
    ClientConfig cc;
    cc.service_socket = socket;
    cc.rpc_timeout_ms = static_cast<int64_t>(kStatusTimeoutS * 1000);
    Result<std::shared_ptr<Client>> client = Client::Create(cc);
    Result<StatusReply> reply =
        client.ok() ? (*client)->ServiceStatus() : Result<StatusReply>(client.status());
    if (reply.ok()) {
      j << ",\"counters\":{";
      bool first = true;
      for (const auto& [k, v] : reply->counters) {
        j << (first ? "" : ",") << JsonQuote(k) << ":" << v;
        first = false;
      }
      j << "},\"info\":{";
      first = true;
      for (const auto& [k, v] : reply->info) {
        j << (first ? "" : ",") << JsonQuote(k) << ":" << JsonQuote(v);
        first = false;
      }
      j << "}";
    } else {
      j << ",\"status_error\":" << JsonQuote(reply.status().message());
    }
  } catch (const std::exception& e) {
    j.str("");
    j << ",\"status_error\":" << JsonQuote(e.what());
  }
  return j.str();
}

// Answers the stats requests whose round trip ended (or all, at unload).
void ReapStats(Module* m, bool all) {
  for (auto it = m->stats_jobs.begin(); it != m->stats_jobs.end();) {
    StatsJob* job = it->get();
    if (!all && !job->done.load()) {
      ++it;
      continue;
    }
    job->thread.join();  // done, or done within kStatusTimeoutS
    const std::string json = ModulePart(m) + job->service_part + "}";
    if (flux_respond(m->h, job->msg, json.c_str()) < 0)
      flux_log_error(m->h, "dyad.stats-get: flux_respond");
    flux_msg_decref(job->msg);
    it = m->stats_jobs.erase(it);
  }
}

void OnStatsDone(flux_reactor_t*, flux_watcher_t*, int, void* arg) {
  auto* m = static_cast<Module*>(arg);
  uint64_t n;
  if (::read(m->stats_efd, &n, sizeof n) < 0 && errno == EAGAIN) return;
  try {
    ReapStats(m, false);
  } catch (const std::exception& e) {
    flux_log(m->h, LOG_ERR, "dyad.stats-get: %s", e.what());
  }
}

void OnStatsUnguarded(flux_t* h, const flux_msg_t* msg, void* arg) {
  auto* m = static_cast<Module*>(arg);
  if (m->stats_jobs.size() >= kMaxStatsJobs) {
    const std::string json =
        ModulePart(m) + ",\"status_error\":\"too many stats requests in progress\"}";
    if (flux_respond(h, msg, json.c_str()) < 0) flux_log_error(h, "dyad.stats-get: flux_respond");
    return;
  }
  auto job = std::make_unique<StatsJob>();
  StatsJob* j = job.get();
  j->msg = flux_msg_incref(msg);
  m->stats_jobs.push_back(std::move(job));
  const std::string socket = m->socket;
  const int efd = m->stats_efd;
  j->thread = std::thread([j, socket, efd] {
    j->service_part = ServicePart(socket);
    j->done.store(true);
    const uint64_t one = 1;
    if (::write(efd, &one, sizeof one) < 0) {
      // (an eventfd write fails only on overflow; the next one wakes it)
    }
  });
}

void OnStats(flux_t* h, flux_msg_handler_t*, const flux_msg_t* msg, void* arg) {
  try {
    OnStatsUnguarded(h, msg, arg);
  } catch (const std::exception& e) {
    flux_log(h, LOG_ERR, "dyad.stats-get: %s", e.what());
    flux_respond_error(h, msg, ENOMEM, e.what());
  }
}

// dyad-service: --service, else beside dyad.so (PREFIX/lib/dyad.so ->
// PREFIX/bin/dyad-service), else where the build put it.
std::string FindService(const ModuleOptions& o) {
  if (!o.service.empty()) return o.service;
  Dl_info info;
  if (::dladdr(reinterpret_cast<void*>(&FindService), &info) != 0 && info.dli_fname != nullptr) {
    std::string dir = info.dli_fname;
    dir = dir.substr(0, dir.rfind('/') + 1);
    for (const char* rel : {"../bin/dyad-service", "../../bin/dyad-service", "../dyad-service"}) {
      const std::string p = dir + rel;
      if (::access(p.c_str(), X_OK) == 0) return CanonicalPath(p);
    }
  }
#ifdef DYAD_FLUX_BUILD_SERVICE
  if (::access(DYAD_FLUX_BUILD_SERVICE, X_OK) == 0) return DYAD_FLUX_BUILD_SERVICE;
#endif
  return "";
}

Status WriteSecretFile(const std::string& path, const std::string& secret) {
  ::unlink(path.c_str());
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return StatusFromErrno(errno, "create secret file '" + path + "'");
  const std::string line = secret + "\n";
  const bool ok = ::fchmod(fd, 0600) == 0 &&
                  ::write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  const int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(path.c_str());
    return StatusFromErrno(err, "write secret file '" + path + "'");
  }
  return Status::OK();
}

// The address rank 0's service advertises (its ready file's advertise=).
std::string ReadyValue(const std::string& ready_file, const std::string& key) {
  std::ifstream in(ready_file);
  std::string line;
  while (std::getline(in, line))
    if (line.compare(0, key.size() + 1, key + "=") == 0) return line.substr(key.size() + 1);
  return "";
}

Status CommitValue(flux_t* h, const std::string& key, const std::string& value) {
  flux_kvs_txn_t* txn = flux_kvs_txn_create();
  if (txn == nullptr) return StatusFromErrno(errno, "flux_kvs_txn_create");
  flux_future_t* f = nullptr;
  Status st;
  if (flux_kvs_txn_put(txn, 0, key.c_str(), value.c_str()) < 0 ||
      (f = flux_kvs_commit(h, nullptr, 0, txn)) == nullptr || flux_future_wait_for(f, 30) < 0 ||
      flux_future_get(f, nullptr) < 0)
    st = StatusFromErrno(errno, "commit " + key + " to the Flux KVS");
  flux_future_destroy(f);
  flux_kvs_txn_destroy(txn);
  return st;
}

Result<std::string> WaitValue(flux_t* h, const std::string& key, double timeout_s) {
  flux_future_t* f = flux_kvs_lookup(h, nullptr, FLUX_KVS_WAITCREATE, key.c_str());
  const char* v = nullptr;
  if (f == nullptr || flux_future_wait_for(f, timeout_s) < 0 || flux_kvs_lookup_get(f, &v) < 0) {
    const int err = errno;
    flux_future_destroy(f);
    if (err == ETIMEDOUT)
      return Status(DYAD_RC_TIMEOUT, "'" + key + "' did not appear in the Flux KVS within " +
                                         std::to_string(static_cast<int>(timeout_s)) +
                                         " s (is dyad.so loaded on rank 0?)");
    return StatusFromErrno(err, "look up " + key + " in the Flux KVS");
  }
  std::string out = v != nullptr ? v : "";
  flux_future_destroy(f);
  // flux_kvs_txn_put stored a JSON string value.
  if (out.size() >= 2 && out.front() == '"' && out.back() == '"')
    out = out.substr(1, out.size() - 2);
  return out;
}

int Refuse(flux_t* h, const Status& st, int errnum) {
  std::istringstream lines(st.message());
  std::string line;
  while (std::getline(lines, line)) flux_log(h, LOG_ERR, "%s", line.c_str());
  errno = errnum;
  return -1;
}

int Run(flux_t* h, int argc, char** argv) {
  flux_log_set_appname(h, "dyad");
  std::vector<std::string> args(argv, argv + argc);
  Result<ModuleOptions> opt = ParseModuleOptions(args);
  if (!opt.ok()) return Refuse(h, opt.status(), EINVAL);
  if (opt->help) {
    std::istringstream lines(ModuleHelp());
    std::string line;
    while (std::getline(lines, line)) flux_log(h, LOG_INFO, "%s", line.c_str());
    return 0;
  }
  auto m = std::make_unique<Module>();
  m->h = h;
  m->opt = *opt;
  if (flux_get_rank(h, &m->rank) < 0)
    return Refuse(h, Status(DYAD_RC_FLUXFAIL, "flux_get_rank failed"), errno);
  const char* uri = flux_attr_get(h, "local-uri");
  m->uri = uri != nullptr ? uri : "";
  m->socket = FluxServiceSocket(m->uri);
  if (m->socket.empty())
    return Refuse(h,
                  Status(DYAD_RC_FLUXFAIL,
                         "this broker's local-uri '" + m->uri + "' is not local:///DIR/NAME"),
                  EINVAL);
  std::string producer = m->opt.producer_path;
  if (producer.empty()) producer = GetEnv("DYAD_PATH_PRODUCER").value_or("");
  if (producer.empty())
    return Refuse(h,
                  Status(DYAD_RC_BADMANAGEDPATH,
                         "dyad.so needs a producer directory: flux module load dyad.so "
                         "[OPTIONS] PRODUCER_PATH (or DYAD_PATH_PRODUCER in the broker's "
                         "environment)"),
                  EINVAL);
  if (producer[0] != '/')
    return Refuse(h,
                  Status(DYAD_RC_BADMANAGEDPATH,
                         "the producer path '" + producer +
                             "' must be absolute (the broker's working directory is not yours)"),
                  EINVAL);
  const std::string base = m->socket.substr(0, m->socket.size() - std::strlen(".sock"));
  m->secret_file = base + ".secret";
  m->ready_file = base + ".ready";

  const std::string service = FindService(m->opt);
  if (service.empty())
    return Refuse(h,
                  Status(DYAD_RC_NOSERVICE,
                         "dyad-service not found beside dyad.so (../bin/dyad-service); "
                         "give it with --service PATH"),
                  ENOENT);

  // The instance's cluster secret (secret.h), as a 0600 file for the child.
  Result<std::string> secret = AgreeClusterSecret(h, m->opt.ready_timeout_s);
  if (!secret.ok()) return Refuse(h, secret.status(), EAGAIN);
  if (Status st = WriteSecretFile(m->secret_file, *secret); !st.ok()) return Refuse(h, st, EIO);

  std::vector<std::string> sargs = {service,        "--rank",        std::to_string(m->rank),
                                    "--socket",     m->socket,       "--listen",
                                    "0.0.0.0:0",    "--secret-file", m->secret_file,
                                    "--ready-file", m->ready_file};
  std::string kvs = m->opt.kvs;
  if (kvs == "embedded" && m->rank != 0) {
    Result<std::string> root = WaitValue(h, kRootKey, m->opt.ready_timeout_s);
    if (!root.ok()) return Refuse(h, root.status(), ETIMEDOUT);
    kvs = "embedded://" + *root;
  }
  sargs.insert(sargs.end(), {"--kvs", kvs});
  if (!m->opt.mode.empty()) sargs.insert(sargs.end(), {"--mode", m->opt.mode});
  if (m->opt.debug) sargs.push_back("--debug");
  const std::string r = std::to_string(m->rank);
  if (!m->opt.info_log.empty())
    sargs.insert(sargs.end(), {"--info_log", m->opt.info_log + "." + r});
  if (!m->opt.error_log.empty())
    sargs.insert(sargs.end(), {"--error_log", m->opt.error_log + "." + r});
  sargs.push_back(producer);

  Supervisor::Config sc;
  sc.uri = m->uri;
  sc.rank = m->rank;
  sc.argv = sargs;
  sc.env = {{"FLUX_URI", m->uri}};
  sc.ready_file = m->ready_file;
  m->sup = std::make_unique<Supervisor>(sc);
  flux_log(h, LOG_INFO, "starting dyad-service rank %u on %s (store %s)", m->rank,
           m->socket.c_str(), RedactSecrets(kvs).c_str());
  if (Status st = m->sup->Start(m->opt.ready_timeout_s); !st.ok()) {
    m->sup->Stop();
    ::unlink(m->secret_file.c_str());
    return Refuse(h, st, st.code() == DYAD_RC_TIMEOUT ? ETIMEDOUT : ECHILD);
  }
  m->producer = CanonicalPath(producer);
  if (m->opt.kvs == "embedded" && m->rank == 0) {
    const std::string addr = ReadyValue(m->ready_file, "advertise");
    if (Status st = CommitValue(h, kRootKey, addr); !st.ok()) {
      m->sup->Stop();
      ::unlink(m->secret_file.c_str());
      return Refuse(h, st, EIO);
    }
  }

  const struct flux_msg_handler_spec htab[] = {
      {FLUX_MSGTYPE_REQUEST, "dyad.fetch", OnFetch, FLUX_ROLE_ALL},
      {FLUX_MSGTYPE_REQUEST, "dyad.stats-get", OnStats, 0},
      FLUX_MSGHANDLER_TABLE_END,
  };
  int rc = 0;
  m->stats_efd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (m->stats_efd >= 0)
    m->stats_w = flux_fd_watcher_create(flux_get_reactor(h), m->stats_efd, FLUX_POLLIN, OnStatsDone,
                                        m.get());
  if (m->stats_w == nullptr) {
    flux_log_error(h, "dyad.so: eventfd watcher");
    rc = -1;
  } else if (flux_msg_handler_addvec(h, htab, m.get(), &m->handlers) < 0) {
    flux_log_error(h, "flux_msg_handler_addvec");
    rc = -1;
  } else {
    flux_watcher_start(m->stats_w);
    flux_log(h, LOG_INFO, "dyad.so loaded on rank %u: producer %s, socket %s", m->rank,
             m->producer.c_str(), m->socket.c_str());
    if (flux_reactor_run(flux_get_reactor(h), 0) < 0) {
      flux_log_error(h, "flux_reactor_run");
      rc = -1;
    }
  }
  flux_msg_handler_delvec(m->handlers);
  ReapStats(m.get(), true);  // (each within kStatusTimeoutS)
  flux_watcher_destroy(m->stats_w);
  if (m->stats_efd >= 0) ::close(m->stats_efd);
  while (!m->fetches.empty()) {
    FetchOp* op = m->fetches.front().get();
    flux_respond_error(h, op->msg, ECANCELED, "dyad.so is being removed");
    FinishFetch(op);
  }
  flux_log(h, LOG_INFO, "stopping dyad-service");
  m->sup->Stop();
  ::unlink(m->secret_file.c_str());
  ::unlink(m->ready_file.c_str());
  return rc;
}

}  // namespace
}  // namespace dyad

extern "C" {
__attribute__((visibility("default"))) const char* mod_name = "dyad";
__attribute__((visibility("default"))) int mod_main(flux_t* h, int argc, char** argv) {
  try {
    return dyad::Run(h, argc, argv);
  } catch (const std::exception& e) {
    // Never let an exception unwind into the broker.
    flux_log(h, LOG_ERR, "dyad.so: %s", e.what());
    errno = EIO;
    return -1;
  }
}
}
