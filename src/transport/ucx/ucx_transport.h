// ucx_transport.h: the "ucx" transport (DTL mode UCX): file bytes move as
// UCX tagged messages straight into receives the requester posted on its
// registered memory, or, between services on one host, are written by the
// owner straight into the requester's registered shared memory; the fetch
// session carries only small control frames.
//
// Protocol (after the FetchReply; both ends know `size`, nothing happens for
// size 0, and files of at most kInlineMaxBytes are sent inline in a single
// kInline frame instead):
//   requester PrepareRequest: transport_args = its UCX worker address.
//   requester Pull:   takes a buffer of kSlots slots from its registered
//                     receive pool, posts a tagged receive for chunk i into
//                     slot i for i < kSlots, then sends kOffer {transfer id,
//                     slot size, slot count}. A chunk's tag is the transfer
//                     id and its index.
//   owner Push:       gets a cached endpoint to that worker address and for
//                     each chunk i: waits for kCredit {i - slots} when
//                     i >= slots, waits until its own send slot i % kSlots
//                     is free (the send from it completed), preads the
//                     chunk into it and ucp_tag_send_nbx()es it. Up to
//                     kSlots sends are in flight, each tracked by its own
//                     request.
//   requester:        waits for chunk i's receive (watching the session for
//                     an error or a hang-up meanwhile), writes the slot to
//                     the sink and, if chunk i + slots exists, posts its
//                     receive into the slot and sends kCredit {i}.
// The chunk size is the smaller of the two sides' slot sizes; the requester
// learns it from the length of chunk 0. Credits are exactly those the owner
// waits for, so the exchange ends when the last chunk is written and a
// session stays reusable after a good transfer. Without native RMA
// (UCX_TLS without rc/dc/sm/...), messages are forced eager
// (RNDV_THRESH=inf): the receiver then never answers the sender at the UCX
// level, so a sender that dies mid-message cannot make UCX 1.13 abort the
// receiver (it does when acknowledging an emulated put to a dead peer).
// Same host (the requester's PrepareRequest also names its host: boot id
// and IPC/pid/mount namespaces) and UCX has shared memory: the requester's
// receive buffers were allocated by UCX from shared memory, and its offer
// carries the buffer's address and packed remote key. The owner maps the
// buffer (ucp_ep_rkey_unpack + ucp_rkey_ptr on an endpoint whose lanes are
// all shared memory) and preads chunk i straight into slot i % slots, then
// announces it with kChunk {i, length} on the session; the requester
// writes the slot out and returns it with kCredit {i} as above. No UCX
// message moves (the first kChunk tells the requester, which cancels its
// receives). When the mapping is impossible the owner falls back to tagged
// messages; $DYAD_UCX_SHM=off forces that.
// Any failure sends kError when possible, cancels the outstanding
// requests, marks the session broken and shuts it down, so the peer fails
// at once instead of at its idle bound; a peer that dies shows up as
// CONNLOST on the session or as a UCX error on the endpoint (error handling
// mode PEER), never as a hang: every wait is bounded by options.idle_ms.
//
// Resources: one UCX context and worker per transport instance (one per
// service), created by Warm() (the service calls it at start) or on first
// use, driven by one progress thread that sleeps
// on the worker's event fd (a thread waiting for a transfer drives the worker
// itself while it moves). Transfer memory is registered once: pools of at
// most $DYAD_UCX_POOL_BUFFERS (default 4) receive and as many send buffers
// of 2 x options.chunk_size bytes (kSlots slots) each, mapped lazily and
// reused. Receive and send pools are separate so that owners never wait for
// buffers held by requesters (which could otherwise wait on each other
// across services).
// Endpoints are cached by the peer's worker address bytes (a restarted peer
// has a new address, hence a new entry) and evicted on any error.
//
// Threading: thread-safe; one instance is shared by every concurrent
// transfer of a service. All UCX calls are serialized by one mutex (the
// worker runs in UCS_THREAD_MODE_SERIALIZED); sessions are used only by the
// calling thread. MemoryRegions returned by Register() must be destroyed
// before the transport.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "transport/transport.h"

namespace dyad {

class UcxTransport final : public Transport {
 public:
  explicit UcxTransport(const TransportOptions& options);
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  std::string name() const override { return "ucx"; }

  Result<std::string> PrepareRequest() override;
  Status Warm() override;
  std::string Details() const override;
  Status Push(Channel& session, const FileSource& src, const std::string& request_args,
              TransferStats* stats) override;
  Status Pull(Channel& session, uint64_t size, const std::string& reply_args, int sink_fd,
              TransferStats* stats) override;
  Result<std::unique_ptr<MemoryRegion>> Register(void* addr, size_t len) override;

  // Session frame types private to this transport (outside proto MsgType).
  static constexpr uint16_t kOfferFrame = 0x5501;
  static constexpr uint16_t kChunkFrame = 0x5502;
  static constexpr uint16_t kCreditFrame = 0x5503;
  static constexpr uint16_t kErrorFrame = 0x5504;
  static constexpr uint16_t kInlineFrame = 0x5505;

  // Files up to this size travel inline in one kInlineFrame on the session:
  // for them the offer and put round trips cost more than the copy saves.
  static constexpr uint64_t kInlineMaxBytes = 64u << 10;

  // Slots per registered buffer: up to this many chunks of one transfer
  // are in flight at once (a buffer is 2 x chunk_size bytes, so a slot is
  // chunk_size / 2).
  static constexpr int kSlots = 4;

  // Buffers per pool when $DYAD_UCX_POOL_BUFFERS is unset or invalid.
  static constexpr int kDefaultPoolBuffers = 4;

  // The implementation (UCX handles, pools, endpoint cache, progress thread).
  class Engine;

 private:
  const TransportOptions options_;
  std::shared_ptr<Engine> engine_;
};

}  // namespace dyad
