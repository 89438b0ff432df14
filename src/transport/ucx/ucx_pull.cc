// ucx_pull.cc: the requester's state machine, as a PullOp whose Step never
// waits. After the FetchReply it takes a small file from one inline frame;
// otherwise it takes a receive buffer, posts one tagged receive per slot,
// offers the buffer, and writes each chunk out as it lands: from a tagged
// message (kMessages), or, once the owner's first kChunk says it writes
// into the buffer itself (same host), from the slot that frame names
// (kDirect). Each slot goes back to the owner with a credit while later
// chunks need it. Completions of the receives make the op's wake fd
// readable (ucx_wake.h); the owner's frames arrive on the session.
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

class RequesterPull final : public UcxOp {
 public:
  RequesterPull(Resources& r, Channel& session, uint64_t size, int sink_fd, TransferStats* stats)
      : UcxOp(r, session), size_(size), sink_fd_(sink_fd), stats_(*stats) {}
  ~RequesterPull() override { Release(); }

  uint64_t moved() const override { return stats_.bytes; }
  Status Fail(const Status& why) override { return Stop(why.Annotate(What()), true); }

 private:
  enum class Stage { kStart, kInline, kMessages, kDirect, kDone, kFailed };

  Result<bool> StepStages() override;
  std::string What() const {
    return "ucx pull (received " + std::to_string(stats_.bytes) + " of " + std::to_string(size_) +
           " bytes)";
  }
  char* Slot(uint64_t i) const { return lease_->memory().base() + (i % kSlots) * slot_; }

  Result<bool> Begin();
  Result<bool> TakeInline();
  Status SendOffer();
  Status Post(uint64_t i);
  Result<bool> StepMessages();
  Result<bool> FinishMessages();
  Status TakeMessage(uint64_t i, size_t got);
  Status OnSessionFrame(uint16_t type, const std::string& payload);
  Result<bool> StepDirect();
  Status TakeDirectChunk(uint64_t i, uint16_t type, const std::string& payload);
  Status WriteOut(uint64_t i, uint64_t len, bool direct);
  Status SendCredit(uint64_t i);
  // Ends the transfer: gives up the receives, tells the owner (unless it
  // is the one that stopped) and fails the session.
  Status Stop(const Status& st, bool tell_owner, bool owner_stopped = false);
  // Gives up every posted receive; the buffer is reusable at once when UCX
  // let go of all of them (and no same-host owner may still write it).
  // Chunks the owner still sends find no receive and are dropped by the
  // progress thread (see Worker::DropUnexpectedLocked).
  void Release();

  const uint64_t size_;
  const int sink_fd_;
  TransferStats& stats_;
  Stage stage_ = Stage::kStart;
  std::optional<BufferLease> lease_;
  uint64_t slot_ = 0;         // our slot size
  uint64_t transfer_id_ = 0;  // names the tags of our receives
  std::vector<void*> recvs_ = std::vector<void*>(kSlots, nullptr);  // per slot
  uint64_t next_ = 0;                                               // the chunk we wait for
  uint64_t chunk_ = 0;                                              // learned from chunk 0
  uint64_t n_chunks_ = 1;                                           // likewise
};

Result<bool> RequesterPull::StepStages() {
  switch (stage_) {
    case Stage::kStart:
      return Begin();
    case Stage::kInline:
      return TakeInline();
    case Stage::kMessages:
      return StepMessages();
    case Stage::kDirect:
      return StepDirect();
    case Stage::kDone:
      return true;
    case Stage::kFailed:
      break;
  }
  return Status(DYAD_RC_BADFETCH, What() + ": the transfer already failed");
}

Result<bool> RequesterPull::Begin() {
  if (size_ == 0) {
    stage_ = Stage::kDone;
    return true;
  }
  if (sink_fd_ < 0) return Stop(Status(DYAD_RC_BADFIO, What() + ": no sink file descriptor"), true);
  if (size_ <= kInlineMaxBytes) {
    stage_ = Stage::kInline;
    return TakeInline();
  }
  if (!wake_) {
    Status st = StartWake();
    if (!st.ok()) return Stop(st.Annotate(What()), true);
  }
  // A receive that cannot be reclaimed after a failure (one already taking
  // a message's fragments) may still land in this buffer; the owner stops
  // within its own idle bound, or at once when it reported its failure.
  // With every buffer of the pool in use, the wake fd says when one is back
  // (meanwhile the owner waits for our offer; the caller's idle bound holds).
  Result<std::optional<BufferLease>> lease =
      r_.recv_pool.TryAcquire(FailureRestMs(r_.options.idle_ms), *wake_);
  if (!lease.ok()) return Stop(lease.status().Annotate(What()), true);
  if (!lease->has_value()) return false;
  lease_.emplace(std::move(**lease));
  slot_ = r_.recv_pool.slot_bytes();
  transfer_id_ = NextTransferId();
  DYAD_RETURN_IF_ERROR(SendOffer());
  stage_ = Stage::kMessages;
  return StepMessages();
}

Result<bool> RequesterPull::TakeInline() {
  uint16_t type = 0;
  Result<bool> got = RecvNow(&type);
  if (!got.ok()) return Stop(got.status().Annotate(What() + ": waiting for the data"), false);
  if (!*got) return false;
  if (type == kErrorFrame)
    return Stop(DecodeErrorFrame(frame_, "owner").Annotate(What()), false, true);
  if (type != kInlineFrame || frame_.size() != size_)
    return Stop(Status(DYAD_RC_BADUNPACK, What() + ": unexpected inline frame"), true);
  Status ws = WriteFully(sink_fd_, frame_.data(), frame_.size());
  if (!ws.ok()) return Stop(Status(DYAD_RC_BADFIO, What() + ": " + ws.message()), true);
  stats_.bytes = size_;
  stats_.chunks = 1;
  stage_ = Stage::kDone;
  return true;
}

// Until the first chunk arrives the chunk size is unknown (the owner may
// use smaller slots): one receive per slot may cover every chunk.
Status RequesterPull::SendOffer() {
  for (uint64_t i = 0; i < static_cast<uint64_t>(kSlots); ++i) {
    Status st = Post(i);
    if (!st.ok()) return Stop(st.Annotate(What()), true);
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
  if (!st.ok()) return Stop(st.Annotate(What()), false);
  return Status::OK();
}

Status RequesterPull::Post(uint64_t i) {
  Result<void*> r = r_.worker.StartRecv(Slot(i), slot_, ChunkTag(transfer_id_, i), wake_.get());
  if (!r.ok()) return r.status();
  recvs_[i % kSlots] = *r;
  return Status::OK();
}

// Takes every chunk that landed, in order; a frame on the session means
// the owner reports an error, hung up, or (before chunk 0) announces that
// it writes into our buffer itself.
Result<bool> RequesterPull::StepMessages() {
  while (next_ < n_chunks_) {
    size_t got = 0;
    Result<bool> done = r_.worker.Test(&recvs_[next_ % kSlots], &got);
    if (!done.ok()) return Stop(done.status().Annotate(What() + ": waiting for a chunk"), true);
    if (!*done) {
      uint16_t type = 0;
      Result<bool> frame = RecvNow(&type);
      if (!frame.ok())
        return Stop(frame.status().Annotate(What() + ": waiting for a chunk"), false,
                    frame.status().code() == DYAD_RC_CONNLOST);
      if (!*frame) return false;
      DYAD_RETURN_IF_ERROR(OnSessionFrame(type, frame_));
      return StepDirect();
    }
    DYAD_RETURN_IF_ERROR(TakeMessage(next_, got));
    ++next_;
  }
  return FinishMessages();
}

Result<bool> RequesterPull::FinishMessages() {
  // Receives posted for chunks that do not exist (a file of fewer chunks
  // than slots) are withdrawn; none can match, the tags are unique.
  for (void*& r : recvs_) {
    if (r != nullptr && !r_.worker.Cancel(&r))
      return Stop(Status(DYAD_RC_UCXCOMM_FAIL, What() + ": a spare receive could not be cancelled"),
                  true);
  }
  // Everything arrived: the owner waits for this before its verdict (a
  // kReply on the session), which could otherwise overtake our last
  // messages and be read here as a frame in the middle of the transfer.
  DYAD_RETURN_IF_ERROR(SendCredit(n_chunks_ - 1));
  lease_->MarkOk();
  stage_ = Stage::kDone;
  return true;
}

// Chunk i arrived as a message of `got` bytes into its slot.
Status RequesterPull::TakeMessage(uint64_t i, size_t got) {
  if (i == 0) {
    chunk_ = got;
    if (chunk_ == 0 || chunk_ > slot_ || chunk_ > size_)
      return Stop(Status(DYAD_RC_BADUNPACK, What() + ": bad first chunk"), true);
    n_chunks_ = ChunkCount(size_, chunk_);
  }
  const uint64_t want = std::min<uint64_t>(chunk_, size_ - i * chunk_);
  if (got != want)
    return Stop(Status(DYAD_RC_BADUNPACK, What() + ": chunk " + std::to_string(i) + " has " +
                                              std::to_string(got) + " bytes, expected " +
                                              std::to_string(want)),
                true);
  DYAD_RETURN_IF_ERROR(WriteOut(i, got, /*direct=*/false));
  if (i + kSlots >= n_chunks_) return Status::OK();
  Status st = Post(i + kSlots);
  if (!st.ok()) return Stop(st.Annotate(What()), true);
  return SendCredit(i);
}

Status RequesterPull::OnSessionFrame(uint16_t type, const std::string& payload) {
  if (type == kErrorFrame)
    return Stop(DecodeErrorFrame(payload, "owner").Annotate(What()), false, true);
  if (type != kChunkFrame || next_ != 0)
    return Stop(
        Status(DYAD_RC_BADUNPACK, What() + ": unexpected frame (type " + std::to_string(type) +
                                      ", chunk " + std::to_string(next_) + ") during the transfer"),
        true);
  // The receives will never match (their tags are this transfer's).
  stage_ = Stage::kDirect;
  n_chunks_ = ChunkCount(size_, slot_);
  for (void*& r : recvs_) {
    if (!r_.worker.Cancel(&r))
      return Stop(Status(DYAD_RC_UCXCOMM_FAIL, What() + ": a receive could not be cancelled"),
                  true);
  }
  return TakeDirectChunk(next_++, type, payload);
}

// The owner's direct path as seen here: chunk i (of our slot size) is in
// slot i % kSlots when kChunk {i, length} arrives.
Result<bool> RequesterPull::StepDirect() {
  while (next_ < n_chunks_) {
    uint16_t type = 0;
    Result<bool> frame = RecvNow(&type);
    if (!frame.ok())
      return Stop(frame.status().Annotate(What() + ": waiting for a chunk"), false,
                  frame.status().code() == DYAD_RC_CONNLOST);
    if (!*frame) return false;
    DYAD_RETURN_IF_ERROR(TakeDirectChunk(next_, type, frame_));
    ++next_;
  }
  lease_->MarkOk();
  stage_ = Stage::kDone;
  return true;
}

Status RequesterPull::TakeDirectChunk(uint64_t i, uint16_t type, const std::string& payload) {
  if (type == kErrorFrame)
    return Stop(DecodeErrorFrame(payload, "owner").Annotate(What()), false, true);
  uint64_t index = 0;
  uint64_t len = 0;
  const bool decoded = DecodeChunk(payload, &index, &len).ok();
  const uint64_t want = std::min<uint64_t>(slot_, size_ - i * slot_);
  if (type != kChunkFrame || !decoded || index != i || len != want)
    return Stop(
        Status(DYAD_RC_BADUNPACK, What() + ": unexpected frame for chunk " + std::to_string(i)),
        true);
  std::atomic_thread_fence(std::memory_order_acquire);
  DYAD_RETURN_IF_ERROR(WriteOut(i, len, /*direct=*/true));
  return i + kSlots < n_chunks_ ? SendCredit(i) : Status::OK();
}

// Writes chunk i (in slot i % kSlots) to the sink.
Status RequesterPull::WriteOut(uint64_t i, uint64_t len, bool direct) {
  Status ws = WriteFully(sink_fd_, Slot(i), static_cast<size_t>(len));
  if (!ws.ok()) return Stop(Status(DYAD_RC_BADFIO, What() + ": " + ws.message()), true);
  stats_.bytes += len;
  stats_.chunks += 1;
  if (direct) stats_.direct_bytes += len;
  return Status::OK();
}

// Hands chunk i's slot back to the owner for chunk i + kSlots. A credit is
// a few bytes on a session the owner drains: the send does not wait.
Status RequesterPull::SendCredit(uint64_t i) {
  Status st = session_.SendFrame(kCreditFrame, EncodeCredit(i), Idle());
  if (!st.ok()) return Stop(st.Annotate(What()), false);
  return Status::OK();
}

Status RequesterPull::Stop(const Status& st, bool tell_owner, bool owner_stopped) {
  if (stage_ == Stage::kFailed) return st;
  if (owner_stopped && lease_) lease_->OwnerStopped();
  Release();
  stage_ = Stage::kFailed;
  return tell_owner ? TellAndBreakSession(session_, kErrorFrame, st) : BreakSession(session_, st);
}

void RequesterPull::Release() {
  if (!lease_) return;
  bool reclaimed = true;
  for (void*& r : recvs_) reclaimed = r_.worker.Cancel(&r) && reclaimed;
  if (reclaimed && stage_ != Stage::kDirect) lease_->MarkOk();
  lease_.reset();
}

}  // namespace

std::unique_ptr<PullOp> StartPullOp(Resources& r, Channel& session, uint64_t size, int sink_fd,
                                    TransferStats* stats) {
  *stats = TransferStats();
  return std::make_unique<RequesterPull>(r, session, size, sink_fd, stats);
}

}  // namespace dyad::ucx
