// ofi_transport.h: the "ofi" transport (DTL mode OFI; MARGO maps to it):
// files move by one-sided RMA reads that the requester issues with
// libfabric from the owner's registered memory into its own, the pull
// model upstream's Margo backend used, on whatever fabric libfabric
// reaches (tcp;ofi_rxm, shm, verbs;ofi_rxm, cxi, efa, psm2/opx, ...).
//
// Protocol (ofi_wire.h has the encodings). Files of at most
// kOfiInlineMaxBytes travel inside the FetchReply. Larger ones:
//   requester PrepareRequest: its provider, host and receive slots.
//   owner ReplyArgs: its provider, host, endpoint name, instance and slots.
//   requester Pull:  takes a receive buffer, then sends kReady.
//   owner Push:      waits for kReady, then takes a send buffer (so a transfer
//                    holding send memory always has its receive memory:
//                    transfers waiting for buffers never wait in a circle);
//                    for chunk i (chunk = the smaller slot, window = the
//                    fewer slots): waits for kCredit {i - window} when
//                    i >= window, preads the chunk into its registered slot
//                    i % window and announces kChunk {i, length, remote
//                    address, key}; finally waits for kDone.
//   requester Pull:  reads each announced chunk with fi_read into its own
//                    slot i % window (up to `window` reads in flight),
//                    writes completed chunks to the sink in order, returns
//                    each slot with kCredit, and ends with kDone.
// Memory is bounded by the pools (ofi_pool.h), never by the file size.
// Every wait is bounded by options.idle_ms without progress. Any failure
// sends kError when it can and shuts the session down, so the peer fails
// at once; a peer that dies shows up as a closed session or a failed read
// (a clear dyad_rc_t: CONNLOST, TIMEOUT, BADFETCH, ...), never as a hang.
// The requester's output is the caller's temporary, which it discards.
//
// Resources: one OfiFabric (ofi_fabric.h) and two pools per transport
// instance (one per service), created by Warm() or on first use, kept
// until destruction. The provider is chosen from $DYAD_OFI_PROVIDER,
// $FI_PROVIDER and $DYAD_OFI_DOMAIN (ofi_provider.h); Details() and
// Probe() say which and why.
//
// Waiting: no transfer holds a thread while it waits on its peer. Each
// end is one straight-line coroutine on the service's runtime (Pull in
// ofi_pull.cc, Push in ofi_push.cc; what they share in ofi_transfer.h):
// it takes the frames the session holds and the completions that arrived,
// and otherwise suspends in TransferWaits until the session or its wake
// fd (an event fd that our reads' completions, a freed pool buffer and a
// busy read worth retrying signal) is readable, its idle bound passes or
// its Stop fires (the requester hung up, the service stops). Tests and
// tools run the same coroutines through PullNow / PushNow.
//
// Threading: thread-safe; one instance serves every concurrent transfer of
// a service. A transfer's session is used only by its coroutine, which
// must not outlive the transport. Regions from Register() may outlive the
// transport object.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "common/thread_annotations.h"
#include "transport/ofi/ofi_pool.h"
#include "transport/ofi/ofi_provider.h"
#include "transport/transport.h"

namespace dyad {

class OfiTransport final : public Transport {
 public:
  explicit OfiTransport(const TransportOptions& options);
  ~OfiTransport() override;
  OfiTransport(const OfiTransport&) = delete;
  OfiTransport& operator=(const OfiTransport&) = delete;

  std::string name() const override { return "ofi"; }

  Result<std::string> PrepareRequest() override;
  Status Warm() override;
  std::string Details() const override;
  std::string Probe() const override;
  std::string SameHostOnly() const override;
  Result<std::string> ReplyArgs(const FileSource& src) override;
  // The two directions as coroutines (transport.h).
  Task<Status> Pull(Channel& session, uint64_t size, const std::string& reply_args, int sink_fd,
                    TransferStats* stats, TransferWaits& waits) override;
  Task<Status> Push(Channel& session, const FileSource& src, const std::string& request_args,
                    TransferStats* stats, TransferWaits& waits) override;
  // Registers memory for remote reads (tests and tools; transfers use the
  // pools). The region may outlive this object.
  Result<std::unique_ptr<OfiRegion>> Register(void* addr, size_t len);
  // Buffers of both pools lent to transfers now (0 before the first
  // transfer): every transfer gives its buffers back when it ends.
  int BuffersInUse() const;

  // Slots per registered buffer: up to this many reads of one transfer are
  // in flight (a buffer is 2 x options.chunk_size bytes).
  static constexpr int kSlots = 4;
  // Buffers per pool when $DYAD_OFI_POOL_BUFFERS is unset or invalid.
  static constexpr int kDefaultPoolBuffers = 4;

 private:
  struct Engine;
  Result<Engine*> Start() const;
  Status CheckPeer(const Engine& e, const std::string& provider, const std::string& host,
                   const char* who) const;

  const OfiConfig config_;
  const int pool_buffers_;
  mutable Mutex start_mu_;
  mutable std::unique_ptr<Engine> engine_ GUARDED_BY(start_mu_);
};

}  // namespace dyad
