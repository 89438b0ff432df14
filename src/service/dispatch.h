// dispatch.h: the service's request table (message type -> handler).
//
// Parts that serve requests register their handlers at start (Route);
// connection threads then look each frame up (Dispatch). An unknown type
// gets an error reply naming it, so a bad peer cannot desynchronise its
// own link. Registration happens before any connection is served; lookups
// need no lock afterwards. Handlers that never block may be registered
// with RouteInline; the event loop then runs them itself (reactor.h).
#pragma once

#include <map>
#include <string>
#include <utility>

#include "proto/router.h"
#include "service/server.h"
#include "service/stats.h"

namespace dyad {

class Dispatcher final : public RequestRouter {
 public:
  Dispatcher(uint32_t rank, int64_t reply_timeout_ms, ServiceStats* stats)
      : rank_(rank), reply_timeout_ms_(reply_timeout_ms), stats_(stats) {}

  void Route(Link link, MsgType type, const char* counter, RequestHandler handler) override;
  void RouteInline(Link link, MsgType type, const char* counter, RequestHandler handler) override;
  void RouteTask(Link link, MsgType type, const char* counter, TaskHandler handler,
                 bool streaming = false) override;
  using RequestRouter::Route;
  using RequestRouter::RouteTask;
  void Malformed(RequestContext& ctx, MsgType type) override;
  // How requests of `type` on `link` are served (an unknown type: inline,
  // its error reply is sent at once).
  Handling HandlingOf(Link link, uint16_t type) const;
  // Runs the inline or blocking handler of `type` on ctx.link, or replies
  // that there is none.
  void Dispatch(RequestContext& ctx, uint16_t type, const std::string& payload) const;
  // Runs the task handler of `type` on ctx.link.
  Task<void> DispatchTask(RequestContext& ctx, uint16_t type, const std::string& payload) const;

 private:
  struct Entry {
    ServiceStats::Counter counter;
    RequestHandler handler;
    TaskHandler task;
    Handling handling = Handling::kBlocking;
  };
  void Add(Link link, MsgType type, const char* counter, Entry entry);
  const Entry* Find(RequestContext& ctx, uint16_t type) const;
  const uint32_t rank_;
  const int64_t reply_timeout_ms_;
  ServiceStats* stats_;
  std::map<std::pair<Link, uint16_t>, Entry> table_;
};

}  // namespace dyad
