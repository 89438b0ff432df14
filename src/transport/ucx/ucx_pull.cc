// ucx_pull.cc: the requester's state machine. After the FetchReply it
// takes a small file from one inline frame; otherwise it takes a receive
// buffer, posts one tagged receive per slot, offers the buffer, and writes
// each chunk out as it lands: from a tagged message (ReceiveMessages), or,
// once the owner's first kChunk says it writes into the buffer itself
// (same host), from the slot that frame names (ReceiveDirect). Each slot
// goes back to the owner with a credit while later chunks need it.
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <vector>

#include "transport/ucx/ucx_config.h"
#include "transport/ucx/ucx_transfer.h"
#include "transport/ucx/ucx_wire.h"

namespace dyad::ucx {
namespace {

uint64_t ChunkCount(uint64_t size, uint64_t chunk) { return (size + chunk - 1) / chunk; }

class RequesterTransfer {
 public:
  RequesterTransfer(Resources& r, Channel& session, uint64_t size, int sink_fd,
                    TransferStats* stats)
      : r_(r), session_(session), size_(size), sink_fd_(sink_fd), stats_(*stats) {}

  Status Run();

 private:
  Deadline Idle() const { return IdleDeadline(r_.options.idle_ms); }
  std::string What() const {
    return "ucx pull (received " + std::to_string(stats_.bytes) + " of " + std::to_string(size_) +
           " bytes)";
  }
  char* Slot(uint64_t i) const { return lease_->memory().base() + (i % kSlots) * slot_; }

  Status ReceiveInline();
  Status SendOffer();
  Status Post(uint64_t i);
  Status ReceiveMessages();
  Status TakeMessage(uint64_t i, size_t got);
  Status OnSessionFrame(uint64_t i);
  Status ReceiveDirect(std::string payload);
  Status TakeDirectChunk(uint64_t i, uint64_t n_chunks, uint16_t type, const std::string& payload);
  Status WriteOut(uint64_t i, uint64_t len, bool direct);
  Status SendCredit(uint64_t i);
  Status Fail(const Status& st, bool tell_owner, bool owner_stopped = false);

  Resources& r_;
  Channel& session_;
  const uint64_t size_;
  const int sink_fd_;
  TransferStats& stats_;
  std::optional<BufferLease> lease_;
  uint64_t slot_ = 0;         // our slot size
  uint64_t transfer_id_ = 0;  // names the tags of our receives
  std::vector<void*> recvs_ = std::vector<void*>(kSlots, nullptr);  // per slot
  bool direct_ = false;    // written into by a same-host owner
  uint64_t chunk_ = 0;     // learned from chunk 0
  uint64_t n_chunks_ = 1;  // likewise
};

Status RequesterTransfer::Run() {
  if (size_ == 0) return Status::OK();
  if (sink_fd_ < 0)
    return SendErrorAndFail(session_, Status(DYAD_RC_BADFIO, "ucx pull: no sink file descriptor"));
  if (size_ <= kInlineMaxBytes) return ReceiveInline();
  Status st = r_.worker.Start();
  if (!st.ok()) return SendErrorAndFail(session_, st.Annotate("ucx pull"));
  // A receive that cannot be reclaimed after a failure (one already taking
  // a message's fragments) may still land in this buffer; the owner stops
  // within its own idle bound, or at once when it reported its failure.
  Result<BufferLease> lease = r_.recv_pool.Acquire(Idle(), FailureRestMs(r_.options.idle_ms));
  if (!lease.ok()) return SendErrorAndFail(session_, lease.status().Annotate("ucx pull"));
  lease_.emplace(std::move(lease).value());
  slot_ = r_.recv_pool.slot_bytes();
  transfer_id_ = NextTransferId();
  DYAD_RETURN_IF_ERROR(SendOffer());
  return ReceiveMessages();
}

Status RequesterTransfer::ReceiveInline() {
  // The data frame follows the FetchReply at once: spin for it rather than
  // pay a sleeping thread's wake-up (as the tcp transport does).
  (void)session_.SpinFor(POLLIN);
  uint16_t type = 0;
  std::string payload;
  Status rs = session_.RecvFrame(&type, &payload, Idle());
  if (!rs.ok()) return FailSession(session_, rs.Annotate(What() + ": waiting for the data"));
  if (type == kErrorFrame)
    return FailSession(session_, DecodeErrorFrame(payload, "owner").Annotate(What()));
  if (type != kInlineFrame || payload.size() != size_)
    return SendErrorAndFail(session_,
                            Status(DYAD_RC_BADUNPACK, What() + ": unexpected inline frame"));
  Status ws = WriteFully(sink_fd_, payload.data(), payload.size());
  if (!ws.ok())
    return SendErrorAndFail(session_, Status(DYAD_RC_BADFIO, What() + ": " + ws.message()));
  stats_.bytes = size_;
  stats_.chunks = 1;
  return Status::OK();
}

// Until the first chunk arrives the chunk size is unknown (the owner may
// use smaller slots): one receive per slot may cover every chunk.
Status RequesterTransfer::SendOffer() {
  for (uint64_t i = 0; i < static_cast<uint64_t>(kSlots); ++i) {
    Status st = Post(i);
    if (!st.ok()) return Fail(st.Annotate(What()), true);
  }
  const RegisteredMemory& mem = lease_->memory();
  Offer offer;
  offer.transfer_id = transfer_id_;
  offer.slot_bytes = slot_;
  offer.slots = kSlots;
  offer.base = reinterpret_cast<uintptr_t>(mem.base());
  // A key only for a buffer in shared memory: without one, the owner sends
  // messages and never tries to reach us through shared memory.
  if (mem.ucx_allocated() && ShmDirectAllowed()) offer.rkey = mem.packed_key();
  Status st = session_.SendFrame(kOfferFrame, EncodeOffer(offer), Idle());
  if (!st.ok()) return Fail(st.Annotate(What()), false);
  return Status::OK();
}

Status RequesterTransfer::Post(uint64_t i) {
  Result<void*> r = r_.worker.StartRecv(Slot(i), slot_, ChunkTag(transfer_id_, i));
  if (!r.ok()) return r.status();
  recvs_[i % kSlots] = *r;
  return Status::OK();
}

Status RequesterTransfer::ReceiveMessages() {
  for (uint64_t i = 0; i < n_chunks_; ++i) {
    size_t got = 0;
    bool session_ready = false;
    Status st = r_.worker.Wait(&recvs_[i % kSlots], &got, Idle(), session_.fd(), &session_ready);
    if (!st.ok()) return Fail(st.Annotate(What() + ": waiting for a chunk"), true);
    if (session_ready) return OnSessionFrame(i);
    DYAD_RETURN_IF_ERROR(TakeMessage(i, got));
  }
  // Receives posted for chunks that do not exist (a file of fewer chunks
  // than slots) are withdrawn; none can match, the tags are unique.
  for (void*& r : recvs_) {
    if (r != nullptr && !r_.worker.Cancel(&r))
      return Fail(Status(DYAD_RC_UCXCOMM_FAIL, What() + ": a spare receive could not be cancelled"),
                  true);
  }
  // Everything arrived: the owner waits for this before its verdict (a
  // kReply on the session), which could otherwise overtake our last
  // messages and be read here as a frame in the middle of the transfer.
  DYAD_RETURN_IF_ERROR(SendCredit(n_chunks_ - 1));
  lease_->MarkOk();
  return Status::OK();
}

// Chunk i arrived as a message of `got` bytes into its slot.
Status RequesterTransfer::TakeMessage(uint64_t i, size_t got) {
  if (i == 0) {
    chunk_ = got;
    if (chunk_ == 0 || chunk_ > slot_ || chunk_ > size_)
      return Fail(Status(DYAD_RC_BADUNPACK, What() + ": bad first chunk"), true);
    n_chunks_ = ChunkCount(size_, chunk_);
  }
  const uint64_t want = std::min<uint64_t>(chunk_, size_ - i * chunk_);
  if (got != want)
    return Fail(Status(DYAD_RC_BADUNPACK, What() + ": chunk " + std::to_string(i) + " has " +
                                              std::to_string(got) + " bytes, expected " +
                                              std::to_string(want)),
                true);
  DYAD_RETURN_IF_ERROR(WriteOut(i, got, /*direct=*/false));
  if (i + kSlots >= n_chunks_) return Status::OK();
  Status st = Post(i + kSlots);
  if (!st.ok()) return Fail(st.Annotate(What()), true);
  return SendCredit(i);
}

// The session became readable while we waited for chunk i's message: the
// owner reports an error, hung up, or (chunk 0 only) announces that it
// writes into our buffer itself.
Status RequesterTransfer::OnSessionFrame(uint64_t i) {
  uint16_t type = 0;
  std::string payload;
  Status st = session_.RecvFrame(&type, &payload, Deadline::AfterMs(1000));
  if (!st.ok())
    return Fail(st.Annotate(What() + ": waiting for a chunk"), false,
                st.code() == DYAD_RC_CONNLOST);
  if (type == kErrorFrame)
    return Fail(DecodeErrorFrame(payload, "owner").Annotate(What()), false, true);
  if (type != kChunkFrame || i != 0)
    return Fail(
        Status(DYAD_RC_BADUNPACK, What() + ": unexpected frame (type " + std::to_string(type) +
                                      ", chunk " + std::to_string(i) + ") during the transfer"),
        true);
  // The receives will never match (their tags are this transfer's).
  direct_ = true;
  for (void*& r : recvs_) {
    if (!r_.worker.Cancel(&r))
      return Fail(Status(DYAD_RC_UCXCOMM_FAIL, What() + ": a receive could not be cancelled"),
                  true);
  }
  return ReceiveDirect(std::move(payload));
}

// The owner's direct path as seen here: chunk i (of our slot size) is in
// slot i % kSlots when kChunk {i, length} arrives; `payload` is chunk 0's.
Status RequesterTransfer::ReceiveDirect(std::string payload) {
  const uint64_t n_chunks = ChunkCount(size_, slot_);
  for (uint64_t i = 0; i < n_chunks; ++i) {
    uint16_t type = kChunkFrame;
    if (i > 0) {
      Status rs = session_.RecvFrame(&type, &payload, Idle());
      if (!rs.ok())
        return Fail(rs.Annotate(What() + ": waiting for a chunk"), false,
                    rs.code() == DYAD_RC_CONNLOST);
    }
    DYAD_RETURN_IF_ERROR(TakeDirectChunk(i, n_chunks, type, payload));
  }
  lease_->MarkOk();
  return Status::OK();
}

Status RequesterTransfer::TakeDirectChunk(uint64_t i, uint64_t n_chunks, uint16_t type,
                                          const std::string& payload) {
  if (type == kErrorFrame)
    return Fail(DecodeErrorFrame(payload, "owner").Annotate(What()), false, true);
  uint64_t index = 0;
  uint64_t len = 0;
  const bool decoded = DecodeChunk(payload, &index, &len).ok();
  const uint64_t want = std::min<uint64_t>(slot_, size_ - i * slot_);
  if (type != kChunkFrame || !decoded || index != i || len != want)
    return Fail(
        Status(DYAD_RC_BADUNPACK, What() + ": unexpected frame for chunk " + std::to_string(i)),
        true);
  std::atomic_thread_fence(std::memory_order_acquire);
  DYAD_RETURN_IF_ERROR(WriteOut(i, len, /*direct=*/true));
  return i + kSlots < n_chunks ? SendCredit(i) : Status::OK();
}

// Writes chunk i (in slot i % kSlots) to the sink.
Status RequesterTransfer::WriteOut(uint64_t i, uint64_t len, bool direct) {
  Status ws = WriteFully(sink_fd_, Slot(i), static_cast<size_t>(len));
  if (!ws.ok()) return Fail(Status(DYAD_RC_BADFIO, What() + ": " + ws.message()), true);
  stats_.bytes += len;
  stats_.chunks += 1;
  if (direct) stats_.direct_bytes += len;
  return Status::OK();
}

// Hands chunk i's slot back to the owner for chunk i + kSlots.
Status RequesterTransfer::SendCredit(uint64_t i) {
  Status st = session_.SendFrame(kCreditFrame, EncodeCredit(i), Idle());
  if (!st.ok()) return Fail(st.Annotate(What()), false);
  return Status::OK();
}

// Gives up on every posted receive; the buffer is reusable at once when UCX
// let go of all of them (and no same-host owner may still write it).
// Chunks the owner still sends find no receive and are dropped by the
// progress thread (see Worker::DropUnexpectedLocked).
Status RequesterTransfer::Fail(const Status& st, bool tell_owner, bool owner_stopped) {
  if (owner_stopped) lease_->OwnerStopped();
  bool reclaimed = true;
  for (void*& r : recvs_) reclaimed = r_.worker.Cancel(&r) && reclaimed;
  if (reclaimed && !direct_) lease_->MarkOk();
  return tell_owner ? SendErrorAndFail(session_, st) : FailSession(session_, st);
}

}  // namespace

Status PullFile(Resources& r, Channel& session, uint64_t size, int sink_fd, TransferStats* stats) {
  TransferStats local_stats;
  if (stats == nullptr) stats = &local_stats;
  *stats = TransferStats();
  return RequesterTransfer(r, session, size, sink_fd, stats).Run();
}

}  // namespace dyad::ucx
