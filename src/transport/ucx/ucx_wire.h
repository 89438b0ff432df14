// ucx_wire.h: what the UCX transport says on the fetch session and how it
// tags its messages: the requester's transport arguments, the frames private
// to this transport (outside proto::MsgType), chunk tags, and how a failed
// session is ended. The exchange itself is in docs/ucx.md, "How a fetch
// moves". Every decoder treats its input as untrusted. Stateless.
#pragma once

#include <cstdint>
#include <string>

#include "common/net.h"
#include "common/status.h"
#include "common/time.h"

namespace dyad::ucx {

constexpr uint16_t kOfferFrame = 0x5501;   // requester: its receive buffer
constexpr uint16_t kChunkFrame = 0x5502;   // owner, direct path: chunk i is in place
constexpr uint16_t kCreditFrame = 0x5503;  // requester: slot of chunk i is free
constexpr uint16_t kErrorFrame = 0x5504;   // either side: why it stops
constexpr uint16_t kInlineFrame = 0x5505;  // owner: the whole (small) file

// Files up to this size travel inline in one kInlineFrame on the session:
// for them the offer round trip costs more than the copy saves.
constexpr uint64_t kInlineMaxBytes = 64u << 10;

// PrepareRequest's transport_args: the requester's worker address and host
// identity (see SameHostId, transport/host_id.h).
struct RequestArgs {
  std::string address;
  std::string host_id;
};
std::string EncodeRequestArgs(const RequestArgs& args);
// Fails with DYAD_RC_BADREQUEST.
Result<RequestArgs> DecodeRequestArgs(const std::string& bytes);

// kOffer: the tags (transfer id) and the slots of the requester's receive
// buffer; its address and packed remote key ("" unless an owner on the
// same host may map it).
struct Offer {
  uint64_t transfer_id = 0;
  uint64_t slot_bytes = 0;
  uint64_t slots = 0;
  uint64_t base = 0;
  std::string rkey;
};
std::string EncodeOffer(const Offer& offer);
// Fails with DYAD_RC_BADUNPACK (bounds on slot size and count included).
Result<Offer> DecodeOffer(const std::string& payload);

// kCredit {index} and kChunk {index, length}.
std::string EncodeCredit(uint64_t index);
std::string EncodeChunk(uint64_t index, uint64_t length);
// Fails with DYAD_RC_BADUNPACK.
Result<uint64_t> DecodeCredit(const std::string& payload);
Status DecodeChunk(const std::string& payload, uint64_t* index, uint64_t* length);

// The peer's kError {code, message} as a Status naming `who` failed.
Status DecodeErrorFrame(const std::string& payload, const char* who);

// A chunk's tag: the requester's transfer id (40 bits) and the chunk index
// modulo 2^24 (at most kSlots chunks are outstanding, so indexes cannot
// collide). Ids are unique per process and random across processes, so a
// late message of a failed transfer never matches a later receive.
uint64_t ChunkTag(uint64_t transfer_id, uint64_t index);
uint64_t NextTransferId();

}  // namespace dyad::ucx
