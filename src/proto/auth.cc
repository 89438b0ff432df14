#include "proto/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/config.h"
#include "common/handshake.h"
#include "common/wire.h"
#include "proto/auth_internal.h"
#include "proto/protocol.h"

namespace dyad {

using namespace auth_internal;

namespace {

std::string Mac(const std::string& secret, const char* role, const std::string& transcript) {
  const std::string msg = std::string(kHandshakeLabel) + " " + role + " " + transcript;
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &out_len);
  return std::string(reinterpret_cast<char*>(out), out_len);
}

std::string MungePayload(const char* role, const std::string& transcript) {
  return std::string(kHandshakeLabel) + " " + role + " " + transcript;
}

}  // namespace

bool auth_internal::ConstantTimeEqual(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string auth_internal::SecretCheck(const std::string& secret, const std::string& server_nonce) {
  return Mac(secret, "secret-check", server_nonce);
}

namespace auth_internal {

Status DeriveSessionKeys(const Secret& dh, const std::string& secret, const std::string& transcript,
                         Secret* okm) {
  Secret ikm;
  ikm.bytes = dh.bytes + secret;
  static const char kInfo[] = "dyad-handshake-2 session keys";
  PkeyCtxPtr ctx(EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr), EVP_PKEY_CTX_free);
  size_t len = kSessionKeyBytes;
  okm->bytes.assign(len, '\0');
  if (!ctx || EVP_PKEY_derive_init(ctx.get()) != 1 ||
      EVP_PKEY_CTX_set_hkdf_md(ctx.get(), EVP_sha256()) != 1 ||
      EVP_PKEY_CTX_set1_hkdf_salt(ctx.get(),
                                  reinterpret_cast<const unsigned char*>(transcript.data()),
                                  static_cast<int>(transcript.size())) != 1 ||
      EVP_PKEY_CTX_set1_hkdf_key(ctx.get(),
                                 reinterpret_cast<const unsigned char*>(ikm.bytes.data()),
                                 static_cast<int>(ikm.bytes.size())) != 1 ||
      EVP_PKEY_CTX_add1_hkdf_info(ctx.get(), reinterpret_cast<const unsigned char*>(kInfo),
                                  static_cast<int>(sizeof kInfo - 1)) != 1 ||
      EVP_PKEY_derive(ctx.get(), reinterpret_cast<unsigned char*>(okm->bytes.data()), &len) != 1 ||
      len != kSessionKeyBytes)
    return CryptoError("HKDF key derivation");
  return Status::OK();
}

Status ProtectSession(Channel& ch, const Secret& okm, LinkProtection level, bool accepting) {
  if (level == LinkProtection::kNone) {
    ch.Protect(level, nullptr, nullptr);
  } else {
    const auto* c2s = reinterpret_cast<const unsigned char*>(okm.bytes.data());
    const auto* s2c = c2s + kSealKeySize;
    Result<std::unique_ptr<RecordCipher>> send =
        RecordCipher::Create(accepting ? s2c : c2s, level, /*sealing=*/true);
    Result<std::unique_ptr<RecordCipher>> recv =
        RecordCipher::Create(accepting ? c2s : s2c, level, /*sealing=*/false);
    if (!send.ok()) return send.status();
    if (!recv.ok()) return recv.status();
    ch.Protect(level, std::move(*send), std::move(*recv));
  }
  ch.SetTrust(Trust::kAuthenticated);
  return Status::OK();
}

}  // namespace auth_internal

namespace {

Status Expect(Channel& ch, MsgType want, std::string* payload, Deadline deadline) {
  uint16_t type = 0;
  DYAD_RETURN_IF_ERROR(ch.RecvFrame(&type, payload, deadline));
  if (type != static_cast<uint16_t>(want)) {
    ch.MarkBroken();
    return Status(DYAD_RC_AUTH, std::string("handshake: expected '") +
                                    MsgTypeName(static_cast<uint16_t>(want)) + "', got '" +
                                    MsgTypeName(type) + "'");
  }
  return Status::OK();
}

// Tells the peer it is refused, and nothing more (best effort): an
// unauthenticated peer learns no uid, no path and no credential detail.
// The caller logs `local`, which says why. Breaks the channel.
Status Refuse(Channel& ch, const Status& local, Deadline deadline) {
  (void)ch.SendFrame(static_cast<uint16_t>(MsgType::kReply),
                     EncodeReply(Status(DYAD_RC_AUTH, kRefusedMessage)), deadline);
  ch.MarkBroken();
  return local;
}

}  // namespace

LinkProtection auth_internal::Stronger(LinkProtection a, uint8_t b) {
  return static_cast<LinkProtection>(std::max<uint8_t>(static_cast<uint8_t>(a), b));
}

Authenticator::Authenticator(AuthConfig config) : cfg_(std::move(config)) {}
Authenticator::Authenticator(std::string secret) { cfg_.secret = std::move(secret); }

uint8_t Authenticator::credentials() const {
  return static_cast<uint8_t>((has_secret() ? kCredSecret : 0) | (has_munge() ? kCredMunge : 0));
}

std::string Authenticator::credential_names() const { return CredentialSetName(credentials()); }

namespace auth_internal {

Status MakeProofs(const AuthConfig& cfg, const char* role, const std::string& transcript,
                  std::string* munge, std::string* mac) {
  if (!cfg.secret.empty()) *mac = Mac(cfg.secret, role, transcript);
  if (cfg.munge) {
    Result<std::string> cred = cfg.munge->Encode(MungePayload(role, transcript));
    if (!cred.ok()) return cred.status().Annotate("handshake: create MUNGE credential");
    *munge = std::move(*cred);
  }
  return Status::OK();
}

Status CheckProofs(const AuthConfig& cfg, const char* role, const std::string& transcript,
                   const std::string& munge, const std::string& mac) {
  if (!cfg.secret.empty() && !ConstantTimeEqual(mac, Mac(cfg.secret, role, transcript)))
    return Status(DYAD_RC_AUTH, kProofFailed);
  if (cfg.munge) {
    Result<CredentialService::Verified> v = cfg.munge->Decode(munge);
    if (!v.ok()) return Status(DYAD_RC_AUTH, "MUNGE credential refused: " + v.status().message());
    if (v->uid != ::geteuid())
      return Status(DYAD_RC_AUTH, "MUNGE credential of uid " + std::to_string(v->uid) +
                                      ", expected uid " + std::to_string(::geteuid()));
    if (v->payload != MungePayload(role, transcript))
      return Status(DYAD_RC_AUTH, "MUNGE credential was made for another handshake");
  }
  return Status::OK();
}

}  // namespace auth_internal

namespace {

struct AcceptState final : Authenticator::PendingAccept {
  std::unique_ptr<EphemeralKey> eph;
  std::string challenge_payload;
};

}  // namespace

Status Authenticator::Accept(Channel& ch, const PeerIdentity& self, Deadline deadline,
                             PeerIdentity* peer) const {
  Result<std::unique_ptr<PendingAccept>> state = AcceptBegin(ch, self, deadline);
  if (!state.ok()) return state.status();
  return AcceptFinish(**state, ch, deadline, peer);
}

Result<std::unique_ptr<Authenticator::PendingAccept>> Authenticator::AcceptBegin(
    Channel& ch, const PeerIdentity& self, Deadline deadline) const {
  Result<std::unique_ptr<EphemeralKey>> eph = EphemeralKey::Generate();
  if (!eph.ok()) return eph.status();
  ChallengeMsg challenge;
  Hello& mine = challenge.hello;
  mine.nonce.assign(kHandshakeNonceSize, '\0');
  DYAD_RETURN_IF_ERROR(RandomBytes(mine.nonce.data(), mine.nonce.size()));
  mine.rank = self.rank;
  mine.incarnation = self.incarnation;
  mine.credentials = credentials();
  mine.protection = static_cast<uint8_t>(cfg_.protection);
  Result<std::string> pub = (*eph)->PublicKey();
  if (!pub.ok()) return pub.status();
  mine.public_key = *pub;
  auto state = std::make_unique<AcceptState>();
  state->eph = std::move(*eph);
  state->challenge_payload = challenge.Encode();
  DYAD_RETURN_IF_ERROR(
      ch.SendFrame(static_cast<uint16_t>(MsgType::kChallenge), state->challenge_payload, deadline));
  return std::unique_ptr<PendingAccept>(std::move(state));
}

Status Authenticator::AcceptFinish(PendingAccept& pending, Channel& ch, Deadline deadline,
                                   PeerIdentity* peer) const {
  auto& state = static_cast<AcceptState&>(pending);
  const std::string& challenge_payload = state.challenge_payload;

  std::string payload;
  DYAD_RETURN_IF_ERROR(Expect(ch, MsgType::kAuthenticate, &payload, deadline));
  AuthenticateMsg m;
  if (!AuthenticateMsg::Decode(payload, &m))
    return Refuse(ch, Status(DYAD_RC_BADUNPACK, "malformed authentication message"), deadline);
  const std::string who = "peer claiming rank " + std::to_string(m.hello.rank);
  auto failed = [&](const std::string& why) {
    return Status(DYAD_RC_AUTH, who + " failed authentication (" + why + ")");
  };
  if (m.hello.credentials != credentials())
    return Refuse(ch,
                  failed("credential mismatch: this service requires " + credential_names() +
                         ", the peer presents " + CredentialSetName(m.hello.credentials)),
                  deadline);
  if (!m.challenge_hash.empty() && m.challenge_hash != Sha256(challenge_payload))
    return Refuse(ch,
                  failed("handshake altered in transit: the challenge the peer answered is not "
                         "the one this service sent"),
                  deadline);
  const std::string transcript = HandshakeTranscript(challenge_payload, m.hello);
  if (transcript.empty()) return CryptoError("transcript hash");
  if (Status st = CheckProofs(cfg_, kClientRole, transcript, m.munge, m.mac); !st.ok()) {
    std::string why = st.message();
    if (why == kProofFailed) {
      // The secret check (over our nonce only) says whether the peer holds
      // our secret; peers before it sent none.
      ChallengeMsg sent;
      bool older = false;
      const bool have_nonce = ChallengeMsg::Decode(challenge_payload, &sent, &older);
      if (m.secret_check.empty() || !have_nonce)
        why =
            "its proof of the cluster secret did not verify: another secret, or the handshake "
            "was altered in transit";
      else if (!ConstantTimeEqual(m.secret_check, SecretCheck(cfg_.secret, sent.hello.nonce)))
        why = "wrong cluster secret";
      else
        why =
            "handshake altered in transit: the peer holds this cluster secret but signed "
            "another transcript";
    }
    return Refuse(ch, failed(why), deadline);
  }
  Secret dh, okm;
  if (Status st = state.eph->Agree(m.hello.public_key, &dh); !st.ok())
    return Refuse(ch, failed(st.message()), deadline);
  DYAD_RETURN_IF_ERROR(DeriveSessionKeys(dh, cfg_.secret, transcript, &okm));
  ServerProofMsg proof;
  DYAD_RETURN_IF_ERROR(MakeProofs(cfg_, kServerRole, transcript, &proof.munge, &proof.mac));
  DYAD_RETURN_IF_ERROR(ch.SendFrame(static_cast<uint16_t>(MsgType::kReply),
                                    EncodeReply(Status::OK(), proof.Encode()), deadline));
  DYAD_RETURN_IF_ERROR(
      ProtectSession(ch, okm, Stronger(cfg_.protection, m.hello.protection), /*accepting=*/true));
  if (peer) *peer = PeerIdentity{m.hello.rank, m.hello.incarnation};
  return Status::OK();
}

double SecretStrengthBits(std::string_view secret) {
  // The smallest usual alphabet holding every byte bounds what each byte
  // can carry: hex digits 4 bits, base64 (either alphabet, with '=') 6,
  // printable ASCII log2(95), anything else 8.
  bool hex = true, b64 = true, printable = true;
  for (const char ch : secret) {
    const unsigned char c = static_cast<unsigned char>(ch);
    const bool alnum = std::isalnum(c) != 0;
    hex = hex && std::isxdigit(c) != 0;
    b64 = b64 && (alnum || c == '+' || c == '/' || c == '-' || c == '_' || c == '=');
    printable = printable && c >= 0x20 && c < 0x7f;
  }
  const double per_byte = hex ? 4.0 : b64 ? 6.0 : printable ? 6.569855608330948 : 8.0;
  return per_byte * static_cast<double>(secret.size());
}

Status CheckSecretStrength(std::string_view secret, const std::string& source) {
  const double bits = SecretStrengthBits(secret);
  bool seen[256] = {};
  size_t distinct = 0;
  for (const char c : secret) {
    if (!seen[static_cast<unsigned char>(c)]) ++distinct;
    seen[static_cast<unsigned char>(c)] = true;
  }
  std::string why;
  if (bits < kMinSecretBits) {
    char b[32];
    std::snprintf(b, sizeof b, "%.0f", bits);
    why = std::to_string(secret.size()) + " bytes, at most " + b + " bits";
  } else if (distinct < kMinSecretDistinctBytes) {
    why = "only " + std::to_string(distinct) + " different characters";
  } else {
    return Status::OK();
  }
  // The message never quotes the secret.
  return Status(DYAD_RC_AUTH,
                "the cluster secret from " + source + " is too weak (" + why +
                    "): one recorded handshake would let anyone guess it offline. A secret needs "
                    "at least 128 random bits, e.g. 32 hex digits; `dyad secret init FILE` "
                    "writes one");
}

namespace {

// Removes DYAD_SECRET from the environment and overwrites its value where
// the process started with it (the block /proc/PID/environ shows), once
// the secret is copied.
void ForgetSecretVariable() { EraseEnv("DYAD_SECRET"); }

}  // namespace

Result<std::string> LoadClusterSecret(const std::string& file) {
  std::string path = file;
  if (path.empty()) {
    if (std::optional<std::string> f = GetEnv("DYAD_SECRET_FILE"); f && !f->empty()) path = *f;
  }
  if (path.empty()) {
    std::optional<std::string> s = GetEnv("DYAD_SECRET");
    ForgetSecretVariable();
    if (!s || s->empty()) return std::string();
    DYAD_RETURN_IF_ERROR(CheckSecretStrength(*s, "DYAD_SECRET"));
    return *s;
  }
  // A secret file wins; DYAD_SECRET is forgotten all the same.
  ForgetSecretVariable();
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return StatusFromErrno(errno, "open secret file '" + path + "'", DYAD_RC_AUTH);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return StatusFromErrno(errno, "stat secret file '" + path + "'");
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    return Status(DYAD_RC_AUTH,
                  "secret file '" + path + "' is accessible by group or others; chmod 600 it");
  std::string secret;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return StatusFromErrno(errno, "read secret file '" + path + "'");
    }
    if (n == 0) break;
    secret.append(buf, static_cast<size_t>(n));
    if (secret.size() > (1u << 16)) return Status(DYAD_RC_AUTH, "secret file too large");
  }
  OPENSSL_cleanse(buf, sizeof buf);
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) return Status(DYAD_RC_AUTH, "secret file '" + path + "' is empty");
  DYAD_RETURN_IF_ERROR(CheckSecretStrength(secret, "secret file '" + path + "'"));
  return secret;
}

Result<std::string> NewClusterSecret() {
  unsigned char raw[32];
  DYAD_RETURN_IF_ERROR(RandomBytes(raw, sizeof raw));
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (const unsigned char b : raw) {
    out += kHex[b >> 4];
    out += kHex[b & 15];
  }
  OPENSSL_cleanse(raw, sizeof raw);
  return out;
}

}  // namespace dyad
