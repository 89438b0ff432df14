#include "service/dispatch.h"

#include <cstdlib>

#include "common/log.h"
#include "service/file_server.h"

namespace dyad {

void Dispatcher::Route(Link link, MsgType type, const char* counter, RequestHandler handler) {
  Add(link, type, counter, Entry{{}, std::move(handler), nullptr, Handling::kBlocking});
}

void Dispatcher::RouteInline(Link link, MsgType type, const char* counter, RequestHandler handler) {
  Add(link, type, counter, Entry{{}, std::move(handler), nullptr, Handling::kInline});
}

void Dispatcher::RouteTask(Link link, MsgType type, const char* counter, TaskHandler handler,
                           bool streaming) {
  Add(link, type, counter,
      Entry{{}, nullptr, std::move(handler), streaming ? Handling::kStreaming : Handling::kTask});
}

void Dispatcher::Malformed(RequestContext& ctx, MsgType type) {
  SendReply(ctx.ch,
            Status(DYAD_RC_BADUNPACK, std::string("malformed ") +
                                          MsgTypeName(static_cast<uint16_t>(type)) + " request"),
            {}, reply_timeout_ms_, stats_);
}

Handling Dispatcher::HandlingOf(Link link, uint16_t type) const {
  auto it = table_.find(std::make_pair(link, type));
  return it == table_.end() ? Handling::kInline : it->second.handling;
}

void Dispatcher::Add(Link link, MsgType type, const char* counter, Entry entry) {
  const auto key = std::make_pair(link, static_cast<uint16_t>(type));
  if (table_.count(key) != 0) {
    DYAD_LOG_ERROR("two handlers for '%s'", MsgTypeName(key.second));
    std::abort();  // a programming error, found by every test that starts a service
  }
  entry.counter = counter != nullptr ? ServiceStats::Find(counter) : ServiceStats::kNumCounters;
  table_[key] = std::move(entry);
}

const Dispatcher::Entry* Dispatcher::Find(RequestContext& ctx, uint16_t type) const {
  auto it = table_.find(std::make_pair(ctx.link, type));
  if (it == table_.end()) {
    const char* where = ctx.link == Link::kLocal ? "from local clients" : "from other services";
    SendReply(ctx.ch,
              Status(DYAD_RC_BADREQUEST, "rank " + std::to_string(rank_) + " serves no '" +
                                             MsgTypeName(type) + "' requests " + where),
              {}, reply_timeout_ms_, stats_);
    return nullptr;
  }
  if (it->second.counter != ServiceStats::kNumCounters) stats_->Add(it->second.counter);
  return &it->second;
}

void Dispatcher::Dispatch(RequestContext& ctx, uint16_t type, const std::string& payload) const {
  const Entry* e = Find(ctx, type);
  if (e == nullptr) return;
  if (e->handler) e->handler(ctx, payload);  // task routes are served by DispatchTask
}

Task<void> Dispatcher::DispatchTask(RequestContext& ctx, uint16_t type,
                                    const std::string& payload) const {
  const Entry* e = Find(ctx, type);
  if (e == nullptr) co_return;
  if (e->task) {
    co_await e->task(ctx, payload);
  } else {
    e->handler(ctx, payload);
  }
}

}  // namespace dyad
