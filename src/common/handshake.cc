#include "common/handshake.h"

#include <openssl/evp.h>

#include "common/wire.h"

namespace dyad {
namespace {

bool DecodeHello(Decoder& d, Hello* h) {
  h->nonce = d.Str(kHandshakeNonceSize);
  h->rank = d.U32();
  h->incarnation = d.U64();
  h->credentials = d.U8();
  h->protection = d.U8();
  h->public_key = d.Str(kHandshakeKeySize);
  return !d.failed() && h->nonce.size() == kHandshakeNonceSize &&
         h->public_key.size() == kHandshakeKeySize &&
         (h->credentials & ~(kCredSecret | kCredMunge)) == 0 && h->protection <= 2;
}

}  // namespace

std::string CredentialSetName(uint8_t bits) {
  switch (bits & (kCredSecret | kCredMunge)) {
    case kCredSecret:
      return "cluster secret";
    case kCredMunge:
      return "MUNGE";
    case kCredSecret | kCredMunge:
      return "cluster secret + MUNGE";
    default:
      return "none";
  }
}

std::string Hello::Encode() const {
  Encoder e;
  e.Str(nonce).U32(rank).U64(incarnation).U8(credentials).U8(protection).Str(public_key);
  return e.Take();
}

std::string ChallengeMsg::Encode() const {
  Encoder e;
  e.Str(kHandshakeLabel);
  std::string out = e.Take();
  out += hello.Encode();
  return out;
}

bool ChallengeMsg::Decode(std::string_view payload, ChallengeMsg* out, bool* older) {
  *older = false;
  Decoder d(payload);
  const std::string label = d.Str(64);
  if (d.failed()) return false;
  if (label != kHandshakeLabel) {
    // Version 1 started with the 32-byte nonce where the label now is.
    *older = label.size() == kHandshakeNonceSize;
    return false;
  }
  ChallengeMsg m;
  if (!DecodeHello(d, &m.hello) || !d.done()) return false;
  *out = std::move(m);
  return true;
}

std::string AuthenticateMsg::Encode() const {
  Encoder e;
  e.Str(munge).Str(mac);
  if (!challenge_hash.empty()) e.Str(challenge_hash).Str(secret_check);
  return hello.Encode() + e.Take();
}

bool AuthenticateMsg::Decode(std::string_view payload, AuthenticateMsg* out) {
  Decoder d(payload);
  AuthenticateMsg m;
  if (!DecodeHello(d, &m.hello)) return false;
  m.munge = d.Str(kMaxMungeCredential);
  m.mac = d.Str(kHandshakeMacSize);
  if (!d.failed() && !d.done()) {
    m.challenge_hash = d.Str(kHandshakeMacSize);
    m.secret_check = d.Str(kHandshakeMacSize);
    if (m.challenge_hash.size() != kHandshakeMacSize ||
        (!m.secret_check.empty() && m.secret_check.size() != kHandshakeMacSize))
      return false;
  }
  if (!d.done() || (!m.mac.empty() && m.mac.size() != kHandshakeMacSize)) return false;
  *out = std::move(m);
  return true;
}

std::string ServerProofMsg::Encode() const {
  Encoder e;
  e.Str(munge).Str(mac);
  return e.Take();
}

bool ServerProofMsg::Decode(std::string_view body, ServerProofMsg* out) {
  Decoder d(body);
  ServerProofMsg m;
  m.munge = d.Str(kMaxMungeCredential);
  m.mac = d.Str(kHandshakeMacSize);
  if (!d.done() || (!m.mac.empty() && m.mac.size() != kHandshakeMacSize)) return false;
  *out = std::move(m);
  return true;
}

std::string Sha256(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  if (EVP_Digest(data.data(), data.size(), md, &md_len, EVP_sha256(), nullptr) != 1)
    return std::string();
  return std::string(reinterpret_cast<char*>(md), md_len);
}

std::string HandshakeTranscript(std::string_view challenge_payload, const Hello& client) {
  const std::string hello = client.Encode();
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int md_len = 0;
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  const bool ok = ctx != nullptr && EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) == 1 &&
                  EVP_DigestUpdate(ctx, kHandshakeLabel, sizeof kHandshakeLabel - 1) == 1 &&
                  EVP_DigestUpdate(ctx, challenge_payload.data(), challenge_payload.size()) == 1 &&
                  EVP_DigestUpdate(ctx, hello.data(), hello.size()) == 1 &&
                  EVP_DigestFinal_ex(ctx, md, &md_len) == 1;
  EVP_MD_CTX_free(ctx);
  // An empty transcript matches no proof, so a failure here fails closed.
  return ok ? std::string(reinterpret_cast<char*>(md), md_len) : std::string();
}

}  // namespace dyad
