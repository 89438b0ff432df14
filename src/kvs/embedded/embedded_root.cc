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

// A peer's wait or watch poll without a thread: the request of `type`
// decoded from `payload`, `start(req, deadline, done, &ticket)` answers at
// once or parks it, and its answer then comes through `done` (a Put, the
// end of its slice, a shutdown); the task waits for it, or until the peer
// goes away (`cancel(ticket)` then ends the parked request), and replies.
template <typename Request, typename R, typename Ticket>
Task<void> ServeParked(
    std::shared_ptr<EmbeddedKvsServer> server, RequestContext& ctx, const std::string& payload,
    MsgType type,
    std::function<std::optional<R>(const Request&, Deadline, std::function<void(R)>, Ticket*)>
        start,
    std::function<void(Ticket)> cancel, std::function<void(R&, Encoder&)> encode) {
  const uint16_t t = static_cast<uint16_t>(type);
  Request req;
  if (!DecodeOrExplain(server, t, ctx, payload, &req)) co_return;
  auto answer = std::make_shared<Rendezvous<R>>(ctx.runtime->executor());
  Ticket ticket{};
  std::optional<R> r = start(
      req, Deadline::AfterMs(SliceMs(req.timeout_ms)),
      [answer](R got) { answer->Deliver(std::move(got)); }, &ticket);
  if (!r) {
    r = co_await answer->Take(Deadline::Never(), ctx.stop);
    if (!r) {
      cancel(ticket);  // its callback runs before this returns
      r = co_await answer->Take(Deadline::AfterMs(0), nullptr);
    }
  }
  if (!r) r.emplace(Status(DYAD_RC_CANCELLED, "cancelled"));
  std::string body;
  if (r->ok()) {
    Encoder e;
    encode(*r, e);
    body = e.Take();
  }
  if (!server->SendResult(t, r->status(), body, ctx.ch).ok()) ctx.ch.MarkBroken();
}

Task<void> HandleWait(std::shared_ptr<EmbeddedKvsServer> server, RequestContext& ctx,
                      const std::string& payload) {
  std::function<std::optional<Result<std::string>>(const KvsRequest&, Deadline, KvsWaitCallback,
                                                   KvsWaitTicket*)>
      start = [server](const KvsRequest& req, Deadline deadline, KvsWaitCallback done,
                       KvsWaitTicket* ticket) {
        return Parked(server->store()->StartWait(req.ns, req.key, deadline, std::move(done)),
                      ticket);
      };
  std::function<void(KvsWaitTicket)> cancel = [server](KvsWaitTicket t) {
    server->store()->CancelWait(t);
  };
  std::function<void(Result<std::string>&, Encoder&)> encode =
      [](Result<std::string>& r, Encoder& e) { e.Bool(true).Str(*r); };
  co_await ServeParked(server, ctx, payload, MsgType::kKvsWait, std::move(start), std::move(cancel),
                       std::move(encode));
}

Task<void> HandleWatch(std::shared_ptr<EmbeddedKvsServer> server, RequestContext& ctx,
                       const std::string& payload) {
  using Ticket = ChangeFeeds::PollTicket;
  std::function<std::optional<Result<KvsWatchReply>>(const KvsWatchRequest&, Deadline,
                                                     ChangeFeeds::PollCallback, Ticket*)>
      start = [server](const KvsWatchRequest& req, Deadline deadline,
                       ChangeFeeds::PollCallback done, Ticket* ticket) {
        return server->feeds().StartPoll(req, deadline, std::move(done), ticket);
      };
  std::function<void(Ticket)> cancel = [server](Ticket t) { server->feeds().CancelPoll(t); };
  std::function<void(Result<KvsWatchReply>&, Encoder&)> encode = [](Result<KvsWatchReply>& r,
                                                                    Encoder& e) { r->EncodeTo(e); };
  co_await ServeParked(server, ctx, payload, MsgType::kKvsWatch, std::move(start),
                       std::move(cancel), std::move(encode));
}

}  // namespace

EmbeddedRoot::EmbeddedRoot(RequestRouter& router, std::optional<asio::any_io_executor> loop)
    : store_(std::make_shared<MemoryKvs>(loop)),
      server_(std::make_shared<EmbeddedKvsServer>(store_, EmbeddedKvsServer::kDefaultReplyTimeoutMs,
                                                  std::move(loop))) {
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
  std::optional<asio::any_io_executor> loop;
  if (options.runtime != nullptr) loop = options.runtime->executor();
  return std::unique_ptr<Kvs>(std::make_unique<EmbeddedRoot>(*options.router, std::move(loop)));
}

}  // namespace dyad
