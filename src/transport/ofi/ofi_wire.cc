#include "transport/ofi/ofi_wire.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "common/wire.h"

namespace dyad {
namespace {

constexpr uint8_t kKindInline = 0;
constexpr uint8_t kKindRma = 1;
constexpr size_t kMaxNameBytes = 256;
constexpr size_t kMaxHostBytes = 1024;

Status Malformed(const char* what) {
  return Status(DYAD_RC_BADUNPACK, std::string("malformed ofi ") + what);
}

bool SlotsValid(uint64_t slot_bytes, uint32_t slots) {
  return slot_bytes > 0 && slot_bytes <= kOfiMaxSlotBytes && slots > 0 && slots <= kOfiMaxSlots;
}

}  // namespace

std::string OfiRequestArgs::Encode() const {
  Encoder e;
  e.U8(kOfiWireVersion).Str(provider).Str(host).U64(slot_bytes).U32(slots);
  return e.Take();
}

Status OfiRequestArgs::Decode(const std::string& bytes) {
  Decoder d(bytes);
  const uint8_t version = d.U8();
  provider = d.Str(kMaxNameBytes);
  host = d.Str(kMaxHostBytes);
  slot_bytes = d.U64();
  slots = d.U32();
  if (!d.done() || version != kOfiWireVersion || provider.empty() || !SlotsValid(slot_bytes, slots))
    return Malformed("transport arguments in the fetch request");
  return Status::OK();
}

std::string OfiReplyArgs::Encode() const {
  Encoder e;
  e.U8(kOfiWireVersion);
  if (inline_data) {
    e.U8(kKindInline).Str(data);
  } else {
    e.U8(kKindRma).Str(provider).Str(host).Str(address).U64(instance).U64(slot_bytes).U32(slots);
  }
  return e.Take();
}

Status OfiReplyArgs::Decode(const std::string& bytes) {
  Decoder d(bytes);
  const uint8_t version = d.U8();
  const uint8_t kind = d.U8();
  if (d.failed() || version != kOfiWireVersion) return Malformed("reply arguments");
  inline_data = kind == kKindInline;
  if (inline_data) {
    data = d.Str(kOfiInlineMaxBytes);
    if (!d.done()) return Malformed("inline reply");
    return Status::OK();
  }
  provider = d.Str(kMaxNameBytes);
  host = d.Str(kMaxHostBytes);
  address = d.Str(kOfiMaxAddressBytes);
  instance = d.U64();
  slot_bytes = d.U64();
  slots = d.U32();
  if (kind != kKindRma || !d.done() || provider.empty() || address.empty() ||
      !SlotsValid(slot_bytes, slots))
    return Malformed("reply arguments");
  return Status::OK();
}

std::string OfiChunk::Encode() const {
  Encoder e;
  e.U64(index).U64(length).U64(remote_addr).U64(key);
  return e.Take();
}

bool OfiChunk::Decode(const std::string& payload) {
  Decoder d(payload);
  index = d.U64();
  length = d.U64();
  remote_addr = d.U64();
  key = d.U64();
  return d.done();
}

Result<OfiGeometry> OfiGeometryFor(uint64_t size, uint64_t owner_slot, uint32_t owner_slots,
                                   uint64_t requester_slot, uint32_t requester_slots) {
  OfiGeometry g;
  g.chunk = std::min(owner_slot, requester_slot);
  g.window = std::min(owner_slots, requester_slots);
  if (g.chunk == 0 || g.window == 0)
    return Status(DYAD_RC_BADUNPACK, "ofi: empty slots in the transfer arguments");
  g.chunks = size / g.chunk + (size % g.chunk != 0 ? 1 : 0);
  return g;
}

Status OfiDecodeError(const std::string& payload, const char* who) {
  Decoder d(payload);
  const int32_t code = d.I32();
  const std::string msg = d.Str();
  if (!d.done() || code == DYAD_RC_OK)
    return Status(DYAD_RC_BADUNPACK, std::string("malformed error frame from the ") + who);
  return Status(static_cast<dyad_rc_t>(code), std::string(who) + " failed: " + msg);
}

Status OfiSendU64(Channel& ch, uint16_t type, uint64_t v, Deadline deadline) {
  Encoder e;
  e.U64(v);
  return ch.SendFrame(type, e.data(), deadline);
}

Status OfiCheckU64(uint16_t got_type, const std::string& payload, uint16_t type, uint64_t want,
                   const char* who) {
  if (got_type == kOfiErrorFrame) return OfiDecodeError(payload, who);
  Decoder d(payload);
  const uint64_t v = d.U64();
  if (got_type != type || !d.done() || v != want) {
    const char* name = type == kOfiCreditFrame ? "credit "
                       : type == kOfiDoneFrame ? "done "
                                               : "ready ";
    return Status(DYAD_RC_BADUNPACK, std::string("unexpected frame from the ") + who + " (wanted " +
                                         name + std::to_string(want) + ")");
  }
  return Status::OK();
}

}  // namespace dyad
