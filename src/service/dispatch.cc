#include "service/dispatch.h"

#include <cstdlib>

#include "common/log.h"
#include "service/file_server.h"

namespace dyad {

void Dispatcher::Route(Link link, MsgType type, const char* counter, RequestHandler handler) {
  Add(link, type, counter, std::move(handler), false);
}

void Dispatcher::RouteInline(Link link, MsgType type, const char* counter, RequestHandler handler) {
  Add(link, type, counter, std::move(handler), true);
}

void Dispatcher::Malformed(RequestContext& ctx, MsgType type) {
  SendReply(ctx.ch,
            Status(DYAD_RC_BADUNPACK, std::string("malformed ") +
                                          MsgTypeName(static_cast<uint16_t>(type)) + " request"),
            {}, reply_timeout_ms_, stats_);
}

bool Dispatcher::RunsInline(Link link, uint16_t type) const {
  auto it = table_.find(std::make_pair(link, type));
  return it != table_.end() && it->second.runs_inline;
}

void Dispatcher::Add(Link link, MsgType type, const char* counter, RequestHandler handler,
                     bool runs_inline) {
  const auto key = std::make_pair(link, static_cast<uint16_t>(type));
  if (table_.count(key) != 0) {
    DYAD_LOG_ERROR("two handlers for '%s'", MsgTypeName(key.second));
    std::abort();  // a programming error, found by every test that starts a service
  }
  const ServiceStats::Counter c =
      counter != nullptr ? ServiceStats::Find(counter) : ServiceStats::kNumCounters;
  table_[key] = Entry{c, std::move(handler), runs_inline};
}

void Dispatcher::Dispatch(RequestContext& ctx, uint16_t type, const std::string& payload) const {
  auto it = table_.find(std::make_pair(ctx.link, type));
  if (it == table_.end()) {
    const char* where = ctx.link == Link::kLocal ? "from local clients" : "from other services";
    SendReply(ctx.ch,
              Status(DYAD_RC_BADREQUEST, "rank " + std::to_string(rank_) + " serves no '" +
                                             MsgTypeName(type) + "' requests " + where),
              {}, reply_timeout_ms_, stats_);
    return;
  }
  if (it->second.counter != ServiceStats::kNumCounters) stats_->Add(it->second.counter);
  it->second.handler(ctx, payload);
}

}  // namespace dyad
