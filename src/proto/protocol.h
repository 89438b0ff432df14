// protocol.h: every message exchanged by DYAD processes.
//
// Three links use these messages, all framed by Channel (common/net.h):
//   client  -> local service  (Unix socket; peer credentials checked)
//   service -> root service   (TCP; embedded metadata store operations)
//   service -> owner service  (TCP; file fetches)
// Each request frame has a MsgType; the answer is one kReply frame whose
// payload starts with a status code and message (EncodeReply), followed by the
// request-specific fields on success. A fetch reply is followed by the file
// bytes in the format of the chosen transport. TCP links start with the
// authentication handshake of common/auth.h.
//
// Encode*/Decode* functions are pure; Decode returns false on malformed input.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/wire.h"

namespace dyad {

// In a message struct, DYAD_FIELDS(a, b, ...) defines EncodeTo and
// DecodeFrom (false when malformed): the fields in the order listed, each
// by its type (std::string: Str, bool: Bool, uint32_t: U32, uint64_t: U64,
// int64_t: I64); another type does not compile.
#define DYAD_FIELDS(...)                                                    \
  void EncodeTo(Encoder& e) const { ::dyad::EncodeFields(e, __VA_ARGS__); } \
  bool DecodeFrom(Decoder& d) { return ::dyad::DecodeFields(d, __VA_ARGS__); }

inline void EncodeField(Encoder& e, const std::string& v) { e.Str(v); }
inline void EncodeField(Encoder& e, bool v) { e.Bool(v); }
inline void EncodeField(Encoder& e, uint32_t v) { e.U32(v); }
inline void EncodeField(Encoder& e, uint64_t v) { e.U64(v); }
inline void EncodeField(Encoder& e, int64_t v) { e.I64(v); }
inline void DecodeField(Decoder& d, std::string& v) { v = d.Str(); }
inline void DecodeField(Decoder& d, bool& v) { v = d.Bool(); }
inline void DecodeField(Decoder& d, uint32_t& v) { v = d.U32(); }
inline void DecodeField(Decoder& d, uint64_t& v) { v = d.U64(); }
inline void DecodeField(Decoder& d, int64_t& v) { v = d.I64(); }
template <typename... T>
void EncodeFields(Encoder& e, const T&... v) {
  (EncodeField(e, v), ...);
}
template <typename... T>
bool DecodeFields(Decoder& d, T&... v) {
  (DecodeField(d, v), ...);
  return !d.failed();
}

enum class MsgType : uint16_t {
  kReply = 1,
  // Authentication handshake (TCP links).
  kChallenge = 2,
  kAuthenticate = 3,
  // Client -> local service.
  kPublish = 10,
  kLocate = 11,
  kConsume = 12,
  kStatus = 13,
  kList = 14,
  kPing = 15,
  kRemove = 16,
  kPeers = 17,
  kPrefetch = 18,
  kConsumeBatch = 19,
  // Service -> root: embedded metadata store.
  kKvsPut = 30,
  kKvsGet = 31,
  kKvsWait = 32,
  kKvsRemove = 33,
  kKvsList = 34,
  kKvsWatch = 35,
  // Added after the first release: an older root refuses it (no route),
  // and clients then read key by key (EmbeddedKvs::MultiGet).
  kKvsMultiGet = 36,
  // Service -> owner service.
  kFetch = 50,
  // Owner -> requester: one chunk of file data on a protected session
  // (the tcp transport's sealed data path).
  kFileData = 51,
  // Service -> service: a newer version of a file superseded the one the
  // receiver holds or served (read-write ownership; service/versions.h).
  kSupersede = 52,
  // Service -> owner service: many small files in one request, answered by
  // one stream of replies (FetchBatchRequest).
  kFetchBatch = 53,
};

const char* MsgTypeName(uint16_t type);

// The value stored in the metadata store for one published file.
struct FileRecord {
  uint32_t owner_rank = 0;
  uint64_t owner_incarnation = 0;  // changes each time the owner service restarts
  uint64_t size = 0;
  uint64_t version = 0;       // modification time (ns) of the published file
  uint64_t published_ns = 0;  // wall clock at publication
  std::string upath;          // path relative to the managed directory
  // The owner's publication counter (per incarnation, from 1): with the
  // owner's rank and incarnation it names this version even when a rewrite
  // kept size and mtime (coarse clocks, touch). 0 in records of older
  // DYADs, which encode without it.
  uint64_t seq = 0;

  std::string Encode() const;
  static bool Decode(const std::string& bytes, FileRecord* out);
};

// Copies placed by a service carry their version in this extended
// attribute (where the file system has user attributes), so a client that
// knows the record (dyad_consume_w_metadata) can tell a current copy
// without asking the service: StampNames(attribute, record).
//
// A `revocable` stamp ends with one more byte: the placing service follows
// the record's namespace and withdraws the stamp as soon as the copy is no
// longer current, so a client may take such a copy as complete and current
// from its stamp alone (StampDescribes), also in a directory producers
// write to.
inline constexpr const char* kVersionXattr = "user.dyad.version";
std::string VersionStamp(const FileRecord& rec, bool revocable = false);
// True when `stamp` (either form) is the stamp of exactly `rec`'s version.
bool StampNames(std::string_view stamp, const FileRecord& rec);
// True when `stamp` is a revocable stamp of a copy of `size` bytes and
// content time `version`: the file still is the copy a service placed (a
// local write since then changed its size or mtime) and that service has
// not withdrawn it.
bool StampDescribes(std::string_view stamp, uint64_t size, uint64_t version);
// True when `stamp` is a revocable stamp (of any copy).
bool IsRevocableStamp(std::string_view stamp);

// Where a service can be reached; stored in the metadata store under
// namespace kMembersNamespace, key "rank.<N>".
struct ServiceRecord {
  uint32_t rank = 0;
  uint32_t node_idx = 0;
  uint64_t incarnation = 0;
  std::string address;    // HOST:PORT other services connect to
  std::string prod_path;  // producer-managed directory it serves ("" if none)
  std::string hostname;
  uint64_t started_ns = 0;
  uint32_t pid = 0;  // process id on `hostname` (0: unknown, an older record)
  // Wall clock of a clean stop (SIGTERM/SIGINT): the service left on
  // purpose. 0 while it runs, or when it crashed. Appended only when set.
  uint64_t stopped_ns = 0;

  std::string Encode() const;
  static bool Decode(const std::string& bytes, ServiceRecord* out);
};

inline const char* kMembersNamespace = "dyad.services";
std::string MemberKey(uint32_t rank);

// Encodes a reply: header followed by `body` (already-encoded fields).
std::string EncodeReply(const Status& st, const std::string& body = {});
// Splits a reply into its status and the remaining body bytes.
bool DecodeReply(const std::string& payload, Status* st, std::string* body);

// --- client -> local service -------------------------------------------

struct PublishRequest {
  std::string ns;
  std::string key;  // gen_path_key(upath)
  std::string upath;
  std::string prod_path;  // client's producer-managed directory (absolute, canonical)
  uint64_t size = 0;
  uint64_t version = 0;
  bool async = false;  // DYAD_ASYNC_PUBLISH: reply before the store confirms
  // Read-write ownership: the consumer copy (absolute, canonical) this
  // publication was made from; it becomes a copy of the new version.
  // Appended, and only when set.
  std::string adopted_copy;
  void EncodeTo(Encoder& e) const;
  bool DecodeFrom(Decoder& d);
};

struct LocateRequest {
  std::string ns;
  std::string key;
  bool wait = false;
  int64_t timeout_ms = -1;  // < 0: no limit
  DYAD_FIELDS(ns, key, wait, timeout_ms)
};
// Locate reply body: FileRecord::Encode() as one string field.

struct ConsumeRequest {
  std::string ns;
  std::string key;
  std::string upath;
  std::string cons_path;  // client's consumer-managed directory (absolute, canonical)
  int64_t timeout_ms = -1;
  bool shared_storage = false;
  bool have_record = false;  // consume_w_metadata: skip the lookup
  FileRecord record;
  std::string dtl_mode;  // requested transport ("" = service default)
  void EncodeTo(Encoder& e) const;
  bool DecodeFrom(Decoder& d);
};

struct ConsumeReply {
  FileRecord record;
  bool transferred = false;  // this request caused a transfer
  bool joined = false;       // waited for a transfer another request started
  bool local = false;        // no transfer needed (same directory / shared storage)
  uint64_t bytes = 0;
  uint64_t transfer_ns = 0;
  // What moved the file, for `dyad consume -v`: the transport's name ("tcp",
  // "ucx", "local"; "" when nothing moved) and the owner service's address
  // ("" when this service owns the file). Optional trailing fields: a reply
  // without them decodes with both empty.
  std::string transport;
  std::string owner_address;
  void EncodeTo(Encoder& e) const;
  bool DecodeFrom(Decoder& d);
};

struct ListRequest {
  std::string ns;
  std::string path_prefix;
  uint32_t limit = 0;  // 0: no limit
  DYAD_FIELDS(ns, path_prefix, limit)
};
// List reply body: u32 count, then count x (key, FileRecord::Encode()).

struct RemoveRequest {
  std::string ns;
  std::string key;
  DYAD_FIELDS(ns, key)
};

// One transfer in flight, as `dyad status` lists it.
struct TransferInfo {
  static constexpr uint64_t kUnknownBytes = ~0ull;
  bool outgoing = false;  // true: this service sends (owner side)
  std::string upath;
  uint32_t peer_rank = 0;  // the other end
  std::string transport;
  uint64_t bytes_done = kUnknownBytes;  // kUnknownBytes when the transport cannot tell
  uint64_t bytes_total = 0;
  uint64_t elapsed_ns = 0;
  void EncodeTo(Encoder& e) const;
  bool DecodeFrom(Decoder& d);
};

// Status reply body: u32 count, then count x (name, u64 value), then the
// service's identity strings (u32 count, count x (name, value)), then
// (optional, absent in older replies) u32 count x TransferInfo in flight.
// A request of a local client waiting for a publication (`dyad status`).
struct WaitInfo {
  std::string kind;     // "consume" or "locate"
  std::string ns;       // the metadata namespace
  std::string upath;    // the file (a locate: its key)
  std::string local;    // a file by that name this node has but never published ("": none)
  uint32_t pid = 0;     // the client process (0: unknown)
  uint64_t age_ns = 0;  // how long it has waited
  void EncodeTo(Encoder& e) const;
  bool DecodeFrom(Decoder& d);
};

struct StatusReply {
  std::map<std::string, uint64_t> counters;
  std::map<std::string, std::string> info;
  std::vector<TransferInfo> transfers;
  // Optional trailing section: a reply of an older service decodes without.
  std::vector<WaitInfo> waits;
  void EncodeTo(Encoder& e) const;
  bool DecodeFrom(Decoder& d);
};

// kPeers: the services registered in the metadata store, each probed with
// an authenticated ping bounded by `probe_timeout_ms` when `probe` is set.
// `ranks` limits the answer to those ranks (empty: all).
struct PeersRequest {
  bool probe = true;
  int64_t probe_timeout_ms = 2000;
  std::vector<uint32_t> ranks;
  void EncodeTo(Encoder& e) const;
  bool DecodeFrom(Decoder& d);
};

enum class PeerState : uint8_t {
  kUnknown = 0,        // not probed
  kAlive = 1,          // answered as the registered rank and incarnation
  kDown = 2,           // did not answer within the bound
  kOtherIdentity = 3,  // its address answers as another service (stale record)
  kRefused = 4,        // refused our cluster credential
  kStopped = 5,        // stopped cleanly (its record says so); not probed
};
const char* PeerStateName(PeerState s);

struct PeerInfo {
  ServiceRecord record;
  PeerState state = PeerState::kUnknown;
  uint64_t last_contact_ns = 0;  // wall clock of the last authenticated exchange (0: never)
  uint64_t rtt_ns = 0;           // round trip of the probe
  std::string detail;            // why it is not alive, or "this service"
  void EncodeTo(Encoder& e) const;
  bool DecodeFrom(Decoder& d);
};

struct PeersReply {
  std::vector<PeerInfo> peers;  // sorted by rank
  void EncodeTo(Encoder& e) const;
  bool DecodeFrom(Decoder& d);
};

// Declares (or, with `cancel`, withdraws) what a consumer will read: the
// service pulls every matching publication of `ns` into `cons_path` as it
// appears (service/prefetch.h). `pattern` is a path prefix, or a glob when
// it holds '*', '?' or '['.
struct PrefetchRequest {
  std::string ns;
  std::string pattern;
  std::string cons_path;  // absolute, canonical
  std::string dtl_mode;   // "" = service default
  bool cancel = false;
  DYAD_FIELDS(ns, pattern, cons_path, dtl_mode, cancel)
};
// Prefetch reply body: u32 files already published that matched.

// Many consumes in one request, placed concurrently by the service. The
// reply carries one result per item, in order: a failed item does not
// fail the others.
struct ConsumeBatchRequest {
  std::vector<ConsumeRequest> items;
  void EncodeTo(Encoder& e) const;
  bool DecodeFrom(Decoder& d);
};
struct ConsumeBatchResult {
  int32_t code = DYAD_RC_OK;
  std::string message;
  ConsumeReply reply;  // when code is DYAD_RC_OK
};
struct ConsumeBatchReply {
  std::vector<ConsumeBatchResult> results;
  void EncodeTo(Encoder& e) const;
  bool DecodeFrom(Decoder& d);
};
// Most items one batch may carry.
inline constexpr uint32_t kMaxBatchItems = 65536;

// --- service -> root (embedded store) ------------------------------------

struct KvsRequest {
  std::string ns;
  std::string key;         // key, or key prefix for kKvsList
  std::string value;       // kKvsPut
  int64_t timeout_ms = 0;  // kKvsWait: server-side bound of this wait
  uint32_t limit = 0;      // kKvsList
  DYAD_FIELDS(ns, key, value, timeout_ms, limit)
};
// Replies: kKvsGet/kKvsWait body: Bool found, Str value.
//          kKvsList body: u32 count, count x (Str key, Str value).

// kKvsMultiGet: the values of many keys of one namespace. Reply body: u32
// answered, then answered x (Bool found, Str value) for the first
// `answered` keys, in order: the root answers fewer than asked (at least
// one) when the values would not fit in one frame, and the client asks
// again for the rest.
struct KvsMultiGetRequest {
  std::string ns;
  std::vector<std::string> keys;
  void EncodeTo(Encoder& e) const;
  bool DecodeFrom(Decoder& d);
};
// Most keys one kKvsMultiGet may name.
inline constexpr uint32_t kMaxMultiGetKeys = 4096;

// A long poll of a namespace's change feed (Kvs::Watch on the embedded
// store): the puts after position `after` of feed `epoch`, waiting up to
// `timeout_ms` for the first. epoch 0 (or a feed the root no longer has)
// answers at once with the current position and `resync`.
struct KvsWatchRequest {
  std::string ns;
  uint64_t epoch = 0;
  uint64_t after = 0;
  int64_t timeout_ms = 0;
  uint32_t max_entries = 0;  // 0: the server's bound
  DYAD_FIELDS(ns, epoch, after, timeout_ms, max_entries)
};
struct KvsWatchReply {
  uint64_t epoch = 0;
  uint64_t last = 0;    // position of the last change returned (or the head)
  bool resync = false;  // changes were missed: list the namespace again
  std::vector<std::pair<std::string, std::string>> changes;  // key, value
  void EncodeTo(Encoder& e) const;
  bool DecodeFrom(Decoder& d);
};

// --- service -> owner service ----------------------------------------------

// kSupersede: `record` (of `ns`, `key`) replaced earlier versions of its
// file. `forward`: the receiver was the previous owner and passes the notice
// on to the services that fetched the file from it. Reply: empty body.
struct SupersedeNotice {
  std::string ns;
  std::string key;
  FileRecord record;
  bool forward = false;
  void EncodeTo(Encoder& e) const;
  bool DecodeFrom(Decoder& d);
};

struct FetchRequest {
  std::string upath;
  std::string transport;        // "tcp", "local", ...
  std::string transport_args;   // opaque, transport-specific
  uint64_t expect_version = 0;  // 0: any
  DYAD_FIELDS(upath, transport, transport_args, expect_version)
};

struct FetchReply {
  uint64_t size = 0;
  uint64_t version = 0;
  std::string transport_args;  // opaque, transport-specific (e.g. a local path)
  uint32_t mode = 0644;        // the file's permission bits, kept by the copy
  DYAD_FIELDS(size, version, transport_args, mode)
};

// After the bytes of a fetch, the owner sends one more kReply: OK when the
// file was the same (size and version) at the end of the transfer as at its
// start, else DYAD_RC_STALE; the requester places nothing before it.

// kFetchBatch: many small files from one owner in one request, for the
// prefetcher. The owner answers with one kReply (OK with a u32 count equal
// to the number of items, or an error for the whole batch), then one kReply
// per item, in order: OK with a FetchBatchPart (the file's bytes inline,
// read under the producer's shared lock and checked unchanged after the
// read), or that item's error. An item larger than `max_inline` gets
// DYAD_RC_NOTSUP: the requester fetches it alone with kFetch. An owner
// without kFetchBatch (an older DYAD) answers DYAD_RC_BADREQUEST.
struct FetchBatchItem {
  std::string upath;
  uint64_t expect_version = 0;  // 0: any
};
struct FetchBatchRequest {
  uint64_t max_inline = 0;  // largest file sent inline
  std::vector<FetchBatchItem> items;
  void EncodeTo(Encoder& e) const;
  bool DecodeFrom(Decoder& d);
};
struct FetchBatchPart {
  uint64_t version = 0;
  uint32_t mode = 0644;
  std::string data;  // the whole file
  void EncodeTo(Encoder& e) const;
  bool DecodeFrom(Decoder& d);
};
// Most items in one kFetchBatch, and the largest inline file either side
// accepts (so one part always fits in a frame).
inline constexpr uint32_t kMaxFetchBatchItems = 1024;
inline constexpr uint64_t kMaxFetchBatchInline = 1u << 20;

// Sends `request` of `type` and waits for the reply; on success `body` holds
// the reply body. Transport and decoding failures mark `ch` broken.
class Channel;
class Deadline;
Status CallRpc(Channel& ch, MsgType type, const std::string& request, std::string* body,
               const Deadline& deadline);
// Waits for one kReply frame: its status, and on success its body.
Status ReceiveReply(Channel& ch, std::string* body, const Deadline& deadline);
// The status (and on success the body) of a received frame that must be a
// kReply; anything else marks `ch` broken (for callers that assemble the
// frame without waiting, Channel::RecvFrameNow).
Status ReplyOfFrame(Channel& ch, uint16_t type, const std::string& payload, std::string* body);

}  // namespace dyad
