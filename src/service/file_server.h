// file_server.h: the owner's side of a fetch.
//
// Serves kFetch and kFetchBatch requests from authenticated peer services: only regular
// files beneath this service's producer directory (OpenBeneath: no "..",
// no absolute paths, no symlink out), read under the producer's shared lock
// so a file being written is never served, with the transport the
// requester named. Registered on the peer link by the service. Thread-safe.
#pragma once

#include <sys/stat.h>

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "common/fsutil.h"
#include "common/wire_queue.h"
#include "proto/router.h"
#include "service/peer_waits.h"
#include "service/stats.h"
#include "service/transfers.h"
#include "service/transports.h"

namespace dyad {

class FileServer {
 public:
  // `transfers` (may be null) lists each file while it is being sent.
  FileServer(uint32_t rank, std::string prod_real, int64_t rpc_timeout_ms, TransportSet* transports,
             ServiceStats* stats, TransferRegistry* transfers = nullptr)
      : rank_(rank),
        prod_real_(std::move(prod_real)),
        root_(prod_real_),
        rpc_timeout_ms_(rpc_timeout_ms),
        transports_(transports),
        stats_(stats),
        transfers_(transfers) {}

  // Registers the fetch handlers; without `batches` this owner answers
  // kFetchBatch as one from before batched fetches did (it serves no such
  // request), and requesters fall back to one fetch per file.
  void Route(RequestRouter& router, bool batches = true);
  // Called with (upath, requester rank) for each fetch about to be served
  // (versions.h records who holds copies). Set before serving starts.
  void SetOnServe(std::function<void(const std::string&, uint32_t)> fn) {
    on_serve_ = std::move(fn);
  }
  // The file a publication of `upath` names, looked at as a fetch of it
  // would open it: beneath the producer directory (DYAD_RC_PERM when a
  // symlink or ".." leads out of it) and a regular file (DYAD_RC_BADFIO
  // otherwise). Opened O_PATH: a FIFO or device there is not opened.
  Result<struct stat> StatPublished(const std::string& upath);
  // kFetch: a task on the runtime, which waits for the requester (room,
  // its offer or credits) and for a producer's lock without a thread.
  Task<void> HandleFetch(RequestContext& ctx, const std::string& payload);
  // kFetchBatch (file_server_batch.cc): small files inline, one reply each.
  Task<void> HandleFetchBatch(RequestContext& ctx, const std::string& payload);

  // A response whose requester has taken no bytes for this long counts as
  // parked for room (fetch.parked_for_room), and what it holds unsent is
  // charged against kParkedOutputCap.
  static constexpr int64_t kParkAfterMs = 100;

  // What sessions that stop reading can hold (docs/security.md). Every
  // response has at most one frame beyond kGatheredFileBytes in memory
  // (more is queued only while less is: a sealed chunk of a file, or one
  // reply of a batch), and a batch's inline files are at most this large
  // whatever the request asks (larger ones are answered DYAD_RC_NOTSUP and
  // fetched alone, in chunks).
  static constexpr uint64_t kMaxServedInline = 256u << 10;
  // The reply bytes all responses parked for room (their requester took
  // nothing for kParkAfterMs) may hold in memory together. A response
  // that would take the total past it is not parked: its session is
  // closed, with the reason logged (counter fetch.closed_for_output).
  static constexpr uint64_t kParkedOutputCap = 32u << 20;
  // The bytes parked responses hold now (`dyad status`: fetch.unsent_bytes).
  uint64_t unsent_bytes() const { return parked_bytes_.load(std::memory_order_relaxed); }

 private:
  // Every response (replies, file bytes, verdicts) is queued and sent as
  // the requester takes it, so that one that stops reading holds no thread.
  struct Sending;
  struct Batch;
  // What a response's fill step did: queued something (call again while
  // the queue gathers), must wait until the queue is sent, queued the end,
  // or must wait for the requester through the response's `peer` step.
  enum class Fill { kQueued, kFlush, kEnd, kPeer };
  // A response in the making: what is queued for the requester, how to
  // queue more, and what to do once it is all sent or the session failed.
  struct Response {
    WireQueue out;
    std::string captured;  // replies sent while preparing it
    std::function<Result<Fill>(RequestContext&, WireQueue&)> fill =
        [](RequestContext&, WireQueue&) { return Result<Fill>(Fill::kEnd); };
    std::function<void(RequestContext&, const Status&)> done = [](RequestContext&, const Status&) {
    };
    // For kPeer: the exchange with the requester that the transport
    // drives itself (its offers, credits), run through `waits`.
    std::function<Task<void>(RequestContext&, PeerWaits&)> peer;
    bool ended = false;    // fill said kEnd
    uint64_t charged = 0;  // of parked_bytes_, while parked for room
    std::string locked;    // the prepare found this file locked by its producer
  };
  // Counts `r`'s unsent memory in parked_bytes_; false when that would
  // pass kParkedOutputCap. Uncharge gives it back (idempotent).
  bool Charge(Response& r);
  void Uncharge(Response& r);
  // Queues one reply frame (sealed as the session seals) on `out`.
  void QueueReply(Channel& ch, WireQueue& out, const Status& st, const std::string& body);
  // Prepares a response to `payload` (its first replies are captured;
  // again once its file is no longer locked by its producer), then sends it.
  using Prepare = void (FileServer::*)(RequestContext&, const std::string&, Response*);
  Task<void> Respond(RequestContext& ctx, const std::string& payload, Prepare prepare);
  // Sends `r`, filling its queue as it goes and waiting (no thread held)
  // for the requester to take it, or for r's peer step (counting
  // `fetch.parked_for_peer` when that lasts); ends with r's done step.
  Task<void> Send(RequestContext& ctx, std::shared_ptr<Response> r);
  // A fetch's checks and first reply; on success sets r's steps.
  void PrepareFetch(RequestContext& ctx, const std::string& payload, Response* r);
  Result<Fill> FillFetch(RequestContext& ctx, Sending& s, WireQueue& out);
  // The transport's Push of `s`, run to its end (kPeer).
  Task<void> Push(RequestContext& ctx, Sending& s, PeerWaits& waits);
  void FetchDone(RequestContext& ctx, Sending& s, const Status& why);
  void PrepareBatch(RequestContext& ctx, const std::string& payload, Response* r);
  Result<Fill> FillBatch(RequestContext& ctx, Batch& b, WireQueue& out);
  void BatchDone(RequestContext& ctx, Batch& b, const Status& why);
  void Refuse(RequestContext& ctx, const std::string& upath, const Status& st);
  Status Stale(const std::string& upath, const char* when) const;
  // Takes the shared lock if the producer holds none (true), or says the
  // producer holds it (false).
  static bool TryShared(int fd);
  // Waits until the producer may have let `upath` go (it closed the file,
  // or `*pause_ms` passed, which then doubles up to a second); false at
  // `deadline` or when the request's Stop fires.
  Task<bool> WaitUnlocked(RequestContext& ctx, const std::string& upath, Deadline deadline,
                          int64_t* pause_ms);
  // One item of a batch: the whole file into `part`, or why not.
  Status ReadInline(RequestContext& ctx, const FetchBatchItem& item, uint64_t max_inline,
                    FetchBatchPart* part);
  // Registers an outgoing transfer for `dyad status` (progress from the
  // session when the transport streams the file there).
  TransferRegistry::Entry TrackSend(RequestContext& ctx, const std::string& upath,
                                    Transport& transport, uint64_t size);

  const uint32_t rank_;
  const std::string prod_real_;
  BeneathRoot root_;  // prod_real_, held open: where served files are opened
  const int64_t rpc_timeout_ms_;
  TransportSet* transports_;
  ServiceStats* stats_;
  std::function<void(const std::string&, uint32_t)> on_serve_;
  TransferRegistry* transfers_;
  std::atomic<uint64_t> parked_bytes_{0};
};

// Sends one reply frame (status + body) and counts errors.
void SendReply(Channel& ch, const Status& st, const std::string& body, int64_t timeout_ms,
               ServiceStats* stats);

}  // namespace dyad
