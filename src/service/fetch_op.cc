#include "service/fetch_op.h"

#include <sys/socket.h>

namespace dyad {

FetchOp::FetchOp(PeerDirectory* peers, int64_t rpc_timeout_ms, TransferRegistry* transfers,
                 const FileRecord& rec, Transport* transport, int sink_fd)
    : peers_(peers),
      rpc_timeout_ms_(rpc_timeout_ms),
      transfers_(transfers),
      rec_(rec),
      transport_(transport),
      sink_fd_(sink_fd),
      what_("fetch '" + rec.upath + "' from rank " + std::to_string(rec.owner_rank)) {}

FetchOp::~FetchOp() {
  // Dropped before its end (a service stopping): nothing may use the
  // session afterwards.
  if (stage_ != Stage::kDone) End(Status(DYAD_RC_CANCELLED, what_ + ": abandoned"));
}

bool FetchOp::Step(Wait* wait) {
  for (;;) {
    bool waits = false;
    switch (stage_) {
      case Stage::kStart:
        waits = Start();
        break;
      case Stage::kSession:
        waits = TakeSession(wait);
        break;
      case Stage::kReply:
        waits = ReadReply(wait);
        break;
      case Stage::kPull:
        waits = StepPull(wait);
        break;
      case Stage::kVerdict:
        waits = ReadVerdict(wait);
        break;
      case Stage::kDone:
        return true;
    }
    if (waits) return false;
  }
}

bool FetchOp::Start() {
  outcome_.retryable = false;
  span_ = std::make_unique<TraceSpan>("fetch", "service");
  span_->Arg("path", rec_.upath).Arg("owner", rec_.owner_rank).Arg("transport", transport_->name());
  deadline_ = Deadline::AfterMs(rpc_timeout_ms_);
  dial_ = std::make_unique<PeerDial>(peers_, rec_.owner_rank, deadline_);
  stage_ = Stage::kSession;
  return false;
}

bool FetchOp::TakeSession(Wait* wait) {
  if (!dial_->Step(wait)) return true;
  Result<std::unique_ptr<Channel>> session = dial_->Take();
  dial_.reset();
  if (!session.ok()) {
    const bool stale = session.status().code() == DYAD_RC_STALE;
    outcome_.retryable = stale;
    End(Status(stale ? DYAD_RC_BADFETCH : session.status().code(),
               what_ + ": " + session.status().message()));
    return false;
  }
  session_ = std::move(*session);
  Result<std::string> args = transport_->PrepareRequest();
  if (!args.ok()) {
    Release();
    End(args.status());
    return false;
  }
  FetchRequest req;
  req.upath = rec_.upath;
  req.transport = transport_->name();
  req.transport_args = *args;
  req.expect_version = rec_.version;
  Encoder e;
  req.EncodeTo(e);
  Status st = session_->SendFrame(static_cast<uint16_t>(MsgType::kFetch), e.data(), deadline_);
  if (!st.ok()) {
    FailRpc(st);
    return false;
  }
  stage_ = Stage::kReply;
  return false;
}

Status FetchOp::NextReply(bool* done, std::string* body) {
  uint16_t type = 0;
  Result<bool> r = session_->RecvFrameNow(&frame_, &type, &payload_);
  *done = r.ok() && *r;
  if (!r.ok() || !*r) return r.status();
  frame_.Reset();
  return ReplyOfFrame(*session_, type, payload_, body);
}

bool FetchOp::ReadReply(Wait* wait) {
  bool done = false;
  std::string body;
  Status st = NextReply(&done, &body);
  if (!st.ok()) {
    FailRpc(st);
    return false;
  }
  if (!done) {
    *wait = Wait{session_.get(), deadline_};
    return true;
  }
  Decoder d(body);
  if (!reply_.DecodeFrom(d) || !d.done()) {
    session_->MarkBroken();
    End(Status(DYAD_RC_BADUNPACK, what_ + ": malformed reply"));
    return false;
  }
  // The record's size is what the node's budget admitted (prefetch) and
  // what the consumer was promised: a file of another size is not that
  // version, and none of its bytes are taken. The owner streams them
  // after its reply, so the session is out of step: it is not pooled.
  if (reply_.size != rec_.size) {
    session_->MarkBroken();
    End(Status(DYAD_RC_STALE, what_ + ": the owner's file has " + std::to_string(reply_.size) +
                                  " bytes, its record says " + std::to_string(rec_.size) +
                                  "; the record does not describe the file, nothing was placed"));
    return false;
  }
  return BeginPull(reply_);
}

bool FetchOp::BeginPull(const FetchReply& fr) {
  if (transfers_ != nullptr)
    progress_ = transfers_->Begin(false, rec_.upath, rec_.owner_rank, transport_->name(), fr.size,
                                  SinkProgress(sink_fd_));
  pull_ = transport_->StartPull(*session_, fr.size, fr.transport_args, sink_fd_, &ts_);
  if (!pull_) {
    // A transport that waits on its own completions (transport.h).
    PullDone(transport_->Pull(*session_, fr.size, fr.transport_args, sink_fd_, &ts_));
    return false;
  }
  stage_ = Stage::kPull;
  const int64_t idle = pull_->idle_ms();
  deadline_ = idle > 0 ? Deadline::AfterMs(idle) : Deadline::Never();
  return false;
}

bool FetchOp::StepPull(Wait* wait) {
  Result<bool> r = pull_->Step();
  if (!r.ok() || *r) {
    PullDone(r.status());
    return false;
  }
  const uint64_t got = pull_->moved();
  if (got != last_got_) {  // progress: the idle bound starts again
    last_got_ = got;
    const int64_t idle = pull_->idle_ms();
    deadline_ = idle > 0 ? Deadline::AfterMs(idle) : Deadline::Never();
  }
  *wait = Wait{session_.get(), deadline_};
  wait->fd = pull_->wake_fd();
  return true;
}

void FetchOp::PullDone(const Status& st) {
  pull_.reset();
  progress_.Reset();
  span_->Arg("bytes", reply_.size).Rc(st);
  if (!st.ok()) {
    session_->MarkBroken();
    End(Status(st.code() == DYAD_RC_CONNLOST ? DYAD_RC_BADFETCH : st.code(),
               what_ + ": " + st.message()));
    return;
  }
  stage_ = Stage::kVerdict;
  deadline_ = Deadline::AfterMs(rpc_timeout_ms_);
}

bool FetchOp::ReadVerdict(Wait* wait) {
  bool done = false;
  std::string body;
  Status st = NextReply(&done, &body);
  if (st.ok() && !done) {
    *wait = Wait{session_.get(), deadline_};
    return true;
  }
  if (!st.ok()) {
    // The owner's verdict: the file changed while it was sent.
    if (st.code() != DYAD_RC_STALE)
      session_->MarkBroken();
    else
      Release();
    End(Status(st.code() == DYAD_RC_CONNLOST ? DYAD_RC_BADFETCH : st.code(),
               what_ + ": " + st.message()));
    return false;
  }
  Release();
  outcome_.version = reply_.version;
  outcome_.bytes = reply_.size;
  outcome_.mode = reply_.mode;
  End(Status::OK());
  return false;
}

void FetchOp::FailRpc(const Status& st) {
  // A broken session received nothing: it was dead before we used it.
  if (session_->broken())
    outcome_.retryable = st.code() == DYAD_RC_CONNLOST;
  else
    Release();
  End(Status(st.code(), what_ + ": " + st.message()));
}

bool FetchOp::NextStepBlocks() const {
  switch (stage_) {
    case Stage::kStart:
      return !peers_->Known(rec_.owner_rank);
    case Stage::kSession:
      return dial_ && dial_->NextStepBlocks();
    case Stage::kReply:
      return transport_->caps().same_node_only;
    default:
      return false;
  }
}

void FetchOp::Expired() {
  if (stage_ == Stage::kSession) return dial_->Expired();
  if (stage_ == Stage::kPull) {
    const int64_t idle = pull_->idle_ms();
    return PullDone(pull_->Fail(
        Status(DYAD_RC_TIMEOUT, "no data from peer for " + std::to_string(idle) + " ms")));
  }
  if (stage_ != Stage::kReply && stage_ != Stage::kVerdict) return;
  // A late answer would put the session out of step: it cannot be pooled.
  session_->MarkBroken();
  const char* which = stage_ == Stage::kReply ? "reply" : "verdict";
  End(Status(DYAD_RC_TIMEOUT, what_ + ": no " + which + " from the owner within " +
                                  std::to_string(rpc_timeout_ms_) + " ms (--rpc-timeout)"));
}

void FetchOp::Abandon(const Status& why) {
  if (stage_ == Stage::kDone) return;
  if (dial_) dial_->Abandon(why);  // closes a connection still dialling
  if (session_) {
    session_->MarkBroken();
    ::shutdown(session_->fd(), SHUT_RDWR);  // the owner stops sending at once
  }
  End(Status(why.code(), what_ + ": " + why.message()));
}

void FetchOp::Release() {
  if (session_) peers_->Release(rec_.owner_rank, std::move(session_));
  session_.reset();
}

void FetchOp::End(const Status& st) {
  dial_.reset();
  pull_.reset();  // before the session it reads
  progress_.Reset();
  session_.reset();  // still held: broken, or never to be reused
  if (span_ && !st.ok()) span_->Rc(st);
  span_.reset();
  status_ = st;
  stage_ = Stage::kDone;
}

}  // namespace dyad
