// service_pool.h: the client's connections to the node's dyad-service.
//
// A ServicePool keeps up to kMaxIdle idle connections to one service socket
// and runs request/reply calls over them. Any number of threads may call
// Call() at once: each call borrows a connection for its whole duration (a
// new one is made when none is idle), so a long consume never blocks a
// publish from another thread. Broken connections are dropped, never
// returned to the pool.
//
// Fork safety: a child process must never send on a connection it inherited,
// since the parent's requests and the child's would interleave on one
// socket. A pthread_atfork child handler empties every pool in the child
// (closing only the child's copies of the descriptors; the parent's
// connections are untouched), and Call() also compares the process's fork
// generation with the pool's, which covers children created without atfork
// handlers (a raw clone): the generation changes when a page advised
// MADV_WIPEONFORK reads zero, so the check costs no system call (with
// getpid() instead on kernels without that advice).
//
// Interruption: a waiting call polls in short slices and asks the process's
// interrupt check (SetInterruptCheck) whether to give up, so a language
// runtime that handles SIGINT itself (Python) can cancel a long consume. A
// call that gives up closes its connection, which tells the service to
// abandon the wait. With the default SIGINT disposition the process simply
// dies, as without DYAD.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/net.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "common/time.h"
#include "proto/protocol.h"

namespace dyad {

class PublishPipeline;

// Returns true when the caller wants the current wait abandoned. Called from
// the waiting thread at least every kInterruptSliceMs and after EINTR.
using InterruptCheck = std::function<bool()>;

// Installs the process-wide interrupt check (nullptr removes it).
void SetInterruptCheck(InterruptCheck check);
// Asks the installed check (false when none): for other sliced waits of the
// client (the Flux path, flux_link.h).
bool InterruptRequested();

class ServicePool {
 public:
  static constexpr size_t kMaxIdle = 8;
  static constexpr int64_t kInterruptSliceMs = 200;
  // Bytes a reply is read with at once (Channel::SetReadAhead).
  static constexpr size_t kReplyReadAhead = 4096;

  // `socket` is a path ("/tmp/dyad-1000/service.sock"), "unix:/path", or a
  // relative path (taken against the working directory now).
  explicit ServicePool(std::string socket);
  ~ServicePool();
  ServicePool(const ServicePool&) = delete;
  ServicePool& operator=(const ServicePool&) = delete;

  const std::string& socket_path() const { return socket_path_; }

  // Sends one request and waits for its reply. On success `body` holds the
  // reply body. `connect_ms` bounds connecting (< 0: no limit); `deadline`
  // bounds the whole call. An unreachable service gives DYAD_RC_NOSERVICE;
  // a reply carrying an error gives that error. `what` names the operation
  // in messages ("consume 'a/b'"). A pooled connection the service closed
  // since its last use (a restart) costs no check before the send: a
  // request safe to repeat (consume, locate, status, list, ping, peers) is
  // sent again on a fresh connection when the old one fails before any
  // byte of the reply; other requests (publish, prefetch, remove) poll the
  // pooled connection first and are repeated only when the send failed.
  Status Call(MsgType type, const std::string& request, std::string* body, Deadline deadline,
              int64_t connect_ms, const std::string& what);

  // A new connection to the service, checked to be our own service
  // (TrustLocalService), outside the pool. DYAD_RC_NOSERVICE when
  // unreachable.
  Result<std::unique_ptr<Channel>> Dial(int64_t connect_ms);

  // The pipeline of asynchronous publications on this socket
  // (publish_pipeline.h), made at the first use; one per pool, so a
  // re-configured client keeps the publications of the one before. A
  // forked child gets a new one.
  std::shared_ptr<PublishPipeline> Pipeline();
  // The pipeline if one was made (nullptr otherwise), without making one.
  std::shared_ptr<PublishPipeline> PipelineIfAny();

  // Number of idle pooled connections (for tests and diagnostics).
  size_t idle_count();
  // Closes every idle connection.
  void Clear();

  // atfork plumbing (see the file comment); not for general use.
  static void AtForkPrepare();
  static void AtForkParent();
  static void AtForkChild();

 private:
  // How far one attempt got before it failed.
  enum class Progress { kNothingSent, kSent, kReplyBegun };

  // An idle connection (`reused`) or a new one. With `check_alive`, an idle
  // one is first polled for a hang-up (a system call); without, a dead one
  // shows at the send or as an end of stream, and Call repeats the request.
  Result<std::unique_ptr<Channel>> Borrow(int64_t connect_ms, bool check_alive, bool* reused);
  void Return(std::unique_ptr<Channel> ch);
  // One attempt on one connection.
  Status CallOn(Channel& ch, MsgType type, const std::string& request, std::string* body,
                Deadline deadline, Progress* progress);
  // Requests the service may receive twice with the effect of once.
  static bool SafeToRepeat(MsgType type);
  Status WaitReadable(Channel& ch, Deadline deadline);
  Status NoService(const Status& cause) const;
  // In a forked child: forgets the parent's idle connections and pipeline
  // (closing only this process's copies of their descriptors).
  void DropForChild() REQUIRES(mu_);

  std::string socket_path_;
  Result<SocketAddress> address_;

  Mutex mu_;  // a leaf lock
  std::vector<std::unique_ptr<Channel>> idle_ GUARDED_BY(mu_);
  // The process's fork generation the connections belong to (a forked
  // child has another one; service_pool.cc, ForkGeneration).
  uint64_t generation_ GUARDED_BY(mu_);
  std::shared_ptr<PublishPipeline> pipeline_ GUARDED_BY(mu_);
};

}  // namespace dyad
