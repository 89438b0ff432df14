#include "kvs/embedded/embedded_root.h"

#include <algorithm>
#include <optional>

#include "common/wire.h"
#include "kvs/embedded/embedded_kvs.h"

namespace dyad {

namespace {

// Decodes a parkable request into `req`. A malformed one is left to the
// blocking path, which explains it to the peer; false then.
template <typename Request>
bool DecodeOrExplain(const std::shared_ptr<EmbeddedKvsServer>& server, uint16_t type,
                     RequestContext& ctx, const std::string& payload, Request* req) {
  Decoder d(payload);
  if (req->DecodeFrom(d) && d.done()) return true;
  if (!server->Handle(type, payload, ctx.ch, ctx.cancel).ok()) ctx.ch.MarkBroken();
  return false;
}

// A parked request waits at most one slice, as in EmbeddedKvsServer.
int64_t SliceMs(int64_t timeout_ms) {
  return timeout_ms < 0 ? EmbeddedKvsServer::kMaxWaitSliceMs
                        : std::min(timeout_ms, EmbeddedKvsServer::kMaxWaitSliceMs);
}

// A peer's wait without a thread: a task until the store answers (at most
// one slice, as in EmbeddedKvsServer), or the peer goes away.
Task<void> HandleWait(std::shared_ptr<EmbeddedKvsServer> server, RequestContext& ctx,
                      const std::string& payload) {
  constexpr uint16_t kType = static_cast<uint16_t>(MsgType::kKvsWait);
  KvsRequest req;
  if (!DecodeOrExplain(server, kType, ctx, payload, &req)) co_return;
  const int64_t ms = SliceMs(req.timeout_ms);
  auto answer = std::make_shared<Rendezvous<Result<std::string>>>(ctx.runtime->executor());
  Result<KvsWaitTicket> ticket = server->store()->StartWait(
      req.ns, req.key, Deadline::AfterMs(ms),
      [answer](Result<std::string> r) { answer->Deliver(std::move(r)); });
  Result<std::string> r = ticket.status();
  if (ticket.ok()) {
    std::optional<Result<std::string>> got = co_await answer->Take(Deadline::Never(), ctx.stop);
    if (!got) {
      server->store()->CancelWait(*ticket);  // its callback runs before this returns
      got = co_await answer->Take(Deadline::AfterMs(0), nullptr);
    }
    r = got ? std::move(*got) : Result<std::string>(Status(DYAD_RC_CANCELLED, "cancelled"));
  }
  std::string body;
  if (r.ok()) {
    Encoder e;
    e.Bool(true).Str(*r);
    body = e.Take();
  }
  if (!server->SendResult(kType, r.status(), body, ctx.ch).ok()) ctx.ch.MarkBroken();
}

// A peer's watch poll without a thread: answered now when there are
// changes, else a task until a Put brings one or its slice ends.
Task<void> HandleWatch(std::shared_ptr<EmbeddedKvsServer> server, RequestContext& ctx,
                       const std::string& payload) {
  constexpr uint16_t kType = static_cast<uint16_t>(MsgType::kKvsWatch);
  KvsWatchRequest req;
  if (!DecodeOrExplain(server, kType, ctx, payload, &req)) co_return;
  const int64_t ms = SliceMs(req.timeout_ms);
  auto answer = std::make_shared<Rendezvous<Result<KvsWatchReply>>>(ctx.runtime->executor());
  ChangeFeeds::PollTicket ticket = 0;
  std::optional<Result<KvsWatchReply>> r = server->feeds().StartPoll(
      req, Deadline::AfterMs(ms),
      [answer](Result<KvsWatchReply> got) { answer->Deliver(std::move(got)); }, &ticket);
  if (!r) {
    r = co_await answer->Take(Deadline::Never(), ctx.stop);
    if (!r) {
      server->feeds().CancelPoll(ticket);
      r = co_await answer->Take(Deadline::AfterMs(0), nullptr);
    }
  }
  if (!r) r = Result<KvsWatchReply>(Status(DYAD_RC_CANCELLED, "cancelled"));
  std::string body;
  if (r->ok()) {
    Encoder e;
    (*r)->EncodeTo(e);
    body = e.Take();
  }
  if (!server->SendResult(kType, r->status(), body, ctx.ch).ok()) ctx.ch.MarkBroken();
}

}  // namespace

EmbeddedRoot::EmbeddedRoot(RequestRouter& router)
    : store_(std::make_shared<MemoryKvs>()), server_(std::make_shared<EmbeddedKvsServer>(store_)) {
  for (MsgType type : {MsgType::kKvsPut, MsgType::kKvsGet, MsgType::kKvsWait, MsgType::kKvsRemove,
                       MsgType::kKvsList, MsgType::kKvsWatch, MsgType::kKvsMultiGet}) {
    // The handler keeps the server alive as long as the service routes to it.
    RequestHandler handler = [server = server_, type](RequestContext& ctx,
                                                      const std::string& payload) {
      Status sent = server->Handle(static_cast<uint16_t>(type), payload, ctx.ch, ctx.cancel);
      if (!sent.ok()) ctx.ch.MarkBroken();
    };
    // Put, get, remove, list and batched reads only touch the store's
    // memory, and each does bounded work (a get copies one value, a
    // batched read at most kMultiGetReplyBytes of values, a listing is
    // measured before it is copied and stops at one frame, or scans at
    // most KeyTable::kMaxOrderedScan keys when it needs key order): the
    // service's event loop runs them itself. Waits and watch polls wait:
    // tasks on the loop, holding no thread.
    // Batched reads have a counter of their own: `dyad status` then tells
    // how many reads were batched.
    if (type == MsgType::kKvsWait) {
      router.RouteTask(Link::kPeer, type, "requests.kvs",
                       [server = server_](RequestContext& ctx, const std::string& payload) {
                         return HandleWait(server, ctx, payload);
                       });
    } else if (type == MsgType::kKvsWatch) {
      router.RouteTask(Link::kPeer, type, "requests.kvs",
                       [server = server_](RequestContext& ctx, const std::string& payload) {
                         return HandleWatch(server, ctx, payload);
                       });
    } else if (type == MsgType::kKvsMultiGet) {
      router.RouteInline(Link::kPeer, type, "requests.kvs.multi_get", std::move(handler));
    } else {
      router.RouteInline(Link::kPeer, type, "requests.kvs", std::move(handler));
    }
  }
}

// "embedded" hosts the store in this service; "embedded://HOST:PORT" is a
// client of the store hosted by the root service there.
Result<std::unique_ptr<Kvs>> OpenKvs_embedded(const std::string& url, const KvsOptions& options) {
  constexpr const char kScheme[] = "embedded://";
  if (url != "embedded" && url != kScheme) {
    Result<std::unique_ptr<EmbeddedKvs>> kvs =
        EmbeddedKvs::Open(url.substr(sizeof(kScheme) - 1), options);
    if (!kvs.ok()) return kvs.status();
    return std::unique_ptr<Kvs>(std::move(*kvs));
  }
  if (options.router == nullptr)
    return Status(DYAD_RC_BADREQUEST,
                  "metadata store '" + url +
                      "' names the store hosted by the root service; a client of it needs "
                      "embedded://HOST:PORT");
  if (options.self_rank != 0 && !options.host_root)
    return Status(DYAD_RC_BADREQUEST,
                  "rank " + std::to_string(options.self_rank) +
                      " needs the root's address: --kvs embedded://ROOT_HOST:PORT "
                      "(or --root to host the store here)");
  return std::unique_ptr<Kvs>(std::make_unique<EmbeddedRoot>(*options.router));
}

}  // namespace dyad
