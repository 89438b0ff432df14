// handshake.h: the messages of the service-to-service handshake and the
// transcript both ends sign. The protocol itself (who sends what, which
// checks, which keys) is in common/auth.h; this file only encodes, decodes
// and hashes, so the decoders can be fuzzed on their own.
//
//   accepting side  -> kChallenge     label, Hello(nonce, rank, incarnation,
//                                      credentials, protection, X25519 key)
//   connecting side -> kAuthenticate  Hello(...), MUNGE credential, MAC,
//                                      and (since 0.9) the challenge's hash
//                                      and a secret check (below)
//   accepting side  -> kReply         status; on success its MUNGE
//                                      credential and MAC
//
// The transcript hash is SHA-256 over the label, the challenge payload and
// the connecting side's Hello: every proof covers both nonces, both
// identities, both credential sets, both protection levels and both
// ephemeral keys, so none of them can be altered or replayed.
// Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dyad {

inline constexpr char kHandshakeLabel[] = "dyad-handshake-2";
constexpr size_t kHandshakeNonceSize = 32;
constexpr size_t kHandshakeKeySize = 32;  // X25519 public key
constexpr size_t kHandshakeMacSize = 32;  // HMAC-SHA256
constexpr size_t kMaxMungeCredential = 2048;

// Credentials a service requires of its peers and presents itself.
enum CredentialBits : uint8_t {
  kCredSecret = 1,  // the shared cluster secret
  kCredMunge = 2,   // a MUNGE credential of the same uid
};
// "cluster secret", "MUNGE", "cluster secret + MUNGE", or "none".
std::string CredentialSetName(uint8_t bits);

// What each side says about itself.
struct Hello {
  std::string nonce;  // kHandshakeNonceSize random bytes
  uint32_t rank = 0;
  uint64_t incarnation = 0;
  uint8_t credentials = 0;  // CredentialBits
  uint8_t protection = 0;   // LinkProtection
  std::string public_key;   // ephemeral X25519 key, kHandshakeKeySize bytes

  std::string Encode() const;
};

struct ChallengeMsg {
  Hello hello;
  std::string Encode() const;
  // False on malformed input; `*older` is set when the peer speaks an
  // older handshake (so the error can say "upgrade").
  static bool Decode(std::string_view payload, ChallengeMsg* out, bool* older);
};

struct AuthenticateMsg {
  Hello hello;
  std::string munge;  // MUNGE credential ("" without MUNGE)
  std::string mac;    // HMAC of the transcript ("" without a secret)
  // So that the accepting side can name why a proof fails (both "" from
  // peers before them, which Decode accepts):
  //   challenge_hash  SHA-256 of the challenge payload as received: differs
  //                   from the one sent when the challenge was altered;
  //   secret_check    HMAC-SHA256(secret, label " secret-check " server
  //                   nonce) ("" without a secret): matches when both hold
  //                   the same secret, so a `mac` that fails then means the
  //                   handshake was altered, not the secret wrong.
  std::string challenge_hash;
  std::string secret_check;
  std::string Encode() const;
  static bool Decode(std::string_view payload, AuthenticateMsg* out);
};

// Body of the accepting side's successful kReply.
struct ServerProofMsg {
  std::string munge;
  std::string mac;
  std::string Encode() const;
  static bool Decode(std::string_view body, ServerProofMsg* out);
};

// SHA-256 of `data` (32 bytes; "" if the digest failed).
std::string Sha256(std::string_view data);

// SHA-256 of label || challenge payload || the connecting side's Hello.
std::string HandshakeTranscript(std::string_view challenge_payload, const Hello& client);

}  // namespace dyad
