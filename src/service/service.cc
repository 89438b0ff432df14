#include "service/service.h"

#include <fcntl.h>
#include <sys/file.h>
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
#include "kvs/embedded/embedded_server.h"
#include "kvs/memory/memory_kvs.h"
#include "service/fetcher.h"
#include "service/peers.h"

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
  if (started_) return Status(DYAD_RC_SYSFAIL, "service already started");
  started_ = true;
  incarnation_ = NewIncarnation();
  started_ns_ = WallNs();
  hostname_ = HostName();
  if (opt_.service_mux == 0) opt_.service_mux = 1;
  node_idx_ = opt_.rank / opt_.service_mux;

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
  Result<std::shared_ptr<const Authenticator>> auth = OpenAuthenticator(
      ServiceCredentials{opt_.secret, opt_.munge, opt_.munge_socket, opt_.protection});
  if (!auth.ok()) return auth.status();
  auth_ = std::move(*auth);

  // Transport for fetches this service makes.
  Result<std::string> tname = TransportNameForMode(opt_.dtl_mode);
  if (!tname.ok()) return tname.status();
  TransportOptions topt;
  topt.chunk_size = opt_.chunk_size;
  topt.idle_ms = opt_.rpc_timeout_ms;
  Result<std::unique_ptr<Transport>> transport = CreateTransport(*tname, topt);
  if (!transport.ok()) return transport.status();
  transport_ = std::move(*transport);
  // Not fatal: fetches with other transports (a client's DYAD_DTL_MODE)
  // still work, and each fetch with this one reports the error itself.
  if (Status ws = transport_->Warm(); !ws.ok())
    DYAD_LOG_WARN("transport %s is not ready: %s", transport_->name().c_str(),
                  ws.ToString().c_str());

  // Listeners first: with port 0 the advertised address needs the real port.
  Result<SocketAddress> laddr = ParseAddress(opt_.listen);
  if (!laddr.ok()) return laddr.status().Annotate("--listen");
  if (laddr->is_unix) return Status(DYAD_RC_BADREQUEST, "--listen must be a TCP HOST:PORT");
  DYAD_RETURN_IF_ERROR(CheckListenPolicy(*laddr, auth_->has_credential(), opt_.insecure));
  Result<UniqueFd> tcp = Listen(*laddr);
  if (!tcp.ok()) return tcp.status().Annotate("listen for peers");
  tcp_listener_ = std::move(*tcp);
  Result<SocketAddress> bound = BoundAddress(tcp_listener_.get());
  if (!bound.ok()) return bound.status();
  if (!opt_.advertise.empty()) {
    advertise_ = opt_.advertise;
  } else {
    const std::string host =
        (laddr->host == "0.0.0.0" || laddr->host == "*") ? hostname_ : laddr->host;
    advertise_ = host + ":" + std::to_string(bound->port);
  }

  if (opt_.socket_path.empty()) return Status(DYAD_RC_BADREQUEST, "no Unix socket path");
  {
    const size_t slash = opt_.socket_path.rfind('/');
    if (slash != std::string::npos && slash > 0) {
      DYAD_RETURN_IF_ERROR(PrepareSocketDirectory(opt_.socket_path.substr(0, slash)));
    }
  }
  Result<SocketAddress> uaddr = ParseAddress("unix:" + opt_.socket_path);
  if (!uaddr.ok()) return uaddr.status();
  Result<UniqueFd> ux = Listen(*uaddr);
  if (!ux.ok()) return ux.status().Annotate("listen for local clients");
  unix_listener_ = std::move(*ux);

  // Metadata store.
  if (opt_.kvs_url == "embedded" || opt_.kvs_url == "memory") {
    if (opt_.kvs_url == "embedded" && !opt_.host_root && opt_.rank != 0)
      return Status(DYAD_RC_BADREQUEST,
                    "rank " + std::to_string(opt_.rank) +
                        " needs the root's address: --kvs embedded://ROOT_HOST:PORT "
                        "(or --root to host the store here)");
    root_store_ = std::make_shared<MemoryKvs>();
    if (opt_.kvs_url == "embedded") root_server_ = std::make_unique<EmbeddedKvsServer>(root_store_);
    kvs_ = root_store_;
  } else {
    KvsOptions kopt;
    kopt.secret = opt_.secret;
    kopt.auth = auth_;
    kopt.self_rank = opt_.rank;
    kopt.self_incarnation = incarnation_;
    kopt.rpc_timeout_ms = opt_.rpc_timeout_ms;
    Result<std::unique_ptr<Kvs>> kvs = OpenKvs(opt_.kvs_url, kopt);
    if (!kvs.ok())
      return kvs.status().Annotate("open metadata store '" + RedactUrl(opt_.kvs_url) + "'");
    kvs_ = std::shared_ptr<Kvs>(std::move(*kvs));
  }

  peers_ = std::make_unique<PeerDirectory>(kvs_.get(), auth_.get(),
                                           PeerIdentity{opt_.rank, incarnation_},
                                           opt_.rpc_timeout_ms);
  FetcherConfig fc;
  fc.rank = opt_.rank;
  fc.node_idx = node_idx_;
  fc.service_mux = opt_.service_mux;
  fc.prod_real = prod_real_;
  fc.rpc_timeout_ms = opt_.rpc_timeout_ms;
  fetcher_ = std::make_unique<Fetcher>(fc, peers_.get(), &stats_,
                                       [this](const std::string& name) -> Result<Transport*> {
                                         return GetTransport(name);
                                       });

  // Serve peers before registering: the root must answer its own registration
  // and others may start fetching as soon as the record is visible.
  tcp_acceptor_ = std::thread([this] { AcceptLoop(tcp_listener_.get(), false); });
  Status reg = RegisterMembership();
  if (!reg.ok()) {
    Stop();
    return reg;
  }
  async_thread_ = std::thread([this] { AsyncPublishLoop(); });
  if (!root_store_) membership_thread_ = std::thread([this] { MembershipLoop(); });
  unix_acceptor_ = std::thread([this] { AcceptLoop(unix_listener_.get(), true); });

  DYAD_LOG_INFO("serving: rank %u (incarnation %016llx), peers on %s, clients on %s, producer "
                "path %s, store %s%s, transport %s",
                opt_.rank, static_cast<unsigned long long>(incarnation_), advertise_.c_str(),
                opt_.socket_path.c_str(), prod_real_.empty() ? "(none)" : prod_real_.c_str(),
                RedactUrl(opt_.kvs_url).c_str(), root_server_ ? " (root)" : "", transport_->name().c_str());
  return WriteReadyFile();
}

Result<Transport*> Service::GetTransport(const std::string& name) {
  std::lock_guard<std::mutex> lk(transports_mu_);
  if (transport_ && transport_->name() == name) return transport_.get();
  auto it = extra_transports_.find(name);
  if (it != extra_transports_.end()) return it->second.get();
  TransportOptions topt;
  topt.chunk_size = opt_.chunk_size;
  topt.idle_ms = opt_.rpc_timeout_ms;
  Result<std::unique_ptr<Transport>> t = CreateTransport(name, topt);
  if (!t.ok()) return t.status();
  Transport* raw = t->get();
  extra_transports_[name] = std::move(*t);
  return raw;
}

Status Service::RegisterMembership() {
  ServiceRecord rec;
  rec.rank = opt_.rank;
  rec.node_idx = node_idx_;
  rec.incarnation = incarnation_;
  rec.address = advertise_;
  rec.prod_path = prod_real_;
  rec.hostname = hostname_;
  rec.started_ns = started_ns_;
  // The root may still be starting (services are launched in parallel).
  const Deadline deadline = Deadline::AfterMs(std::max<int64_t>(opt_.rpc_timeout_ms, 30000));
  int64_t backoff = 100;
  member_value_ = rec.Encode();
  for (;;) {
    Status st = kvs_->Put(kMembersNamespace, MemberKey(opt_.rank), member_value_);
    if (st.ok()) return st;
    if (deadline.expired() || stopping_)
      return st.Annotate("register rank " + std::to_string(opt_.rank) + " in the metadata store");
    DYAD_LOG_WARN("metadata store not reachable yet (%s); retrying", st.ToString().c_str());
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff));
    backoff = std::min<int64_t>(backoff * 2, 2000);
  }
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
  }
  async_cv_.notify_all();
  if (root_store_) root_store_->Shutdown();
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
    SpawnConnection(std::move(*fd), local);
  }
}

void Service::SpawnConnection(UniqueFd fd, bool local) {
  std::lock_guard<std::mutex> lk(conns_mu_);
  if (stopping_) return;
  auto conn = std::make_unique<Conn>();
  Conn* raw = conn.get();
  raw->fd = fd.get();
  conns_.push_back(std::move(conn));
  raw->thread = std::thread([this, raw, f = fd.release(), local]() mutable {
    Channel ch{UniqueFd(f), Trust::kUnauthenticated};
    if (local)
      ServeLocal(ch);
    else
      ServePeer(ch);
    // Marked under the lock, before the descriptor closes, so Stop() never
    // shuts down a descriptor number that was reused.
    std::lock_guard<std::mutex> lk(conns_mu_);
    raw->done = true;
    raw->fd = -1;
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

void Service::Reply(Channel& ch, const Status& st, const std::string& body) {
  if (!st.ok()) stats_.Add(ServiceStats::kErrors);
  Status s = ch.SendFrame(static_cast<uint16_t>(MsgType::kReply), EncodeReply(st, body),
                          Deadline::AfterMs(opt_.rpc_timeout_ms));
  if (!s.ok()) DYAD_LOG_DEBUG("reply not delivered: %s", s.ToString().c_str());
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
  while (!stopping_) {
    uint16_t type = 0;
    std::string payload;
    Status st = ch.RecvFrame(&type, &payload, Deadline::AfterMs(kIdlePollMs));
    if (!st.ok()) {
      if (st.code() == DYAD_RC_TIMEOUT && !ch.broken()) continue;
      if (st.code() == DYAD_RC_BADUNPACK) {
        DYAD_LOG_WARN("local client pid %d: %s", cred.pid, st.ToString().c_str());
        Reply(ch, st);
      }
      return;
    }
    switch (static_cast<MsgType>(type)) {
      case MsgType::kPublish: HandlePublish(ch, payload); break;
      case MsgType::kLocate: HandleLocate(ch, payload); break;
      case MsgType::kConsume: HandleConsume(ch, payload); break;
      case MsgType::kList: HandleList(ch, payload); break;
      case MsgType::kRemove: HandleRemove(ch, payload); break;
      case MsgType::kStatus: HandleStatus(ch); break;
      case MsgType::kPing: Reply(ch, Status::OK()); break;
      default:
        Reply(ch, Status(DYAD_RC_BADREQUEST,
                         std::string("unexpected request '") + MsgTypeName(type) + "'"));
    }
    if (ch.broken()) return;
  }
}

void Service::ServePeer(Channel& ch) {
  PeerIdentity peer;
  Status st = auth_->Accept(ch, PeerIdentity{opt_.rank, incarnation_},
                            Deadline::AfterMs(kHandshakeTimeoutMs), &peer);
  if (!st.ok()) {
    DYAD_LOG_WARN("refused peer connection: %s", st.ToString().c_str());
    return;
  }
  while (!stopping_) {
    uint16_t type = 0;
    std::string payload;
    st = ch.RecvFrame(&type, &payload, Deadline::AfterMs(kIdlePollMs));
    if (!st.ok()) {
      if (st.code() == DYAD_RC_TIMEOUT && !ch.broken()) continue;
      if (st.code() == DYAD_RC_BADUNPACK) {
        DYAD_LOG_WARN("peer rank %u: %s", peer.rank, st.ToString().c_str());
        Reply(ch, st);
      }
      return;
    }
    if (type == static_cast<uint16_t>(MsgType::kFetch)) {
      HandleFetch(ch, payload, peer);
    } else if (EmbeddedKvsServer::Handles(type)) {
      stats_.Add(ServiceStats::kReqKvs);
      if (!root_server_) {
        Reply(ch, Status(DYAD_RC_NOTSUP, "rank " + std::to_string(opt_.rank) +
                                             " does not host the metadata store"));
      } else {
        Channel* chp = &ch;
        Status hs = root_server_->Handle(type, payload, ch, [this, chp] {
          return stopping_.load() || chp->PeerClosed();
        });
        if (!hs.ok()) DYAD_LOG_DEBUG("kvs request from rank %u: %s", peer.rank, hs.ToString().c_str());
      }
    } else if (type == static_cast<uint16_t>(MsgType::kPing)) {
      Reply(ch, Status::OK());
    } else {
      Reply(ch, Status(DYAD_RC_BADREQUEST,
                       std::string("unexpected request '") + MsgTypeName(type) + "'"));
    }
    if (ch.broken()) return;
  }
}

void Service::HandlePublish(Channel& ch, const std::string& payload) {
  stats_.Add(ServiceStats::kReqPublish);
  PublishRequest req;
  Decoder d(payload);
  if (!req.DecodeFrom(d) || !d.done()) return Reply(ch, Status(DYAD_RC_BADUNPACK, "malformed publish"));
  Result<std::string> upath = ValidateUpath(req.upath);
  if (!upath.ok()) return Reply(ch, upath.status());
  if (prod_real_.empty())
    return Reply(ch, Status(DYAD_RC_BADMANAGEDPATH,
                            "this dyad-service serves no producer directory; start it with the "
                            "producer path (dyad-service ... " +
                                (req.prod_path.empty() ? std::string("DIR") : req.prod_path) + ")"));
  if (req.prod_path != prod_real_)
    return Reply(ch, Status(DYAD_RC_BADMANAGEDPATH,
                            "producer path '" + req.prod_path +
                                "' is not the directory this dyad-service serves ('" + prod_real_ +
                                "'); set DYAD_PATH_PRODUCER to it"));
  if (req.key.empty()) return Reply(ch, Status(DYAD_RC_BADREQUEST, "empty key"));
  FileRecord rec;
  rec.owner_rank = opt_.rank;
  rec.owner_incarnation = incarnation_;
  rec.size = req.size;
  rec.version = req.version;
  rec.published_ns = WallNs();
  rec.upath = *upath;
  cache_.Put(req.ns, req.key, rec);
  if (req.async) {
    {
      std::lock_guard<std::mutex> lk(async_mu_);
      async_queue_.push_back({req.ns, req.key, rec.Encode()});
    }
    stats_.Add(ServiceStats::kAsyncPending);
    async_cv_.notify_one();
    return Reply(ch, Status::OK());
  }
  Status st = kvs_->Put(req.ns, req.key, rec.Encode());
  if (!st.ok()) st = Status(DYAD_RC_BADCOMMIT, "publish '" + rec.upath + "': " + st.ToString());
  Reply(ch, st);
}

void Service::MembershipLoop() {
  constexpr int64_t kCheckEveryMs = 3000;
  std::unique_lock<std::mutex> lk(async_mu_);
  while (!stopping_) {
    async_cv_.wait_for(lk, std::chrono::milliseconds(kCheckEveryMs));
    if (stopping_) break;
    lk.unlock();
    Result<std::optional<std::string>> v = kvs_->Get(kMembersNamespace, MemberKey(opt_.rank));
    if (v.ok() && !v->has_value()) {
      Status st = kvs_->Put(kMembersNamespace, MemberKey(opt_.rank), member_value_);
      if (st.ok())
        DYAD_LOG_WARN("membership record was missing from the metadata store (root restarted?); "
                      "registered again");
    }
    lk.lock();
  }
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

Result<FileRecord> Service::Locate(const std::string& ns, const std::string& key, bool wait,
                                   Deadline deadline, const CancelFn& cancel, bool* from_cache) {
  if (from_cache) *from_cache = false;
  if (std::optional<FileRecord> hit = cache_.Get(ns, key)) {
    stats_.Add(ServiceStats::kCacheHits);
    if (from_cache) *from_cache = true;
    return *hit;
  }
  stats_.Add(ServiceStats::kCacheMisses);
  std::string value;
  if (wait) {
    Result<std::string> v = kvs_->Wait(ns, key, deadline, cancel);
    if (!v.ok()) return v.status();
    value = std::move(*v);
  } else {
    Result<std::optional<std::string>> v = kvs_->Get(ns, key);
    if (!v.ok()) return v.status();
    if (!v->has_value()) return Status(DYAD_RC_NOTFOUND, "'" + key + "' is not published");
    value = std::move(**v);
  }
  FileRecord rec;
  if (!FileRecord::Decode(value, &rec))
    return Status(DYAD_RC_BADMETADATA, "malformed metadata under key '" + key + "'");
  cache_.Put(ns, key, rec);
  return rec;
}

void Service::HandleLocate(Channel& ch, const std::string& payload) {
  stats_.Add(ServiceStats::kReqLocate);
  LocateRequest req;
  Decoder d(payload);
  if (!req.DecodeFrom(d) || !d.done()) return Reply(ch, Status(DYAD_RC_BADUNPACK, "malformed locate"));
  Channel* chp = &ch;
  Result<FileRecord> rec =
      Locate(req.ns, req.key, req.wait, Deadline::AfterMs(req.timeout_ms),
             [this, chp] { return stopping_.load() || chp->PeerClosed(); });
  if (!rec.ok()) {
    if (rec.status().code() == DYAD_RC_TIMEOUT)
      return Reply(ch, Status(DYAD_RC_TIMEOUT, "'" + req.key + "' was not published within " +
                                                   std::to_string(req.timeout_ms) + " ms"));
    return Reply(ch, rec.status());
  }
  Encoder e;
  e.Str(rec->Encode());
  Reply(ch, Status::OK(), e.data());
}

Result<ConsumeReply> Service::Consume(const ConsumeRequest& req, Deadline deadline,
                                      const CancelFn& cancel) {
  Result<std::string> upath = ValidateUpath(req.upath);
  if (!upath.ok()) return upath.status();
  if (req.cons_path.empty() || req.cons_path[0] != '/')
    return Status(DYAD_RC_BADMANAGEDPATH, "consumer path must be absolute");

  FileRecord rec;
  if (req.have_record) {
    rec = req.record;
    rec.upath = *upath;
  } else {
    bool from_cache = false;
    Result<FileRecord> located = Locate(req.ns, req.key, true, deadline, cancel, &from_cache);
    if (!located.ok()) {
      if (located.status().code() == DYAD_RC_TIMEOUT) {
        // Keep the store's explanation when it says more than "not yet"
        // (e.g. that the root was unreachable during the wait).
        std::string msg = "'" + *upath + "' was not published within " +
                          std::to_string(req.timeout_ms) + " ms";
        if (located.status().message().find("unreachable") != std::string::npos)
          msg += " (" + located.status().message() + ")";
        return Status(DYAD_RC_TIMEOUT, msg);
      }
      return located.status();
    }
    rec = *located;
    // A cached record that our local copy already matches may be outdated
    // (the producer rewrote and re-published the file): confirm it with the
    // store before declaring the copy current. Other cache hits need no
    // check, since a fetch always returns the owner's current file.
    if (from_cache && !req.shared_storage &&
        IsCompleteCopy(req.cons_path + "/" + rec.upath, rec.size, rec.version)) {
      Result<std::optional<std::string>> fresh = kvs_->Get(req.ns, req.key);
      FileRecord newer;
      if (fresh.ok() && fresh->has_value() && FileRecord::Decode(**fresh, &newer) &&
          (newer.version != rec.version || newer.size != rec.size ||
           newer.owner_rank != rec.owner_rank)) {
        cache_.Put(req.ns, req.key, newer);
        rec = newer;
      }
    }
  }

  ConsumeReply reply;
  reply.record = rec;
  if (req.shared_storage) {
    reply.local = true;
    stats_.Add(ServiceStats::kConsumeLocal);
    return reply;
  }
  // Same node and the consumer reads the very directory the owner writes:
  // the file is there, complete, since it was published after its close.
  if (rec.owner_rank / opt_.service_mux == node_idx_) {
    std::string owner_prod = prod_real_;
    if (rec.owner_rank != opt_.rank) {
      Result<ServiceRecord> owner = peers_->Resolve(rec.owner_rank, false);
      if (!owner.ok()) return owner.status();
      owner_prod = owner->prod_path;
    }
    if (!owner_prod.empty() && owner_prod == req.cons_path) {
      reply.local = true;
      stats_.Add(ServiceStats::kConsumeLocal);
      return reply;
    }
  }

  std::string tname = transport_->name();
  if (!req.dtl_mode.empty()) {
    Result<std::string> t = TransportNameForMode(req.dtl_mode);
    if (!t.ok()) return t.status();
    tname = *t;
  }
  Result<ConsumeReply> r = fetcher_->Ensure(rec, req.cons_path, tname, deadline, cancel);
  if (!r.ok() && (r.status().code() == DYAD_RC_BADFETCH || r.status().code() == DYAD_RC_BADFIO ||
                  r.status().code() == DYAD_RC_NOTFOUND))
    cache_.Erase(req.ns, req.key);  // do not keep pointing at a copy that failed
  return r;
}

void Service::HandleConsume(Channel& ch, const std::string& payload) {
  stats_.Add(ServiceStats::kReqConsume);
  ConsumeRequest req;
  Decoder d(payload);
  if (!req.DecodeFrom(d) || !d.done()) return Reply(ch, Status(DYAD_RC_BADUNPACK, "malformed consume"));
  Channel* chp = &ch;
  Result<ConsumeReply> r = Consume(req, Deadline::AfterMs(req.timeout_ms),
                                   [this, chp] { return stopping_.load() || chp->PeerClosed(); });
  if (!r.ok()) {
    if (r.status().code() != DYAD_RC_CANCELLED)
      DYAD_LOG_INFO("consume '%s' failed: %s", req.upath.c_str(), r.status().ToString().c_str());
    return Reply(ch, r.status());
  }
  Encoder e;
  r->EncodeTo(e);
  Reply(ch, Status::OK(), e.data());
}

void Service::HandleList(Channel& ch, const std::string& payload) {
  stats_.Add(ServiceStats::kReqList);
  ListRequest req;
  Decoder d(payload);
  if (!req.DecodeFrom(d) || !d.done()) return Reply(ch, Status(DYAD_RC_BADUNPACK, "malformed list"));
  Result<std::vector<KvsEntry>> all = kvs_->List(req.ns, "", 0);
  if (!all.ok()) return Reply(ch, all.status());
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [key, value] : *all) {
    FileRecord rec;
    if (!FileRecord::Decode(value, &rec)) continue;
    if (rec.upath.compare(0, req.path_prefix.size(), req.path_prefix) != 0) continue;
    out.emplace_back(key, value);
    if (req.limit != 0 && out.size() >= req.limit) break;
  }
  Encoder e;
  e.U32(static_cast<uint32_t>(out.size()));
  for (const auto& [k, v] : out) e.Str(k).Str(v);
  Reply(ch, Status::OK(), e.data());
}

void Service::HandleRemove(Channel& ch, const std::string& payload) {
  RemoveRequest req;
  Decoder d(payload);
  if (!req.DecodeFrom(d) || !d.done()) return Reply(ch, Status(DYAD_RC_BADUNPACK, "malformed remove"));
  cache_.Erase(req.ns, req.key);
  Reply(ch, kvs_->Remove(req.ns, req.key));
}

void Service::HandleStatus(Channel& ch) {
  stats_.Add(ServiceStats::kReqStatus);
  StatusReply r;
  r.counters = stats_.Snapshot();
  r.counters["cache.entries"] = cache_.size();
  r.info["version"] = DYAD_VERSION;
  r.info["rank"] = std::to_string(opt_.rank);
  r.info["node"] = std::to_string(node_idx_);
  r.info["incarnation"] = std::to_string(incarnation_);
  r.info["host"] = hostname_;
  r.info["pid"] = std::to_string(getpid());
  r.info["address"] = advertise_;
  r.info["socket"] = opt_.socket_path;
  r.info["producer_path"] = prod_real_;
  r.info["kvs"] = RedactUrl(opt_.kvs_url) + (root_server_ ? " (root)" : "");
  r.info["transport"] = transport_->name();
  if (std::string d = transport_->Details(); !d.empty()) r.info["transport.details"] = d;
  r.info["credentials"] = auth_->credential_names();
  r.info["link_protection"] = LinkProtectionDescription(auth_->protection());
  r.info["uptime_s"] = std::to_string((WallNs() - started_ns_) / 1000000000ull);
  Encoder e;
  r.EncodeTo(e);
  Reply(ch, Status::OK(), e.data());
}

void Service::HandleFetch(Channel& ch, const std::string& payload, const PeerIdentity& peer) {
  stats_.Add(ServiceStats::kReqFetch);
  FetchRequest req;
  Decoder d(payload);
  if (!req.DecodeFrom(d) || !d.done()) {
    stats_.Add(ServiceStats::kFetchRefused);
    return Reply(ch, Status(DYAD_RC_BADUNPACK, "malformed fetch request"));
  }
  auto refuse = [&](const Status& st) {
    stats_.Add(ServiceStats::kFetchRefused);
    DYAD_LOG_WARN("refused fetch of '%s' from rank %u: %s", req.upath.c_str(), peer.rank,
                  st.ToString().c_str());
    Reply(ch, st);
  };
  if (prod_real_.empty())
    return refuse(Status(DYAD_RC_NOTFOUND, "rank " + std::to_string(opt_.rank) +
                                               " serves no producer directory"));
  Result<std::string> upath = ValidateUpath(req.upath);
  if (!upath.ok()) return refuse(upath.status());
  Result<Transport*> transport = GetTransport(req.transport);
  if (!transport.ok()) return refuse(transport.status());
  Result<UniqueFd> fd = OpenBeneath(prod_real_, *upath, O_RDONLY | O_NONBLOCK);
  if (!fd.ok()) {
    if (fd.status().code() == DYAD_RC_PERM) return refuse(fd.status());
    return Reply(ch, Status(fd.status().code() == DYAD_RC_BADFIO ? DYAD_RC_BADFETCH
                                                                 : fd.status().code(),
                            "rank " + std::to_string(opt_.rank) + ": published file '" + *upath +
                                "' cannot be read: " + fd.status().message()));
  }
  struct stat st;
  if (fstat(fd->get(), &st) != 0) return Reply(ch, StatusFromErrno(errno, "stat '" + *upath + "'"));
  if (!S_ISREG(st.st_mode))
    return refuse(Status(DYAD_RC_PERM, "'" + *upath + "' is not a regular file"));
  // A producer holds an exclusive lock while writing (preload library);
  // wait for it, bounded, so a half-written file is never served.
  const Deadline lock_deadline = Deadline::AfterMs(opt_.rpc_timeout_ms);
  while (::flock(fd->get(), LOCK_SH | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK && errno != EINTR) break;  // locking unsupported: serve anyway
    if (lock_deadline.expired())
      return Reply(ch, Status(DYAD_RC_TIMEOUT, "'" + *upath + "' stayed locked by its producer"));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (fstat(fd->get(), &st) != 0) return Reply(ch, StatusFromErrno(errno, "stat '" + *upath + "'"));
  FileSource src;
  src.fd = fd->get();
  src.size = static_cast<uint64_t>(st.st_size);
  src.version = MtimeNs(st);
  src.path = prod_real_ + "/" + *upath;
  Result<std::string> rargs = (*transport)->ReplyArgs(src);
  if (!rargs.ok()) return Reply(ch, rargs.status());
  FetchReply fr;
  fr.size = src.size;
  fr.version = src.version;
  fr.transport_args = *rargs;
  Encoder e;
  fr.EncodeTo(e);
  Reply(ch, Status::OK(), e.data());
  if (ch.broken()) return;
  TransferStats ts;
  Status ps = (*transport)->Push(ch, src, req.transport_args, &ts);
  if (!ps.ok()) {
    ch.MarkBroken();
    stats_.Add(ServiceStats::kErrors);
    DYAD_LOG_WARN("sending '%s' to rank %u failed: %s", upath->c_str(), peer.rank,
                  ps.ToString().c_str());
    return;
  }
  stats_.Add(ServiceStats::kTransfersOut);
  stats_.Add(ServiceStats::kBytesOut, src.size);
  stats_.Add(ServiceStats::kBytesOutDirect, ts.direct_bytes);
}

}  // namespace dyad
