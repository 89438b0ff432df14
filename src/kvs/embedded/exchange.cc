// exchange.cc: see exchange.h.
#include "kvs/embedded/exchange.h"

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>

#include <cerrno>

namespace dyad {
namespace {

// Bytes of a reply read in one system call: every reply but a long
// listing's fits.
constexpr size_t kReplyReadAhead = 4096;

// Reads the start of the reply to the request just sent on `ch` with one
// recv where Channel::RecvFrame alone takes three (poll, header, payload),
// and hands it back to `ch` (Unread), from which ReceiveReply then takes
// the frame. Waits in poll until `deadline`. Reading ahead is safe on this link only: the root
// sends exactly one reply per request, so whatever arrives belongs to this reply (anything after it
// stays in `ch`, which EmbeddedKvs then keeps out of its pool). A timeout breaks the link, as the
// reply may still come.
Status ReadReplyAhead(Channel& ch, const Deadline& deadline) {
  char buf[kReplyReadAhead];
  for (;;) {
    const ssize_t n = ::recv(ch.fd(), buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      ch.Unread(std::string(buf, static_cast<size_t>(n)));
      return Status::OK();
    }
    if (n == 0) {
      ch.MarkBroken();
      return Status(DYAD_RC_CONNLOST, "peer closed the connection");
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      ch.MarkBroken();
      return StatusFromErrno(errno, "recv", DYAD_RC_CONNLOST);
    }
    pollfd p{ch.fd(), POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(deadline.RemainingMs(1000)));
    if (r < 0 && errno != EINTR) {
      ch.MarkBroken();
      return StatusFromErrno(errno, "poll", DYAD_RC_CONNLOST);
    }
    if (r == 0 && deadline.expired()) {
      ch.MarkBroken();
      return Status(DYAD_RC_TIMEOUT, "timed out waiting for the reply");
    }
  }
}

}  // namespace

Status EmbeddedExchange(Channel& ch, MsgType type, const std::string& request, std::string* body,
                        const Deadline& deadline) {
  DYAD_RETURN_IF_ERROR(ch.SendFrame(static_cast<uint16_t>(type), request, deadline));
  DYAD_RETURN_IF_ERROR(ReadReplyAhead(ch, deadline));
  return ReceiveReply(ch, body, deadline);
}

}  // namespace dyad
