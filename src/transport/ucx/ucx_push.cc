// ucx_push.cc: the owner's state machine. After the FetchReply it sends a
// small file inline; otherwise it reads the requester's arguments and
// buffer offer, then either writes each chunk straight into the requester's
// mapped buffer (same host, SendDirect) or sends it as a tagged message
// (SendMessages), reusing a slot only once the requester's credit says so.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <vector>

#include "common/fsutil.h"
#include "common/log.h"
#include "transport/ucx/ucx_config.h"
#include "transport/ucx/ucx_transfer.h"
#include "transport/ucx/ucx_wire.h"

namespace dyad::ucx {
namespace {

uint64_t ChunkCount(uint64_t size, uint64_t chunk) { return (size + chunk - 1) / chunk; }

class OwnerTransfer {
 public:
  OwnerTransfer(Resources& r, Channel& session, const FileSource& src, TransferStats* stats)
      : r_(r),
        session_(session),
        src_(src),
        stats_(*stats),
        what_("ucx push of '" + src.path + "'") {}

  Status Run(const std::string& request_args);

 private:
  Deadline Idle() const { return IdleDeadline(r_.options.idle_ms); }
  // Every failure after the FetchReply is reported to the requester, which
  // waits for the chunks the reply promised.
  Status Fail(const Status& st) {
    return SendErrorAndFail(session_, st.Annotate(what_ + " (sent " + std::to_string(stats_.bytes) +
                                                  " of " + std::to_string(src_.size) + " bytes)"));
  }
  void Count(size_t len, bool direct) {
    stats_.bytes += len;
    stats_.chunks += 1;
    if (direct) stats_.direct_bytes += len;
  }

  Status SendInline();
  Result<Offer> ReceiveOffer();
  bool DirectPossible(const RequestArgs& args, const Offer& offer) const;
  Status SendDirect(DirectPeers::Mapping& target, const Offer& offer);
  Status SendDirectChunks(char* target, const Offer& offer);
  Status SendMessages(const std::string& address, const Offer& offer);
  Status SendChunks(ucp_ep_h ep, char* local_base, const Offer& offer, std::vector<void*>& sends);
  Status WaitSend(void** send) { return r_.worker.Wait(send, nullptr, Idle(), -1, nullptr); }

  Resources& r_;
  Channel& session_;
  const FileSource& src_;
  TransferStats& stats_;
  const std::string what_;
};

Status OwnerTransfer::Run(const std::string& request_args) {
  if (src_.size == 0) return Status::OK();
  if (src_.fd < 0)
    return SendErrorAndFail(session_, Status(DYAD_RC_BADFIO, what_ + ": no open file descriptor"));
  if (src_.size <= kInlineMaxBytes) return SendInline();
  Status st = r_.worker.Start();
  if (!st.ok()) return SendErrorAndFail(session_, st.Annotate(what_));
  Result<RequestArgs> args = DecodeRequestArgs(request_args);
  if (!args.ok()) return SendErrorAndFail(session_, args.status().Annotate(what_));
  Result<Offer> offer = ReceiveOffer();
  if (!offer.ok()) return offer.status();
  // Same host: write straight into the requester's buffer when it is in
  // shared memory we can map; otherwise (or when that fails) messages.
  if (DirectPossible(*args, *offer)) {
    Result<DirectPeers::Mapping> target =
        r_.direct.Map(args->address, offer->rkey, offer->base, offer->slot_bytes * offer->slots);
    if (target.ok()) return SendDirect(*target, *offer);
    DYAD_LOG_DEBUG("ucx: same-host requester, no shared-memory path (%s); using messages",
                   target.status().ToString().c_str());
  }
  return SendMessages(args->address, *offer);
}

Status OwnerTransfer::SendInline() {
  std::string data(static_cast<size_t>(src_.size), '\0');
  Status rs = PreadFully(src_.fd, data.data(), data.size(), 0);
  if (!rs.ok()) return SendErrorAndFail(session_, rs.Annotate(what_));
  Status ss = session_.SendFrame(kInlineFrame, data, Idle());
  if (!ss.ok()) return FailSession(session_, ss.Annotate(what_));
  stats_.bytes = src_.size;
  stats_.chunks = 1;
  return Status::OK();
}

// The requester's offer: which tags, how many slots of what size.
Result<Offer> OwnerTransfer::ReceiveOffer() {
  uint16_t type = 0;
  std::string payload;
  Status st = session_.RecvFrame(&type, &payload, Idle());
  if (!st.ok()) return FailSession(session_, st.Annotate(what_ + ": waiting for the buffer offer"));
  if (type == kErrorFrame) return FailSession(session_, DecodeErrorFrame(payload, "requester"));
  Result<Offer> offer = type == kOfferFrame
                            ? DecodeOffer(payload)
                            : Result<Offer>(Status(DYAD_RC_BADUNPACK, "bad buffer offer"));
  if (!offer.ok()) return SendErrorAndFail(session_, offer.status().Annotate(what_));
  return offer;
}

bool OwnerTransfer::DirectPossible(const RequestArgs& args, const Offer& offer) const {
  return !args.host_id.empty() && args.host_id == LocalHostId() && r_.worker.shm_capable() &&
         ShmDirectAllowed() && !offer.rkey.empty();
}

Status OwnerTransfer::SendDirect(DirectPeers::Mapping& target, const Offer& offer) {
  Status st = SendDirectChunks(target.ptr(), offer);
  target.Done(st.ok());
  return st.ok() ? st : Fail(st);
}

// Chunk i is read from the file straight into slot i % slots of the
// requester's mapped buffer, then announced as kChunk {i, length}; from
// chunk `slots` on, the slot is reused once the requester's kCredit
// {i - slots} says it has written the slot out. No UCX call is made.
Status OwnerTransfer::SendDirectChunks(char* target, const Offer& offer) {
  const uint64_t slot = offer.slot_bytes;
  const uint64_t n_chunks = ChunkCount(src_.size, slot);
  for (uint64_t i = 0; i < n_chunks; ++i) {
    if (i >= offer.slots) DYAD_RETURN_IF_ERROR(RecvCredit(session_, i - offer.slots, Idle()));
    const uint64_t offset = i * slot;
    const size_t len = static_cast<size_t>(std::min(slot, src_.size - offset));
    DYAD_RETURN_IF_ERROR(PreadFully(src_.fd, target + (i % offer.slots) * slot, len, offset));
    // The chunk's bytes are in place before the requester can learn of it.
    std::atomic_thread_fence(std::memory_order_release);
    DYAD_RETURN_IF_ERROR(session_.SendFrame(kChunkFrame, EncodeChunk(i, len), Idle()));
    Count(len, /*direct=*/true);
  }
  return Status::OK();
}

Status OwnerTransfer::SendMessages(const std::string& address, const Offer& offer) {
  Result<EndpointCache::Ref> ep = r_.endpoints.Get(address);
  if (!ep.ok()) return SendErrorAndFail(session_, ep.status().Annotate(what_));
  // A send buffer is only read by UCX; it rests only when a send of a
  // failed transfer could not be reclaimed (see below).
  Result<BufferLease> buf = r_.send_pool.Acquire(Idle(), FailureRestMs(r_.options.idle_ms));
  if (!buf.ok()) return SendErrorAndFail(session_, buf.status().Annotate(what_));
  std::vector<void*> sends(kSlots, nullptr);  // per local slot
  Status st = SendChunks(ep->get(), buf->memory().base(), offer, sends);
  if (st.ok()) {
    buf->MarkOk();
    return st;
  }
  // Sends still pending after a failure must not outlive this call: they
  // read our send buffer. The endpoint is retired and, once its last user
  // lets go, force-closed, which fails its sends; then they are cancelled.
  r_.endpoints.Evict(address, ep->get());
  ep->Release();
  bool reclaimed = true;
  for (void*& send : sends) reclaimed = r_.worker.Cancel(&send) && reclaimed;
  if (reclaimed) buf->MarkOk();
  return Fail(st);
}

// Chunk i goes from local slot i % kSlots to the requester's receive for
// tag (transfer id, i), once our slot's previous send completed and, from
// chunk `offer.slots` on, the requester's credit says the receive is posted.
Status OwnerTransfer::SendChunks(ucp_ep_h ep, char* local_base, const Offer& offer,
                                 std::vector<void*>& sends) {
  const uint64_t local_slot_bytes = r_.send_pool.slot_bytes();
  const uint64_t chunk = std::min<uint64_t>(offer.slot_bytes, local_slot_bytes);
  const uint64_t n_chunks = ChunkCount(src_.size, chunk);
  for (uint64_t i = 0; i < n_chunks; ++i) {
    if (i >= offer.slots) {
      // Drive the worker meanwhile: sends that did not fit the socket move
      // only when it is progressed.
      DYAD_RETURN_IF_ERROR(r_.worker.WaitReadable(session_.fd(), Idle()));
      DYAD_RETURN_IF_ERROR(RecvCredit(session_, i - offer.slots, Idle()));
    }
    void*& send = sends[i % kSlots];
    DYAD_RETURN_IF_ERROR(WaitSend(&send));
    const uint64_t offset = i * chunk;
    const size_t len = static_cast<size_t>(std::min(chunk, src_.size - offset));
    char* local = local_base + (i % kSlots) * local_slot_bytes;
    DYAD_RETURN_IF_ERROR(PreadFully(src_.fd, local, len, offset));
    Result<void*> r = r_.endpoints.StartSend(ep, local, len, ChunkTag(offer.transfer_id, i));
    if (!r.ok()) return r.status();
    send = *r;
    Count(len, /*direct=*/false);
  }
  for (void*& s : sends) DYAD_RETURN_IF_ERROR(WaitSend(&s));
  // A completed send may not have arrived yet: the requester's credit for
  // the last chunk says it has them all, so what we send on the session
  // next (the fetch verdict) cannot overtake them.
  DYAD_RETURN_IF_ERROR(r_.worker.WaitReadable(session_.fd(), Idle()));
  return RecvCredit(session_, n_chunks - 1, Idle());
}

}  // namespace

Status PushFile(Resources& r, Channel& session, const FileSource& src,
                const std::string& request_args, TransferStats* stats) {
  TransferStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  *stats = TransferStats();
  return OwnerTransfer(r, session, src, stats).Run(request_args);
}

}  // namespace dyad::ucx
