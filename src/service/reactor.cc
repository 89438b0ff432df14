#include "service/reactor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "common/log.h"
#include "common/time.h"

namespace dyad {

namespace {

constexpr int kMaxEvents = 256;
constexpr int kIdleTickMs = 500;
constexpr size_t kReadChunk = 64u << 10;
// Bytes read from one connection per wake-up before the others get a turn.
constexpr size_t kReadBudget = 256u << 10;
// Short sends the loop makes itself (a refusal on a fresh socket) never
// wait long: the socket's buffer is empty.
constexpr int64_t kLoopSendMs = 100;
// At the cap of connections in their handshake, one that has waited this
// long without finishing gives its place to a newcomer (Admit).
constexpr int64_t kDisplaceAfterMs = 20;
// Requests a worker serves back to back on one connection (NextFrameArrives)
// before it hands the connection back to the loop, so that one busy client
// cannot keep a worker forever.
constexpr uint32_t kMaxServedInARow = 64;

// What the head of `buf` holds for `ch`: a whole frame (its type), not yet
// one (nullopt), or a malformed header (its error).
Result<std::optional<uint16_t>> HeadFrame(const Channel& ch, const std::string& buf) {
  if (buf.size() < kFrameHeaderSize) return std::optional<uint16_t>();
  Result<size_t> need = ch.CheckHeader(buf.data());
  if (!need.ok()) return need.status();
  if (buf.size() < kFrameHeaderSize + *need) return std::optional<uint16_t>();
  return std::optional<uint16_t>(FrameType(buf.data()));
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

struct Reactor::Conn {
  Conn(UniqueFd fd, bool is_local) : ch(std::move(fd), Trust::kUnauthenticated), local(is_local) {}
  Channel ch;
  const bool local;
  std::string peer_host;  // TCP: the remote address the per-peer cap counts
  PeerIdentity peer;      // once authenticated
  // Loop thread only (or the worker holding the connection).
  std::unique_ptr<Authenticator::PendingAccept> handshake;  // set while in the handshake
  bool counted_unauthenticated = false;
  Deadline handshake_deadline = Deadline::Never();
  std::string inbuf;   // bytes of the next frame(s), while the loop owns the connection
  std::string outbuf;  // replies of inline requests the socket has not taken yet
  bool busy = false;   // on a worker or parked (the loop does not read it)
  // Parking, under mu.
  std::mutex mu;
  bool running = false;  // a handler is running on a worker
  bool parked = false;
  bool hung_up = false;
  std::function<void(RequestContext&)> pending_resume;  // Resume() before the handler returned
  std::function<void()> on_hangup;
  // Parked until the socket takes more bytes (ParkUntilWritable).
  bool want_write = false;
  Deadline write_deadline = Deadline::Never();
  std::function<void()> on_writable;
};

// The handle a parked request's waiter keeps. Resume and OnHangup may run at
// once on different threads (a store's callback resumes the request while
// the handler that parked it is still registering its cancel), so the
// connection pointer never changes after construction and `resumed_` says
// whether the request is done.
class Reactor::Parked final : public ParkedRequest {
 public:
  Parked(Reactor* r, std::shared_ptr<Conn> c) : r_(r), c_(std::move(c)) {}
  void Resume(std::function<void(RequestContext&)> finish) override {
    if (resumed_.exchange(true)) return;  // resumed twice: a programming error, ignored
    {
      std::lock_guard<std::mutex> lk(c_->mu);
      c_->on_hangup = nullptr;
      c_->on_writable = nullptr;
      c_->want_write = false;
      if (c_->running) {  // the parking handler has not returned yet
        c_->pending_resume = std::move(finish);
        return;
      }
      c_->parked = false;
    }
    r_->parked_.fetch_sub(1);
    r_->Resume(c_, std::move(finish));
  }
  void OnHangup(std::function<void()> cancel) override {
    {
      std::lock_guard<std::mutex> lk(c_->mu);
      if (resumed_) return;  // done (checked under the lock Resume takes): nothing to cancel
      if (!c_->hung_up && !r_->stopping_) {
        c_->on_hangup = std::move(cancel);
        return;
      }
    }
    cancel();
  }

 private:
  Reactor* const r_;
  const std::shared_ptr<Conn> c_;
  std::atomic<bool> resumed_{false};
};

class Reactor::Parking final : public RequestParking {
 public:
  Parking(Reactor* r, std::shared_ptr<Conn> c) : r_(r), c_(std::move(c)) {}
  std::shared_ptr<ParkedRequest> Park() override {
    parked_ = true;
    r_->parked_.fetch_add(1);
    return std::make_shared<Parked>(r_, c_);
  }
  void ParkUntilWritable(std::function<void(RequestContext&)> more,
                         std::function<void(RequestContext&)> give_up,
                         int64_t timeout_ms) override {
    std::shared_ptr<ParkedRequest> p = Park();
    {
      std::lock_guard<std::mutex> lk(c_->mu);
      c_->want_write = true;
      c_->write_deadline = Deadline::AfterMs(timeout_ms);
      c_->on_writable = [p, more = std::move(more)]() mutable { p->Resume(std::move(more)); };
    }
    // The loop closes the connection once the response is abandoned.
    p->OnHangup([p, give_up = std::move(give_up)]() mutable {
      p->Resume([give_up = std::move(give_up)](RequestContext& ctx) {
        give_up(ctx);
        ctx.ch.MarkBroken();
      });
    });
  }
  bool parked() const { return parked_; }

 private:
  Reactor* const r_;
  std::shared_ptr<Conn> c_;
  bool parked_ = false;
};

Reactor::Reactor(ReactorConfig config, ReactorHooks hooks)
    : cfg_(std::move(config)), hooks_(std::move(hooks)) {}

Reactor::~Reactor() { Stop(); }

Status Reactor::Start() {
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) return StatusFromErrno(errno, "epoll_create1");
  wake_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake_.valid()) return StatusFromErrno(errno, "eventfd");
  for (int fd : {wake_.get(), cfg_.unix_listener, cfg_.tcp_listener}) {
    if (fd < 0) continue;
    if (fd != wake_.get()) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    ev.data.u64 = static_cast<uint64_t>(fd);  // listeners and wake_ by number, conns by pointer
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0)
      return StatusFromErrno(errno, "epoll_ctl(listener)");
  }
  local_pool_ = std::make_unique<WorkerPool>("dyad-local", cfg_.workers, cfg_.worker_idle_ms);
  peer_pool_ = std::make_unique<WorkerPool>("dyad-peer", cfg_.workers, cfg_.worker_idle_ms);
  started_ = true;
  loop_ = std::thread([this] { Loop(); });
  pthread_setname_np(loop_.native_handle(), "dyad-loop");
  return Status::OK();
}

void Reactor::Stop() {
  if (stopping_.exchange(true) || !started_) return;
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof one);
  if (loop_.joinable()) loop_.join();
  // The loop shut every connection down; what the pools still run fails fast.
  local_pool_->Stop();
  peer_pool_->Stop();
}

void Reactor::Loop() {
  epoll_event events[kMaxEvents];
  while (!stopping_) {
    const int n = ::epoll_wait(epoll_.get(), events, kMaxEvents, NextTimeoutMs());
    if (n < 0 && errno != EINTR) {
      DYAD_LOG_ERROR("epoll_wait: %s", std::strerror(errno));
      break;
    }
    for (int i = 0; i < n && !stopping_; ++i) {
      const uint64_t tag = events[i].data.u64;
      if (tag == static_cast<uint64_t>(wake_.get())) {
        uint64_t v;
        (void)!::read(wake_.get(), &v, sizeof v);
        DrainPosts();
      } else if (tag == static_cast<uint64_t>(cfg_.unix_listener)) {
        AcceptAll(cfg_.unix_listener, true);
      } else if (tag == static_cast<uint64_t>(cfg_.tcp_listener)) {
        AcceptAll(cfg_.tcp_listener, false);
      } else {
        Conn* c = reinterpret_cast<Conn*>(events[i].data.ptr);
        if (conns_.count(c) == 0) continue;
        if (c->busy) {
          OnEventWhileParked(c, events[i].events);
        } else {
          OnReadable(c);
        }
      }
    }
    ExpireHandshakes();
    ExpireWriteParks();
  }
  // Stopping: wake every connection's user, then let the workers finish.
  {
    std::lock_guard<std::mutex> lk(post_mu_);
    loop_gone_ = true;
    posts_.clear();
  }
  for (auto& [raw, c] : conns_) {
    ::shutdown(c->ch.fd(), SHUT_RDWR);
    if (c->busy) OnHangupWhileParked(raw);
  }
  conns_.clear();  // connections still on workers close when those drop them
  handshaking_.clear();
  live_ = 0;
}

int Reactor::NextTimeoutMs() const {
  int64_t ms = kIdleTickMs;
  for (const Conn* c : handshaking_)
    if (!c->busy) ms = std::min(ms, c->handshake_deadline.RemainingMs() + 1);
  return static_cast<int>(std::max<int64_t>(ms, 0));
}

std::string Reactor::Admit(bool local, const std::string& peer_host) {
  if (conns_.size() >= cfg_.max_connections)
    return "connection cap reached (" + std::to_string(cfg_.max_connections) +
           ", DYAD_MAX_CONNECTIONS)";
  if (local) return std::string();
  auto it = per_peer_.find(peer_host);
  if (it != per_peer_.end() && it->second >= cfg_.max_per_peer)
    return "too many connections in their handshake from " + peer_host + " (" +
           std::to_string(cfg_.max_per_peer) + ", DYAD_MAX_UNAUTHENTICATED_PER_PEER)";
  if (handshaking_.size() >= cfg_.max_unauthenticated && !DisplaceOldestHandshake())
    return "too many connections in their handshake (" + std::to_string(cfg_.max_unauthenticated) +
           ", DYAD_MAX_UNAUTHENTICATED)";
  return std::string();
}

// A real peer finishes its handshake within a round trip or two; connections
// that stay silent can only fill the places. So at the cap the oldest
// handshake that has waited kDisplaceAfterMs makes room for the newcomer
// (handshaking_ is in arrival order): a flood of silent connections then
// mostly displaces itself, and shuts a real peer out only by opening the
// whole cap's worth of connections within the peer's own handshake time.
bool Reactor::DisplaceOldestHandshake() {
  for (Conn* c : handshaking_) {
    if (c->busy) continue;  // a worker is finishing it
    const int64_t waited = cfg_.handshake_ms - c->handshake_deadline.RemainingMs();
    if (waited < kDisplaceAfterMs) return false;  // the rest arrived later still
    hooks_.refused("handshake: displaced by a newer connection after " + std::to_string(waited) +
                   " ms (from " + c->peer_host + ")");
    Close(c);
    return true;
  }
  return false;
}

void Reactor::AcceptAll(int listen_fd, bool local) {
  for (int accepted = 0; accepted < kMaxEvents && !stopping_; ++accepted) {
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        DYAD_LOG_WARN("accept: %s", std::strerror(errno));  // EMFILE: the caps are too high
      return;
    }
    auto c = std::make_shared<Conn>(UniqueFd(fd), local);
    if (!local) {
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      c->peer_host = RemoteHost(fd);
    }
    const std::string why = Admit(local, c->peer_host);
    if (!why.empty()) {
      hooks_.refused(why);
      continue;  // closes it: refused before any byte is read
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
      c->handshake_deadline = Deadline::AfterMs(cfg_.handshake_ms);
      Result<std::unique_ptr<Authenticator::PendingAccept>> hs =
          cfg_.auth->AcceptBegin(c->ch, cfg_.self, Deadline::AfterMs(kLoopSendMs));
      if (!hs.ok()) {
        hooks_.refused("handshake: " + hs.status().ToString());
        continue;
      }
      c->handshake = std::move(*hs);
      c->counted_unauthenticated = true;
      ++per_peer_[c->peer_host];
      handshaking_.push_back(c.get());
      unauthenticated_ = handshaking_.size();
    }
    Register(std::move(c));
  }
}

void Reactor::Register(std::shared_ptr<Conn> c) {
  Conn* raw = c.get();
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | EPOLLONESHOT;
  ev.data.ptr = raw;
  conns_.emplace(raw, std::move(c));
  live_ = conns_.size();
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, raw->ch.fd(), &ev) != 0) {
    DYAD_LOG_WARN("epoll_ctl(add): %s", std::strerror(errno));
    Close(raw);
  }
}

void Reactor::Arm(Conn* c, uint32_t events) {
  epoll_event ev{};
  ev.events = events | EPOLLONESHOT;
  ev.data.ptr = c;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c->ch.fd(), &ev) != 0) {
    DYAD_LOG_WARN("epoll_ctl(mod): %s", std::strerror(errno));
    Close(c);
  }
}

void Reactor::Close(Conn* c) {
  if (c->counted_unauthenticated) {
    c->counted_unauthenticated = false;
    handshaking_.erase(std::find(handshaking_.begin(), handshaking_.end(), c));
    auto it = per_peer_.find(c->peer_host);
    if (it != per_peer_.end() && --it->second == 0) per_peer_.erase(it);
    unauthenticated_ = handshaking_.size();
  }
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, c->ch.fd(), nullptr);
  write_parked_.erase(std::remove(write_parked_.begin(), write_parked_.end(), c),
                      write_parked_.end());
  conns_.erase(c);  // closes the descriptor unless a worker still holds it
  live_ = conns_.size();
}

void Reactor::OnReadable(Conn* c) {
  if (!c->outbuf.empty()) {  // armed for output only: replies still queued
    const Flushed f = Flush(c);
    if (f == Flushed::kClosed) return;
    if (f == Flushed::kPending) return Arm(c, EPOLLOUT);
    return TryFrame(c);
  }
  size_t got = 0;
  char buf[kReadChunk];
  while (got < kReadBudget) {
    const ssize_t n = ::recv(c->ch.fd(), buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      c->inbuf.append(buf, static_cast<size_t>(n));
      got += static_cast<size_t>(n);
      // Stop reading once a frame is complete: the rest waits in the socket.
      Result<std::optional<uint16_t>> head = HeadFrame(c->ch, c->inbuf);
      if (!head.ok() || head->has_value()) break;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    return Close(c);  // closed by the peer, or reset
  }
  TryFrame(c);
}

void Reactor::TryFrame(Conn* c) {
  for (;;) {
    Result<std::optional<uint16_t>> head = HeadFrame(c->ch, c->inbuf);
    if (!head.ok()) {
      if (c->handshake) {
        hooks_.refused("handshake: " + head.status().ToString());
      } else {
        DYAD_LOG_WARN(
            "%s: %s",
            c->local ? "local client" : ("peer rank " + std::to_string(c->peer.rank)).c_str(),
            head.status().ToString().c_str());
        hooks_.reply_error(c->ch, head.status());
      }
      return Close(c);
    }
    if (!head->has_value()) break;
    const uint16_t type = **head;
    if (!c->handshake && hooks_.runs_inline && hooks_.runs_inline(c->local, type)) {
      if (!ServeInline(c)) return;
      continue;  // a pipelined frame may be complete already
    }
    c->busy = true;
    c->ch.Unread(std::move(c->inbuf));
    c->inbuf.clear();
    std::shared_ptr<Conn> ref = conns_.at(c);
    if (c->handshake) {
      peer_pool_->Submit([this, ref] { FinishHandshake(ref); });
    } else {
      PoolOf(*c).Submit([this, ref] { Serve(ref); });
    }
    return;
  }
  Arm(c, EPOLLIN | EPOLLRDHUP);
}

bool Reactor::ServeInline(Conn* c) {
  c->ch.Unread(std::move(c->inbuf));
  c->inbuf.clear();
  uint16_t type = 0;
  // The whole frame is buffered: this never waits on the peer.
  Status st = c->ch.RecvFrame(&type, &inline_payload_, Deadline::AfterMs(kLoopSendMs));
  if (!st.ok()) {
    DYAD_LOG_WARN("%s: %s",
                  c->local ? "local client" : ("peer rank " + std::to_string(c->peer.rank)).c_str(),
                  st.ToString().c_str());
    Close(c);
    return false;
  }
  c->ch.CaptureSends(&c->outbuf);
  RequestContext ctx = ContextOf(*c, nullptr);
  hooks_.dispatch(ctx, type, inline_payload_);
  c->ch.CaptureSends(nullptr);
  c->inbuf = c->ch.TakeUnread();
  const bool broken = c->ch.broken();
  const Flushed f = Flush(c);
  if (f == Flushed::kClosed) return false;
  if (broken) {  // the reply (an error, say) went out as far as it could
    Close(c);
    return false;
  }
  if (f == Flushed::kPending) {
    Arm(c, EPOLLOUT);
    return false;
  }
  return true;
}

Reactor::Flushed Reactor::Flush(Conn* c) {
  size_t sent = 0;
  while (sent < c->outbuf.size()) {
    const ssize_t n = ::send(c->ch.fd(), c->outbuf.data() + sent, c->outbuf.size() - sent,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    Close(c);  // reset, or gone
    return Flushed::kClosed;
  }
  c->outbuf.erase(0, sent);
  return c->outbuf.empty() ? Flushed::kAll : Flushed::kPending;
}

void Reactor::ExpireHandshakes() {
  std::vector<Conn*> expired;
  for (Conn* c : handshaking_)
    if (!c->busy && c->handshake_deadline.expired()) expired.push_back(c);
  for (Conn* c : expired) {
    hooks_.refused("handshake: not completed within " + std::to_string(cfg_.handshake_ms) +
                   " ms (from " + c->peer_host + ")");
    Close(c);
  }
}

void Reactor::PostBack(Post what, std::shared_ptr<Conn> c) {
  {
    std::lock_guard<std::mutex> lk(post_mu_);
    if (loop_gone_) return;  // stopping: dropping the reference closes it
    posts_.emplace_back(what, std::move(c));
  }
  const uint64_t one = 1;
  (void)!::write(wake_.get(), &one, sizeof one);
}

void Reactor::DrainPosts() {
  std::vector<std::pair<Post, std::shared_ptr<Conn>>> posts;
  {
    std::lock_guard<std::mutex> lk(post_mu_);
    posts.swap(posts_);
  }
  for (auto& [what, c] : posts) {
    if (conns_.count(c.get()) == 0) continue;
    if (what == Post::kReturn) {
      OnReturned(c.get());
      continue;
    }
    std::lock_guard<std::mutex> lk(c->mu);  // kWatchParked
    if (!c->parked) continue;
    if (!c->want_write) {
      Arm(c.get(), EPOLLRDHUP);
      continue;
    }
    if (std::find(write_parked_.begin(), write_parked_.end(), c.get()) == write_parked_.end())
      write_parked_.push_back(c.get());
    Arm(c.get(), EPOLLOUT | EPOLLRDHUP);
  }
}

void Reactor::OnEventWhileParked(Conn* c, uint32_t events) {
  std::function<void()> writable;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    const bool gone = (events & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) != 0;
    if (c->want_write && !gone && (events & EPOLLOUT) != 0) {
      writable = std::move(c->on_writable);
      c->on_writable = nullptr;
      c->want_write = false;
    }
  }
  write_parked_.erase(std::remove(write_parked_.begin(), write_parked_.end(), c),
                      write_parked_.end());
  if (writable) return writable();  // resumes the response on a worker
  OnHangupWhileParked(c);
}

void Reactor::ExpireWriteParks() {
  for (size_t i = 0; i < write_parked_.size();) {
    Conn* c = write_parked_[i];
    bool waiting, expired;
    {
      std::lock_guard<std::mutex> lk(c->mu);
      waiting = c->want_write;
      expired = waiting && c->write_deadline.expired();
    }
    if (waiting && !expired) {
      ++i;
      continue;
    }
    write_parked_.erase(write_parked_.begin() + static_cast<std::ptrdiff_t>(i));
    if (!expired) continue;  // resumed meanwhile
    DYAD_LOG_WARN(
        "%s took no bytes of its response within its bound; closing",
        c->local ? "local client" : ("peer rank " + std::to_string(c->peer.rank)).c_str());
    OnHangupWhileParked(c);  // its give_up step runs, then the connection closes
  }
}

void Reactor::OnReturned(Conn* c) {
  c->busy = false;
  if (c->counted_unauthenticated && !c->handshake) {  // the handshake succeeded
    c->counted_unauthenticated = false;
    handshaking_.erase(std::find(handshaking_.begin(), handshaking_.end(), c));
    auto it = per_peer_.find(c->peer_host);
    if (it != per_peer_.end() && --it->second == 0) per_peer_.erase(it);
    unauthenticated_ = handshaking_.size();
  }
  if (c->ch.broken()) return Close(c);
  c->inbuf = c->ch.TakeUnread();
  TryFrame(c);
}

void Reactor::OnHangupWhileParked(Conn* c) {
  std::function<void()> cancel;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    c->hung_up = true;
    if (c->parked) cancel = std::move(c->on_hangup);
    c->on_hangup = nullptr;
  }
  if (cancel) cancel();  // the wait ends; its Resume returns the connection
}

WorkerPool& Reactor::PoolOf(const Conn& c) { return c.local ? *local_pool_ : *peer_pool_; }

RequestContext Reactor::ContextOf(Conn& c, RequestParking* parking) {
  Channel& ch = c.ch;
  return RequestContext{ch, c.local ? Link::kLocal : Link::kPeer, c.local ? nullptr : &c.peer,
                        [this, &ch] { return stopping_.load() || ch.PeerClosed(); }, parking};
}

void Reactor::FinishHandshake(const std::shared_ptr<Conn>& c) {
  Status st = cfg_.auth->AcceptFinish(*c->handshake, c->ch, c->handshake_deadline, &c->peer);
  if (st.ok()) {
    c->handshake.reset();
  } else {
    hooks_.refused("handshake: " + st.ToString());
    c->ch.MarkBroken();
  }
  PostBack(Post::kReturn, c);
}

void Reactor::Serve(const std::shared_ptr<Conn>& c) {
  for (uint32_t served = 1;; ++served) {
    if (!ServeOne(c)) return;  // parked, or handed back after a failure
    if (served >= kMaxServedInARow || !NextFrameArrives(*c)) break;
  }
  PostBack(Post::kReturn, c);
}

bool Reactor::ServeOne(const std::shared_ptr<Conn>& c) {
  uint16_t type = 0;
  std::string payload;
  // The whole frame is buffered: this never waits on the peer.
  Status st = c->ch.RecvFrame(&type, &payload, Deadline::AfterMs(kLoopSendMs));
  if (!st.ok()) {
    DYAD_LOG_WARN("%s: %s",
                  c->local ? "local client" : ("peer rank " + std::to_string(c->peer.rank)).c_str(),
                  st.ToString().c_str());
    c->ch.MarkBroken();
    PostBack(Post::kReturn, c);
    return false;
  }
  return RunHandler(c, [&](RequestContext& ctx) { hooks_.dispatch(ctx, type, payload); });
}

bool Reactor::RunHandler(const std::shared_ptr<Conn>& c,
                         const std::function<void(RequestContext&)>& handler) {
  Parking parking(this, c);
  {
    std::lock_guard<std::mutex> lk(c->mu);
    c->running = true;
  }
  RequestContext ctx = ContextOf(*c, &parking);
  handler(ctx);
  if (!parking.parked()) {
    std::lock_guard<std::mutex> lk(c->mu);
    c->running = false;
    return true;
  }
  std::function<void(RequestContext&)> finish;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    c->running = false;
    if (c->pending_resume) {
      finish = std::move(c->pending_resume);
      c->pending_resume = nullptr;
    } else {
      c->parked = true;
    }
  }
  if (!finish) {
    PostBack(Post::kWatchParked, c);
  } else {
    parked_.fetch_sub(1);
    Resume(c, std::move(finish));
  }
  return false;
}

bool Reactor::NextFrameArrives(Conn& c) {
  // Lingering holds this worker, so only while another one is idle or may
  // still start: work the loop submits meanwhile still starts at once.
  if (cfg_.linger_us <= 0 || stopping_.load() || c.ch.broken() || PoolOf(c).spare() == 0)
    return false;
  std::string bytes = c.ch.TakeUnread();  // frames the client pipelined
  // A client issuing requests back to back sends the next one within
  // microseconds: poll for it briefly on this CPU (DYAD_SPIN_US, yielding)
  // before sleeping, as a requester does for its reply.
  if (bytes.empty()) (void)c.ch.SpinFor(POLLIN);
  const int64_t until = static_cast<int64_t>(MonoNs() / 1000) + cfg_.linger_us;
  for (;;) {
    Result<std::optional<uint16_t>> head = HeadFrame(c.ch, bytes);
    // A malformed header goes back to the loop, which reports and closes.
    if (!head.ok()) break;
    if (head->has_value()) {
      // Requests the loop serves itself stay there: no hand-off to save.
      if (hooks_.runs_inline && hooks_.runs_inline(c.local, **head)) break;
      c.ch.Unread(std::move(bytes));
      return true;
    }
    const int64_t left_us = until - static_cast<int64_t>(MonoNs() / 1000);
    if (left_us <= 0) break;
    pollfd p{c.ch.fd(), POLLIN | POLLRDHUP, 0};
    const timespec ts{static_cast<time_t>(left_us / 1000000),
                      static_cast<long>(left_us % 1000000) * 1000};
    const int r = ::ppoll(&p, 1, &ts, nullptr);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    char buf[kReadChunk];
    const ssize_t n = ::recv(c.ch.fd(), buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      bytes.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    c.ch.MarkBroken();  // closed by the peer, or reset: the loop closes it
    break;
  }
  // Nothing complete in time: the loop owns the connection again, with
  // whatever part of a frame arrived (a slow peer costs a buffer, not a thread).
  c.ch.Unread(std::move(bytes));
  return false;
}

void Reactor::Resume(const std::shared_ptr<Conn>& c, std::function<void(RequestContext&)> finish) {
  // From a store's thread, the loop (a hang-up) or a worker: the finish
  // step runs on the pool of the connection's link.
  PoolOf(*c).Submit([this, c, finish = std::move(finish)] {
    if (RunHandler(c, finish)) PostBack(Post::kReturn, c);  // else parked again
  });
}

}  // namespace dyad
