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
#include <memory>
#include <string>
#include <utility>

#include "common/cancel.h"
#include "common/net.h"
#include "common/runtime.h"
#include "common/wire.h"
#include "proto/auth.h"
#include "proto/protocol.h"

namespace dyad {

enum class Link { kLocal, kPeer };

// What a handler knows of its request.
struct RequestContext {
  Channel& ch;
  Link link;
  const PeerIdentity* peer;  // the authenticated peer service (kPeer), else null
  CancelFn cancel;           // true once the requester hung up or the service stops
  // The request's Stop (common/runtime.h): fires when the requester hangs
  // up or the service stops; every wait of a task handler names it.
  Stop* stop = nullptr;
  Runtime* runtime = nullptr;
};

// A handler that answers at once or blocks (on a store's client, a disk):
// the service runs it on its pool of threads for blocking calls.
using RequestHandler = std::function<void(RequestContext& ctx, const std::string& payload)>;
// A handler that waits (for a publication, a peer, room in the socket): a
// task on the service's loop (common/runtime.h), holding no thread while it
// waits. Its replies are collected and sent once it ends, without blocking,
// unless it was routed as streaming (it then sends as it goes, without
// blocking: common/wire_queue.h).
using TaskHandler = std::function<Task<void>(RequestContext& ctx, const std::string& payload)>;

class RequestRouter {
 public:
  virtual ~RequestRouter() = default;
  // Serves requests of `type` arriving on `link` with `handler`; `counter`
  // names the statistic counted per request ("requests.kvs"). A type has
  // one handler per link; registering it twice is a programming error.
  virtual void Route(Link link, MsgType type, const char* counter, RequestHandler handler) = 0;
  // As Route, for a handler that never blocks (no network, disk, or wait:
  // a lookup in memory, say) and never parks: the service may run it on its
  // event loop, sparing the hand-off to a worker and back, with its reply
  // buffered by the loop so that a peer that does not read cannot stall it.
  virtual void RouteInline(Link link, MsgType type, const char* counter, RequestHandler handler) {
    Route(link, type, counter, std::move(handler));
  }
  // As Route, for a handler that waits: a task on the loop (see TaskHandler).
  // `streaming`: it sends its own replies as it goes (a fetch's response).
  virtual void RouteTask(Link link, MsgType type, const char* counter, TaskHandler handler,
                         bool streaming = false) = 0;

  // A typed route: the payload is decoded as a `Request` (its DecodeFrom,
  // every byte used) before `handle` sees it; a payload that does not
  // decode is answered by Malformed and never reaches the handler. Each
  // request type is then decoded, checked and refused in this one place.
  template <typename Request, typename Owner>
  void Route(Link link, MsgType type, const char* counter, Owner* owner,
             void (Owner::*handle)(RequestContext&, const Request&)) {
    Route(link, type, counter,
          [this, owner, handle, type](RequestContext& ctx, const std::string& payload) {
            Request req;
            Decoder d(payload);
            if (!req.DecodeFrom(d) || !d.done()) return Malformed(ctx, type);
            (owner->*handle)(ctx, req);
          });
  }

  // A typed task route (as the typed Route above).
  template <typename Request, typename Owner>
  void RouteTask(Link link, MsgType type, const char* counter, Owner* owner,
                 Task<void> (Owner::*handle)(RequestContext&, Request)) {
    RouteTask(
        link, type, counter,
        [this, owner, handle, type](RequestContext& ctx, const std::string& payload) -> Task<void> {
          Request req;
          Decoder d(payload);
          if (!req.DecodeFrom(d) || !d.done()) {
            Malformed(ctx, type);
            co_return;
          }
          co_await (owner->*handle)(ctx, std::move(req));
        });
  }

  // Answers a request of `type` whose payload does not decode
  // (DYAD_RC_BADUNPACK, "malformed <type>").
  virtual void Malformed(RequestContext& ctx, MsgType type) = 0;
};

}  // namespace dyad
