#include "client/publish_pipeline.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "client/service_pool.h"
#include "proto/protocol.h"

namespace dyad {
namespace {

std::string Plural(size_t n, const char* one) {
  return std::to_string(n) + " " + one + (n == 1 ? "" : "s");
}

}  // namespace

PublishPipeline::~PublishPipeline() = default;

void PublishPipeline::CloseDescriptorInChild() {
  const int fd = fd_.exchange(-1);
  if (fd >= 0) ::close(fd);
}

void PublishPipeline::Drain(Deadline deadline) {
  MutexLock lk(mu_);
  if (!sent_.empty()) (void)Collect(true, deadline);
}

size_t PublishPipeline::outstanding() {
  MutexLock lk(mu_);
  return sent_.size();
}

void PublishPipeline::Record(Status st) {
  if (failure_.ok()) {
    failure_ = std::move(st);
  } else {
    ++more_failures_;
  }
}

Status PublishPipeline::TakeFailure() {
  if (failure_.ok()) return Status::OK();
  Status st = std::move(failure_);
  failure_ = Status::OK();
  if (more_failures_ > 0)
    st = Status(st.code(), st.message() + " (and " +
                               Plural(more_failures_, "later asynchronous publication") +
                               " failed as well)");
  more_failures_ = 0;
  return st;
}

void PublishPipeline::Break(const Status& cause) {
  if (!sent_.empty()) {
    const size_t n = sent_.size();
    std::string which = "'" + sent_.front() + "'";
    if (n > 1) which += " to '" + sent_.back() + "'";
    Record(Status(DYAD_RC_CONNLOST,
                  "asynchronous publish: connection to dyad-service at '" + pool_->socket_path() +
                      "' lost with " + Plural(n, "publication") + " unconfirmed (" + which + "; " +
                      cause.message() +
                      "); they are not sent again: check them with `dyad locate` or publish "
                      "them again"));
  }
  sent_.clear();
  partial_.Reset();
  reply_.clear();
  fd_.store(-1);
  ch_.reset();
}

Status PublishPipeline::WaitSlice(short events, Deadline deadline, short* revents) {
  *revents = 0;
  if (InterruptRequested()) return Status(DYAD_RC_CANCELLED, "interrupted");
  if (deadline.expired()) return Status(DYAD_RC_TIMEOUT, "expired");
  pollfd p{ch_->fd(), events, 0};
  const int n =
      ::poll(&p, 1, static_cast<int>(deadline.RemainingMs(ServicePool::kInterruptSliceMs)));
  if (n < 0 && errno != EINTR) return StatusFromErrno(errno, "poll", DYAD_RC_CONNLOST);
  if (n > 0) *revents = p.revents;
  return Status::OK();
}

Status PublishPipeline::Collect(bool wait, Deadline deadline) {
  while (ch_ != nullptr && !sent_.empty()) {
    uint16_t type = 0;
    Result<bool> got = ch_->RecvFrameNow(&partial_, &type, &reply_);
    if (!got.ok()) {
      Break(got.status());
      return Status::OK();
    }
    if (!*got) {
      if (!wait) return Status::OK();
      short revents = 0;
      Status ws = WaitSlice(POLLIN, deadline, &revents);
      if (ws.code() == DYAD_RC_CONNLOST) {
        Break(ws);
        return Status::OK();
      }
      if (!ws.ok()) return ws;
      continue;
    }
    partial_.Reset();
    Status st;
    std::string body;
    if (type != static_cast<uint16_t>(MsgType::kReply) || !DecodeReply(reply_, &st, &body)) {
      Break(Status(DYAD_RC_BADRPC, "malformed reply"));
      return Status::OK();
    }
    const std::string upath = std::move(sent_.front());
    sent_.pop_front();
    if (!st.ok())
      Record(Status(st.code(), "asynchronous publish '" + upath + "' failed: " + st.message()));
  }
  return Status::OK();
}

Status PublishPipeline::Send(const std::string& request, const std::string& upath,
                             Deadline deadline, int64_t connect_ms) {
  MutexLock lk(mu_);
  (void)Collect(false, deadline);
  if (Status earlier = TakeFailure(); !earlier.ok())
    return Status(earlier.code(), earlier.message() + " [reported by the next produce; '" + upath +
                                      "' was not published: produce it again]");
  // The frame as Channel::SendFrame writes it on a local (unsealed) link,
  // sent here without blocking so that replies are read while the socket
  // buffer is full (the service may be waiting for us to read them).
  std::string frame(kFrameHeaderSize, '\0');
  EncodeFrameHeader(frame.data(), static_cast<uint16_t>(MsgType::kPublish),
                    static_cast<uint32_t>(request.size()));
  frame += request;
  for (int attempt = 0;; ++attempt) {
    if (ch_ == nullptr) {
      Result<std::unique_ptr<Channel>> ch = pool_->Dial(connect_ms);
      if (!ch.ok()) return ch.status();
      ch_ = std::move(*ch);
      fd_.store(ch_->fd());
    }
    size_t done = 0;
    Status why = SendFrameBytes(frame, deadline, &done);
    if (why.ok()) break;
    // A connection that broke with nothing unconfirmed and nothing of
    // this request sent (the service restarted since the last one): one
    // new connection, as ServicePool::Call retries.
    if (why.code() == DYAD_RC_CONNLOST && attempt == 0 && done == 0 && ch_ == nullptr &&
        failure_.ok())
      continue;
    std::string msg = "publish '" + upath + "' not sent: " + why.message();
    if (Status lost = TakeFailure(); !lost.ok()) msg += "; " + lost.message();
    return Status(why.code(), msg);
  }
  sent_.push_back(upath);
  return Status::OK();
}

Status PublishPipeline::SendFrameBytes(const std::string& frame, Deadline deadline, size_t* done) {
  *done = 0;
  while (*done < frame.size()) {
    const ssize_t n =
        ::send(ch_->fd(), frame.data() + *done, frame.size() - *done, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      *done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    Status why;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      short revents = 0;
      why = WaitSlice(POLLOUT | POLLIN, deadline, &revents);
      if (why.ok()) {
        if (revents & (POLLIN | POLLHUP | POLLERR)) (void)Collect(false, deadline);
        if (ch_ != nullptr) continue;
        // Broken while we waited: what was unconfirmed is recorded.
        return Status(DYAD_RC_CONNLOST, "connection to dyad-service lost");
      }
      if (why.code() == DYAD_RC_TIMEOUT)
        why = Status(DYAD_RC_TIMEOUT, "the connection to dyad-service at '" + pool_->socket_path() +
                                          "' accepted nothing more in time (" +
                                          Plural(sent_.size(), "publication") + " unconfirmed)");
    } else {
      why = StatusFromErrno(n < 0 ? errno : EPIPE, "send", DYAD_RC_CONNLOST);
    }
    // Nothing of this request went out: the connection is still in step
    // unless it broke. Part of it: the connection must go (the service
    // drops a partial frame at the hang-up).
    if (*done > 0 || why.code() == DYAD_RC_CONNLOST) Break(why);
    return why;
  }
  return Status::OK();
}

Status PublishPipeline::Flush(Deadline deadline) {
  MutexLock lk(mu_);
  Status ws = Collect(true, deadline);
  Status st = TakeFailure();
  if (!ws.ok() && !sent_.empty()) {
    const std::string why =
        ws.code() == DYAD_RC_TIMEOUT ? std::string("no reply in time") : ws.message();
    Status pending(ws.code(), "asynchronous publish: " + Plural(sent_.size(), "publication") +
                                  " still unconfirmed by dyad-service at '" + pool_->socket_path() +
                                  "' (" + why + ")");
    if (st.ok()) return pending;
    return Status(st.code(), st.message() + "; " + pending.message());
  }
  return st;
}

}  // namespace dyad
