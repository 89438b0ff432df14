// ucx_pull.cc: the requester's transfer, one coroutine (PullFile). After
// the FetchReply it takes a small file from one inline frame; otherwise it
// takes a receive buffer, posts one tagged receive per slot, offers the
// buffer, and writes each chunk out as it lands: from a tagged message, or,
// once the owner's first kChunk says it writes into the buffer itself (same
// host), from the slot that frame names. Each slot goes back to the owner
// with a credit while later chunks need it. Wherever the owner has to act
// first the coroutine waits (Transfer::ForPeer) for the session, where the
// owner's frames arrive, or for its wake fd, which the completions of its
// receives (and a buffer coming back to the pool) make readable
// (ucx_wake.h).
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

// One pull's state: its lease and posted receives, and how it ends. Its
// destructor gives up every receive and returns the buffer, also when the
// coroutine is destroyed at a wait.
class Puller final : Transfer {
 public:
  Puller(Resources& r, Channel& session, uint64_t size, int sink_fd, TransferStats& stats,
         TransferWaits& waits)
      : Transfer(r, session, waits, "no data from the owner"),
        size_(size),
        sink_fd_(sink_fd),
        stats_(stats) {}
  ~Puller() { Release(); }

  Task<Status> Run();

 private:
  std::string What() const {
    return "ucx pull (received " + std::to_string(stats_.bytes) + " of " + std::to_string(size_) +
           " bytes)";
  }
  char* Slot(uint64_t i) const { return lease_->memory().base() + (i % kSlots) * slot_; }

  Task<Status> TakeInline();
  Task<Status> TakeBuffer();
  Status NothingFromOwnerYet();
  Status SendOffer();
  Status Post(uint64_t i);
  Status FinishMessages();
  Status TakeMessage(uint64_t i, size_t got);
  Status OnSessionFrame(uint16_t type, const std::string& payload);
  Status TakeDirectChunk(uint64_t i, uint16_t type, const std::string& payload);
  Status WriteOut(uint64_t i, uint64_t len, bool direct);
  Status SendCredit(uint64_t i);
  // A wait that ended without the owner (no progress within the idle
  // bound, or the Stop fired): the owner is told.
  Status Fail(const Status& why) { return Stop(why.Annotate(What()), true); }
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
  std::optional<BufferLease> lease_;
  bool direct_ = false;       // the owner writes into our buffer itself
  uint64_t slot_ = 0;         // our slot size
  uint64_t transfer_id_ = 0;  // names the tags of our receives
  std::vector<void*> recvs_ = std::vector<void*>(kSlots, nullptr);  // per slot
  uint64_t next_ = 0;                                               // the chunk we wait for
  uint64_t chunk_ = 0;                                              // learned from chunk 0
  uint64_t n_chunks_ = 1;                                           // likewise
};

Task<Status> Puller::Run() {
  if (size_ == 0) co_return Status::OK();
  if (sink_fd_ < 0)
    co_return Stop(Status(DYAD_RC_BADFIO, What() + ": no sink file descriptor"), true);
  if (size_ <= kInlineMaxBytes) co_return co_await TakeInline();
  if (Status st = StartWake(); !st.ok()) co_return Stop(st.Annotate(What()), true);
  if (Status st = co_await TakeBuffer(); !st.ok()) co_return st;
  if (Status st = SendOffer(); !st.ok()) co_return st;

  // Chunks as messages, taken in order as they land. A frame on the session
  // means the owner reports an error, hung up, or (before chunk 0)
  // announces that it writes into our buffer itself.
  while (!direct_ && next_ < n_chunks_) {
    size_t got = 0;
    Result<bool> done = r_.worker.Test(&recvs_[next_ % kSlots], &got);
    if (!done.ok()) co_return Stop(done.status().Annotate(What() + ": waiting for a chunk"), true);
    if (*done) {
      if (Status st = TakeMessage(next_, got); !st.ok()) co_return st;
      ++next_;
      continue;
    }
    uint16_t type = 0;
    Result<bool> frame = RecvNow(&type);
    if (!frame.ok())
      co_return Stop(frame.status().Annotate(What() + ": waiting for a chunk"), false,
                     frame.status().code() == DYAD_RC_CONNLOST);
    if (*frame) {
      if (Status st = OnSessionFrame(type, frame_); !st.ok()) co_return st;
      continue;
    }
    if (Status w = co_await ForPeer(stats_.bytes); !w.ok()) co_return Fail(w);
  }
  if (!direct_) co_return FinishMessages();

  // The owner's direct path as seen here: chunk i (of our slot size) is in
  // slot i % kSlots when kChunk {i, length} arrives.
  while (next_ < n_chunks_) {
    uint16_t type = 0;
    Result<bool> frame = RecvNow(&type);
    if (!frame.ok())
      co_return Stop(frame.status().Annotate(What() + ": waiting for a chunk"), false,
                     frame.status().code() == DYAD_RC_CONNLOST);
    if (!*frame) {
      if (Status w = co_await ForPeer(stats_.bytes); !w.ok()) co_return Fail(w);
      continue;
    }
    if (Status st = TakeDirectChunk(next_, type, frame_); !st.ok()) co_return st;
    ++next_;
  }
  lease_->MarkOk();
  co_return Status::OK();
}

Task<Status> Puller::TakeInline() {
  uint16_t type = 0;
  for (;;) {
    Result<bool> got = RecvNow(&type);
    if (!got.ok()) co_return Stop(got.status().Annotate(What() + ": waiting for the data"), false);
    if (*got) break;
    if (Status w = co_await ForPeer(stats_.bytes); !w.ok()) co_return Fail(w);
  }
  if (type == kErrorFrame)
    co_return Stop(DecodeErrorFrame(frame_, "owner").Annotate(What()), false, true);
  if (type != kInlineFrame || frame_.size() != size_)
    co_return Stop(Status(DYAD_RC_BADUNPACK, What() + ": unexpected inline frame"), true);
  Status ws = WriteFully(sink_fd_, frame_.data(), frame_.size());
  if (!ws.ok()) co_return Stop(Status(DYAD_RC_BADFIO, What() + ": " + ws.message()), true);
  stats_.bytes = size_;
  stats_.chunks = 1;
  co_return Status::OK();
}

// A receive that cannot be reclaimed after a failure (one already taking a
// message's fragments) may still land in a buffer; the owner stops within
// its own idle bound, or at once when it reported its failure. With every
// buffer of the pool in use, the wake fd says when one is back (meanwhile
// the owner waits for our offer; the idle bound holds).
Task<Status> Puller::TakeBuffer() {
  for (;;) {
    Result<std::optional<BufferLease>> lease =
        r_.recv_pool.TryAcquire(FailureRestMs(r_.options.idle_ms), *wake_);
    if (!lease.ok()) co_return Stop(lease.status().Annotate(What()), true);
    if (lease->has_value()) {
      lease_.emplace(std::move(**lease));
      break;
    }
    if (Status st = NothingFromOwnerYet(); !st.ok()) co_return st;
    if (Status w = co_await ForPeer(stats_.bytes, /*for_buffer=*/true); !w.ok()) co_return Fail(w);
  }
  slot_ = r_.recv_pool.slot_bytes();
  transfer_id_ = NextTransferId();
  co_return Status::OK();
}

// Before our offer the owner says nothing, unless it stops (kError) or is
// gone: then so are we, without waiting for a buffer any longer.
Status Puller::NothingFromOwnerYet() {
  uint16_t type = 0;
  Result<bool> frame = RecvNow(&type);
  if (!frame.ok())
    return Stop(frame.status().Annotate(What() + ": waiting for a receive buffer"), false,
                frame.status().code() == DYAD_RC_CONNLOST);
  if (!*frame) return Status::OK();
  if (type == kErrorFrame)
    return Stop(DecodeErrorFrame(frame_, "owner").Annotate(What()), false, true);
  return Stop(Status(DYAD_RC_BADUNPACK, What() + ": unexpected frame (type " +
                                            std::to_string(type) + ") before the offer"),
              true);
}

// Until the first chunk arrives the chunk size is unknown (the owner may
// use smaller slots): one receive per slot may cover every chunk.
Status Puller::SendOffer() {
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

Status Puller::Post(uint64_t i) {
  Result<void*> r = r_.worker.StartRecv(Slot(i), slot_, ChunkTag(transfer_id_, i), wake_.get());
  if (!r.ok()) return r.status();
  recvs_[i % kSlots] = *r;
  return Status::OK();
}

Status Puller::FinishMessages() {
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
  return Status::OK();
}

// Chunk i arrived as a message of `got` bytes into its slot.
Status Puller::TakeMessage(uint64_t i, size_t got) {
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

// A frame while chunks are due as messages: the owner's error, or its
// first kChunk (it writes into our buffer itself from now on).
Status Puller::OnSessionFrame(uint16_t type, const std::string& payload) {
  if (type == kErrorFrame)
    return Stop(DecodeErrorFrame(payload, "owner").Annotate(What()), false, true);
  if (type != kChunkFrame || next_ != 0)
    return Stop(
        Status(DYAD_RC_BADUNPACK, What() + ": unexpected frame (type " + std::to_string(type) +
                                      ", chunk " + std::to_string(next_) + ") during the transfer"),
        true);
  // The receives will never match (their tags are this transfer's).
  direct_ = true;
  n_chunks_ = ChunkCount(size_, slot_);
  for (void*& r : recvs_) {
    if (!r_.worker.Cancel(&r))
      return Stop(Status(DYAD_RC_UCXCOMM_FAIL, What() + ": a receive could not be cancelled"),
                  true);
  }
  DYAD_RETURN_IF_ERROR(TakeDirectChunk(next_, type, payload));
  ++next_;
  return Status::OK();
}

Status Puller::TakeDirectChunk(uint64_t i, uint16_t type, const std::string& payload) {
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
Status Puller::WriteOut(uint64_t i, uint64_t len, bool direct) {
  Status ws = WriteFully(sink_fd_, Slot(i), static_cast<size_t>(len));
  if (!ws.ok()) return Stop(Status(DYAD_RC_BADFIO, What() + ": " + ws.message()), true);
  stats_.bytes += len;
  stats_.chunks += 1;
  if (direct) stats_.direct_bytes += len;
  return Status::OK();
}

// Hands chunk i's slot back to the owner for chunk i + kSlots. A credit is
// a few bytes on a session the owner drains: the send does not wait.
Status Puller::SendCredit(uint64_t i) {
  Status st = session_.SendFrame(kCreditFrame, EncodeCredit(i), Idle());
  if (!st.ok()) return Stop(st.Annotate(What()), false);
  return Status::OK();
}

Status Puller::Stop(const Status& st, bool tell_owner, bool owner_stopped) {
  if (owner_stopped && lease_) lease_->OwnerStopped();
  Release();
  return tell_owner ? TellAndBreakSession(session_, kErrorFrame, st) : BreakSession(session_, st);
}

void Puller::Release() {
  if (!lease_) return;
  bool reclaimed = true;
  for (void*& r : recvs_) reclaimed = r_.worker.Cancel(&r) && reclaimed;
  if (reclaimed && !direct_) lease_->MarkOk();
  lease_.reset();
}

}  // namespace

Task<Status> PullFile(Resources& r, Channel& session, uint64_t size, int sink_fd,
                      TransferStats* stats, TransferWaits& waits) {
  *stats = TransferStats();
  Puller pull(r, session, size, sink_fd, *stats, waits);
  co_return co_await pull.Run();
}

}  // namespace dyad::ucx
