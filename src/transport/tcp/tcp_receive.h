// tcp_receive.h (internal to the tcp transport): the requester's side of a
// tcp fetch, one coroutine per session protection:
//  * PullStream, unprotected: exactly `size` raw bytes, spliced socket ->
//    pipe -> sink (no copy through user space) or received into a buffer of
//    at most options.chunk_size bytes where splice is unavailable;
//  * PullSealed, protected: sealed kFileData frames, each verified (and
//    decrypted) as it streams through a buffer of `read_bytes`.
// Each reads what the socket holds (MSG_DONTWAIT, non-blocking splice) and
// waits for more through `waits` (no thread held); no bytes for
// options.idle_ms, a failure or the operation's Stop break the session.
#pragma once

#include <cstdint>
#include <string>

#include "common/net.h"
#include "transport/transport.h"

namespace dyad {
namespace tcp_internal {

Task<Status> PullStream(Channel& ch, uint64_t size, int sink_fd, const TransportOptions& options,
                        TransferStats* stats, TransferWaits& waits);
Task<Status> PullSealed(Channel& ch, uint64_t size, int sink_fd, const TransportOptions& options,
                        TransferStats* stats, TransferWaits& waits, size_t read_bytes);

// "received GOT of SIZE bytes", for error messages.
std::string Progress(uint64_t got, uint64_t size);

}  // namespace tcp_internal
}  // namespace dyad
