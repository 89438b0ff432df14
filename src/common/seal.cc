#include "common/seal.h"

#include <openssl/evp.h>
#include <sys/random.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <string>

namespace dyad {
namespace {

constexpr size_t kNonceSize = 12;
// EVP update calls take an int length.
constexpr size_t kMaxUpdate = 1u << 30;

Status CryptoFailure(const char* what) {
  return Status(DYAD_RC_SYSFAIL, std::string("AES-256-GCM: ") + what + " failed");
}

// Feeds `len` bytes at `in` as associated data (out == nullptr) or as
// plaintext/ciphertext (to `out`), in pieces EVP accepts.
bool Update(EVP_CIPHER_CTX* ctx, bool sealing, const char* in, char* out, size_t len) {
  size_t done = 0;
  while (done < len) {
    const int n = static_cast<int>(std::min(len - done, kMaxUpdate));
    int outl = 0;
    auto* o = out ? reinterpret_cast<unsigned char*>(out + done) : nullptr;
    const auto* i = reinterpret_cast<const unsigned char*>(in + done);
    const int ok =
        sealing ? EVP_EncryptUpdate(ctx, o, &outl, i, n) : EVP_DecryptUpdate(ctx, o, &outl, i, n);
    if (ok != 1) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

const char* LinkProtectionName(LinkProtection p) {
  switch (p) {
    case LinkProtection::kNone:
      return "none";
    case LinkProtection::kIntegrity:
      return "integrity";
    case LinkProtection::kEncrypt:
      return "encrypt";
  }
  return "?";
}

const char* LinkProtectionDescription(LinkProtection p) {
  switch (p) {
    case LinkProtection::kNone:
      return "none: nothing is authenticated after the handshake; file bytes move zero-copy "
             "(sendfile/splice). Only for a fabric where nobody can alter traffic";
    case LinkProtection::kIntegrity:
      return "integrity: every message and file chunk between services carries an "
             "AES-256-GCM tag (altered, replayed or cut traffic fails the transfer); "
             "contents travel in clear";
    case LinkProtection::kEncrypt:
      return "encrypt: every message and file chunk between services is encrypted and "
             "authenticated with AES-256-GCM";
  }
  return "?";
}

Result<LinkProtection> ParseLinkProtection(std::string_view text) {
  std::string t(text);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "integrity") return LinkProtection::kIntegrity;
  if (t == "encrypt") return LinkProtection::kEncrypt;
  if (t == "none") return LinkProtection::kNone;
  return Status(DYAD_RC_BADREQUEST, "unknown link protection '" + std::string(text) +
                                        "' (expected integrity, encrypt or none)");
}

Result<std::unique_ptr<RecordCipher>> RecordCipher::Create(const unsigned char* key,
                                                           LinkProtection mode, bool sealing) {
  if (mode == LinkProtection::kNone)
    return Status(DYAD_RC_BADREQUEST, "a record cipher needs integrity or encrypt protection");
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  if (ctx == nullptr) return CryptoFailure("context allocation");
  std::unique_ptr<RecordCipher> c(new RecordCipher(ctx, mode, sealing));
  // The key schedule is computed once; each record only sets a new nonce.
  if (EVP_CipherInit_ex(ctx, EVP_aes_256_gcm(), nullptr, key, nullptr, sealing ? 1 : 0) != 1)
    return CryptoFailure("key setup");
  return c;
}

RecordCipher::~RecordCipher() { EVP_CIPHER_CTX_free(ctx_); }

Status RecordCipher::NextNonce(unsigned char nonce[kNonceSize]) {
  if (failed_)
    return Status(DYAD_RC_AUTH, "session integrity was already lost; the link cannot be used");
  // 2^64 records never happen in practice, but a repeated nonce would
  // void every guarantee, so the counter refuses to wrap.
  if (seq_ == UINT64_MAX) return Status(DYAD_RC_AUTH, "record counter exhausted");
  for (int i = 0; i < 4; ++i) nonce[i] = 0;
  for (int i = 0; i < 8; ++i) nonce[4 + i] = static_cast<unsigned char>(seq_ >> (56 - 8 * i));
  ++seq_;
  return Status::OK();
}

Status RecordCipher::Seal(std::string_view aad, const char* in, char* out, size_t len,
                          unsigned char tag[kSealTagSize]) {
  if (!sealing_) return Status(DYAD_RC_SYSFAIL, "Seal on a receiving record cipher");
  unsigned char nonce[kNonceSize];
  DYAD_RETURN_IF_ERROR(NextNonce(nonce));
  const bool encrypt = mode_ == LinkProtection::kEncrypt;
  int outl = 0;
  unsigned char scratch[16];
  if (EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, nonce) != 1 ||
      !Update(ctx_, true, aad.data(), nullptr, aad.size()) ||
      // Integrity only: the payload is authenticated as associated data and
      // travels unchanged.
      !Update(ctx_, true, in, encrypt ? out : nullptr, len) ||
      EVP_EncryptFinal_ex(ctx_, scratch, &outl) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kSealTagSize), tag) != 1) {
    failed_ = true;
    return CryptoFailure("sealing a record");
  }
  return Status::OK();
}

Status RecordCipher::Open(std::string_view aad, char* data, size_t len,
                          const unsigned char tag[kSealTagSize]) {
  if (sealing_) return Status(DYAD_RC_SYSFAIL, "Open on a sending record cipher");
  const uint64_t record = seq_;
  unsigned char nonce[kNonceSize];
  DYAD_RETURN_IF_ERROR(NextNonce(nonce));
  const bool encrypt = mode_ == LinkProtection::kEncrypt;
  unsigned char expected[kSealTagSize];
  std::copy(tag, tag + kSealTagSize, expected);
  int outl = 0;
  unsigned char scratch[16];
  if (EVP_DecryptInit_ex(ctx_, nullptr, nullptr, nullptr, nonce) != 1 ||
      !Update(ctx_, false, aad.data(), nullptr, aad.size()) ||
      !Update(ctx_, false, data, encrypt ? data : nullptr, len) ||
      EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_TAG, static_cast<int>(kSealTagSize), expected) !=
          1) {
    failed_ = true;
    return CryptoFailure("opening a record");
  }
  if (EVP_DecryptFinal_ex(ctx_, scratch, &outl) != 1) {
    failed_ = true;
    return Status(DYAD_RC_AUTH, "record " + std::to_string(record) +
                                    " from the peer failed its integrity check (altered, "
                                    "replayed or reordered in transit)");
  }
  return Status::OK();
}

Status RecordCipher::OpenBegin(std::string_view aad) {
  if (sealing_) return Status(DYAD_RC_SYSFAIL, "Open on a sending record cipher");
  opening_ = seq_;
  unsigned char nonce[kNonceSize];
  DYAD_RETURN_IF_ERROR(NextNonce(nonce));
  if (EVP_DecryptInit_ex(ctx_, nullptr, nullptr, nullptr, nonce) != 1 ||
      !Update(ctx_, false, aad.data(), nullptr, aad.size())) {
    failed_ = true;
    return CryptoFailure("opening a record");
  }
  return Status::OK();
}

Status RecordCipher::OpenUpdate(char* data, size_t len) {
  if (failed_) return Status(DYAD_RC_AUTH, "session integrity was already lost");
  const bool encrypt = mode_ == LinkProtection::kEncrypt;
  if (!Update(ctx_, false, data, encrypt ? data : nullptr, len)) {
    failed_ = true;
    return CryptoFailure("opening a record");
  }
  return Status::OK();
}

Status RecordCipher::OpenFinish(const unsigned char tag[kSealTagSize]) {
  if (failed_) return Status(DYAD_RC_AUTH, "session integrity was already lost");
  unsigned char expected[kSealTagSize];
  std::copy(tag, tag + kSealTagSize, expected);
  int outl = 0;
  unsigned char scratch[16];
  if (EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_TAG, static_cast<int>(kSealTagSize), expected) !=
          1 ||
      EVP_DecryptFinal_ex(ctx_, scratch, &outl) != 1) {
    failed_ = true;
    return Status(DYAD_RC_AUTH, "record " + std::to_string(opening_) +
                                    " from the peer failed its integrity check (altered, "
                                    "replayed or reordered in transit)");
  }
  return Status::OK();
}

Status RandomBytes(void* buf, size_t len) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    const ssize_t n = getrandom(p, len, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return StatusFromErrno(errno, "getrandom");
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::OK();
}

}  // namespace dyad
