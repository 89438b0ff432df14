// router.h: how request handlers are attached to a service's links.
//
// dyad-service receives frames on two links: the Unix socket of its node's
// application processes (kLocal) and authenticated TCP sessions of other
// services (kPeer). Each request type has one handler, found in a table
// (message type -> handler); a part that serves requests (the service's own
// handlers, the embedded store on the root) registers its handlers through
// a RequestRouter, so the service never needs to know which part serves
// what. A handler sends exactly one reply on ctx.ch (a transfer may follow a
// fetch reply) and marks the channel broken when it can no longer be used.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/auth.h"
#include "common/cancel.h"
#include "common/net.h"
#include "proto/protocol.h"

namespace dyad {

enum class Link { kLocal, kPeer };

struct RequestContext {
  Channel& ch;
  Link link;
  const PeerIdentity* peer;  // the authenticated peer service (kPeer), else null
  CancelFn cancel;           // true once the requester hung up or the service stops
};

using RequestHandler = std::function<void(RequestContext& ctx, const std::string& payload)>;

class RequestRouter {
 public:
  virtual ~RequestRouter() = default;
  // Serves requests of `type` arriving on `link` with `handler`; `counter`
  // names the statistic counted per request ("requests.kvs"). A type has
  // one handler per link; registering it twice is a programming error.
  virtual void Route(Link link, MsgType type, const char* counter, RequestHandler handler) = 0;
};

}  // namespace dyad
