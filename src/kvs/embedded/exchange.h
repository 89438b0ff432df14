// exchange.h: one request and its reply on a link to the embedded root
// (EmbeddedKvs's put, get, remove, list and multi-get).
#pragma once

#include <string>

#include "common/net.h"
#include "common/runtime.h"
#include "common/status.h"
#include "common/time.h"
#include "proto/protocol.h"

namespace dyad {

// Sends `request` as a frame of `type` on `ch` and waits on the loop that
// runs it for the root's reply (its body in `*body`, its status returned),
// until `deadline` or `stop`. The link reads ahead (4 KiB: one system call
// for every reply but a long listing's); that is safe on this link only,
// where the root sends one reply per request: bytes after the reply stay
// unread in `ch` (Channel::has_unread), which then must not be reused. A
// failure of the link, a timeout or a stop included, marks `ch` broken
// (the reply may still come).
Task<Status> EmbeddedExchange(Channel& ch, MsgType type, const std::string& request,
                              std::string* body, Deadline deadline, Stop* stop);

}  // namespace dyad
