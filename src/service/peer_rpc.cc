#include "service/peer_rpc.h"

#include <sys/socket.h>

namespace dyad {

PeerRpcOp::PeerRpcOp(PeerDirectory* peers, uint32_t rank, MsgType type, std::string request,
                     int64_t timeout_ms)
    : peers_(peers),
      rank_(rank),
      type_(type),
      request_(std::move(request)),
      timeout_ms_(timeout_ms),
      deadline_(Deadline::AfterMs(timeout_ms)),
      dial_(std::make_unique<PeerDial>(peers, rank, deadline_)) {}

PeerRpcOp::~PeerRpcOp() = default;

bool PeerRpcOp::Step(Wait* wait) {
  if (done_) return true;
  if (dial_) {
    if (!dial_->Step(wait)) return false;
    Result<std::unique_ptr<Channel>> s = dial_->Take();
    dial_.reset();
    if (!s.ok()) {
      End(s.status());
      return true;
    }
    session_ = std::move(*s);
    if (!Send()) return true;
  }
  uint16_t type = 0;
  Result<bool> r = session_->RecvFrameNow(&frame_, &type, &payload_);
  if (!r.ok()) {
    End(r.status());
    return true;
  }
  if (!*r) {
    *wait = Wait{session_.get(), deadline_};
    return false;
  }
  replied_ = true;
  End(ReplyOfFrame(*session_, type, payload_, &body_));
  return true;
}

bool PeerRpcOp::Send() {
  // A small frame on a session with an empty send buffer: it leaves at
  // once (bounded by the deadline all the same).
  Status st = session_->SendFrame(static_cast<uint16_t>(type_), request_, deadline_);
  if (st.ok()) return true;
  End(st);
  return false;
}

void PeerRpcOp::Expired() {
  if (dial_) return dial_->Expired();  // the next Step takes its outcome
  if (done_) return;
  End(Status(DYAD_RC_TIMEOUT, "no reply from rank " + std::to_string(rank_) + " within " +
                                  std::to_string(timeout_ms_) + " ms (--rpc-timeout)"));
}

void PeerRpcOp::Abandon(const Status& why) {
  if (dial_) {
    dial_->Abandon(why);
    dial_.reset();
  }
  if (!done_) End(why);
}

void PeerRpcOp::End(const Status& st) {
  done_ = true;
  status_ = st;
  if (!session_) return;
  // A reply (even one saying no) leaves the session ready for the next
  // request; anything else leaves it in the middle of an exchange.
  if (replied_ && !session_->broken()) return peers_->Release(rank_, std::move(session_));
  session_->MarkBroken();
  (void)::shutdown(session_->fd(), SHUT_RDWR);
  session_.reset();
}

}  // namespace dyad
