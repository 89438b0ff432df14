// auth.h: mutual authentication of the TCP links between DYAD services.
//
// Every service of a cluster shares one secret (a file readable only by the
// job's user, or an environment variable). On connect, the accepting side
// sends a random challenge; the connecting side answers with
// HMAC-SHA256(secret, challenge) and its own challenge, which the accepting
// side answers in turn. A peer without the secret is refused with
// DYAD_RC_AUTH before it can send any request. With an empty secret the
// handshake still runs (and interoperates) but proves nothing; services warn
// about that at startup. Thread-safe (immutable after construction).
#pragma once

#include <cstdint>
#include <string>

#include "common/net.h"
#include "common/status.h"

namespace dyad {

struct PeerIdentity {
  uint32_t rank = 0;
  uint64_t incarnation = 0;
};

class Authenticator {
 public:
  explicit Authenticator(std::string secret) : secret_(std::move(secret)) {}
  bool has_secret() const { return !secret_.empty(); }

  // Accepting side. `self` is sent to the peer; the peer's identity is returned.
  Status Accept(Channel& ch, const PeerIdentity& self, Deadline deadline,
                PeerIdentity* peer) const;
  // Connecting side.
  Status Connect(Channel& ch, const PeerIdentity& self, Deadline deadline,
                 PeerIdentity* peer) const;

 private:
  std::string Mac(const std::string& label, const std::string& nonce) const;
  std::string secret_;
};

// Reads the cluster secret: from `file` when non-empty (must not be readable
// by group or others), else from the environment (DYAD_SECRET_FILE, then
// DYAD_SECRET). Returns "" when none is configured.
Result<std::string> LoadClusterSecret(const std::string& file);

// Fills `len` bytes with cryptographically random data.
Status RandomBytes(void* buf, size_t len);

}  // namespace dyad
