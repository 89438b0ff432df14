// safety.h: the safe defaults every dyad-service checks before it serves.
//
// * A service that listens without any credential would let every host
//   that reaches its port (on loopback: every local user) fetch any file of
//   its producer directory and, on the root, read and write the metadata
//   store. It refuses to start that way, on loopback too, unless the
//   operator says --insecure (then it warns, once).
// * The directory holding the service's Unix socket must belong to the
//   service's user and be closed to everyone else (mode 0700), or another
//   user could replace the socket and answer the service's clients.
// Pure checks on the file system and addresses; thread-safe.
#pragma once

#include <string>

#include "common/net.h"
#include "common/status.h"

namespace dyad {

// DYAD_RC_PERM, with the reason and the way out, when `has_credential` and
// `insecure` are both false (whatever `listen` is). Logs a warning when it
// lets a credential-less service start.
Status CheckListenPolicy(const SocketAddress& listen, bool has_credential, bool insecure);

// Makes sure `dir` can safely hold a service socket: creates it (mode 0700)
// when missing; refuses (DYAD_RC_PERM) a symlink, a non-directory, one
// owned by another user, or one group or others can access.
Status PrepareSocketDirectory(const std::string& dir);

}  // namespace dyad
