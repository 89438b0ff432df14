#include "service/peer_rpc.h"

#include "service/peer_dial.h"
#include "transport/transport.h"

namespace dyad {

Task<Status> AwaitReply(Channel& session, Deadline deadline, PeerWaits& waits,
                        const std::string& timeout_what, std::string* body, bool* replied,
                        bool just_sent) {
  Channel::PartialFrame frame;
  uint16_t type = 0;
  std::string payload;
  // Bytes read ahead with an earlier frame are looked at first, always.
  bool wait = just_sent && !session.has_unread();
  for (;;) {
    if (wait) {
      const Ready w = co_await waits.Readable(session, deadline);
      // A late answer would put the session out of step: it is not reused.
      if (w == Ready::kTimeout) {
        session.MarkBroken();
        co_return Status(DYAD_RC_TIMEOUT, timeout_what);
      }
      if (w == Ready::kStopped) co_return BreakSession(session, waits.Stopped());  // stops the peer
    }
    Result<bool> r = session.RecvFrameNow(&frame, &type, &payload);
    if (!r.ok()) co_return r.status();
    if (*r) {
      if (replied != nullptr) *replied = true;
      co_return ReplyOfFrame(session, type, payload, body);
    }
    wait = true;
  }
}

Task<Result<std::string>> PeerRpc(PeerDirectory& peers, uint32_t rank, MsgType type,
                                  const std::string& request, int64_t timeout_ms,
                                  PeerWaits& waits) {
  const Deadline deadline = Deadline::AfterMs(timeout_ms);
  Result<std::unique_ptr<Channel>> session = co_await DialPeer(peers, rank, deadline, waits);
  if (!session.ok()) co_return session.status();
  Channel& ch = **session;
  // A small frame on a session with an empty send buffer: it leaves at
  // once (bounded by the deadline all the same).
  Status st = ch.SendFrame(static_cast<uint16_t>(type), request, deadline);
  std::string body;
  bool replied = false;
  if (st.ok())
    st = co_await AwaitReply(ch, deadline, waits,
                             "no reply from rank " + std::to_string(rank) + " within " +
                                 std::to_string(timeout_ms) + " ms (--rpc-timeout)",
                             &body, &replied, /*just_sent=*/true);
  // A reply (even one saying no) leaves the session ready for the next
  // request; anything else leaves it in the middle of an exchange.
  if (!replied) (void)BreakSession(ch, st);
  peers.Release(rank, std::move(*session));
  if (!st.ok()) co_return st;
  co_return body;
}

}  // namespace dyad
