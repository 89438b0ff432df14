#include "client/service_pool.h"

#include <poll.h>
#include <pthread.h>
#include <unistd.h>

#include <cerrno>
#include <set>

#include "client/publish_pipeline.h"

namespace dyad {
namespace {

// Every live pool, so the atfork handlers can reach them. Leaked on purpose:
// pools may outlive static destruction (a detached thread still consuming
// at exit), and a destroyed registry would crash them.
Mutex& RegistryMutex() {
  static Mutex* mu = new Mutex;
  return *mu;
}
std::set<ServicePool*>& Registry() REQUIRES(RegistryMutex()) {
  static std::set<ServicePool*>* pools = new std::set<ServicePool*>;
  return *pools;
}

Mutex& InterruptMutex() {
  static Mutex* mu = new Mutex;
  return *mu;
}
std::shared_ptr<InterruptCheck>& InterruptSlot() REQUIRES(InterruptMutex()) {
  static std::shared_ptr<InterruptCheck>* slot = new std::shared_ptr<InterruptCheck>;
  return *slot;
}

bool Interrupted() {
  std::shared_ptr<InterruptCheck> check;
  {
    MutexLock lk(InterruptMutex());
    check = InterruptSlot();
  }
  return check && *check && (*check)();
}

void RegisterAtFork() {
  static std::once_flag once;
  std::call_once(once, [] {
    pthread_atfork(&ServicePool::AtForkPrepare, &ServicePool::AtForkParent,
                   &ServicePool::AtForkChild);
  });
}

std::string SocketPathFrom(const std::string& socket) {
  if (socket.rfind("unix:", 0) == 0) return socket.substr(5);
  if (!socket.empty() && socket[0] != '/' && socket.find(':') == std::string::npos) {
    // A relative socket path: pin it now so a later chdir cannot move it.
    char cwd[4096];
    if (::getcwd(cwd, sizeof cwd) != nullptr) return std::string(cwd) + "/" + socket;
  }
  return socket;
}

}  // namespace

bool InterruptRequested() { return Interrupted(); }

void SetInterruptCheck(InterruptCheck check) {
  auto slot = check ? std::make_shared<InterruptCheck>(std::move(check)) : nullptr;
  MutexLock lk(InterruptMutex());
  InterruptSlot() = std::move(slot);
}

ServicePool::ServicePool(std::string socket)
    : socket_path_(SocketPathFrom(socket)), address_(ParseAddress(socket_path_)), pid_(::getpid()) {
  RegisterAtFork();
  MutexLock lk(RegistryMutex());
  Registry().insert(this);
}

ServicePool::~ServicePool() {
  {
    MutexLock lk(RegistryMutex());
    Registry().erase(this);
  }
  Clear();
  std::shared_ptr<PublishPipeline> pipeline;
  MutexLock lk(mu_);
  pipeline.swap(pipeline_);
}

std::shared_ptr<PublishPipeline> ServicePool::Pipeline() {
  MutexLock lk(mu_);
  if (pid_ != ::getpid()) {
    // Forked without our atfork handler: the pipeline is the parent's.
    DropForChild();
    pid_ = ::getpid();
  }
  if (pipeline_ == nullptr) pipeline_ = std::make_shared<PublishPipeline>(this);
  return pipeline_;
}

std::shared_ptr<PublishPipeline> ServicePool::PipelineIfAny() {
  MutexLock lk(mu_);
  if (pid_ != ::getpid()) return nullptr;
  return pipeline_;
}

void ServicePool::DropForChild() {
  idle_.clear();
  if (pipeline_ == nullptr) return;
  // Its lock may have been held by a thread of the parent: the object is
  // left alone (leaked), only our copy of its descriptor is closed.
  pipeline_->CloseDescriptorInChild();
  new std::shared_ptr<PublishPipeline>(std::move(pipeline_));
  pipeline_.reset();
}

size_t ServicePool::idle_count() {
  MutexLock lk(mu_);
  return idle_.size();
}

void ServicePool::Clear() {
  std::vector<std::unique_ptr<Channel>> drop;
  MutexLock lk(mu_);
  drop.swap(idle_);
}

// Lock order: registry, then each pool (pool mutexes are otherwise leaves),
// then the interrupt slot. Holding them across fork() means the child finds
// every structure consistent and every mutex owned by its only thread.
// (Held from one handler to the next: beyond what the analysis follows.)
void ServicePool::AtForkPrepare() NO_THREAD_SAFETY_ANALYSIS {
  RegistryMutex().lock();
  for (ServicePool* p : Registry()) p->mu_.lock();
  InterruptMutex().lock();
}

void ServicePool::AtForkParent() NO_THREAD_SAFETY_ANALYSIS {
  InterruptMutex().unlock();
  for (ServicePool* p : Registry()) p->mu_.unlock();
  RegistryMutex().unlock();
}

void ServicePool::AtForkChild() NO_THREAD_SAFETY_ANALYSIS {
  InterruptMutex().unlock();
  const pid_t self = ::getpid();
  for (ServicePool* p : Registry()) {
    // Closing the child's copies only drops references; the parent's
    // sockets stay connected (no shutdown(), which would affect both).
    p->DropForChild();
    p->pid_ = self;
    p->mu_.unlock();
  }
  RegistryMutex().unlock();
}

Status ServicePool::NoService(const Status& cause) const {
  return Status(DYAD_RC_NOSERVICE,
                "dyad-service is not reachable at '" + socket_path_ + "' (" + cause.message() +
                    "); start dyad-service on this node, or set DYAD_SERVICE_SOCKET to the "
                    "socket it listens on");
}

Result<std::unique_ptr<Channel>> ServicePool::Borrow(int64_t connect_ms, bool* reused) {
  *reused = false;
  {
    std::vector<std::unique_ptr<Channel>> stale;
    MutexLock lk(mu_);
    const pid_t self = ::getpid();
    if (pid_ != self) {
      // Forked without our atfork handler (e.g. a raw clone): the idle
      // connections (and the pipeline) belong to the parent.
      stale.swap(idle_);
      DropForChild();
      pid_ = self;
    }
    while (!idle_.empty()) {
      std::unique_ptr<Channel> ch = std::move(idle_.back());
      idle_.pop_back();
      // A service that restarted closed its end; skip such connections
      // instead of failing the caller's request on them.
      if (ch->broken() || ch->PeerClosed()) {
        stale.push_back(std::move(ch));
        continue;
      }
      *reused = true;
      return ch;
    }
  }
  return Dial(connect_ms);
}

Result<std::unique_ptr<Channel>> ServicePool::Dial(int64_t connect_ms) {
  if (!address_.ok()) return NoService(address_.status());
  Result<UniqueFd> fd = Connect(*address_, Deadline::AfterMs(connect_ms));
  if (!fd.ok()) return NoService(fd.status());
  auto ch = std::make_unique<Channel>(std::move(*fd), Trust::kUnauthenticated);
  // Whoever listens on the socket must be our own service (same user or
  // root): a socket planted by another user must not answer our requests.
  Status st = TrustLocalService(*ch);
  if (!st.ok()) return st.Annotate("dyad-service socket '" + socket_path_ + "'");
  // A reply's header and payload in one recv (the link carries frames
  // only, all read through the Channel; WaitReadable looks at what was
  // read ahead first).
  ch->SetReadAhead(kReplyReadAhead);
  return ch;
}

void ServicePool::Return(std::unique_ptr<Channel> ch) {
  // Bytes after the reply: the link is out of step with its requests.
  if (ch == nullptr || ch->broken() || ch->has_unread()) return;
  MutexLock lk(mu_);
  if (pid_ != ::getpid() || idle_.size() >= kMaxIdle) return;  // dropped (closed) on return
  idle_.push_back(std::move(ch));
}

Status ServicePool::WaitReadable(Channel& ch, Deadline deadline) {
  for (;;) {
    if (Interrupted()) {
      ch.MarkBroken();
      return Status(DYAD_RC_CANCELLED, "interrupted");
    }
    if (ch.has_unread()) return Status::OK();  // read ahead with the previous frame
    pollfd p{ch.fd(), POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(deadline.RemainingMs(kInterruptSliceMs)));
    if (n > 0) return Status::OK();  // data, or hang-up that RecvFrame reports
    if (n < 0 && errno != EINTR) {
      ch.MarkBroken();
      return StatusFromErrno(errno, "poll");
    }
    if (n == 0 && deadline.expired()) {
      ch.MarkBroken();
      return Status(DYAD_RC_TIMEOUT,
                    "no reply from dyad-service at '" + socket_path_ + "' in time");
    }
  }
}

Status ServicePool::CallOn(Channel& ch, MsgType type, const std::string& request, std::string* body,
                           Deadline deadline) {
  DYAD_RETURN_IF_ERROR(ch.SendFrame(static_cast<uint16_t>(type), request, deadline));
  DYAD_RETURN_IF_ERROR(WaitReadable(ch, deadline));
  uint16_t rtype = 0;
  std::string payload;
  DYAD_RETURN_IF_ERROR(ch.RecvFrame(&rtype, &payload, deadline));
  if (rtype != static_cast<uint16_t>(MsgType::kReply)) {
    ch.MarkBroken();
    return Status(DYAD_RC_BADRPC,
                  std::string("expected a reply, got '") + MsgTypeName(rtype) + "'");
  }
  Status st;
  if (!DecodeReply(payload, &st, body)) {
    ch.MarkBroken();
    return Status(DYAD_RC_BADUNPACK, "malformed reply from dyad-service");
  }
  return st;
}

Status ServicePool::Call(MsgType type, const std::string& request, std::string* body,
                         Deadline deadline, int64_t connect_ms, const std::string& what) {
  for (int attempt = 0;; ++attempt) {
    bool reused = false;
    Result<std::unique_ptr<Channel>> ch = Borrow(connect_ms, &reused);
    if (!ch.ok()) return ch.status().Annotate(what);
    Status st = CallOn(**ch, type, request, body, deadline);
    const bool broken = (*ch)->broken();
    if (!broken) {
      Return(std::move(*ch));
      return st;  // success, or an error the service replied with
    }
    // The connection failed under us. A pooled connection can die between
    // our liveness check and the send (service restarting); every request
    // is idempotent, so one retry on a fresh connection is safe.
    if (reused && attempt == 0 && st.code() == DYAD_RC_CONNLOST) continue;
    if (st.code() == DYAD_RC_CONNLOST)
      return Status(DYAD_RC_CONNLOST, what + ": connection to dyad-service at '" + socket_path_ +
                                          "' lost (" + st.message() + "; did the service stop?)");
    return st.Annotate(what);
  }
}

}  // namespace dyad
