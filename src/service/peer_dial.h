// peer_dial.h: taking a session to another service, on the runtime.
//
// A pooled session is taken at once. Otherwise the session is dialled
// without holding a thread: a non-blocking connect that waits for the
// socket to become writable, then the connecting side of the handshake
// (ClientHandshake), whose waits are for the socket to become readable. An
// owner that accepts connections but never sends its challenge (hung,
// stopped), or an address whose SYNs are dropped, holds no thread of the
// requesting service.
//
// One dial per rank at a time (PeerDirectory::JoinDial): a caller that
// finds a dial to its rank in flight waits for that dial's outcome (on the
// flight's eventfd). A failed dial fails its waiters at once with its
// error; a successful one lets them go on (a pooled session, or a dial of
// their own, without waiting again: the owner answers); a dial abandoned
// by its requester lets one of them lead the next. Errors keep
// PeerDirectory's wording (FinishDial). A Stop that fires ends the dial
// with its reason.
//
// Bounds: the connect and the handshake together min(deadline,
// --rpc-timeout); the wait for another's dial the caller's deadline, or
// the end of that dial when it comes at most 250 ms later.
#pragma once

#include <cstdint>
#include <memory>

#include "common/net.h"
#include "service/peer_waits.h"
#include "service/peers.h"

namespace dyad {

// The dial itself: connects to `addr` and authenticates (the connecting
// side of the handshake) by `deadline`; `*peer` is who answered.
// `*stopped` is set when the Stop ended it (the status is its reason).
Task<Result<std::unique_ptr<Channel>>> ConnectPeer(PeerDirectory& peers, const SocketAddress& addr,
                                                   Deadline deadline, PeerWaits& waits,
                                                   PeerIdentity* peer, bool* stopped);

Task<Result<std::unique_ptr<Channel>>> DialPeer(PeerDirectory& peers, uint32_t rank,
                                                Deadline deadline, PeerWaits& waits);

}  // namespace dyad
