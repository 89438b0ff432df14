// auth.h: mutual authentication of the TCP links between DYAD services, and
// the keys that protect them afterwards.
//
// A service proves itself with one or two credentials (AuthConfig): the
// cluster's shared secret (a file readable only by the job's user), a MUNGE
// credential (munged vouches for the uid of the process, as on Flux and
// Slurm sites), or both. Both ends must be configured with the same set.
//
// The handshake (messages in common/handshake.h), on every new connection:
//   1. the accepting side sends a challenge: a fresh nonce, its identity,
//      its credential set, its link protection and an ephemeral X25519 key;
//   2. the connecting side answers with the same about itself plus its
//      proofs over the transcript hash T of both: HMAC-SHA256(secret,
//      "client" || T) and/or a MUNGE credential whose payload is
//      "client" || T and whose uid must be the accepting service's own;
//   3. the accepting side checks them and answers with its own proofs
//      ("server" || T), which the connecting side checks in turn.
// A peer without the credentials is refused with DYAD_RC_AUTH before it can
// send any request; before that, the Channel accepts only small frames.
//
// Session keys: HKDF-SHA256 over the X25519 shared secret concatenated with
// the cluster secret, salted with T, gives one AES-256-GCM key per
// direction (common/seal.h). The ephemeral exchange makes the keys secret
// even when MUNGE is the only credential (MUNGE authenticates, it does not
// give the two ends a shared secret), and new for every connection. The
// session then uses the stronger of the two ends' LinkProtection levels;
// the levels are part of T, so nobody in between can lower them.
//
// Without any credential the handshake still runs (the keys then resist
// eavesdropping but not an active man in the middle) and proves nothing;
// services refuse to listen beyond loopback that way unless told
// --insecure. Thread-safe (immutable after construction).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/net.h"
#include "common/seal.h"
#include "common/status.h"

namespace dyad {

struct PeerIdentity {
  uint32_t rank = 0;
  uint64_t incarnation = 0;
};

// How long a peer has to complete the handshake. Short: until then the
// connection is unauthenticated and holds one of the few handshake slots.
constexpr int64_t kHandshakeTimeoutMs = 5000;

// What an accepting side at its cap of handshakes in progress sends, in
// place of its challenge or verdict, to a connection it closes to make room
// or refuses for want of one (docs/security.md): a reply with
// DYAD_RC_CONNLOST and this message. The connecting side may dial again
// soon; DYAD's own does, with pauses, until its deadline.
inline constexpr char kHandshakeBusyMessage[] =
    "busy: too many connections in their handshake; dial again";
inline Status HandshakeBusy() { return Status(DYAD_RC_CONNLOST, kHandshakeBusyMessage); }
inline bool IsHandshakeBusy(const Status& st) {
  return st.code() == DYAD_RC_CONNLOST && st.message() == kHandshakeBusyMessage;
}

// A node-local credential service (MUNGE) that vouches for the uid of the
// process that made a credential. Implementations are thread-safe.
class CredentialService {
 public:
  struct Verified {
    std::string payload;
    uid_t uid = 0;
    gid_t gid = 0;
  };
  virtual ~CredentialService() = default;
  virtual std::string name() const = 0;
  // A credential carrying `payload`, verifiable on every node sharing the key.
  virtual Result<std::string> Encode(std::string_view payload) const = 0;
  // Checks `credential` (integrity, expiry, replay) and returns its content.
  virtual Result<Verified> Decode(std::string_view credential) const = 0;
};

struct AuthConfig {
  std::string secret;  // cluster secret ("" = not used)
  // MUNGE credentials (null = not used). The uid every peer's credential
  // must carry is this process's effective uid.
  std::shared_ptr<const CredentialService> munge;
  LinkProtection protection = LinkProtection::kIntegrity;
};

class Authenticator {
 public:
  explicit Authenticator(AuthConfig config);
  // The cluster secret only, integrity protection.
  explicit Authenticator(std::string secret);

  bool has_secret() const { return !cfg_.secret.empty(); }
  bool has_munge() const { return cfg_.munge != nullptr; }
  bool has_credential() const { return has_secret() || has_munge(); }
  uint8_t credentials() const;  // CredentialBits
  // "cluster secret", "MUNGE", "cluster secret + MUNGE" or "none".
  std::string credential_names() const;
  LinkProtection protection() const { return cfg_.protection; }
  const AuthConfig& config() const { return cfg_; }

  // Accepting side. `self` is sent to the peer; the peer's identity is
  // returned. On success `ch` is kAuthenticated and protected.
  Status Accept(Channel& ch, const PeerIdentity& self, Deadline deadline, PeerIdentity* peer) const;
  // The accepting side in two steps, for event loops that must not block
  // on a peer: AcceptBegin sends the challenge and returns the state the
  // second step needs; the caller then collects the peer's answer (one
  // frame, kAuthenticate) however it likes, puts its bytes back with
  // Channel::Unread, and calls AcceptFinish, which reads it without
  // waiting, checks it and answers. Accept() is the two steps in a row.
  class PendingAccept {  // opaque: what AcceptBegin generated
   public:
    virtual ~PendingAccept() = default;
  };
  Result<std::unique_ptr<PendingAccept>> AcceptBegin(Channel& ch, const PeerIdentity& self,
                                                     Deadline deadline) const;
  Status AcceptFinish(PendingAccept& state, Channel& ch, Deadline deadline,
                      PeerIdentity* peer) const;
  // Connecting side; the same on success. ClientHandshake's steps in a row,
  // waiting on `ch` between them.
  Status Connect(Channel& ch, const PeerIdentity& self, Deadline deadline,
                 PeerIdentity* peer) const;

 private:
  AuthConfig cfg_;
};

// The connecting side in steps, for callers that must not block on a peer
// (a fetch that parks while a new session's owner is slow or silent: a
// hung owner accepts connections but never sends its challenge). Step
// takes what the channel holds without waiting: the challenge (then it
// answers, a small frame a fresh socket takes at once), later the server's
// proof (then it checks it and protects the channel). It returns true once
// the handshake ended (status(), peer()), false when it needs `ch`
// readable again. Expired() ends it with DYAD_RC_TIMEOUT. Errors mark the
// channel broken. One handshake per object; one thread at a time.
class ClientHandshake {
 public:
  ClientHandshake(const Authenticator& auth, const PeerIdentity& self);
  ~ClientHandshake();
  bool Step(Channel& ch, Deadline deadline);
  void Expired(Channel& ch);
  const Status& status() const { return status_; }
  const PeerIdentity& peer() const { return peer_; }

 private:
  struct State;  // the ephemeral key and transcript (auth_connect.cc)
  bool ReadChallenge(Channel& ch, Deadline deadline);
  bool ReadProof(Channel& ch);
  Status Answer(Channel& ch, const std::string& challenge_payload, Deadline deadline);
  Status Finish(Channel& ch, const std::string& reply_payload);
  bool End(Channel& ch, const Status& st);

  const Authenticator& auth_;
  const PeerIdentity self_;
  std::unique_ptr<State> s_;
  Channel::PartialFrame frame_;
  std::string payload_;
  bool answered_ = false;  // sent ours, waiting for the server's proof
  bool done_ = false;
  Status status_;
  PeerIdentity peer_;
};

// Reads the cluster secret: from `file` when non-empty (must not be readable
// by group or others), else from the environment (DYAD_SECRET_FILE, then
// DYAD_SECRET). Returns "" when none is configured. A secret weaker than
// CheckSecretStrength allows is refused (DYAD_RC_AUTH). DYAD_SECRET is
// removed from the environment (and its value overwritten in the initial
// environment block) whichever source is used: not thread-safe, call it
// before starting threads.
Result<std::string> LoadClusterSecret(const std::string& file);

// A cluster secret must carry at least this much: an observed handshake
// gives an HMAC-SHA256 of the secret over known inputs, so a weak one can
// be guessed offline at hash speed.
constexpr double kMinSecretBits = 128;
constexpr size_t kMinSecretDistinctBytes = 8;
// An upper bound of the entropy of `secret`: its length times the bits per
// byte of the smallest alphabet holding it (hex 4, base64 6, printable
// ASCII 6.57, other 8). DYAD cannot see how random a secret is; this
// refuses what is certainly too weak ("password", 16 hex digits, 1 byte).
double SecretStrengthBits(std::string_view secret);
// OK, or DYAD_RC_AUTH naming `source`, the bound found and how to make a
// good secret, when SecretStrengthBits < kMinSecretBits or the secret has
// fewer than kMinSecretDistinctBytes different bytes. Never quotes it.
Status CheckSecretStrength(std::string_view secret, const std::string& source);
// A new secret: 256 random bits as 64 hex digits (`dyad secret init`).
Result<std::string> NewClusterSecret();

}  // namespace dyad
