// peer_rpc.h: one request to another service and its reply, on the runtime.
//
// Takes a session to the rank (DialPeer: pooled, or dialled without holding
// a thread), sends the request, and waits for the reply frame: a request
// that must hear from another service (a version notice before a
// publication returns) holds no thread while that service is slow or
// silent.
//
// Bounds: the session and the reply together `timeout_ms`. A session that
// answered (even "no") is returned to the pool; one that timed out, broke
// or was abandoned is shut down.
#pragma once

#include <cstdint>
#include <string>

#include "proto/protocol.h"
#include "service/peer_waits.h"
#include "service/peers.h"

namespace dyad {

// Waits for the reply frame of a request sent on `session`: its status,
// and its body on success. `*replied` (may be null) says whether a frame
// came (else the status says why not). No frame by `deadline` is
// DYAD_RC_TIMEOUT with `timeout_what`; the Stop ends it with its reason
// and shuts the session down. Either leaves the session marked broken.
// `just_sent`: the request has only now left, so its reply cannot be in
// the socket yet; the first look is then the wait (which still sees bytes
// already there), not a read that would find nothing.
Task<Status> AwaitReply(Channel& session, Deadline deadline, PeerWaits& waits,
                        const std::string& timeout_what, std::string* body, bool* replied,
                        bool just_sent = false);

// The reply's body, or its status (or why there is none).
Task<Result<std::string>> PeerRpc(PeerDirectory& peers, uint32_t rank, MsgType type,
                                  const std::string& request, int64_t timeout_ms, PeerWaits& waits);

}  // namespace dyad
