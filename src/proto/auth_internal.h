// auth_internal.h: what both sides of the handshake (auth.cc accepting,
// auth_connect.cc connecting) share: key exchange, proofs, session keys.
// Internal to src/proto; see auth.h for the handshake itself.
#pragma once

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <cstdint>
#include <memory>
#include <string>

#include "common/net.h"
#include "common/seal.h"
#include "common/status.h"
#include "proto/auth.h"

namespace dyad::auth_internal {

using PkeyPtr = std::unique_ptr<EVP_PKEY, decltype(&EVP_PKEY_free)>;
using PkeyCtxPtr = std::unique_ptr<EVP_PKEY_CTX, decltype(&EVP_PKEY_CTX_free)>;

inline constexpr char kClientRole[] = "client";
inline constexpr char kServerRole[] = "server";
inline constexpr size_t kSessionKeyBytes = 2 * kSealKeySize;

inline Status CryptoError(const std::string& what) {
  return Status(DYAD_RC_SYSFAIL, "handshake: " + what + " failed (OpenSSL)");
}

// Wipes key material when it goes out of scope.
struct Secret {
  std::string bytes;
  ~Secret() { OPENSSL_cleanse(bytes.data(), bytes.size()); }
};

// An ephemeral X25519 key pair, used for one handshake.
class EphemeralKey {
 public:
  static Result<std::unique_ptr<EphemeralKey>> Generate() {
    PkeyCtxPtr ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, nullptr), EVP_PKEY_CTX_free);
    EVP_PKEY* key = nullptr;
    if (!ctx || EVP_PKEY_keygen_init(ctx.get()) != 1 || EVP_PKEY_keygen(ctx.get(), &key) != 1)
      return CryptoError("X25519 key generation");
    return std::unique_ptr<EphemeralKey>(new EphemeralKey(key));
  }
  Result<std::string> PublicKey() const {
    std::string pub(kHandshakeKeySize, '\0');
    size_t len = pub.size();
    if (EVP_PKEY_get_raw_public_key(key_.get(), reinterpret_cast<unsigned char*>(pub.data()),
                                    &len) != 1 ||
        len != kHandshakeKeySize)
      return CryptoError("X25519 public key export");
    return pub;
  }
  // The shared secret with the peer's public key. A malformed or low-order
  // peer key (an all-zero result) is refused.
  Status Agree(const std::string& peer_public, Secret* out) const {
    PkeyPtr peer(
        EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr,
                                    reinterpret_cast<const unsigned char*>(peer_public.data()),
                                    peer_public.size()),
        EVP_PKEY_free);
    PkeyCtxPtr ctx(EVP_PKEY_CTX_new(key_.get(), nullptr), EVP_PKEY_CTX_free);
    size_t len = kHandshakeKeySize;
    out->bytes.assign(len, '\0');
    if (!peer || !ctx || EVP_PKEY_derive_init(ctx.get()) != 1 ||
        EVP_PKEY_derive_set_peer(ctx.get(), peer.get()) != 1 ||
        EVP_PKEY_derive(ctx.get(), reinterpret_cast<unsigned char*>(out->bytes.data()), &len) !=
            1 ||
        len != kHandshakeKeySize)
      return Status(DYAD_RC_AUTH, "handshake: the peer's key exchange value is invalid");
    return Status::OK();
  }

 private:
  explicit EphemeralKey(EVP_PKEY* key) : key_(key, EVP_PKEY_free) {}
  PkeyPtr key_;
};

// The proofs this end gives for `role` over `transcript`.
Status MakeProofs(const AuthConfig& cfg, const char* role, const std::string& transcript,
                  std::string* munge, std::string* mac);
// Checks the peer's proofs for `role`; DYAD_RC_AUTH says which one failed.
Status CheckProofs(const AuthConfig& cfg, const char* role, const std::string& transcript,
                   const std::string& munge, const std::string& mac);
// HKDF-SHA256(ikm = dh || secret, salt = transcript) -> both directions' keys.
Status DeriveSessionKeys(const Secret& dh, const std::string& secret, const std::string& transcript,
                         Secret* okm);
// Installs the session keys and the agreed protection on `ch`.
Status ProtectSession(Channel& ch, const Secret& okm, LinkProtection level, bool accepting);
LinkProtection Stronger(LinkProtection a, uint8_t b);

// The only thing an unauthenticated peer is told when it is refused.
inline constexpr char kRefusedMessage[] = "refused";
// CheckProofs' message when the secret's MAC does not verify (the
// accepting side words it by the secret check, see AuthenticateMsg).
inline constexpr char kProofFailed[] = "cluster secret proof did not verify";
bool ConstantTimeEqual(const std::string& a, const std::string& b);
// HMAC-SHA256(secret, label " secret-check " server_nonce).
std::string SecretCheck(const std::string& secret, const std::string& server_nonce);

}  // namespace dyad::auth_internal
