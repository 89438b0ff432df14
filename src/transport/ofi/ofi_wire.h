// ofi_wire.h: what the "ofi" transport says on the fetch session.
//
//   FetchRequest.transport_args (requester, PrepareRequest):
//     u8 version, str provider, str host, u64 slot bytes, u32 slots
//   FetchReply.transport_args (owner, ReplyArgs):
//     u8 version, u8 kind;
//     kind inline: str data (the whole file, at most kInlineMaxBytes)
//     kind rma:    str provider, str host, str endpoint name (any length up
//                  to 64 KiB), u64 instance, u64 slot bytes, u32 slots
//   frames after the reply (types outside proto MsgType):
//     kReady  requester -> owner  u64 0 (it holds its receive buffer)
//     kChunk  owner -> requester  u64 index, u64 length, u64 remote address, u64 key
//     kCredit requester -> owner  u64 index (its slot may be refilled)
//     kDone   requester -> owner  u64 chunk count (every chunk landed)
//     kError  either way          i32 dyad_rc_t, str message
// `host` is SameHostId() (transport/host_id.h: boot id, IPC, pid and mount
// namespaces); shm works only between equal ones.
// Every decoder bounds what it accepts; a malformed message is
// DYAD_RC_BADUNPACK.
#pragma once

#include <cstdint>
#include <string>

#include "common/net.h"
#include "common/status.h"
#include "common/time.h"

namespace dyad {

constexpr uint8_t kOfiWireVersion = 1;
constexpr uint16_t kOfiChunkFrame = 0x4F01;
constexpr uint16_t kOfiCreditFrame = 0x4F02;
constexpr uint16_t kOfiDoneFrame = 0x4F03;
constexpr uint16_t kOfiErrorFrame = 0x4F04;
constexpr uint16_t kOfiReadyFrame = 0x4F05;

// Files up to this size travel inside the FetchReply: for them an RMA
// round trip costs more than the copy saves.
constexpr uint64_t kOfiInlineMaxBytes = 64u << 10;
// Bounds on what a peer may announce.
constexpr uint64_t kOfiMaxSlotBytes = 1ull << 31;
constexpr uint32_t kOfiMaxSlots = 64;
constexpr size_t kOfiMaxAddressBytes = 64u << 10;

struct OfiRequestArgs {
  std::string provider;
  std::string host;
  uint64_t slot_bytes = 0;
  uint32_t slots = 0;
  std::string Encode() const;
  Status Decode(const std::string& bytes);
};

struct OfiReplyArgs {
  bool inline_data = false;
  std::string data;  // inline: the file
  std::string provider;
  std::string host;
  std::string address;
  uint64_t instance = 0;
  uint64_t slot_bytes = 0;
  uint32_t slots = 0;
  std::string Encode() const;
  Status Decode(const std::string& bytes);
};

struct OfiChunk {
  uint64_t index = 0;
  uint64_t length = 0;
  uint64_t remote_addr = 0;
  uint64_t key = 0;
  std::string Encode() const;
  bool Decode(const std::string& payload);
};

// Chunk geometry both ends derive from the two sides' slots (each side's
// slot is at most one message of its provider): chunk size, chunks in
// flight (slots used) and chunk count of a `size`-byte file.
struct OfiGeometry {
  uint64_t chunk = 0;
  uint32_t window = 0;
  uint64_t chunks = 0;
};
Result<OfiGeometry> OfiGeometryFor(uint64_t size, uint64_t owner_slot, uint32_t owner_slots,
                                   uint64_t requester_slot, uint32_t requester_slots);

// The peer's kError frame as a Status ("owner failed: ...").
Status OfiDecodeError(const std::string& payload, const char* who);
// Sends a frame carrying one u64.
Status OfiSendU64(Channel& ch, uint16_t type, uint64_t v, Deadline deadline);
// Checks a received frame: it must be `type` carrying one u64 equal to
// `want` (a kError frame gives the peer's error).
Status OfiCheckU64(uint16_t got_type, const std::string& payload, uint16_t type, uint64_t want,
                   const char* who);

}  // namespace dyad
