#include "service/service.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "common/fsutil.h"
#include "common/log.h"
#include "common/munge/munge.h"
#include "common/safety.h"
#include "common/time.h"
#include "common/trace.h"
#include "service/advertise.h"
#include "service/dispatch.h"
#include "service/file_server.h"
#include "service/peers.h"
#include "service/placement.h"
#include "service/transfers.h"
#include "service/prefetch.h"
#include "service/transports.h"

namespace dyad {

namespace {

constexpr int64_t kIdlePollMs = 500;

// The store URL with any password replaced, for logs and status replies.
std::string RedactUrl(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t at = url.find('@');
  if (scheme == std::string::npos || at == std::string::npos || at < scheme) return url;
  const size_t colon = url.find(':', scheme + 3);
  if (colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon + 1) + "***" + url.substr(at);
}

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
      stop_cv_.notify_all();
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
  DYAD_RETURN_IF_ERROR(OpenStore());
  BuildParts();
  RouteRequests();
  TraceSetProcessName("dyad-service rank " + std::to_string(opt_.rank) + " (" + hostname_ + ")");

  // Serve peers before registering: the root must answer its own registration
  // and others may start fetching as soon as the record is visible.
  tcp_acceptor_ = std::thread([this] { AcceptLoop(tcp_listener_.get(), false); });
  DYAD_RETURN_IF_ERROR(RegisterMembership());
  async_thread_ = std::thread([this] { AsyncPublishLoop(); });
  membership_thread_ = std::thread([this] { MembershipLoop(); });
  unix_acceptor_ = std::thread([this] { AcceptLoop(unix_listener_.get(), true); });

  DYAD_LOG_INFO("serving: rank %u (incarnation %016llx), peers on %s, clients on %s, producer "
                "path %s, store %s, transport %s",
                opt_.rank, static_cast<unsigned long long>(incarnation_), advertise_.c_str(),
                opt_.socket_path.c_str(), prod_real_.empty() ? "(none)" : prod_real_.c_str(),
                StoreDescription().c_str(), transports_->Default().name().c_str());
  return WriteReadyFile();
}

// One descriptor per connection: use the hard limit, not the usual soft
// 1024, so the connection cap (not EMFILE) is what refuses the excess.
void Service::RaiseDescriptorLimit() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= rl.rlim_max) return;
  rl.rlim_cur = rl.rlim_max;
  if (::setrlimit(RLIMIT_NOFILE, &rl) != 0)
    DYAD_LOG_WARN("cannot raise the descriptor limit: %s", std::strerror(errno));
}

Status Service::PrepareDirectories() {
  if (!opt_.prod_path.empty()) {
    if (::mkdir(opt_.prod_path.c_str(), 0755) != 0 && errno != EEXIST)
      return StatusFromErrno(errno, "create producer directory '" + opt_.prod_path + "'",
                             DYAD_RC_BADMANAGEDPATH);
    prod_real_ = CanonicalPath(opt_.prod_path);
    const size_t n = RemoveStaleTemporaries(prod_real_);
    if (n > 0) DYAD_LOG_INFO("removed %zu incomplete temporaries under %s", n, prod_real_.c_str());
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
  peers_ = std::make_unique<PeerDirectory>(kvs_.get(), auth_.get(),
                                           PeerIdentity{opt_.rank, incarnation_},
                                           opt_.rpc_timeout_ms);
  PlacementConfig pc;
  pc.rank = opt_.rank;
  pc.node_idx = node_idx_;
  pc.service_mux = opt_.service_mux;
  pc.prod_real = prod_real_;
  pc.rpc_timeout_ms = opt_.rpc_timeout_ms;
  transfers_in_flight_ = std::make_unique<TransferRegistry>();
  placement_ = std::make_unique<Placement>(pc, peers_.get(), transports_.get(), &stats_,
                                           transfers_in_flight_.get());
  file_server_ = std::make_unique<FileServer>(opt_.rank, prod_real_, opt_.rpc_timeout_ms,
                                              transports_.get(), &stats_,
                                              transfers_in_flight_.get());
  PrefetchConfig fc;
  fc.max_inflight = opt_.prefetch_concurrency;
  fc.max_per_peer = opt_.prefetch_per_peer;
  fc.transfer_timeout_ms = opt_.rpc_timeout_ms;
  prefetch_ = std::make_unique<Prefetcher>(fc, kvs_.get(), placement_.get(), &cache_);
}

std::string Service::StoreDescription() const {
  return RedactUrl(opt_.kvs_url) + (kvs_ && kvs_->caps().hosted_by_service &&
                                            opt_.kvs_url.find("://") == std::string::npos
                                        ? " (root)"
                                        : "");
}

Status Service::WriteReadyFile() {
  if (opt_.ready_file.empty()) return Status::OK();
  const std::string tmp = opt_.ready_file + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f == nullptr) return StatusFromErrno(errno, "write ready file '" + tmp + "'");
  std::fprintf(f, "rank=%u\nlisten=%s\nsocket=%s\npid=%d\nincarnation=%llu\n", opt_.rank,
               advertise_.c_str(), opt_.socket_path.c_str(), getpid(),
               static_cast<unsigned long long>(incarnation_));
  std::fclose(f);
  if (std::rename(tmp.c_str(), opt_.ready_file.c_str()) != 0)
    return StatusFromErrno(errno, "rename ready file");
  return Status::OK();
}

void Service::Stop() {
  {
    std::lock_guard<std::mutex> lk(stop_mu_);
    if (stopping_.exchange(true)) return;
    stop_cv_.notify_all();  // start-up pauses
    if (kvs_) kvs_->Shutdown();
    if (starting_) return;  // Start() sees stopping_ and tears down itself
    if (!started_) {        // nothing to tear down
      stopped_ = true;
      return;
    }
  }
  Teardown();
}

void Service::Teardown() {
  async_cv_.notify_all();
  // Unblock accept loops and every connection thread.
  if (tcp_listener_.valid()) ::shutdown(tcp_listener_.get(), SHUT_RDWR);
  if (unix_listener_.valid()) ::shutdown(unix_listener_.get(), SHUT_RDWR);
  {
    std::lock_guard<std::mutex> lk(conns_mu_);
    for (auto& c : conns_)
      if (!c->done && c->fd >= 0) ::shutdown(c->fd, SHUT_RDWR);
  }
  std::thread([this] {
    if (tcp_acceptor_.joinable()) tcp_acceptor_.join();
    if (unix_acceptor_.joinable()) unix_acceptor_.join();
    if (async_thread_.joinable()) async_thread_.join();
    if (membership_thread_.joinable()) membership_thread_.join();
    if (prefetch_) prefetch_->Stop();
    std::list<std::unique_ptr<Conn>> conns;
    {
      std::lock_guard<std::mutex> lk(conns_mu_);
      conns.swap(conns_);
    }
    for (auto& c : conns)
      if (c->thread.joinable()) c->thread.join();
    if (!opt_.socket_path.empty() && unix_listener_.valid()) ::unlink(opt_.socket_path.c_str());
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

void Service::AcceptLoop(int listen_fd, bool local) {
  while (!stopping_) {
    Result<UniqueFd> fd = Accept(listen_fd, Deadline::AfterMs(kIdlePollMs));
    ReapFinished();
    if (!fd.ok()) {
      if (fd.status().code() == DYAD_RC_TIMEOUT) continue;
      if (stopping_) break;
      DYAD_LOG_WARN("accept: %s", fd.status().ToString().c_str());
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      continue;
    }
    std::string peer_host;
    const std::string why = Admit(fd->get(), local, &peer_host);
    if (!why.empty()) {
      NoteRefusal(why);
      continue;  // closes it: refused before any byte is read
    }
    SpawnConnection(std::move(*fd), local, std::move(peer_host));
  }
}

std::string Service::Admit(int fd, bool local, std::string* peer_host) {
  if (!local) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    char host[INET6_ADDRSTRLEN] = "?";
    if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
      if (ss.ss_family == AF_INET)
        ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, host, sizeof host);
      else if (ss.ss_family == AF_INET6)
        ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, host, sizeof host);
    }
    *peer_host = host;
  }
  std::lock_guard<std::mutex> lk(conns_mu_);
  if (live_ >= opt_.max_connections)
    return "connection cap reached (" + std::to_string(opt_.max_connections) +
           ", DYAD_MAX_CONNECTIONS)";
  if (!local) {
    if (unauthenticated_ >= opt_.max_unauthenticated)
      return "too many connections in their handshake (" +
             std::to_string(opt_.max_unauthenticated) + ", DYAD_MAX_UNAUTHENTICATED)";
    if (per_peer_[*peer_host] >= opt_.max_per_peer)
      return "too many connections in their handshake from " + *peer_host + " (" +
             std::to_string(opt_.max_per_peer) + ", DYAD_MAX_UNAUTHENTICATED_PER_PEER)";
    ++unauthenticated_;
    ++per_peer_[*peer_host];
  }
  ++live_;
  return std::string();
}

void Service::HandshakeOver(const std::string& peer_host) {
  std::lock_guard<std::mutex> lk(conns_mu_);
  --unauthenticated_;
  auto it = per_peer_.find(peer_host);
  if (it != per_peer_.end() && --it->second == 0) per_peer_.erase(it);
}

void Service::NoteRefusal(const std::string& why) {
  stats_.Add(ServiceStats::kConnRefused);
  std::lock_guard<std::mutex> lk(conns_mu_);
  ++refused_since_log_;
  const uint64_t now = MonoNs();
  if (now - last_refusal_log_ns_ < 10'000'000'000ull && last_refusal_log_ns_ != 0) return;
  DYAD_LOG_WARN("refused %llu connection(s) in the last 10 s; latest: %s",
                static_cast<unsigned long long>(refused_since_log_), why.c_str());
  refused_since_log_ = 0;
  last_refusal_log_ns_ = now;
}

void Service::SpawnConnection(UniqueFd fd, bool local, std::string peer_host) {
  std::lock_guard<std::mutex> lk(conns_mu_);
  if (stopping_) {
    --live_;
    if (!local) {
      --unauthenticated_;
      if (--per_peer_[peer_host] == 0) per_peer_.erase(peer_host);
    }
    return;  // closes it
  }
  auto conn = std::make_unique<Conn>();
  Conn* raw = conn.get();
  raw->fd = fd.get();
  raw->peer_host = std::move(peer_host);
  conns_.push_back(std::move(conn));
  raw->thread = std::thread([this, raw, f = fd.release(), local]() mutable {
    {
      Channel ch{UniqueFd(f), Trust::kUnauthenticated};
      bool handshake_done = local;
      if (local) {
        ServeLocal(ch);
      } else {
        ServePeer(ch, raw->peer_host, &handshake_done);
      }
      if (!handshake_done) HandshakeOver(raw->peer_host);
      // Marked under the lock, before the descriptor closes, so Stop() never
      // shuts down a descriptor number that was reused.
      std::lock_guard<std::mutex> lk(conns_mu_);
      --live_;
      raw->done = true;
      raw->fd = -1;
    }
  });
}

void Service::ReapFinished() {
  std::list<std::unique_ptr<Conn>> finished;
  {
    std::lock_guard<std::mutex> lk(conns_mu_);
    for (auto it = conns_.begin(); it != conns_.end();) {
      if ((*it)->done) {
        finished.push_back(std::move(*it));
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& c : finished)
    if (c->thread.joinable()) c->thread.join();
}

void Service::ServeLocal(Channel& ch) {
  // Only processes of this user (or root) may use the service.
  PeerCred cred;
  if (Status admit = AdmitLocalClient(ch, &cred); !admit.ok()) {
    DYAD_LOG_WARN("refused local client pid %d uid %u (service runs as uid %u): %s", cred.pid,
                  cred.uid, geteuid(), admit.ToString().c_str());
    Reply(ch, admit);
    return;
  }
  RequestContext ctx{ch, Link::kLocal, nullptr,
                     [this, &ch] { return stopping_.load() || ch.PeerClosed(); }};
  ServeFrames(ctx);
}

void Service::ServePeer(Channel& ch, const std::string& peer_host, bool* handshake_done) {
  PeerIdentity peer;
  Status st = auth_->Accept(ch, PeerIdentity{opt_.rank, incarnation_},
                            Deadline::AfterMs(kHandshakeTimeoutMs), &peer);
  HandshakeOver(peer_host);
  *handshake_done = true;
  if (!st.ok()) {
    NoteRefusal("handshake: " + st.ToString());
    return;
  }
  RequestContext ctx{ch, Link::kPeer, &peer,
                     [this, &ch] { return stopping_.load() || ch.PeerClosed(); }};
  ServeFrames(ctx);
}

void Service::ServeFrames(RequestContext& ctx) {
  while (!stopping_) {
    uint16_t type = 0;
    std::string payload;
    Status st = ctx.ch.RecvFrame(&type, &payload, Deadline::AfterMs(kIdlePollMs));
    if (!st.ok()) {
      if (st.code() == DYAD_RC_TIMEOUT && !ctx.ch.broken()) continue;
      if (st.code() == DYAD_RC_BADUNPACK) {
        DYAD_LOG_WARN("%s: %s",
                      ctx.peer != nullptr ? ("peer rank " + std::to_string(ctx.peer->rank)).c_str()
                                          : "local client",
                      st.ToString().c_str());
        Reply(ctx.ch, st);
      }
      return;
    }
    dispatch_->Dispatch(ctx, type, payload);
    if (ctx.ch.broken()) return;
  }
}

void Service::Reply(Channel& ch, const Status& st, const std::string& body) {
  SendReply(ch, st, body, opt_.rpc_timeout_ms, &stats_);
}

void Service::AsyncPublishLoop() {
  for (;;) {
    PendingPublish p;
    {
      std::unique_lock<std::mutex> lk(async_mu_);
      async_cv_.wait(lk, [this] { return stopping_ || !async_queue_.empty(); });
      if (async_queue_.empty()) return;  // stopping and drained
      p = std::move(async_queue_.front());
      async_queue_.pop_front();
    }
    int64_t backoff = 50;
    for (int attempt = 0;; ++attempt) {
      Status st = kvs_->Put(p.ns, p.key, p.value);
      if (st.ok()) break;
      if (attempt >= 8 || stopping_) {
        DYAD_LOG_ERROR("asynchronous publish of key '%s' failed: %s", p.key.c_str(),
                       st.ToString().c_str());
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(backoff));
      backoff = std::min<int64_t>(backoff * 2, 2000);
    }
    stats_.Sub(ServiceStats::kAsyncPending);
  }
}

}  // namespace dyad
