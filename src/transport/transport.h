// transport.h: the data transport layer (DTL) interface.
//
// A fetch is a short conversation between the requesting service and the
// owner service over an authenticated Channel (the "session"):
//   requester: PrepareRequest() -> transport_args sent in the FetchRequest
//   owner:     validates the path, opens the file, replies FetchReply
//              (size, version, its own ReplyArgs()), then moves the file:
//              Push(), or QueueChunk() for transports that stream on the
//              session (queues_chunks())
//   requester: Pull() lands exactly `size` bytes into the sink fd.
// The session carries control traffic; each transport decides how data
// moves: "tcp" streams it on the session itself (sendfile on the sender,
// bounded buffers on the receiver); "local" passes only the owner's path and
// copies within the node; "ucx" moves chunks as messages into the
// requester's registered memory (or writes them there directly on one host)
// and uses the session for small control frames; "ofi" reads the owner's
// registered memory with one-sided RMA, keys exchanged in transport_args.
// Nothing transport-specific leaks into the service.
//
// Every transfer is written once, per direction, as a straight-line
// coroutine on the service's runtime (common/runtime.h): its waits on the
// peer go through TransferWaits (transfer_waits.h) and hold no thread.
// Tests and tools run the same coroutines with PullNow / PushNow. A new
// transport writes:
//   * PrepareRequest / ReplyArgs: what each end tells the other;
//   * Pull: the requester's side;
//   * Push: the owner's side, or, for a transport whose bytes are framed on
//     the session, QueueChunk + queues_chunks() instead;
//   * its row (caps, selectors, settings) in its folder's row.cc.
//
// Both ends bound every wait (no progress for `idle_ms` is an error,
// IdleBound), end at once when the operation's Stop fires, and never hold a
// whole file in memory. A Transport is shared by all concurrent transfers
// of a service and must be thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/backend.h"
#include "common/net.h"
#include "common/status.h"
#include "common/time.h"
#include "common/wire_queue.h"
#include "transport/transfer_waits.h"

namespace dyad {

// An open, validated file on the owner side.
struct FileSource {
  int fd = -1;
  uint64_t size = 0;
  uint64_t version = 0;
  std::string path;  // absolute path (for logs)
  // Where it was opened (root + upath, beneath which it was resolved) and
  // what it is (device and inode): a same-node requester opens it again
  // beneath the same root and must find the same file.
  std::string root;
  std::string upath;
  uint64_t dev = 0;
  uint64_t ino = 0;
};

struct TransferStats {
  uint64_t bytes = 0;
  uint64_t chunks = 0;
  // Of `bytes`, those written straight into the peer's memory (a same-host
  // one-sided path, e.g. UCX over shared memory).
  uint64_t direct_bytes = 0;
};

struct TransportOptions {
  size_t chunk_size = 4u << 20;  // receive buffer / pipeline chunk
  int64_t idle_ms = 60000;       // no progress for this long fails the transfer
};

// The bound of a transfer's wait without progress: `idle_ms` from now;
// never for idle_ms <= 0 (TransportOptions::idle_ms).
Deadline IdleDeadline(int64_t idle_ms);

// A failed transfer leaves its session out of step with the protocol, so
// the session can never be reused: BreakSession marks it broken and shuts
// it down, so the peer fails at once instead of after its own idle bound,
// and returns `st`. TellAndBreakSession first tells the peer why, in one
// best-effort frame of the transport's `error_frame` type (code and
// message, common/wire.h encoding; the session may already be gone).
Status BreakSession(Channel& session, const Status& st);
Status TellAndBreakSession(Channel& session, uint16_t error_frame, const Status& st);

class Transport {
 public:
  virtual ~Transport() = default;
  virtual std::string name() const = 0;
  // The capabilities of this transport's row (common/backend.h).
  TransportCaps caps() const;
  const TransportOptions& options() const { return options_; }

  // Requester: bytes to put in FetchRequest::transport_args.
  virtual Result<std::string> PrepareRequest() { return std::string(); }

  // Acquires what the transport needs before its first transfer (e.g. a
  // UCX context and worker), so that the first fetch does not pay for it.
  // Optional: transfers acquire it on demand otherwise.
  virtual Status Warm() { return Status::OK(); }

  // One line for operators (`dyad status`): how this transport moves data
  // here, e.g. which paths its library chose. "" when there is nothing to add.
  virtual std::string Details() const { return std::string(); }

  // Non-empty when this transport, as started, reaches only services on
  // this host (libfabric's shm provider): says why, for the service to
  // refuse peers of other hosts at start. "" otherwise or when not started.
  virtual std::string SameHostOnly() const { return std::string(); }

  // What this transport would use on this host, found without starting it
  // (`dyad info`), e.g. which provider a fabric library offers and why.
  // "" when there is nothing to say.
  virtual std::string Probe() const { return std::string(); }

  // Owner: transport_args to put into the FetchReply (before the push).
  virtual Result<std::string> ReplyArgs(const FileSource& src) {
    (void)src;
    return std::string();
  }

  // --- The two directions, each written once as a coroutine. ---

  // Requester, after receiving the FetchReply: lands `size` bytes in
  // `sink_fd` (opened for writing at offset 0). `*stats` is reset first and
  // counts what moves. Every wait on the owner goes through `waits`: no
  // progress for options().idle_ms fails it with DYAD_RC_TIMEOUT, the
  // waits' Stop with its reason. A failure that leaves the session out of
  // step breaks it (BreakSession). `session`, `stats` and `waits` must
  // outlive the task.
  virtual Task<Status> Pull(Channel& session, uint64_t size, const std::string& reply_args,
                            int sink_fd, TransferStats* stats, TransferWaits& waits) = 0;

  // Owner, after sending the FetchReply: moves `src` to the requester;
  // `request_args` are the requester's transport_args. Waits and failures
  // as for Pull. For a transport that frames the file on the session
  // (queues_chunks()) this base version sends QueueChunk's chunks as the
  // requester takes them (a service's file server queues them itself,
  // gathered with its reply); every other transport writes its own.
  virtual Task<Status> Push(Channel& session, const FileSource& src,
                            const std::string& request_args, TransferStats* stats,
                            TransferWaits& waits);

  // Owner, transports that frame the file on the session (queues_chunks()):
  // queues the next chunk of `src` from `*offset` on (wire-ready: framed and
  // sealed) and advances `*offset`. The caller sends the queue as the
  // requester takes it (common/wire_queue.h), so a requester that stops
  // reading holds no thread, and a small file goes out with the reply and
  // the verdict in one send; then it queues the next chunk. Chunks must be
  // sent in the order they were queued. Errors mark the session broken.
  // Others: DYAD_RC_NOTSUP (Push).
  virtual Status QueueChunk(Channel& session, const FileSource& src, uint64_t* offset,
                            WireQueue* out) {
    (void)session, (void)src, (void)offset, (void)out;
    return Status(DYAD_RC_NOTSUP, name() + " sends only whole files (Push)");
  }
  virtual bool queues_chunks() const { return false; }

  // --- For callers outside a runtime (tests, tools): Pull and Push run to
  // their end on this thread's behalf (RunTransfer). `stats` may be null.
  Status PullNow(Channel& session, uint64_t size, const std::string& reply_args, int sink_fd,
                 TransferStats* stats);
  Status PushNow(Channel& session, const FileSource& src, const std::string& request_args,
                 TransferStats* stats);

 protected:
  explicit Transport(const TransportOptions& options) : options_(options) {}

  const TransportOptions options_;
};

// Creates a transport by name or DTL mode (any case, aliases accepted)
// from its row; unknown or not compiled-in names give DYAD_RC_BADDTLMODE
// saying which modes exist here or which build switch adds the backend.
Result<std::unique_ptr<Transport>> CreateTransport(const std::string& name,
                                                   const TransportOptions& options);
// Canonical transport name for a DTL mode ("FLUX_RPC" -> "tcp").
Result<std::string> TransportNameForMode(const std::string& dtl_mode);
// Names of the transports compiled in.
std::vector<std::string> TransportNames();
// The row of the transport used between services on one node (the one
// whose capabilities say same_node_only).
Result<const BackendRow*> SameNodeTransportRow();

// A backend's source defines its factory with this (inside namespace dyad);
// registry.cc finds it through CMake's list of built backends.
#define DYAD_DEFINE_TRANSPORT_FACTORY(name, Class)                                       \
  Result<std::unique_ptr<Transport>> CreateTransport_##name(const TransportOptions& o) { \
    return std::unique_ptr<Transport>(std::make_unique<Class>(o));                       \
  }

}  // namespace dyad
