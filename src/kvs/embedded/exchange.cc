// exchange.cc: see exchange.h.
#include "kvs/embedded/exchange.h"

#include <poll.h>

namespace dyad {

namespace {
constexpr size_t kReplyReadAhead = 4096;
}  // namespace

Task<Status> EmbeddedExchange(Channel& ch, MsgType type, const std::string& request,
                              std::string* body, Deadline deadline, Stop* stop) {
  DYAD_CO_RETURN_IF_ERROR(ch.SendFrame(static_cast<uint16_t>(type), request, deadline));
  ch.SetReadAhead(kReplyReadAhead);
  Channel::PartialFrame frame;
  uint16_t rtype = 0;
  std::string payload;
  for (;;) {
    const Ready r = co_await WaitReady(ch, POLLIN, deadline, stop);
    if (r != Ready::kReady) {
      ch.MarkBroken();
      if (r == Ready::kStopped && stop != nullptr) co_return stop->why();
      co_return Status(DYAD_RC_TIMEOUT, "timed out waiting for the reply");
    }
    Result<bool> got = ch.RecvFrameNow(&frame, &rtype, &payload);
    if (!got.ok()) {
      ch.MarkBroken();
      co_return got.status();
    }
    if (*got) break;
  }
  co_return ReplyOfFrame(ch, rtype, payload, body);
}

}  // namespace dyad
