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

// A peer's wait without a thread: parked until the store answers (at most
// one slice, as in EmbeddedKvsServer), then replied to from a worker.
void HandleWaitParked(const std::shared_ptr<EmbeddedKvsServer>& server, RequestContext& ctx,
                      const std::string& payload) {
  constexpr uint16_t kType = static_cast<uint16_t>(MsgType::kKvsWait);
  KvsRequest req;
  if (!DecodeOrExplain(server, kType, ctx, payload, &req)) return;
  const int64_t ms = SliceMs(req.timeout_ms);
  std::shared_ptr<ParkedRequest> parked = ctx.parking->Park();
  // What the store's threads hold refers to the server weakly: the last
  // reference to it (and so to the store) must never be dropped on one of
  // the store's own threads, whose destructor joins them.
  const std::weak_ptr<EmbeddedKvsServer> weak = server;
  auto reply = [weak](const Status& st, const std::string& body) {
    return [weak, st, body](RequestContext& c) {
      const std::shared_ptr<EmbeddedKvsServer> s = weak.lock();
      if (s == nullptr || !s->SendResult(kType, st, body, c.ch).ok()) c.ch.MarkBroken();
    };
  };
  Result<KvsWaitTicket> ticket = server->store()->StartWait(
      req.ns, req.key, Deadline::AfterMs(ms), [parked, reply](Result<std::string> r) {
        if (!r.ok()) return parked->Resume(reply(r.status(), {}));
        Encoder e;
        e.Bool(true).Str(*r);
        parked->Resume(reply(Status::OK(), e.Take()));
      });
  if (!ticket.ok()) return parked->Resume(reply(ticket.status(), {}));
  parked->OnHangup([weak, t = *ticket] {
    if (const std::shared_ptr<EmbeddedKvsServer> s = weak.lock()) s->store()->CancelWait(t);
  });
}

// A peer's watch poll without a thread: answered now when there are
// changes, else parked until a Put brings one or its slice ends.
void HandleWatchParked(const std::shared_ptr<EmbeddedKvsServer>& server, RequestContext& ctx,
                       const std::string& payload) {
  constexpr uint16_t kType = static_cast<uint16_t>(MsgType::kKvsWatch);
  KvsWatchRequest req;
  if (!DecodeOrExplain(server, kType, ctx, payload, &req)) return;
  const int64_t ms = SliceMs(req.timeout_ms);
  // Weakly, as in HandleWaitParked: the feeds' timer must not drop the
  // last reference to the server that owns it.
  const std::weak_ptr<EmbeddedKvsServer> weak = server;
  auto send = [weak](RequestContext& c, const Result<KvsWatchReply>& r) {
    std::string body;
    if (r.ok()) {
      Encoder e;
      r->EncodeTo(e);
      body = e.Take();
    }
    const std::shared_ptr<EmbeddedKvsServer> s = weak.lock();
    if (s == nullptr || !s->SendResult(kType, r.status(), body, c.ch).ok()) c.ch.MarkBroken();
  };
  std::shared_ptr<ParkedRequest> parked = ctx.parking->Park();
  ChangeFeeds::PollTicket ticket = 0;
  std::optional<Result<KvsWatchReply>> now = server->feeds().StartPoll(
      req, Deadline::AfterMs(ms),
      [parked, send](Result<KvsWatchReply> r) {
        parked->Resume([send, r = std::move(r)](RequestContext& c) { send(c, r); });
      },
      &ticket);
  if (now) {
    return parked->Resume([send, r = std::move(*now)](RequestContext& c) { send(c, r); });
  }
  parked->OnHangup([weak, ticket] {
    if (const std::shared_ptr<EmbeddedKvsServer> s = weak.lock()) s->feeds().CancelPoll(ticket);
  });
}

}  // namespace

EmbeddedRoot::EmbeddedRoot(RequestRouter& router)
    : store_(std::make_shared<MemoryKvs>()), server_(std::make_shared<EmbeddedKvsServer>(store_)) {
  for (MsgType type : {MsgType::kKvsPut, MsgType::kKvsGet, MsgType::kKvsWait, MsgType::kKvsRemove,
                       MsgType::kKvsList, MsgType::kKvsWatch, MsgType::kKvsMultiGet}) {
    // The handler keeps the server alive as long as the service routes to it.
    RequestHandler handler = [server = server_, type](RequestContext& ctx,
                                                      const std::string& payload) {
      if (type == MsgType::kKvsWait && ctx.parking != nullptr)
        return HandleWaitParked(server, ctx, payload);
      if (type == MsgType::kKvsWatch && ctx.parking != nullptr)
        return HandleWatchParked(server, ctx, payload);
      Status sent = server->Handle(static_cast<uint16_t>(type), payload, ctx.ch, ctx.cancel);
      if (!sent.ok()) ctx.ch.MarkBroken();
    };
    // Put, get, remove, list and batched reads only touch the store's
    // memory, and each does bounded work (a get copies one value, a
    // batched read at most kMultiGetReplyBytes of values, a listing is
    // measured before it is copied and stops at one frame, or scans at
    // most KeyTable::kMaxOrderedScan keys when it needs key order): the
    // service's event loop runs them itself. Waits and watch polls wait, so
    // they park (a worker only starts them).
    // Batched reads have a counter of their own: `dyad status` then tells
    // how many reads were batched.
    if (type == MsgType::kKvsWait || type == MsgType::kKvsWatch) {
      router.Route(Link::kPeer, type, "requests.kvs", std::move(handler));
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
