// publish_pipeline.h: DYAD_ASYNC_PUBLISH's publications, pipelined on one
// connection to the node's dyad-service.
//
// With asynchronous publication, dyad_produce validates the file as always,
// writes its publish request on a connection kept for asynchronous
// publications only, and returns without waiting for the reply. The service
// serves the requests of one connection in order and answers each; the
// replies are collected later:
//   * by the next Send (every reply already there, without waiting): the
//     earliest failure is returned by that call, which then does not send
//     its own publication (the caller may call again for it);
//   * by Flush (dyad_finalize, a synchronous publish of the same client):
//     waits for every outstanding reply, bounded by the caller's deadline.
//
// Durability: when Send returns OK the whole request is in the kernel's
// socket buffer (no user-space batching); the service processes every
// complete request it received, also after the client died. A connection
// that breaks while publications are unconfirmed is never replayed (a
// replay could publish twice): the next call reports how many publications
// are unconfirmed, and the one after dials a new connection.
//
// Bounded waits: a full socket buffer blocks Send at most until its
// deadline, in slices that ask the process's interrupt check (service_pool.h),
// and replies are read while it waits (the service may itself wait for us
// to read them). No thread is created.
//
// Threads and fork: any thread may call at once (one mutex; a leaf except
// for the pool's dial). The owning ServicePool drops (and leaks) its
// pipeline in a forked child, closing the child's copy of the descriptor,
// so a child never writes on its parent's connection.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include "common/net.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "common/time.h"

namespace dyad {

class ServicePool;

class PublishPipeline {
 public:
  explicit PublishPipeline(ServicePool* pool) : pool_(pool) {}
  ~PublishPipeline();
  PublishPipeline(const PublishPipeline&) = delete;
  PublishPipeline& operator=(const PublishPipeline&) = delete;

  // Sends one encoded PublishRequest for `upath` and returns once it is in
  // the socket buffer. First collects the replies already received: an
  // earlier publication that failed is returned instead (its name in the
  // message) and `upath` is not sent. DYAD_RC_NOSERVICE when the service
  // cannot be reached; DYAD_RC_TIMEOUT / DYAD_RC_CANCELLED when the buffer
  // stayed full until `deadline` / an interrupt (nothing of this request
  // sent, or the connection is dropped and reported as below).
  Status Send(const std::string& request, const std::string& upath, Deadline deadline,
              int64_t connect_ms);
  // Waits until every sent publication is answered (or `deadline`) and
  // returns the earliest failure not reported yet (OK when none).
  Status Flush(Deadline deadline);
  // Waits until every sent publication is answered (or `deadline`),
  // keeping a failure for the next Send or Flush to report.
  void Drain(Deadline deadline);
  // Publications sent and not answered yet.
  size_t outstanding();

  // Fork plumbing (ServicePool::AtForkChild): closes this process's copy of
  // the descriptor without touching anything the lock guards (a thread of
  // the parent may have held it).
  void CloseDescriptorInChild();

 private:
  // Takes the replies that are there (`wait`: until none is outstanding or
  // `deadline`). Failures are recorded, not returned; the returned status
  // is that of the wait itself (timeout, interrupt).
  Status Collect(bool wait, Deadline deadline) REQUIRES(mu_);
  void Record(Status st) REQUIRES(mu_);
  // Drops the connection; unanswered publications become one failure.
  void Break(const Status& cause) REQUIRES(mu_);
  // The earliest failure not reported yet (and how many followed it).
  Status TakeFailure() REQUIRES(mu_);
  // Writes `frame` whole on ch_ (`*done`: bytes written). On failure the
  // connection is dropped (Break) unless nothing was written and it is
  // still in step.
  Status SendFrameBytes(const std::string& frame, Deadline deadline, size_t* done) REQUIRES(mu_);
  Status WaitSlice(short events, Deadline deadline, short* revents) REQUIRES(mu_);

  ServicePool* const pool_;
  Mutex mu_;
  std::unique_ptr<Channel> ch_ GUARDED_BY(mu_);
  std::atomic<int> fd_{-1};                       // ch_'s descriptor, for CloseDescriptorInChild
  std::deque<std::string> sent_ GUARDED_BY(mu_);  // upaths awaiting a reply, in order
  Channel::PartialFrame partial_ GUARDED_BY(mu_);
  std::string reply_ GUARDED_BY(mu_);
  Status failure_ GUARDED_BY(mu_);  // the earliest unreported failure
  uint64_t more_failures_ GUARDED_BY(mu_) = 0;
};

}  // namespace dyad
