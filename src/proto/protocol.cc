#include "proto/protocol.h"

#include "common/net.h"
#include "common/time.h"

namespace dyad {

const char* MsgTypeName(uint16_t type) {
  switch (static_cast<MsgType>(type)) {
    case MsgType::kReply:
      return "reply";
    case MsgType::kChallenge:
      return "challenge";
    case MsgType::kAuthenticate:
      return "authenticate";
    case MsgType::kPublish:
      return "publish";
    case MsgType::kLocate:
      return "locate";
    case MsgType::kConsume:
      return "consume";
    case MsgType::kStatus:
      return "status";
    case MsgType::kList:
      return "list";
    case MsgType::kPing:
      return "ping";
    case MsgType::kRemove:
      return "remove";
    case MsgType::kPeers:
      return "peers";
    case MsgType::kPrefetch:
      return "prefetch";
    case MsgType::kConsumeBatch:
      return "consume.batch";
    case MsgType::kKvsPut:
      return "kvs.put";
    case MsgType::kKvsGet:
      return "kvs.get";
    case MsgType::kKvsWait:
      return "kvs.wait";
    case MsgType::kKvsRemove:
      return "kvs.remove";
    case MsgType::kKvsList:
      return "kvs.list";
    case MsgType::kKvsWatch:
      return "kvs.watch";
    case MsgType::kKvsMultiGet:
      return "kvs.multi_get";
    case MsgType::kFetch:
      return "fetch";
    case MsgType::kFileData:
      return "file.data";
    case MsgType::kSupersede:
      return "supersede";
    case MsgType::kFetchBatch:
      return "fetch.batch";
  }
  return "unknown";
}

std::string MemberKey(uint32_t rank) { return "rank." + std::to_string(rank); }

std::string FileRecord::Encode() const {
  Encoder e;
  e.U8(1)
      .U32(owner_rank)
      .U64(owner_incarnation)
      .U64(size)
      .U64(version)
      .U64(published_ns)
      .Str(upath);
  // Appended, and only when set: records of older DYADs (no seq) decode.
  if (seq != 0) e.U64(seq);
  return e.Take();
}

bool FileRecord::Decode(const std::string& bytes, FileRecord* out) {
  Decoder d(bytes);
  if (d.U8() != 1) return false;
  FileRecord r;
  r.owner_rank = d.U32();
  r.owner_incarnation = d.U64();
  r.size = d.U64();
  r.version = d.U64();
  r.published_ns = d.U64();
  r.upath = d.Str();
  if (!d.failed() && !d.done()) r.seq = d.U64();
  if (!d.done()) return false;
  *out = std::move(r);
  return true;
}

std::string VersionStamp(const FileRecord& rec, bool revocable) {
  Encoder e;
  e.U8(1)
      .U32(rec.owner_rank)
      .U64(rec.owner_incarnation)
      .U64(rec.seq)
      .U64(rec.size)
      .U64(rec.version);
  if (revocable) e.U8(1);
  return e.Take();
}

bool StampNames(std::string_view stamp, const FileRecord& rec) {
  const std::string want = VersionStamp(rec);
  return (stamp.size() == want.size() || stamp.size() == want.size() + 1) &&
         stamp.compare(0, want.size(), want) == 0;
}

namespace {
// A revocable stamp's size and version; false for any other bytes.
bool DecodeRevocable(std::string_view stamp, uint64_t* size, uint64_t* version) {
  Decoder d(stamp);
  if (d.U8() != 1) return false;
  (void)d.U32();  // owner rank
  (void)d.U64();  // owner incarnation
  (void)d.U64();  // publication counter
  *size = d.U64();
  *version = d.U64();
  return d.U8() == 1 && d.done();
}
}  // namespace

bool StampDescribes(std::string_view stamp, uint64_t size, uint64_t version) {
  uint64_t s = 0, v = 0;
  return DecodeRevocable(stamp, &s, &v) && s == size && v == version;
}

bool IsRevocableStamp(std::string_view stamp) {
  uint64_t s = 0, v = 0;
  return DecodeRevocable(stamp, &s, &v);
}

std::string ServiceRecord::Encode() const {
  Encoder e;
  e.U8(1)
      .U32(rank)
      .U32(node_idx)
      .U64(incarnation)
      .Str(address)
      .Str(prod_path)
      .Str(hostname)
      .U64(started_ns);
  e.U32(pid);
  if (stopped_ns != 0) e.U64(stopped_ns);
  return e.Take();
}

bool ServiceRecord::Decode(const std::string& bytes, ServiceRecord* out) {
  Decoder d(bytes);
  if (d.U8() != 1) return false;
  ServiceRecord r;
  r.rank = d.U32();
  r.node_idx = d.U32();
  r.incarnation = d.U64();
  r.address = d.Str();
  r.prod_path = d.Str();
  r.hostname = d.Str();
  r.started_ns = d.U64();
  if (!d.failed() && !d.done()) r.pid = d.U32();         // absent in records of older services
  if (!d.failed() && !d.done()) r.stopped_ns = d.U64();  // present after a clean stop
  if (!d.done()) return false;
  *out = std::move(r);
  return true;
}

std::string EncodeReply(const Status& st, const std::string& body) {
  Encoder e;
  e.I32(st.code()).Str(st.message());
  std::string out = e.Take();
  out += body;
  return out;
}

bool DecodeReply(const std::string& payload, Status* st, std::string* body) {
  Decoder d(payload);
  const int32_t code = d.I32();
  std::string msg = d.Str();
  if (d.failed()) return false;
  const size_t header = 4 + 4 + msg.size();
  const dyad_rc_t rc = RcFromWire(code);
  if (rc != code)
    msg = "peer replied with unknown status code " + std::to_string(code) + ": " + msg;
  *st = Status(rc, std::move(msg));
  body->assign(payload, header, std::string::npos);
  return true;
}

void PublishRequest::EncodeTo(Encoder& e) const {
  e.Str(ns).Str(key).Str(upath).Str(prod_path).U64(size).U64(version).Bool(async);
  if (!adopted_copy.empty()) e.Str(adopted_copy);
}
bool PublishRequest::DecodeFrom(Decoder& d) {
  ns = d.Str();
  key = d.Str();
  upath = d.Str();
  prod_path = d.Str();
  size = d.U64();
  version = d.U64();
  async = d.Bool();
  if (!d.failed() && !d.done()) adopted_copy = d.Str(4096);
  return !d.failed();
}

void ConsumeRequest::EncodeTo(Encoder& e) const {
  e.Str(ns)
      .Str(key)
      .Str(upath)
      .Str(cons_path)
      .I64(timeout_ms)
      .Bool(shared_storage)
      .Bool(have_record);
  e.Str(have_record ? record.Encode() : std::string());
  e.Str(dtl_mode);
}
bool ConsumeRequest::DecodeFrom(Decoder& d) {
  ns = d.Str();
  key = d.Str();
  upath = d.Str();
  cons_path = d.Str();
  timeout_ms = d.I64();
  shared_storage = d.Bool();
  have_record = d.Bool();
  const std::string rec = d.Str();
  dtl_mode = d.Str();
  if (d.failed()) return false;
  if (have_record && !FileRecord::Decode(rec, &record)) return false;
  return true;
}

void ConsumeReply::EncodeTo(Encoder& e) const {
  e.Str(record.Encode()).Bool(transferred).Bool(joined).Bool(local).U64(bytes).U64(transfer_ns);
  e.Str(transport).Str(owner_address);
}
bool ConsumeReply::DecodeFrom(Decoder& d) {
  const std::string rec = d.Str();
  transferred = d.Bool();
  joined = d.Bool();
  local = d.Bool();
  bytes = d.U64();
  transfer_ns = d.U64();
  if (!d.failed() && !d.done()) {
    transport = d.Str(256);
    owner_address = d.Str(1024);
  }
  return !d.failed() && FileRecord::Decode(rec, &record);
}

void StatusReply::EncodeTo(Encoder& e) const {
  e.U32(static_cast<uint32_t>(counters.size()));
  for (const auto& [k, v] : counters) e.Str(k).U64(v);
  e.U32(static_cast<uint32_t>(info.size()));
  for (const auto& [k, v] : info) e.Str(k).Str(v);
  e.U32(static_cast<uint32_t>(transfers.size()));
  for (const TransferInfo& t : transfers) t.EncodeTo(e);
  e.U32(static_cast<uint32_t>(waits.size()));
  for (const WaitInfo& w : waits) w.EncodeTo(e);
}
bool StatusReply::DecodeFrom(Decoder& d) {
  uint32_t n = d.U32();
  for (uint32_t i = 0; i < n && !d.failed(); ++i) {
    std::string k = d.Str();
    counters[k] = d.U64();
  }
  n = d.U32();
  for (uint32_t i = 0; i < n && !d.failed(); ++i) {
    std::string k = d.Str();
    info[k] = d.Str();
  }
  if (d.failed() || d.done()) return !d.failed();  // a reply without the transfers section
  n = d.U32();
  for (uint32_t i = 0; i < n && !d.failed(); ++i) {
    TransferInfo t;
    if (t.DecodeFrom(d)) transfers.push_back(std::move(t));
  }
  if (d.failed() || d.done()) return !d.failed();  // a reply without the waits section
  n = d.U32();
  for (uint32_t i = 0; i < n && !d.failed(); ++i) {
    WaitInfo w;
    if (w.DecodeFrom(d)) waits.push_back(std::move(w));
  }
  return !d.failed();
}

void WaitInfo::EncodeTo(Encoder& e) const {
  e.Str(kind).Str(ns).Str(upath).Str(local).U32(pid).U64(age_ns);
}
bool WaitInfo::DecodeFrom(Decoder& d) {
  kind = d.Str(64);
  ns = d.Str();
  upath = d.Str();
  local = d.Str();
  pid = d.U32();
  age_ns = d.U64();
  return !d.failed();
}

void TransferInfo::EncodeTo(Encoder& e) const {
  e.Bool(outgoing)
      .Str(upath)
      .U32(peer_rank)
      .Str(transport)
      .U64(bytes_done)
      .U64(bytes_total)
      .U64(elapsed_ns);
}
bool TransferInfo::DecodeFrom(Decoder& d) {
  outgoing = d.Bool();
  upath = d.Str();
  peer_rank = d.U32();
  transport = d.Str(256);
  bytes_done = d.U64();
  bytes_total = d.U64();
  elapsed_ns = d.U64();
  return !d.failed();
}

void PeersRequest::EncodeTo(Encoder& e) const {
  e.Bool(probe).I64(probe_timeout_ms).U32(static_cast<uint32_t>(ranks.size()));
  for (uint32_t r : ranks) e.U32(r);
}
bool PeersRequest::DecodeFrom(Decoder& d) {
  probe = d.Bool();
  probe_timeout_ms = d.I64();
  const uint32_t n = d.U32();
  ranks.clear();
  for (uint32_t i = 0; i < n && !d.failed(); ++i) ranks.push_back(d.U32());
  return !d.failed();
}

const char* PeerStateName(PeerState s) {
  switch (s) {
    case PeerState::kUnknown:
      return "unknown";
    case PeerState::kAlive:
      return "alive";
    case PeerState::kDown:
      return "down";
    case PeerState::kOtherIdentity:
      return "stale";
    case PeerState::kRefused:
      return "refused";
    case PeerState::kStopped:
      return "stopped";
  }
  return "unknown";
}

void PeerInfo::EncodeTo(Encoder& e) const {
  e.Str(record.Encode())
      .U8(static_cast<uint8_t>(state))
      .U64(last_contact_ns)
      .U64(rtt_ns)
      .Str(detail);
}
bool PeerInfo::DecodeFrom(Decoder& d) {
  const std::string rec = d.Str();
  const uint8_t s = d.U8();
  last_contact_ns = d.U64();
  rtt_ns = d.U64();
  detail = d.Str();
  if (d.failed() || s > static_cast<uint8_t>(PeerState::kStopped)) return false;
  state = static_cast<PeerState>(s);
  return ServiceRecord::Decode(rec, &record);
}

void PeersReply::EncodeTo(Encoder& e) const {
  e.U32(static_cast<uint32_t>(peers.size()));
  for (const PeerInfo& p : peers) p.EncodeTo(e);
}
bool PeersReply::DecodeFrom(Decoder& d) {
  const uint32_t n = d.U32();
  peers.clear();
  for (uint32_t i = 0; i < n && !d.failed(); ++i) {
    PeerInfo p;
    if (!p.DecodeFrom(d)) return false;
    peers.push_back(std::move(p));
  }
  return !d.failed();
}

void SupersedeNotice::EncodeTo(Encoder& e) const {
  e.Str(ns).Str(key).Str(record.Encode()).Bool(forward);
}
bool SupersedeNotice::DecodeFrom(Decoder& d) {
  ns = d.Str();
  key = d.Str();
  const std::string rec = d.Str();
  forward = d.Bool();
  return !d.failed() && FileRecord::Decode(rec, &record);
}

void ConsumeBatchRequest::EncodeTo(Encoder& e) const {
  e.U32(static_cast<uint32_t>(items.size()));
  for (const ConsumeRequest& r : items) r.EncodeTo(e);
}
bool ConsumeBatchRequest::DecodeFrom(Decoder& d) {
  const uint32_t n = d.U32();
  if (d.failed() || n > kMaxBatchItems) return false;
  items.clear();
  for (uint32_t i = 0; i < n; ++i) {
    ConsumeRequest r;
    if (!r.DecodeFrom(d)) return false;
    items.push_back(std::move(r));
  }
  return !d.failed();
}

void ConsumeBatchReply::EncodeTo(Encoder& e) const {
  e.U32(static_cast<uint32_t>(results.size()));
  for (const ConsumeBatchResult& r : results) {
    e.I32(r.code).Str(r.message);
    if (r.code == DYAD_RC_OK) r.reply.EncodeTo(e);
  }
}
bool ConsumeBatchReply::DecodeFrom(Decoder& d) {
  const uint32_t n = d.U32();
  if (d.failed() || n > kMaxBatchItems) return false;
  results.clear();
  for (uint32_t i = 0; i < n; ++i) {
    ConsumeBatchResult r;
    r.code = d.I32();
    r.message = d.Str();
    if (d.failed()) return false;
    if (r.code == DYAD_RC_OK && !r.reply.DecodeFrom(d)) return false;
    results.push_back(std::move(r));
  }
  return !d.failed();
}

void KvsMultiGetRequest::EncodeTo(Encoder& e) const {
  e.Str(ns).U32(static_cast<uint32_t>(keys.size()));
  for (const std::string& k : keys) e.Str(k);
}
bool KvsMultiGetRequest::DecodeFrom(Decoder& d) {
  ns = d.Str();
  const uint32_t n = d.U32();
  if (d.failed() || n > kMaxMultiGetKeys) return false;
  keys.clear();
  keys.reserve(n);
  for (uint32_t i = 0; i < n && !d.failed(); ++i) keys.push_back(d.Str());
  return !d.failed();
}

void KvsWatchReply::EncodeTo(Encoder& e) const {
  e.U64(epoch).U64(last).Bool(resync).U32(static_cast<uint32_t>(changes.size()));
  for (const auto& [k, v] : changes) e.Str(k).Str(v);
}
bool KvsWatchReply::DecodeFrom(Decoder& d) {
  epoch = d.U64();
  last = d.U64();
  resync = d.Bool();
  const uint32_t n = d.U32();
  if (d.failed()) return false;
  changes.clear();
  for (uint32_t i = 0; i < n && !d.failed(); ++i) {
    std::string k = d.Str();
    std::string v = d.Str();
    changes.emplace_back(std::move(k), std::move(v));
  }
  return !d.failed();
}

void FetchBatchRequest::EncodeTo(Encoder& e) const {
  e.U64(max_inline).U32(static_cast<uint32_t>(items.size()));
  for (const FetchBatchItem& it : items) e.Str(it.upath).U64(it.expect_version);
}
bool FetchBatchRequest::DecodeFrom(Decoder& d) {
  max_inline = d.U64();
  const uint32_t n = d.U32();
  if (d.failed() || n > kMaxFetchBatchItems || max_inline > kMaxFetchBatchInline) return false;
  items.clear();
  for (uint32_t i = 0; i < n; ++i) {
    FetchBatchItem it;
    it.upath = d.Str();
    it.expect_version = d.U64();
    if (d.failed()) return false;
    items.push_back(std::move(it));
  }
  return true;
}

void FetchBatchPart::EncodeTo(Encoder& e) const { e.U64(version).U32(mode).Str(data); }
bool FetchBatchPart::DecodeFrom(Decoder& d) {
  version = d.U64();
  mode = d.U32();
  data = d.Str(kMaxFetchBatchInline);
  return !d.failed();
}

Status CallRpc(Channel& ch, MsgType type, const std::string& request, std::string* body,
               const Deadline& deadline) {
  DYAD_RETURN_IF_ERROR(ch.SendFrame(static_cast<uint16_t>(type), request, deadline));
  return ReceiveReply(ch, body, deadline);
}

Status ReceiveReply(Channel& ch, std::string* body, const Deadline& deadline) {
  uint16_t rtype = 0;
  std::string payload;
  DYAD_RETURN_IF_ERROR(ch.RecvFrame(&rtype, &payload, deadline));
  return ReplyOfFrame(ch, rtype, payload, body);
}

Status ReplyOfFrame(Channel& ch, uint16_t rtype, const std::string& payload, std::string* body) {
  if (rtype != static_cast<uint16_t>(MsgType::kReply)) {
    ch.MarkBroken();
    return Status(DYAD_RC_BADRPC,
                  std::string("expected a reply, got '") + MsgTypeName(rtype) + "'");
  }
  Status st;
  if (!DecodeReply(payload, &st, body)) {
    ch.MarkBroken();
    return Status(DYAD_RC_BADUNPACK, "malformed reply");
  }
  return st;
}

}  // namespace dyad
