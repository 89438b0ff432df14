#include "client/service_pool.h"

#include <poll.h>
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
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

// Fork detection without a system call per use. The kernel zeroes a page
// advised MADV_WIPEONFORK in the child of every fork, whether or not the
// child ran our atfork handlers (a raw clone does not): a pool reads one
// word to know whether it still lives in the process that made its
// connections. Each detection bumps the process's fork generation, which
// every pool compares with the generation it was last used in. Where the
// advice is not available (a kernel before 4.14) the generation follows
// getpid() instead, one system call per check as before.
struct ForkWatch {
  uint64_t* page = nullptr;  // nonzero while in the process that armed it
  std::atomic<uint64_t> generation{1};
  std::atomic<pid_t> pid{0};  // without the page: the pid the generation belongs to
};

ForkWatch& Watch() {
  static ForkWatch* w = [] {
    auto* fw = new ForkWatch;  // leaked, as the registry
    const auto size = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED && ::madvise(p, size, MADV_WIPEONFORK) == 0) {
      fw->page = static_cast<uint64_t*>(p);
      __atomic_store_n(fw->page, uint64_t{1}, __ATOMIC_RELEASE);
    } else if (p != MAP_FAILED) {
      ::munmap(p, size);
    }
    fw->pid.store(::getpid());
    return fw;
  }();
  return *w;
}

// The process's fork generation: it changes in every child of a fork. No
// lock: the first look of a child may run in several of its threads at
// once, and each may bump the generation (one bump more only drops idle
// connections once more). The bump is made before the mark that ends the
// look, so a thread that sees the mark also sees the new generation.
uint64_t ForkGeneration() {
  ForkWatch& w = Watch();
  if (w.page != nullptr) {
    if (__atomic_load_n(w.page, __ATOMIC_ACQUIRE) == 0) {  // first look in this child
      w.generation.fetch_add(1, std::memory_order_acq_rel);
      __atomic_store_n(w.page, uint64_t{1}, __ATOMIC_RELEASE);
    }
  } else if (const pid_t self = ::getpid(); self != w.pid.load(std::memory_order_acquire)) {
    w.generation.fetch_add(1, std::memory_order_acq_rel);
    w.pid.store(self, std::memory_order_release);
  }
  return w.generation.load(std::memory_order_acquire);
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
    : socket_path_(SocketPathFrom(socket)),
      address_(ParseAddress(socket_path_)),
      generation_(ForkGeneration()) {
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
  const uint64_t generation = ForkGeneration();
  MutexLock lk(mu_);
  if (generation_ != generation) {
    // Forked without our atfork handler: the pipeline is the parent's.
    DropForChild();
    generation_ = generation;
  }
  if (pipeline_ == nullptr) pipeline_ = std::make_shared<PublishPipeline>(this);
  return pipeline_;
}

std::shared_ptr<PublishPipeline> ServicePool::PipelineIfAny() {
  const uint64_t generation = ForkGeneration();
  MutexLock lk(mu_);
  if (generation_ != generation) return nullptr;
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
  const uint64_t generation = ForkGeneration();
  for (ServicePool* p : Registry()) {
    // Closing the child's copies only drops references; the parent's
    // sockets stay connected (no shutdown(), which would affect both).
    p->DropForChild();
    p->generation_ = generation;
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

Result<std::unique_ptr<Channel>> ServicePool::Borrow(int64_t connect_ms, bool check_alive,
                                                     bool* reused) {
  *reused = false;
  {
    std::vector<std::unique_ptr<Channel>> stale;
    const uint64_t generation = ForkGeneration();
    MutexLock lk(mu_);
    if (generation_ != generation) {
      // Forked without our atfork handler (e.g. a raw clone): the idle
      // connections (and the pipeline) belong to the parent.
      stale.swap(idle_);
      DropForChild();
      generation_ = generation;
    }
    while (!idle_.empty()) {
      std::unique_ptr<Channel> ch = std::move(idle_.back());
      idle_.pop_back();
      // A service that restarted closed its end. A request that is not safe
      // to repeat looks first (a system call); the others find out by
      // sending and are repeated on a fresh connection (Call).
      if (ch->broken() || (check_alive && ch->PeerClosed())) {
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
  const uint64_t generation = ForkGeneration();
  MutexLock lk(mu_);
  if (generation_ != generation || idle_.size() >= kMaxIdle) return;  // dropped (closed) on return
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
                           Deadline deadline, Progress* progress) {
  *progress = Progress::kNothingSent;
  DYAD_RETURN_IF_ERROR(ch.SendFrame(static_cast<uint16_t>(type), request, deadline));
  *progress = Progress::kSent;
  // The reply, read as the socket holds it, each wait sliced and
  // interruptible; `progress` tells the caller whether a lost connection
  // lost part of a reply (never repeated) or nothing of it.
  uint16_t rtype = 0;
  std::string payload;
  Channel::PartialFrame frame;
  for (;;) {
    DYAD_RETURN_IF_ERROR(WaitReadable(ch, deadline));
    Result<bool> done = ch.RecvFrameNow(&frame, &rtype, &payload);
    if (frame.hdr_got > 0) *progress = Progress::kReplyBegun;
    if (!done.ok()) {
      ch.MarkBroken();
      return done.status();
    }
    if (*done) break;
  }
  return ReplyOfFrame(ch, rtype, payload, body);
}

bool ServicePool::SafeToRepeat(MsgType type) {
  switch (type) {
    // Reads, and a consume (a second one finds the file placed by the
    // first, or waits for it as the first did).
    case MsgType::kConsume:
    case MsgType::kConsumeBatch:
    case MsgType::kLocate:
    case MsgType::kStatus:
    case MsgType::kList:
    case MsgType::kPing:
    case MsgType::kPeers:
      return true;
    // A publication repeated is a new publication (a new publication
    // counter: copies elsewhere are superseded and fetched again); a
    // prefetch declaration or a removal changes state too.
    default:
      return false;
  }
}

Status ServicePool::Call(MsgType type, const std::string& request, std::string* body,
                         Deadline deadline, int64_t connect_ms, const std::string& what) {
  const bool repeatable = SafeToRepeat(type);
  for (int attempt = 0;; ++attempt) {
    bool reused = false;
    Result<std::unique_ptr<Channel>> ch = Borrow(connect_ms, !repeatable, &reused);
    if (!ch.ok()) return ch.status().Annotate(what);
    Progress progress = Progress::kNothingSent;
    Status st = CallOn(**ch, type, request, body, deadline, &progress);
    const bool broken = (*ch)->broken();
    if (!broken) {
      Return(std::move(*ch));
      return st;  // success, or an error the service replied with
    }
    // A pooled connection the service closed since its last use (a
    // restart) fails at the send (EPIPE) or with an end of stream before
    // any byte of the reply: the request is sent once more, on a fresh
    // connection. Requests that are not safe to repeat checked the
    // connection before the send (Borrow) and are repeated only when the
    // send itself failed, so the service never saw them.
    const bool lost = st.code() == DYAD_RC_CONNLOST && progress != Progress::kReplyBegun;
    if (reused && attempt == 0 && lost && (repeatable || progress == Progress::kNothingSent))
      continue;
    if (st.code() == DYAD_RC_CONNLOST)
      return Status(DYAD_RC_CONNLOST, what + ": connection to dyad-service at '" + socket_path_ +
                                          "' lost (" + st.message() + "; did the service stop?)");
    return st.Annotate(what);
  }
}

}  // namespace dyad
