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
#include "common/wire.h"
#include "proto/auth.h"
#include "proto/protocol.h"

namespace dyad {

enum class Link { kLocal, kPeer };

struct RequestContext;
class RequestParking;

// A request set aside while it waits (for a publication, say) without
// holding a worker thread; see RequestParking.
class ParkedRequest {
 public:
  virtual ~ParkedRequest() = default;
  // Call exactly once, from any thread, when the wait is over: `finish`
  // then runs on a worker with the request's context and must send the
  // reply (or park the request again).
  virtual void Resume(std::function<void(RequestContext&)> finish) = 0;
  // What to do should the requester hang up or the service stop while the
  // request is parked: end the wait soon (its completion still calls
  // Resume). Runs at once if that already happened.
  virtual void OnHangup(std::function<void()> cancel) = 0;
};

class RequestParking {
 public:
  virtual ~RequestParking() = default;
  // Releases the handler's worker once the handler returns; the handler
  // must then return without replying and arrange for Resume to be called.
  virtual std::shared_ptr<ParkedRequest> Park() = 0;
  // Parks the request until its connection can take more bytes (a
  // response the requester is slow to read, common/wire_queue.h): `more`
  // then runs on a worker with the request's context. Should the requester
  // hang up, the service stop, or no room come within `timeout_ms`,
  // `give_up` runs there instead, and the connection is closed after it.
  // The handler returns at once after this, sending nothing more.
  virtual void ParkUntilWritable(std::function<void(RequestContext&)> more,
                                 std::function<void(RequestContext&)> give_up,
                                 int64_t timeout_ms) = 0;
};

struct RequestContext {
  Channel& ch;
  Link link;
  const PeerIdentity* peer;  // the authenticated peer service (kPeer), else null
  CancelFn cancel;           // true once the requester hung up or the service stops
  // Non-null when the handler may park its request instead of blocking.
  RequestParking* parking = nullptr;
};

using RequestHandler = std::function<void(RequestContext& ctx, const std::string& payload)>;

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

  // Answers a request of `type` whose payload does not decode
  // (DYAD_RC_BADUNPACK, "malformed <type>").
  virtual void Malformed(RequestContext& ctx, MsgType type) = 0;
};

}  // namespace dyad
