// ucx_push.cc: the owner's transfer, one coroutine (PushFile). After the
// FetchReply it sends a small file inline; otherwise it takes the
// requester's arguments and buffer offer, then either writes each chunk
// straight into the requester's mapped buffer (same host) or sends it as a
// tagged message, reusing a slot only once the requester's credit says so.
// Wherever the requester has to act first the coroutine waits
// (Transfer::ForPeer) for the session, where the offer and credits arrive,
// or for its wake fd, which the completions of its sends (and a buffer
// coming back to the pool) make readable (ucx_wake.h).
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <optional>
#include <vector>

#include "common/fsutil.h"
#include "common/log.h"
#include "transport/host_id.h"
#include "transport/ucx/ucx_config.h"
#include "transport/ucx/ucx_transfer.h"
#include "transport/ucx/ucx_wire.h"

namespace dyad::ucx {
namespace {

uint64_t ChunkCount(uint64_t size, uint64_t chunk) { return (size + chunk - 1) / chunk; }

// One push's state: the mapping, endpoint, send buffer and sends it holds,
// and how it ends. Its destructor lets go of them, also when the coroutine
// is destroyed at a wait.
class Pusher final : Transfer {
 public:
  Pusher(Resources& r, Channel& session, const FileSource& src, std::string request_args,
         TransferStats& stats, TransferWaits& waits)
      : Transfer(r, session, waits, "the requester made no progress"),
        src_(src),
        request_args_(std::move(request_args)),
        stats_(stats),
        what_("ucx push of '" + src.path + "'") {}
  ~Pusher() { Release(); }

  Task<Status> Run();

 private:
  Status SendInline();
  Task<Status> TakeOffer();
  bool DirectPossible() const;
  Task<Status> SendDirect();
  Task<Status> SendMessages();
  // Waits for the requester's next credit and takes it.
  Task<Status> TakeCredit();
  // Takes the requester's next credit if it is on the session now (true).
  Result<bool> TakeCreditNow();
  // The index of the credit expected next: each slot's chunk while later
  // chunks need the slot, then the last chunk's (messages only).
  uint64_t EarlyCredits() const { return n_chunks_ > offer_.slots ? n_chunks_ - offer_.slots : 0; }
  uint64_t CreditIndex() const { return credits_ < EarlyCredits() ? credits_ : n_chunks_ - 1; }
  bool Credited(uint64_t i) const { return i < offer_.slots || credits_ > i - offer_.slots; }
  // Progress restarts the idle bound: bytes sent and credits taken.
  uint64_t moved() const { return stats_.bytes + credits_; }
  void Count(size_t len, bool direct) {
    stats_.bytes += len;
    stats_.chunks += 1;
    if (direct) stats_.direct_bytes += len;
  }
  // Every failure after the FetchReply is reported to the requester, which
  // waits for the chunks the reply promised: a wait that ended without the
  // requester (no progress within the idle bound, or the Stop fired) too.
  Status Fail(const Status& why) { return Stop(why, true); }
  Status Stop(const Status& st, bool tell_requester);
  // Ends the use of the mapping, the endpoint and the send buffer. Sends
  // still pending must not outlive the transfer: they read our send
  // buffer. The endpoint is retired and, once its last user lets go,
  // force-closed, which fails its sends; then they are cancelled.
  void Release();

  const FileSource& src_;
  const std::string request_args_;
  TransferStats& stats_;
  const std::string what_;
  RequestArgs args_;
  Offer offer_;
  std::optional<DirectPeers::Mapping> target_;
  std::optional<EndpointCache::Ref> ep_;
  std::optional<BufferLease> buf_;
  std::vector<void*> sends_ = std::vector<void*>(kSlots, nullptr);  // per local slot
  bool hurried_ = false;
  uint64_t chunk_ = 0;
  uint64_t n_chunks_ = 0;
  uint64_t next_ = 0;     // the chunk to send next
  uint64_t credits_ = 0;  // credits taken
};

Task<Status> Pusher::Run() {
  if (src_.size == 0) co_return Status::OK();
  if (src_.fd < 0) co_return Stop(Status(DYAD_RC_BADFIO, "no open file descriptor"), true);
  if (src_.size <= kInlineMaxBytes) co_return SendInline();
  if (Status st = StartWake(); !st.ok()) co_return Stop(st, true);
  Result<RequestArgs> args = DecodeRequestArgs(request_args_);
  if (!args.ok()) co_return Stop(args.status(), true);
  args_ = std::move(args).value();
  if (Status st = co_await TakeOffer(); !st.ok()) co_return st;
  // Same host: write straight into the requester's buffer when it is in
  // shared memory we can map; otherwise (or when that fails) messages.
  if (DirectPossible()) {
    Result<DirectPeers::Mapping> target =
        r_.direct.Map(args_.address, offer_.rkey, offer_.base, offer_.slot_bytes * offer_.slots);
    if (target.ok()) {
      target_.emplace(std::move(target).value());
      co_return co_await SendDirect();
    }
    DYAD_LOG_DEBUG("ucx: same-host requester, no shared-memory path (%s); using messages",
                   target.status().ToString().c_str());
  }
  co_return co_await SendMessages();
}

// A small file in one frame: the session's socket buffer takes it whole
// unless the requester stopped reading (then bounded by the idle limit).
Status Pusher::SendInline() {
  std::string data(static_cast<size_t>(src_.size), '\0');
  Status rs = PreadFully(src_.fd, data.data(), data.size(), 0);
  if (!rs.ok()) return Stop(rs, true);
  Status ss = session_.SendFrame(kInlineFrame, data, Idle());
  if (!ss.ok()) return Stop(ss, false);
  stats_.bytes = src_.size;
  stats_.chunks = 1;
  return Status::OK();
}

// The requester's offer: which tags, how many slots of what size.
Task<Status> Pusher::TakeOffer() {
  uint16_t type = 0;
  for (;;) {
    Result<bool> got = RecvNow(&type);
    if (!got.ok()) co_return Stop(got.status().Annotate("waiting for the buffer offer"), false);
    if (*got) break;
    if (Status w = co_await ForPeer(moved()); !w.ok()) co_return Fail(w);
  }
  if (type == kErrorFrame) co_return Stop(DecodeErrorFrame(frame_, "requester"), false);
  Result<Offer> offer = type == kOfferFrame
                            ? DecodeOffer(frame_)
                            : Result<Offer>(Status(DYAD_RC_BADUNPACK, "bad buffer offer"));
  if (!offer.ok()) co_return Stop(offer.status(), true);
  offer_ = std::move(offer).value();
  co_return Status::OK();
}

bool Pusher::DirectPossible() const {
  return !args_.host_id.empty() && args_.host_id == SameHostId() && r_.worker.shm_capable() &&
         ShmDirectAllowed() && !offer_.rkey.empty();
}

// Chunk i is read from the file straight into slot i % slots of the
// requester's mapped buffer, then announced as kChunk {i, length}; from
// chunk `slots` on, the slot is reused once the requester's kCredit
// {i - slots} says it has written the slot out. No UCX call is made.
Task<Status> Pusher::SendDirect() {
  n_chunks_ = ChunkCount(src_.size, offer_.slot_bytes);
  const uint64_t slot = offer_.slot_bytes;
  while (next_ < n_chunks_) {
    if (!Credited(next_)) {
      if (Status st = co_await TakeCredit(); !st.ok()) co_return st;
      continue;
    }
    const uint64_t offset = next_ * slot;
    const size_t len = static_cast<size_t>(std::min(slot, src_.size - offset));
    Status st = PreadFully(src_.fd, target_->ptr() + (next_ % offer_.slots) * slot, len, offset);
    // The chunk's bytes are in place before the requester can learn of it.
    std::atomic_thread_fence(std::memory_order_release);
    if (st.ok()) st = session_.SendFrame(kChunkFrame, EncodeChunk(next_, len), Idle());
    if (!st.ok()) co_return Stop(st, true);
    Count(len, /*direct=*/true);
    ++next_;
  }
  target_->Done(true);
  target_.reset();
  co_return Status::OK();
}

// Chunk i goes from local slot i % kSlots to the requester's receive for
// tag (transfer id, i), once our slot's previous send completed and, from
// chunk `offer.slots` on, the requester's credit says the receive is posted.
Task<Status> Pusher::SendMessages() {
  Result<EndpointCache::Ref> ep = r_.endpoints.Get(args_.address);
  if (!ep.ok()) co_return Stop(ep.status(), true);
  ep_.emplace(std::move(ep).value());
  chunk_ = std::min<uint64_t>(offer_.slot_bytes, r_.send_pool.slot_bytes());
  n_chunks_ = ChunkCount(src_.size, chunk_);
  // A send buffer is only read by UCX; it rests only when a send of a
  // failed transfer could not be reclaimed (see Release). With every
  // buffer of the pool in use, the wake fd says when one is back;
  // meanwhile the requester says nothing unless it stops (kError) or is
  // gone, which ends the wait.
  for (;;) {
    Result<std::optional<BufferLease>> buf =
        r_.send_pool.TryAcquire(FailureRestMs(r_.options.idle_ms), *wake_);
    if (!buf.ok()) co_return Stop(buf.status(), true);
    if (buf->has_value()) {
      buf_.emplace(std::move(**buf));
      break;
    }
    if (Result<bool> c = TakeCreditNow(); !c.ok()) co_return c.status();
    if (Status w = co_await ForPeer(moved(), /*for_buffer=*/true); !w.ok()) co_return Fail(w);
  }
  // Over tcp, sends that did not fit the socket move only when the worker
  // is progressed: the progress thread keeps at it while ours are out.
  r_.worker.Hurry(+1);
  hurried_ = true;
  const uint64_t local_slot_bytes = r_.send_pool.slot_bytes();
  while (next_ < n_chunks_) {
    if (!Credited(next_)) {
      if (Status st = co_await TakeCredit(); !st.ok()) co_return st;
      continue;
    }
    void*& send = sends_[next_ % kSlots];
    Result<bool> sent = r_.worker.Test(&send, nullptr);
    if (!sent.ok()) co_return Stop(sent.status(), true);
    if (!*sent) {
      // A credit (or the requester's kError, or its hang-up) may come
      // meanwhile: taken now, so the session does not stay readable.
      Result<bool> c = TakeCreditNow();
      if (!c.ok()) co_return c.status();
      if (*c) continue;
      if (Status w = co_await ForPeer(moved()); !w.ok()) co_return Fail(w);
      continue;
    }
    const uint64_t offset = next_ * chunk_;
    const size_t len = static_cast<size_t>(std::min(chunk_, src_.size - offset));
    char* local = buf_->memory().base() + (next_ % kSlots) * local_slot_bytes;
    Status st = PreadFully(src_.fd, local, len, offset);
    if (!st.ok()) co_return Stop(st, true);
    Result<void*> r = r_.endpoints.StartSend(ep_->get(), local, len,
                                             ChunkTag(offer_.transfer_id, next_), wake_.get());
    if (!r.ok()) co_return Stop(r.status(), true);
    send = *r;
    Count(len, /*direct=*/false);
    ++next_;
  }
  for (void*& s : sends_) {
    for (;;) {
      Result<bool> sent = r_.worker.Test(&s, nullptr);
      if (!sent.ok()) co_return Stop(sent.status(), true);
      if (*sent) break;
      Result<bool> c = TakeCreditNow();
      if (!c.ok()) co_return c.status();
      if (*c) continue;
      if (Status w = co_await ForPeer(moved()); !w.ok()) co_return Fail(w);
    }
  }
  // A completed send may not have arrived yet: the requester's credit for
  // the last chunk says it has them all, so what we send on the session
  // next (the fetch verdict) cannot overtake them.
  while (credits_ < EarlyCredits() + 1) {
    if (Status st = co_await TakeCredit(); !st.ok()) co_return st;
  }
  buf_->MarkOk();
  Release();
  co_return Status::OK();
}

Task<Status> Pusher::TakeCredit() {
  for (;;) {
    Result<bool> c = TakeCreditNow();
    if (!c.ok()) co_return c.status();
    if (*c) co_return Status::OK();
    if (Status w = co_await ForPeer(moved()); !w.ok()) co_return Fail(w);
  }
}

Result<bool> Pusher::TakeCreditNow() {
  uint16_t type = 0;
  Result<bool> got = RecvNow(&type);
  if (!got.ok()) return Stop(got.status().Annotate("waiting for a credit"), false);
  if (!*got) return false;
  if (type == kErrorFrame) return Stop(DecodeErrorFrame(frame_, "requester"), false);
  const uint64_t want = CreditIndex();
  Result<uint64_t> credit = DecodeCredit(frame_);
  if (type != kCreditFrame || !credit.ok() || *credit != want)
    return Stop(
        Status(DYAD_RC_BADUNPACK, "unexpected frame instead of credit " + std::to_string(want)),
        true);
  ++credits_;
  return true;
}

Status Pusher::Stop(const Status& st, bool tell_requester) {
  const Status why = st.Annotate(what_ + " (sent " + std::to_string(stats_.bytes) + " of " +
                                 std::to_string(src_.size) + " bytes)");
  Release();
  return tell_requester ? TellAndBreakSession(session_, kErrorFrame, why)
                        : BreakSession(session_, why);
}

void Pusher::Release() {
  if (hurried_) r_.worker.Hurry(-1);
  hurried_ = false;
  target_.reset();  // not Done(true): the requester's buffer may be half written
  if (!ep_) {
    buf_.reset();
    return;
  }
  const bool pending = std::any_of(sends_.begin(), sends_.end(), [](void* s) { return s; });
  if (pending) {
    r_.endpoints.Evict(args_.address, ep_->get());
    ep_->Release();
    bool reclaimed = true;
    for (void*& send : sends_) reclaimed = r_.worker.Cancel(&send) && reclaimed;
    if (reclaimed && buf_) buf_->MarkOk();
  } else if (buf_) {
    buf_->MarkOk();  // nothing of ours reads it any more
  }
  buf_.reset();
  ep_.reset();
}

}  // namespace

Task<Status> PushFile(Resources& r, Channel& session, const FileSource& src,
                      std::string request_args, TransferStats* stats, TransferWaits& waits) {
  *stats = TransferStats();
  Pusher push(r, session, src, std::move(request_args), *stats, waits);
  co_return co_await push.Run();
}

}  // namespace dyad::ucx
