// tcp_receive.h (internal to the tcp transport): the requester's side of a
// tcp fetch as PullOps (transport.h), one per session protection:
//  * StreamPull, unprotected: exactly `size` raw bytes, spliced socket ->
//    pipe -> sink (no copy through user space) or received into a buffer of
//    at most options.chunk_size bytes where splice is unavailable;
//  * SealedPull, protected: sealed kFileData frames, each verified (and
//    decrypted) as it streams through a buffer of kSealedReadBytes.
// Each Step reads only what the socket holds (MSG_DONTWAIT, non-blocking
// splice) and keeps its place (bytes landed, the partial frame), so the
// same code serves Transport::Pull (which polls between steps) and a
// service that parks the request while the owner is silent.
#pragma once

#include <cstdint>
#include <memory>

#include "common/net.h"
#include "transport/transport.h"

namespace dyad {
namespace tcp_internal {

std::unique_ptr<PullOp> MakeStreamPull(Channel& ch, uint64_t size, int sink_fd,
                                       const TransportOptions& options, TransferStats* stats);
std::unique_ptr<PullOp> MakeSealedPull(Channel& ch, uint64_t size, int sink_fd,
                                       const TransportOptions& options, TransferStats* stats,
                                       size_t read_bytes);

// "received GOT of SIZE bytes", for error messages.
std::string Progress(uint64_t got, uint64_t size);

}  // namespace tcp_internal
}  // namespace dyad
