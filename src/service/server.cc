#include "service/server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "common/log.h"
#include "common/time.h"

namespace dyad {

namespace {

// Short sends on a fresh socket (a refusal, a challenge) never wait long:
// its buffer is empty.
constexpr int64_t kFreshSendMs = 100;
// At the cap of connections in their handshake, one that has waited this
// long without finishing gives its place to a newcomer (Admit).
constexpr int64_t kDisplaceAfterMs = 20;
// Connections accepted in one turn before the others get the loop.
constexpr int kAcceptBurst = 256;
// Bytes a request link reads at once (ReadInto): the header and payload of
// a request, and of those behind it, in one system call.
constexpr size_t kRequestReadAhead = 16u << 10;

// Whether this thread runs as SCHED_BATCH (Server::PreferThroughput).
thread_local bool t_batch_scheduling = false;

// Replies held back while more requests are already read (Serve): at most
// this many bytes before they are sent anyway.
constexpr size_t kBatchedReplies = 64u << 10;

// True when the bytes read ahead on `ch` begin with a whole frame (its
// header and every byte the header announces).
bool HoldsFrame(const Channel& ch) {
  const std::string_view u = ch.unread_view();
  if (u.size() < kFrameHeaderSize) return false;
  uint32_t wire_len = 0;
  std::memcpy(&wire_len, u.data() + 8, sizeof wire_len);
  return u.size() - kFrameHeaderSize >= wire_len;
}

std::string RemoteHost(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  char host[INET6_ADDRSTRLEN] = "?";
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) == 0) {
    if (ss.ss_family == AF_INET)
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, host, sizeof host);
    else if (ss.ss_family == AF_INET6)
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, host, sizeof host);
  }
  return host;
}

}  // namespace

// A read of a connection started while a task request waits (Server::
// Handle): it watches for the requester's hang-up during the request, and
// what it reads (the next request, or the hang-up) is the next frame
// read's. Loop only.
struct Server::PendingRead {
  bool serving = true;  // the request is still being served
  bool done = false;
  Ready ready = Ready::kReady;
  Status error;                // a hang-up or a socket error
  std::function<void()> kick;  // wakes a ReadFrame waiting for it
};

struct Server::Conn {
  Conn(UniqueFd fd, bool is_local) : ch(std::move(fd), Trust::kUnauthenticated), local(is_local) {}
  Channel ch;
  const bool local;
  std::string peer_host;  // TCP: the remote address the per-peer cap counts
  PeerIdentity peer;      // once authenticated
  bool handshaking = false;
  Deadline handshake_deadline = Deadline::Never();
  SteadyClock::time_point challenged{};  // when its challenge was sent
  std::list<Conn*>::iterator in_handshakes;
  Channel::PartialFrame partial;
  std::string payload;  // of the frame being received
  std::string out;      // replies not sent yet
  bool closed = false;
  std::shared_ptr<PendingRead> pending;  // a read started during a request
};

void Server::PreferThroughput(bool on) {
  if (on == t_batch_scheduling) return;
  sched_param param{};
  param.sched_priority = 0;
  if (::sched_setscheduler(0, on ? SCHED_BATCH : SCHED_OTHER, &param) == 0) t_batch_scheduling = on;
}

Server::Server(Runtime& rt, ServerConfig config, ServerHooks hooks)
    : rt_(rt), cfg_(std::move(config)), hooks_(std::move(hooks)) {}

Server::~Server() = default;

Status Server::Start() {
  for (int fd : {cfg_.unix_listener, cfg_.tcp_listener}) {
    if (fd < 0) continue;
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    rt_.Spawn(Accept(fd, fd == cfg_.unix_listener));
  }
  return Status::OK();
}

void Server::Stop() {
  rt_.Post([this] {
    if (stopped_) return;
    stopped_ = true;
    // Each connection's task sees its socket end (and its request's Stop
    // fires through the runtime's).
    for (auto& [raw, c] : conns_) ::shutdown(c->ch.fd(), SHUT_RDWR);
  });
}

std::string Server::Who(const Conn& c) const {
  return c.local ? std::string("local client") : "peer rank " + std::to_string(c.peer.rank);
}

std::string Server::Admit(bool local, const std::string& peer_host) {
  if (conns_.size() >= cfg_.max_connections)
    return "connection cap reached (" + std::to_string(cfg_.max_connections) +
           ", DYAD_MAX_CONNECTIONS)";
  if (local) return std::string();
  // (an address's own silent handshakes make room for its newcomer, as
  // below: a flood from a real peer's host does not shut that peer out)
  auto it = per_peer_.find(peer_host);
  if (it != per_peer_.end() && it->second >= cfg_.max_per_peer &&
      !DisplaceOldestHandshake(peer_host))
    return "too many connections in their handshake from " + peer_host + " (" +
           std::to_string(cfg_.max_per_peer) + ", DYAD_MAX_UNAUTHENTICATED_PER_PEER)";
  if (handshaking_.size() >= cfg_.max_unauthenticated && !DisplaceOldestHandshake())
    return "too many connections in their handshake (" + std::to_string(cfg_.max_unauthenticated) +
           ", DYAD_MAX_UNAUTHENTICATED)";
  return std::string();
}

// A real peer finishes its handshake within a round trip or two; connections
// that stay silent can only fill the places. So at the cap a handshake makes
// room for the newcomer: first the oldest that was sent its challenge
// kDisplaceAfterMs ago or more and has sent nothing back; else the oldest
// accepted that long ago (handshaking_ is in arrival order). A flood of
// silent connections then mostly displaces itself, and a real peer keeps
// its place while the loop, busy with the flood, has not yet sent its
// challenge or read its answer.
bool Server::DisplaceOldestHandshake(const std::string& host) {
  const auto now = SteadyClock::now();
  const auto answer_time = std::chrono::milliseconds(kDisplaceAfterMs);
  auto displace = [this](Conn& c, int64_t waited) {
    hooks_.refused("handshake: displaced by a newer connection after " + std::to_string(waited) +
                   " ms (from " + c.peer_host + ")");
    EndHandshake(c);
    TellBusy(c.ch);  // a real peer dials again
    Close(c);
    return true;
  };
  for (Conn* c : handshaking_) {
    if (!host.empty() && c->peer_host != host) continue;
    if (c->challenged == SteadyClock::time_point{} || now - c->challenged < answer_time) continue;
    int pending = 0;
    if (c->ch.has_unread() || ::ioctl(c->ch.fd(), FIONREAD, &pending) != 0 || pending > 0) continue;
    return displace(*c, cfg_.handshake_ms - c->handshake_deadline.RemainingMs());
  }
  for (Conn* c : handshaking_) {
    if (!host.empty() && c->peer_host != host) continue;
    const int64_t waited = cfg_.handshake_ms - c->handshake_deadline.RemainingMs();
    if (waited < kDisplaceAfterMs) return false;  // the rest arrived later still
    return displace(*c, waited);
  }
  return false;
}

Task<void> Server::Accept(int listen_fd, bool local) {
  dyad::Stop& stop = rt_.stopping();
  while (!stop.fired()) {
    if (co_await WaitReady(listen_fd, POLLIN, Deadline::Never(), &stop) != Ready::kReady) break;
    for (int accepted = 0; accepted < kAcceptBurst && !stop.fired(); ++accepted) {
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
          DYAD_LOG_WARN("accept: %s", std::strerror(errno));  // EMFILE: the caps are too high
        break;
      }
      auto c = std::make_shared<Conn>(UniqueFd(fd), local);
      if (!local) {
        int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        c->peer_host = RemoteHost(fd);
      }
      const std::string why =
          stopped_ ? std::string("the service is stopping") : Admit(local, c->peer_host);
      if (!why.empty()) {
        hooks_.refused(why);
        if (!local && !stopped_) TellBusy(c->ch);  // a real peer dials again
        continue;                                  // closes it: refused before any byte is read
      }
      if (local) {
        PeerCred cred;
        if (Status admit = AdmitLocalClient(c->ch, &cred); !admit.ok()) {
          DYAD_LOG_WARN("refused local client pid %d uid %u (service runs as uid %u): %s", cred.pid,
                        cred.uid, geteuid(), admit.ToString().c_str());
          hooks_.reply_error(c->ch, admit);
          continue;
        }
      } else {
        c->handshaking = true;
        c->handshake_deadline = Deadline::AfterMs(cfg_.handshake_ms);
        ++per_peer_[c->peer_host];
        c->in_handshakes = handshaking_.insert(handshaking_.end(), c.get());
        unauthenticated_ = handshaking_.size();
      }
      conns_.emplace(c.get(), c);
      live_ = conns_.size();
      rt_.Spawn(Serve(std::move(c)));
    }
  }
}

void Server::TellBusy(Channel& ch) {
  // Best effort and never waited for: the loop is busy with a flood.
  (void)ch.SendFrame(static_cast<uint16_t>(MsgType::kReply), EncodeReply(HandshakeBusy()),
                     Deadline::AfterMs(0));
}

void Server::EndHandshake(Conn& c) {
  if (!c.handshaking) return;
  c.handshaking = false;
  handshaking_.erase(c.in_handshakes);
  auto it = per_peer_.find(c.peer_host);
  if (it != per_peer_.end() && --it->second == 0) per_peer_.erase(it);
  unauthenticated_ = handshaking_.size();
}

void Server::Close(Conn& c) {
  if (c.closed) return;
  c.closed = true;
  // Ends whatever the connection's task waits for on its socket; the task
  // then drops the connection.
  ::shutdown(c.ch.fd(), SHUT_RDWR);
  c.ch.MarkBroken();
}

Task<void> Server::Serve(std::shared_ptr<Conn> c) {
  bool refused = false;
  if (!c->local) refused = !co_await Handshake(*c);
  if (refused) {
    EndHandshake(*c);
  } else {
    EndHandshake(*c);
    uint16_t type = 0;
    std::string payload;
    // Once the requester is gone its replies go nowhere, but the requests
    // it sent before (a pipeline of asynchronous publications) are still
    // served, up to the hang-up: what a client sent completely before it
    // died is neither lost nor half done.
    bool requester_gone = false;
    while (!c->closed && !c->ch.broken()) {
      if (!co_await NextFrame(*c, &type, &payload)) break;
      // Only the publish handler knows whether it is asynchronous (it
      // turns the preference on); every other request turns it off.
      if (type != static_cast<uint16_t>(MsgType::kPublish)) PreferThroughput(false);
      if (!c->out.empty() && !requester_gone) {
        // Held-back replies go before a handler that writes the socket itself.
        const Handling how = hooks_.handling(c->local, type);
        if ((how == Handling::kBlocking || how == Handling::kStreaming) && !co_await Flush(*c)) {
          requester_gone = true;
          c->out.clear();
        }
      }
      co_await Handle(c, type, payload);
      if (c->out.empty()) continue;
      if (requester_gone) {
        c->out.clear();
        continue;
      }
      // Replies of requests already read wait for the last of them: one
      // send for a burst of pipelined requests (bounded by kBatchedReplies).
      if (c->ch.has_unread() && c->out.size() < kBatchedReplies && HoldsFrame(c->ch)) continue;
      if (!co_await Flush(*c)) {
        requester_gone = true;
        c->out.clear();
      }
    }
  }
  // A read still pending would keep the connection open: end it.
  if (c->pending && !c->pending->done) Close(*c);
  PreferThroughput(false);  // a pipeline that ends leaves the loop as it was
  conns_.erase(c.get());
  live_ = conns_.size();
}

Task<bool> Server::Handshake(Conn& c) {
  Result<std::unique_ptr<Authenticator::PendingAccept>> hs =
      cfg_.auth->AcceptBegin(c.ch, cfg_.self, Deadline::AfterMs(kFreshSendMs));
  if (!hs.ok()) {
    hooks_.refused("handshake: " + hs.status().ToString());
    co_return false;
  }
  c.challenged = SteadyClock::now();
  // The peer's answer (at most the small frame limit of an unauthenticated
  // link), read as every frame is, then checked on the pool (MUNGE may
  // block) from the channel, where it is handed back.
  uint16_t type = 0;
  std::string payload;
  Status error;
  switch (co_await ReadFrame(c, c.handshake_deadline, &type, &payload, &error)) {
    case FrameRead::kFrame:
      break;
    case FrameRead::kFailed:
      if (error.code() != DYAD_RC_CONNLOST) hooks_.refused("handshake: " + error.ToString());
      co_return false;
    case FrameRead::kStopped:
      co_return false;
    case FrameRead::kTimeout:
      hooks_.refused("handshake: not completed within " + std::to_string(cfg_.handshake_ms) +
                     " ms (from " + c.peer_host + ")");
      co_return false;
  }
  std::string frame(kFrameHeaderSize, '\0');
  EncodeFrameHeader(frame.data(), type, static_cast<uint32_t>(payload.size()));
  frame += payload;
  frame += c.ch.TakeUnread();  // what came behind it (a peer's first request) stays after it
  c.ch.Unread(std::move(frame));
  // Checked off the loop; the connection stays in the handshake count (it
  // cannot be displaced meanwhile: it has answered).
  EndHandshake(c);
  Authenticator::PendingAccept& pending = **hs;
  Status st = co_await rt_.Offload([this, &c, &pending] {
    return cfg_.auth->AcceptFinish(pending, c.ch, c.handshake_deadline, &c.peer);
  });
  if (!st.ok()) {
    hooks_.refused("handshake: " + st.ToString());
    co_return false;
  }
  co_return !c.closed;
}

Task<Server::FrameRead> Server::ReadFrame(Conn& c, Deadline deadline, uint16_t* type,
                                          std::string* payload, Status* error) {
  for (;;) {
    // Frames are taken from the bytes read so far; the socket is read
    // (ReadInto) only when they hold no whole frame.
    if (c.ch.has_unread()) {
      Result<bool> got = c.ch.RecvFrameNow(&c.partial, type, payload);
      if (!got.ok()) {
        *error = got.status();
        co_return FrameRead::kFailed;
      }
      if (*got) {
        c.partial.Reset();
        co_return FrameRead::kFrame;
      }
    }
    // A read that began while the last request waited: its bytes (or the
    // hang-up it saw) come first, and no second read may run beside it.
    if (c.pending) {
      std::shared_ptr<PendingRead> p = c.pending;
      if (!p->done) {
        const Ready r = co_await runtime_internal::WaitKicked(&p->kick, deadline, &rt_.stopping());
        if (!p->done) co_return r == Ready::kTimeout ? FrameRead::kTimeout : FrameRead::kStopped;
      }
      c.pending.reset();
      if (p->ready != Ready::kReady || c.closed) co_return FrameRead::kStopped;
      if (!p->error.ok()) {
        *error = p->error;
        co_return FrameRead::kFailed;
      }
      continue;
    }
    // Before the handshake at most one small frame is read at once.
    const size_t max = c.ch.trust() == Trust::kUnauthenticated
                           ? kFrameHeaderSize + c.ch.frame_limit()
                           : kRequestReadAhead;
    const Ready r = co_await ReadInto(c.ch, max, deadline, &rt_.stopping(), error);
    if (r == Ready::kStopped || c.closed) co_return FrameRead::kStopped;
    if (r == Ready::kTimeout) co_return FrameRead::kTimeout;
    if (!error->ok()) co_return FrameRead::kFailed;
  }
}

Task<bool> Server::NextFrame(Conn& c, uint16_t* type, std::string* payload) {
  Status error;
  const FrameRead how = co_await ReadFrame(c, Deadline::Never(), type, payload, &error);
  if (how == FrameRead::kFailed && error.code() != DYAD_RC_CONNLOST) {
    DYAD_LOG_WARN("%s: %s", Who(c).c_str(), error.ToString().c_str());
    hooks_.reply_error(c.ch, error);
  }
  co_return how == FrameRead::kFrame;
}

Task<void> Server::Handle(std::shared_ptr<Conn> conn, uint16_t type, const std::string& payload) {
  Conn& c = *conn;
  const Handling how = hooks_.handling(c.local, type);
  auto stop = std::make_shared<dyad::Stop>(rt_.executor(), &rt_.stopping());
  Channel& ch = c.ch;
  dyad::Stop* s = stop.get();
  RequestContext ctx{ch,
                     c.local ? Link::kLocal : Link::kPeer,
                     c.local ? nullptr : &c.peer,
                     [s, &ch] { return s->fired() || ch.PeerClosed(); },
                     s,
                     &rt_};
  switch (how) {
    case Handling::kInline:
      ch.CaptureSends(&c.out);
      hooks_.serve(ctx, type, payload);
      ch.CaptureSends(nullptr);
      co_return;
    case Handling::kBlocking:
      co_await rt_.Offload([this, &ctx, type, &payload] { hooks_.serve(ctx, type, payload); });
      co_return;
    case Handling::kStreaming:
      parked_.fetch_add(1);
      co_await hooks_.serve_task(ctx, type, payload);
      parked_.fetch_sub(1);
      co_return;
    case Handling::kTask: {
      parked_.fetch_add(1);
      ch.CaptureSends(&c.out);
      // The requester hanging up fires the request's Stop: its waits end.
      // Watched by a read of the connection, which the next ReadFrame then
      // takes over (the next request's read, begun early): the watch costs
      // no system call, nor registration, of its own. A request that
      // arrived already (pipelined) is left for its turn, unwatched.
      std::shared_ptr<PendingRead> pending;
      if (!conn->pending && !conn->closed && !ch.has_unread()) {
        pending = std::make_shared<PendingRead>();
        conn->pending = pending;
        StartReadInto(rt_.executor(), ch, kRequestReadAhead, Deadline::Never(), &rt_.stopping(),
                      [conn, pending, stop](Ready r, Status error) {
                        pending->ready = r;
                        pending->error = std::move(error);
                        pending->done = true;
                        if (pending->serving && r == Ready::kReady && !pending->error.ok())
                          stop->Fire(Status(DYAD_RC_CANCELLED, "the requester went away"));
                        if (pending->kick) {
                          std::function<void()> kick = pending->kick;  // its wait clears it
                          kick();
                        }
                      });
      }
      co_await hooks_.serve_task(ctx, type, payload);
      if (pending) pending->serving = false;
      ch.CaptureSends(nullptr);
      parked_.fetch_sub(1);
      co_return;
    }
  }
}

Task<bool> Server::Flush(Conn& c) {
  size_t sent = 0;
  while (sent < c.out.size()) {
    const ssize_t n =
        ::send(c.ch.fd(), c.out.data() + sent, c.out.size() - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      // A peer that does not read holds its own connection only: it gets
      // no more service until it has taken its replies.
      if (co_await WaitReady(c.ch, POLLOUT, Deadline::Never(), &rt_.stopping()) != Ready::kReady ||
          c.closed)
        co_return false;
      continue;
    }
    co_return false;  // reset, or gone
  }
  c.out.clear();
  co_return !c.ch.broken();
}

}  // namespace dyad
