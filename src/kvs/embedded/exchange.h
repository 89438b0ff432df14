// exchange.h: one request and its reply on a link to the embedded root
// (EmbeddedKvs's put, get, remove and list).
#pragma once

#include <string>

#include "common/net.h"
#include "common/status.h"
#include "common/time.h"
#include "proto/protocol.h"

namespace dyad {

// Sends `request` as a frame of `type` on `ch` and receives the root's
// reply (its body in `*body`, its status returned), reading the reply's
// start with one system call where RecvFrame alone takes three: waits in
// poll until `deadline`. Safe on this link only, where the root sends one
// reply per request: bytes after the reply stay unread in `ch`
// (Channel::has_unread), which then must not be reused. A failure of the
// link, a timeout included, marks `ch` broken.
Status EmbeddedExchange(Channel& ch, MsgType type, const std::string& request, std::string* body,
                        const Deadline& deadline);

}  // namespace dyad
