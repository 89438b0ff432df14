// fetcher.h: one fetch conversation with the service that owns a file.
//
// FetchBatch() asks one owner for many small files in one kFetchBatch and
// hands each answer to the caller as it arrives (prefetch).
//
// Fetch() is one fetch of one file, a coroutine on the service's runtime
// (transport.h has the conversation): take a pooled (or new) authenticated
// session to the owner (DialPeer), send the FetchRequest with the
// transport's arguments, open the sink while the owner works on it,
// receive the FetchReply, let the transport's
// Pull land the bytes in the sink, receive the owner's
// verdict (the file did not change while it was sent). None of its waits
// holds a thread. It decides nothing about where the file goes or whether
// it is needed (that is Placement's job): it moves bytes and reports what
// happened.
//
// Bounds: the session (connect and handshake, or the wait for another's
// dial) and the reply together --rpc-timeout, the verdict --rpc-timeout;
// the bytes the transport's idle limit without progress. Errors name the
// file and the owner; `retryable` says the session died before the owner
// answered (a pooled session that outlived its peer: a fresh one may well
// succeed). Thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "proto/protocol.h"
#include "service/peer_waits.h"
#include "service/peers.h"
#include "service/transfers.h"
#include "transport/transport.h"

namespace dyad {

struct FetchOutcome {
  uint64_t version = 0;  // the owner's version of what it sent
  uint64_t bytes = 0;
  uint32_t mode = 0644;  // the owner's permission bits
  // The session died before the owner answered (a pooled session that
  // outlived its peer): a fresh session may well succeed.
  bool retryable = false;
};

struct FetchResult {
  Status status;
  FetchOutcome outcome;
};

class Fetcher {
 public:
  // `transfers` (may be null) lists each fetch while its bytes move.
  Fetcher(PeerDirectory* peers, int64_t rpc_timeout_ms, TransferRegistry* transfers = nullptr)
      : peers_(peers), rpc_timeout_ms_(rpc_timeout_ms), transfers_(transfers) {}

  // Opens the file the bytes go to; called once per fetch, after the
  // request is sent (so that creating it overlaps the owner's work). An
  // error ends the fetch with it.
  using SinkFn = std::function<Result<int>()>;

  // A fetch of `rec` from its owner with `transport` into the file
  // `open_sink` opens (see above), its waits through `waits`.
  Task<FetchResult> Fetch(const FileRecord& rec, Transport& transport, const SinkFn& open_sink,
                          PeerWaits& waits);

  // Asks `owner` for every file of `recs` (files of at most `max_inline`
  // bytes) in one request; `on_part(i, status, part)` is called for item i
  // in order, with the file's bytes on success. An error return means the
  // items from `*answered` on got no answer (DYAD_RC_NOTSUP: the owner
  // predates kFetchBatch); the caller fetches those one by one.
  using PartFn = std::function<void(size_t i, const Status& st, FetchBatchPart* part)>;
  Task<Status> FetchBatch(uint32_t owner, const std::vector<const FileRecord*>& recs,
                          uint64_t max_inline, const PartFn& on_part, size_t* answered,
                          PeerWaits& waits);

 private:
  PeerDirectory* peers_;
  const int64_t rpc_timeout_ms_;
  TransferRegistry* transfers_;
};

}  // namespace dyad
