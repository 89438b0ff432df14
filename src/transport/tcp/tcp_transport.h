// tcp_transport.h: the "tcp" transport, which streams file bytes on the
// fetch session itself (DTL modes TCP and FLUX_RPC).
//
// How the bytes travel depends on the session's protection (common/seal.h):
//  * protected (integrity or encrypt, the default): the owner reads the file
//    in chunks of at most kSealedChunkBytes and sends each as a sealed
//    kFileData frame; the requester verifies (and decrypts) every chunk
//    before writing it. An altered, replayed, reordered or missing chunk
//    fails the transfer with DYAD_RC_AUTH, so nothing is placed.
//  * unprotected (a trusted fabric, LinkProtection::kNone): right after the
//    FetchReply frame the owner writes exactly `size` raw bytes with
//    sendfile(2); the requester lands them with splice(2) (socket -> pipe ->
//    file, no user-space copy), or with recv into a buffer of at most
//    options.chunk_size bytes where splice is unavailable.
// Both ends know the size from the FetchReply, so a short stream is always
// detected (the owner fails and shuts the session down; the requester sees
// the peer close before `size` bytes). Any failure marks the session broken,
// since the byte stream is then out of step with the framing.
// options.idle_ms bounds the time without progress on either side (<= 0: no
// bound). Pushing blocks SIGPIPE on the sending thread (WireQueue), so a
// vanished peer is an error, never a signal, whatever the process's
// disposition. QueueChunk hands the owner one chunk at a time, which it
// sends as the requester takes it (the file server, or Transport::Push);
// the requester's side is Pull (tcp_receive.h).
//
// Threading: a TcpTransport holds only immutable options; one instance is
// shared by every concurrent transfer of a service. Each call uses only its
// own session, which the caller must not use from another thread meanwhile.
#pragma once

#include <cstdint>
#include <string>

#include "transport/transport.h"

namespace dyad {

class TcpTransport final : public Transport {
 public:
  explicit TcpTransport(const TransportOptions& options);

  std::string name() const override { return "tcp"; }

  // The receiving side (tcp_receive.h). The owner's side is
  // Transport::Push: it sends what QueueChunk queues (the file server
  // gathers the first chunk with its reply and verdict).
  Task<Status> Pull(Channel& session, uint64_t size, const std::string& reply_args, int sink_fd,
                    TransferStats* stats, TransferWaits& waits) override;
  Status QueueChunk(Channel& session, const FileSource& src, uint64_t* offset,
                    WireQueue* out) override;
  bool queues_chunks() const override { return true; }

  // Transfers of at most this many bytes are received with one small recv
  // buffer instead of splice: setting up a pipe costs more than it saves.
  static constexpr uint64_t kSpliceThreshold = 64u << 10;
  // Largest file chunk per sealed frame on a protected session (smaller
  // when options.chunk_size is): big enough that the per-record cost
  // vanishes, small enough that both ends keep the link busy.
  static constexpr size_t kSealedChunkBytes = 1u << 20;
  // Receive buffer of the sealed path: chunks stream through it.
  static constexpr size_t kSealedReadBytes = 256u << 10;

 private:
  size_t SealedChunk() const;
};

}  // namespace dyad
