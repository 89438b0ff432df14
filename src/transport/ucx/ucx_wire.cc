#include "transport/ucx/ucx_wire.h"

#include <sys/socket.h>

#include <atomic>
#include <random>

#include "common/wire.h"

namespace dyad::ucx {
namespace {

// Version byte of the transport arguments and of kOffer.
constexpr uint8_t kArgsVersion = 3;
// Bounds on what a peer may send: a worker address, a host identity and a
// packed remote key; a slot larger than kMaxSlotBytes or more than
// kMaxSlots of them is a bug or a hostile peer.
constexpr size_t kMaxAddressBytes = 64u << 10;
constexpr size_t kMaxHostIdBytes = 4096;
constexpr size_t kMaxRkeyBytes = 4u << 10;
constexpr uint64_t kMaxSlotBytes = 1ull << 32;
constexpr uint64_t kMaxSlots = 1024;
// See ChunkTag.
constexpr int kIndexBits = 24;
constexpr uint64_t kTransferIdMask = (uint64_t{1} << (64 - kIndexBits)) - 1;

}  // namespace

std::string EncodeRequestArgs(const RequestArgs& args) {
  Encoder e;
  e.U8(kArgsVersion).Str(args.address).Str(args.host_id);
  return e.Take();
}

Result<RequestArgs> DecodeRequestArgs(const std::string& bytes) {
  Decoder d(bytes);
  const uint8_t version = d.U8();
  RequestArgs args;
  args.address = d.Str(kMaxAddressBytes);
  args.host_id = d.Str(kMaxHostIdBytes);
  if (!d.done() || version != kArgsVersion || args.address.empty())
    return Status(DYAD_RC_BADREQUEST, "bad ucx transport arguments");
  return args;
}

std::string EncodeOffer(const Offer& offer) {
  Encoder e;
  e.U8(kArgsVersion)
      .U64(offer.transfer_id)
      .U64(offer.slot_bytes)
      .U64(offer.slots)
      .U64(offer.base)
      .Str(offer.rkey);
  return e.Take();
}

Result<Offer> DecodeOffer(const std::string& payload) {
  Decoder d(payload);
  const uint8_t version = d.U8();
  Offer o;
  o.transfer_id = d.U64();
  o.slot_bytes = d.U64();
  o.slots = d.U64();
  o.base = d.U64();
  o.rkey = d.Str(kMaxRkeyBytes);
  if (!d.done() || version != kArgsVersion || o.slot_bytes == 0 || o.slot_bytes > kMaxSlotBytes ||
      o.slots == 0 || o.slots > kMaxSlots || o.transfer_id > kTransferIdMask)
    return Status(DYAD_RC_BADUNPACK, "bad buffer offer");
  return o;
}

std::string EncodeCredit(uint64_t index) {
  Encoder e;
  e.U64(index);
  return e.Take();
}

std::string EncodeChunk(uint64_t index, uint64_t length) {
  Encoder e;
  e.U64(index).U64(length);
  return e.Take();
}

Result<uint64_t> DecodeCredit(const std::string& payload) {
  Decoder d(payload);
  const uint64_t index = d.U64();
  if (!d.done()) return Status(DYAD_RC_BADUNPACK, "malformed credit");
  return index;
}

Status DecodeChunk(const std::string& payload, uint64_t* index, uint64_t* length) {
  Decoder d(payload);
  const uint64_t i = d.U64();
  const uint64_t len = d.U64();
  if (!d.done()) return Status(DYAD_RC_BADUNPACK, "malformed chunk announcement");
  *index = i;
  *length = len;
  return Status::OK();
}

Status DecodeErrorFrame(const std::string& payload, const char* who) {
  Decoder d(payload);
  const int32_t code = d.I32();
  std::string msg = d.Str();
  if (!d.done() || code == DYAD_RC_OK)
    return Status(DYAD_RC_BADUNPACK, std::string("malformed error frame from ") + who);
  return Status(static_cast<dyad_rc_t>(code), std::string(who) + " failed: " + msg);
}

uint64_t ChunkTag(uint64_t transfer_id, uint64_t index) {
  return (transfer_id << kIndexBits) | (index & ((uint64_t{1} << kIndexBits) - 1));
}

uint64_t NextTransferId() {
  static std::atomic<uint64_t> next{[] {
    std::random_device rd;
    return (uint64_t{rd()} << 32) ^ rd();
  }()};
  return next.fetch_add(1) & kTransferIdMask;
}

}  // namespace dyad::ucx
