#include "service/service.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "common/config.h"
#include "common/format.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "common/safety.h"
#include "common/time.h"
#include "common/trace.h"
#include "proto/munge/munge.h"
#include "service/advertise.h"
#include "service/dispatch.h"
#include "service/file_server.h"
#include "service/peer_waits.h"
#include "service/peers.h"
#include "service/placement.h"
#include "service/prefetch.h"
#include "service/record_feed.h"
#include "service/server.h"
#include "service/transfers.h"
#include "service/transports.h"
#include "service/versions.h"
#include "service/waits.h"

namespace dyad {

namespace {

// Sends the loop makes itself (refusals) on sockets whose buffer is empty.
constexpr int64_t kRefusalReplyMs = 100;

// The store URL with any password replaced, for logs and status replies.
std::string RedactUrl(const std::string& url) { return RedactSecrets(url); }

std::string HostName() {
  char buf[256] = {0};
  if (gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

uint64_t NewIncarnation() {
  uint64_t v = 0;
  while (v == 0) {
    if (!RandomBytes(&v, sizeof v).ok()) v = WallNs() ^ static_cast<uint64_t>(getpid());
  }
  return v;
}

}  // namespace

Service::Service(ServiceOptions options) : opt_(std::move(options)) {}

Service::~Service() {
  Stop();
  Wait();
}

Status Service::Start() {
  {
    std::lock_guard<std::mutex> lk(stop_mu_);
    if (started_) return Status(DYAD_RC_SYSFAIL, "service already started");
    started_ = true;
    if (stopping_) {
      stopped_ = true;
      return Status(DYAD_RC_CANCELLED, "stopped before start-up");
    }
    starting_ = true;
  }
  Status st = StartSteps();
  bool teardown = false;
  {
    std::lock_guard<std::mutex> lk(stop_mu_);
    starting_ = false;
    // A Stop() during start-up left the teardown to us; so does a failure.
    if (stopping_ || !st.ok()) {
      teardown = true;
      stopping_ = true;
      if (kvs_) kvs_->Shutdown();
    }
  }
  if (!teardown) return st;
  Teardown();
  return st.ok() ? Status(DYAD_RC_CANCELLED, "stopped during start-up") : st;
}

Status Service::StartSteps() {
  incarnation_ = NewIncarnation();
  started_ns_ = WallNs();
  hostname_ = HostName();
  if (opt_.service_mux == 0) opt_.service_mux = 1;
  node_idx_ = opt_.rank / opt_.service_mux;
  // However the secret arrived (dyad-service reads it with LoadClusterSecret,
  // which checks it too; embedders set it directly).
  if (!opt_.secret.empty())
    DYAD_RETURN_IF_ERROR(CheckSecretStrength(opt_.secret, "the service's options"));
  Result<std::shared_ptr<const Authenticator>> auth = OpenAuthenticator(
      ServiceCredentials{opt_.secret, opt_.munge, opt_.munge_socket, opt_.protection});
  if (!auth.ok()) return auth.status();
  auth_ = std::move(*auth);

  RaiseDescriptorLimit();
  DYAD_RETURN_IF_ERROR(PrepareDirectories());
  TransportOptions topt;
  topt.chunk_size = opt_.chunk_size;
  topt.idle_ms = opt_.rpc_timeout_ms;
  transports_ = std::make_unique<TransportSet>(topt);
  DYAD_RETURN_IF_ERROR(transports_->Init(opt_.dtl_mode));
  DYAD_RETURN_IF_ERROR(OpenListeners());
  dispatch_ = std::make_unique<Dispatcher>(opt_.rank, opt_.rpc_timeout_ms, &stats_);
  // Twice the workers of the old two pools: the bound of blocking calls.
  // Started before the store is opened, which runs its timers, feeds and
  // waits on it (KvsOptions::runtime).
  runtime_ = std::make_unique<Runtime>(2 * std::max<size_t>(opt_.workers, 1), opt_.worker_idle_ms);
  DYAD_RETURN_IF_ERROR(runtime_->Start());
  {
    std::lock_guard<std::mutex> lk(stop_mu_);
    startup_stop_ = std::make_unique<dyad::Stop>(runtime_->executor(), &runtime_->stopping());
    if (stopping_) startup_stop_->Fire(Status(DYAD_RC_CANCELLED, "stopped during start-up"));
  }
  DYAD_RETURN_IF_ERROR(OpenStore());
  BuildParts();
  RouteRequests();
  TraceSetProcessName("dyad-service rank " + std::to_string(opt_.rank) + " (" + hostname_ + ")");

  // Serve before registering: the root must answer its own registration
  // and others may start fetching as soon as the record is visible.
  DYAD_RETURN_IF_ERROR(StartServer());
  DYAD_RETURN_IF_ERROR(RegisterMembership());
  runtime_->Spawn(Upkeep());

  DYAD_LOG_INFO(
      "serving: rank %u (incarnation %016llx), peers on %s, clients on %s, producer "
      "path %s, store %s, transport %s",
      opt_.rank, static_cast<unsigned long long>(incarnation_), advertise_.c_str(),
      opt_.socket_path.c_str(), prod_real_.empty() ? "(none)" : prod_real_.c_str(),
      StoreDescription().c_str(), transports_->Default().name().c_str());
  return WriteReadyFile();
}

// One descriptor per connection: use the hard limit, not the usual soft
// 1024, and keep the connection cap below it, so the cap (not EMFILE) is
// what refuses the excess.
void Service::RaiseDescriptorLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) {
      DYAD_LOG_WARN("cannot raise the descriptor limit: %s", std::strerror(errno));
      ::getrlimit(RLIMIT_NOFILE, &rl);
    }
  }
  // Room for the store's, the transports' and the files' descriptors.
  constexpr rlim_t kReserve = 256;
  const rlim_t fit = rl.rlim_cur > 2 * kReserve ? rl.rlim_cur - kReserve : rl.rlim_cur / 2;
  if (opt_.max_connections > fit) {
    DYAD_LOG_INFO("connection cap lowered from %u to %llu to fit the descriptor limit (%llu)",
                  opt_.max_connections, static_cast<unsigned long long>(fit),
                  static_cast<unsigned long long>(rl.rlim_cur));
    opt_.max_connections = static_cast<uint32_t>(fit);
  }
}

Status Service::PrepareDirectories() {
  if (!opt_.prod_path.empty()) {
    if (::mkdir(opt_.prod_path.c_str(), 0755) != 0 && errno != EEXIST)
      return StatusFromErrno(errno, "create producer directory '" + opt_.prod_path + "'",
                             DYAD_RC_BADMANAGEDPATH);
    prod_real_ = CanonicalPath(opt_.prod_path);
    const size_t n = RemoveStaleTemporaries(prod_real_);
    if (n > 0) DYAD_LOG_INFO("removed %zu incomplete temporaries under %s", n, prod_real_.c_str());
    // Before any client is served: copies placed by an earlier run keep
    // no stamp a client would take as current without asking.
    const size_t demoted = NodeCache::DemoteStamps(prod_real_);
    if (demoted > 0)
      DYAD_LOG_INFO("withdrew the revocable stamps of %zu copies placed by an earlier run under %s",
                    demoted, prod_real_.c_str());
  }
  if (!opt_.cons_path.empty()) {
    const std::string cons = CanonicalPath(opt_.cons_path);
    if (cons != prod_real_) {
      const size_t n = RemoveStaleTemporaries(cons);
      if (n > 0) DYAD_LOG_INFO("removed %zu incomplete temporaries under %s", n, cons.c_str());
    }
  }
  return Status::OK();
}

Status Service::OpenListeners() {
  // The TCP listener first: with port 0 the advertised address needs the real port.
  Result<SocketAddress> laddr = ParseAddress(opt_.listen);
  if (!laddr.ok()) return laddr.status().Annotate("--listen");
  if (laddr->is_unix) return Status(DYAD_RC_BADREQUEST, "--listen must be a TCP HOST:PORT");
  DYAD_RETURN_IF_ERROR(CheckListenPolicy(*laddr, auth_->has_credential(), opt_.insecure));
  Result<UniqueFd> tcp = Listen(*laddr);
  if (!tcp.ok()) return tcp.status().Annotate("listen for peers");
  tcp_listener_ = std::move(*tcp);
  Result<SocketAddress> bound = BoundAddress(tcp_listener_.get());
  if (!bound.ok()) return bound.status();
  listen_bound_ = bound->ToString();
  AdvertiseInput ai;
  ai.listen_host = laddr->host;
  ai.port = bound->port;
  ai.hostname = hostname_;
  ai.store_host = StoreEndpointOf(opt_.kvs_url).host;
  ai.explicit_address = opt_.advertise;
  Result<AdvertiseChoice> adv = ChooseAdvertiseAddress(ai, SystemNetView());
  if (!adv.ok()) return adv.status();
  advertise_ = adv->address;
  if (!adv->note.empty()) DYAD_LOG_INFO("%s", adv->note.c_str());

  if (opt_.socket_path.empty()) return Status(DYAD_RC_BADREQUEST, "no Unix socket path");
  const size_t slash = opt_.socket_path.rfind('/');
  if (slash != std::string::npos && slash > 0)
    DYAD_RETURN_IF_ERROR(PrepareSocketDirectory(opt_.socket_path.substr(0, slash)));
  Result<SocketAddress> uaddr = ParseAddress("unix:" + opt_.socket_path);
  if (!uaddr.ok()) return uaddr.status();
  Result<UniqueFd> ux = Listen(*uaddr);
  if (!ux.ok()) return ux.status().Annotate("listen for local clients");
  unix_listener_ = std::move(*ux);
  return Status::OK();
}

Status Service::OpenStore() {
  KvsOptions kopt;
  kopt.secret = opt_.secret;
  kopt.auth = auth_;
  kopt.self_rank = opt_.rank;
  kopt.self_incarnation = incarnation_;
  kopt.rpc_timeout_ms = opt_.rpc_timeout_ms;
  kopt.router = dispatch_.get();
  kopt.runtime = runtime_.get();
  kopt.host_root = opt_.host_root;
  Result<std::unique_ptr<Kvs>> kvs = OpenKvs(opt_.kvs_url, kopt);
  if (!kvs.ok())
    return kvs.status().Annotate("open metadata store '" + RedactUrl(opt_.kvs_url) + "'");
  // Published under the lock: a Stop() from another thread shuts it down.
  std::lock_guard<std::mutex> lk(stop_mu_);
  kvs_ = std::shared_ptr<Kvs>(std::move(*kvs));
  if (stopping_) kvs_->Shutdown();
  return Status::OK();
}

void Service::BuildParts() {
  peers_ = std::make_unique<PeerDirectory>(
      kvs_.get(), auth_.get(), PeerIdentity{opt_.rank, incarnation_}, opt_.rpc_timeout_ms);
  PlacementConfig pc;
  pc.rank = opt_.rank;
  pc.node_idx = node_idx_;
  pc.service_mux = opt_.service_mux;
  pc.prod_real = prod_real_;
  pc.rpc_timeout_ms = opt_.rpc_timeout_ms;
  pc.prefetch_min_free_bytes = opt_.prefetch_min_free_bytes;
  pc.prefetch_min_free_pct = opt_.prefetch_min_free_pct;
  waits_ = std::make_unique<WaitRegistry>(std::vector<std::string>{prod_real_});
  transfers_in_flight_ = std::make_unique<TransferRegistry>();
  node_cache_ = std::make_unique<NodeCache>(opt_.cache_bytes, &stats_);
  if (!prod_real_.empty()) node_cache_->ProtectTree(prod_real_);
  placement_ = std::make_unique<Placement>(pc, peers_.get(), transports_.get(), &stats_,
                                           transfers_in_flight_.get(), node_cache_.get());
  peers_->SetRuntime(runtime_.get());
  placement_->SetRuntime(runtime_.get());
  file_server_ =
      std::make_unique<FileServer>(opt_.rank, prod_real_, opt_.rpc_timeout_ms, transports_.get(),
                                   &stats_, transfers_in_flight_.get());
  notices_ = std::make_unique<VersionNotices>(opt_.rank, peers_.get(), opt_.rpc_timeout_ms);
  file_server_->SetOnServe([n = notices_.get()](const std::string& upath, uint32_t rank) {
    n->NoteReader(upath, rank);
  });
  PrefetchConfig fc;
  fc.max_inflight = opt_.prefetch_concurrency;
  fc.max_per_peer = opt_.prefetch_per_peer;
  fc.transfer_timeout_ms = opt_.rpc_timeout_ms;
  prefetch_ =
      std::make_unique<Prefetcher>(fc, runtime_.get(), kvs_.get(), placement_.get(), &cache_);
  // The node cache's budget bounds what is fetched ahead, and every
  // publication the prefetcher's watch sees supersedes older copies.
  prefetch_->SetAdmit([nc = node_cache_.get()](uint64_t bytes) { return nc->Admit(bytes); });
  prefetch_->SetOnPublication(
      [nc = node_cache_.get()](const std::string& ns, const FileRecord& rec) {
        nc->Supersede(ns, rec);
      });
  if (opt_.follow_records)
    record_feed_ = std::make_unique<RecordFeed>(kvs_.get(), &cache_, node_cache_.get(),
                                                runtime_.get(), &stats_);
}

std::string Service::StoreDescription() const {
  return RedactUrl(opt_.kvs_url) +
         (kvs_ && kvs_->caps().hosted_by_service && opt_.kvs_url.find("://") == std::string::npos
              ? " (root)"
              : "");
}

Status Service::WriteReadyFile() {
  if (opt_.ready_file.empty()) return Status::OK();
  // Created with the service's file mode (0600 unless the operator asked
  // otherwise; the umask narrows it further), never through a symlink or
  // a file someone else left at the temporary name.
  const std::string tmp = opt_.ready_file + ".tmp";
  (void)::unlink(tmp.c_str());
  UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                     static_cast<mode_t>(opt_.file_mode & 0777)));
  if (!fd.valid()) return StatusFromErrno(errno, "write ready file '" + tmp + "'");
  // listen= is where the peer listener is bound (0.0.0.0:7590), advertise=
  // the address peers and tools connect to; the incarnation in hex, as in
  // the log, `dyad status` and `dyad peers`.
  char text[2048];
  const int n = std::snprintf(
      text, sizeof text, "rank=%u\nlisten=%s\nadvertise=%s\nsocket=%s\npid=%d\nincarnation=%s\n",
      opt_.rank, listen_bound_.c_str(), advertise_.c_str(), opt_.socket_path.c_str(), getpid(),
      Hex64(incarnation_).c_str());
  const size_t len = n < 0 ? 0 : std::min(static_cast<size_t>(n), sizeof text - 1);
  if (!WriteFully(fd.get(), text, len).ok()) {
    ::unlink(tmp.c_str());
    return StatusFromErrno(errno, "write ready file '" + tmp + "'");
  }
  fd.reset();
  if (std::rename(tmp.c_str(), opt_.ready_file.c_str()) != 0)
    return StatusFromErrno(errno, "rename ready file");
  return Status::OK();
}

void Service::Stop() {
  {
    std::lock_guard<std::mutex> lk(stop_mu_);
    if (stopping_.exchange(true)) return;
    if (starting_ || !started_) {
      if (kvs_) kvs_->Shutdown();
      if (startup_stop_) startup_stop_->Fire(Status(DYAD_RC_CANCELLED, "stopped during start-up"));
      if (starting_) return;  // Start() sees stopping_ and tears down itself
      stopped_ = true;        // nothing to tear down
      return;
    }
  }
  // A clean stop of a running service: say so in the store first (bounded),
  // then end its waits and connections.
  Deregister();
  Teardown();
}

void Service::Teardown() {
  // Parked waits end with DYAD_RC_CANCELLED, and their requests get that reply.
  if (kvs_) kvs_->Shutdown();
  std::thread([this] {
    // Every wait ends (DYAD_RC_CANCELLED), the pending publications' and
    // the prefetcher's transfers' too.
    if (runtime_) runtime_->FireStop();
    if (prefetch_) prefetch_->Stop();  // no new fetches while the rest stops
    if (server_) server_->Stop();      // closes every connection
    if (runtime_) runtime_->Shutdown();
    if (record_feed_) record_feed_->Stop();  // after the pool: nothing starts a watch now
    if (!opt_.socket_path.empty() && unix_listener_.valid()) ::unlink(opt_.socket_path.c_str());
    // Closed, not left to queue connections nobody will accept.
    unix_listener_.reset();
    tcp_listener_.reset();
    if (!opt_.ready_file.empty()) ::unlink(opt_.ready_file.c_str());
    DYAD_LOG_INFO("stopped");
    std::lock_guard<std::mutex> lk(stop_mu_);
    stopped_ = true;
    stop_cv_.notify_all();
  }).detach();
}

void Service::Wait() {
  std::unique_lock<std::mutex> lk(stop_mu_);
  if (!started_) return;
  stop_cv_.wait(lk, [this] { return stopped_; });
}

bool Service::WaitFor(int64_t ms) {
  std::unique_lock<std::mutex> lk(stop_mu_);
  if (!started_) return true;
  return stop_cv_.wait_for(lk, std::chrono::milliseconds(ms), [this] { return stopped_; });
}

Status Service::StartServer() {
  ServerConfig sc;
  sc.unix_listener = unix_listener_.get();
  sc.tcp_listener = tcp_listener_.get();
  sc.max_connections = opt_.max_connections;
  sc.max_unauthenticated = opt_.max_unauthenticated;
  sc.max_per_peer = opt_.max_per_peer;
  sc.auth = auth_.get();
  sc.self = PeerIdentity{opt_.rank, incarnation_};
  ServerHooks hooks;
  hooks.handling = [this](bool local, uint16_t type) {
    return dispatch_->HandlingOf(local ? Link::kLocal : Link::kPeer, type);
  };
  hooks.serve = [this](RequestContext& ctx, uint16_t type, const std::string& payload) {
    if (stopping_) return ctx.ch.MarkBroken();
    dispatch_->Dispatch(ctx, type, payload);
  };
  hooks.serve_task = [this](RequestContext& ctx, uint16_t type,
                            const std::string& payload) -> Task<void> {
    if (stopping_) {
      ctx.ch.MarkBroken();
      co_return;
    }
    co_await dispatch_->DispatchTask(ctx, type, payload);
  };
  hooks.reply_error = [this](Channel& ch, const Status& st) {
    SendReply(ch, st, {}, kRefusalReplyMs, &stats_);
  };
  hooks.refused = [this](const std::string& why) { NoteRefusal(why); };
  server_ = std::make_unique<Server>(*runtime_, sc, std::move(hooks));
  return server_->Start();
}

void Service::NoteRefusal(const std::string& why) {
  stats_.Add(ServiceStats::kConnRefused);
  std::lock_guard<std::mutex> lk(refusal_mu_);
  ++refused_since_log_;
  const uint64_t now = MonoNs();
  if (now - last_refusal_log_ns_ < 10'000'000'000ull && last_refusal_log_ns_ != 0) return;
  DYAD_LOG_WARN("refused %llu connection(s) in the last 10 s; latest: %s",
                static_cast<unsigned long long>(refused_since_log_), why.c_str());
  refused_since_log_ = 0;
  last_refusal_log_ns_ = now;
}

void Service::Reply(Channel& ch, const Status& st, const std::string& body) {
  SendReply(ch, st, body, opt_.rpc_timeout_ms, &stats_);
}

void Service::QueueAsyncPublish(PendingPublish p) {
  stats_.Add(ServiceStats::kAsyncPending);
  bool start = false;
  {
    std::lock_guard<std::mutex> lk(async_mu_);
    async_queue_.push_back(std::move(p));
    start = !async_draining_;
    async_draining_ = true;
  }
  if (start) runtime_->Spawn(DrainAsyncPublications());
}

Task<void> Service::DrainAsyncPublications() {
  dyad::Stop& stopping = runtime_->stopping();
  for (;;) {
    PendingPublish p;
    {
      std::lock_guard<std::mutex> lk(async_mu_);
      if (async_queue_.empty()) {
        async_draining_ = false;
        co_return;
      }
      p = std::move(async_queue_.front());
      async_queue_.pop_front();
    }
    int64_t backoff = 50;
    bool stored = false;
    for (int attempt = 0;; ++attempt) {
      Status st = co_await kvs_->PutTask(*runtime_, p.ns, p.key, p.value);
      if (st.ok()) {
        stored = true;
        break;
      }
      if (attempt >= 8 || stopping.fired()) {
        DYAD_LOG_ERROR("asynchronous publish of key '%s' failed: %s", p.key.c_str(),
                       st.ToString().c_str());
        break;
      }
      co_await Sleep(Deadline::AfterMs(backoff), &stopping);  // a stop: the next try is the last
      backoff = std::min<int64_t>(backoff * 2, 2000);
    }
    // The store holds the record now: its notices can be confirmed.
    if (stored && !p.notices.empty() && !stopping.fired()) {
      PeerWaits waits(*runtime_, &stopping, &stats_, "notices.parked_for_peer");
      co_await notices_->Send(std::move(p.notices), p.upath, waits);
    }
    stats_.Sub(ServiceStats::kAsyncPending);
  }
}

}  // namespace dyad
