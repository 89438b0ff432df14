#include "kvs/embedded/embedded_server.h"

#include <algorithm>
#include <utility>

#include "common/log.h"
#include "common/wire.h"
#include "proto/protocol.h"

namespace dyad {

EmbeddedKvsServer::EmbeddedKvsServer(std::shared_ptr<MemoryKvs> store, int64_t reply_timeout_ms,
                                     std::optional<asio::any_io_executor> loop)
    : store_(store ? std::move(store) : std::make_shared<MemoryKvs>(loop)),
      reply_timeout_ms_(reply_timeout_ms > 0 ? reply_timeout_ms : kDefaultReplyTimeoutMs),
      feeds_(std::make_unique<ChangeFeeds>(store_, ChangeFeedLimits{}, std::move(loop))) {}

bool EmbeddedKvsServer::Handles(uint16_t type) {
  switch (static_cast<MsgType>(type)) {
    case MsgType::kKvsPut:
    case MsgType::kKvsGet:
    case MsgType::kKvsWait:
    case MsgType::kKvsRemove:
    case MsgType::kKvsList:
    case MsgType::kKvsWatch:
    case MsgType::kKvsMultiGet:
      return true;
    default:
      return false;
  }
}

Status EmbeddedKvsServer::Execute(uint16_t type, const std::string& payload, const CancelFn& cancel,
                                  std::string* body) {
  if (!Handles(type)) {
    return Status(DYAD_RC_BADRPC, std::string("'") + MsgTypeName(type) + "' (type " +
                                      std::to_string(type) + ") is not a metadata store request");
  }
  if (static_cast<MsgType>(type) == MsgType::kKvsWatch) return ExecuteWatch(payload, cancel, body);
  if (static_cast<MsgType>(type) == MsgType::kKvsMultiGet) return ExecuteMultiGet(payload, body);
  KvsRequest req;
  Decoder d(payload);
  if (!req.DecodeFrom(d) || !d.done()) {
    DYAD_LOG_WARN("embedded store: malformed %s request (%zu bytes)", MsgTypeName(type),
                  payload.size());
    return Status(DYAD_RC_BADUNPACK, std::string("malformed ") + MsgTypeName(type) + " request (" +
                                         std::to_string(payload.size()) + " bytes)");
  }

  Encoder e;
  switch (static_cast<MsgType>(type)) {
    case MsgType::kKvsPut:
      DYAD_RETURN_IF_ERROR(store_->Put(req.ns, req.key, req.value));
      break;
    case MsgType::kKvsGet: {
      Result<std::optional<std::string>> r = store_->Get(req.ns, req.key);
      if (!r.ok()) return r.status();
      e.Bool(r->has_value()).Str(r->has_value() ? **r : std::string());
      break;
    }
    case MsgType::kKvsWait: {
      // Such a client slices long waits; bounding each slice here caps the
      // time a connection thread is held by a client that may have vanished.
      const int64_t ms =
          req.timeout_ms < 0 ? kMaxWaitSliceMs : std::min(req.timeout_ms, kMaxWaitSliceMs);
      Result<std::string> r = store_->Wait(req.ns, req.key, Deadline::AfterMs(ms), cancel);
      if (!r.ok()) return r.status();
      e.Bool(true).Str(*r);
      break;
    }
    case MsgType::kKvsRemove:
      DYAD_RETURN_IF_ERROR(store_->Remove(req.ns, req.key));
      break;
    case MsgType::kKvsList: {
      // Measured before it is copied: refused rather than truncated (a
      // silently partial listing would be read as complete).
      Result<std::vector<KvsEntry>> r =
          store_->ListUpTo(req.ns, req.key, req.limit, kMaxListReplyBytes - 4);
      if (!r.ok()) return r.status();
      e.U32(static_cast<uint32_t>(r->size()));
      for (const KvsEntry& kv : *r) e.Str(kv.first).Str(kv.second);
      break;
    }
    default:
      break;  // unreachable: Handles() admitted the type
  }
  *body = e.Take();
  return Status::OK();
}

Status EmbeddedKvsServer::ExecuteWatch(const std::string& payload, const CancelFn& cancel,
                                       std::string* body) {
  KvsWatchRequest req;
  Decoder d(payload);
  if (!req.DecodeFrom(d) || !d.done()) {
    DYAD_LOG_WARN("embedded store: malformed kvs.watch request (%zu bytes)", payload.size());
    return Status(DYAD_RC_BADUNPACK, "malformed kvs.watch request");
  }
  // Bounded like a wait slice: the watcher polls again.
  const int64_t ms =
      req.timeout_ms < 0 ? kMaxWaitSliceMs : std::min(req.timeout_ms, kMaxWaitSliceMs);
  Result<KvsWatchReply> r = feeds_->Poll(req, Deadline::AfterMs(ms), cancel);
  if (!r.ok()) return r.status();
  Encoder e;
  r->EncodeTo(e);
  *body = e.Take();
  return Status::OK();
}

Status EmbeddedKvsServer::ExecuteMultiGet(const std::string& payload, std::string* body) {
  KvsMultiGetRequest req;
  Decoder d(payload);
  if (!req.DecodeFrom(d) || !d.done() || req.keys.empty()) {
    DYAD_LOG_WARN("embedded store: malformed kvs.multi_get request (%zu bytes)", payload.size());
    return Status(DYAD_RC_BADUNPACK, "malformed kvs.multi_get request");
  }
  // Only the values one reply carries are copied (at least one; a single
  // value too large for a frame fails in SendResult as a Get of it would).
  Result<KvsValues> r = store_->MultiGetUpTo(req.ns, req.keys, kMultiGetReplyBytes);
  if (!r.ok()) return r.status();
  Encoder e;
  e.U32(static_cast<uint32_t>(r->size()));
  for (const std::optional<std::string>& v : *r) e.Bool(v.has_value()).Str(v ? *v : std::string());
  *body = e.Take();
  return Status::OK();
}

Status EmbeddedKvsServer::Handle(uint16_t type, const std::string& payload, Channel& ch,
                                 const CancelFn& cancel) {
  std::string body;
  Status st = Execute(type, payload, cancel, &body);
  return SendResult(type, st, body, ch);
}

Status EmbeddedKvsServer::SendResult(uint16_t type, const Status& st, const std::string& body,
                                     Channel& ch) const {
  std::string reply = EncodeReply(st, st.ok() ? body : std::string());
  if (reply.size() > kMaxFramePayload) {
    // Only a Get/Wait of a value larger than any Put can carry gets here.
    reply = EncodeReply(Status(DYAD_RC_BADPACK, "reply exceeds the frame size limit"));
  }
  Status sent = ch.SendFrame(static_cast<uint16_t>(MsgType::kReply), reply,
                             Deadline::AfterMs(reply_timeout_ms_));
  if (!sent.ok()) {
    DYAD_LOG_DEBUG("embedded store: cannot send %s reply: %s", MsgTypeName(type),
                   sent.ToString().c_str());
  }
  return sent;
}

}  // namespace dyad
