#include "common/seal.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <climits>
#include <string>

#include "common/log.h"

namespace dyad {
namespace {

constexpr size_t kNonceSize = 12;
// EVP update calls take an int length.
constexpr size_t kMaxUpdate = 1u << 30;

std::atomic<void (*)()> g_inside_hook{nullptr};

Status CryptoFailure(const char* what) {
  return Status(DYAD_RC_SYSFAIL, std::string("AES-256-GCM: ") + what + " failed");
}

// A record whose tag does not match what arrived.
Status IntegrityFailure(uint64_t record) {
  return Status(DYAD_RC_AUTH, "record " + std::to_string(record) +
                                  " from the peer failed its integrity check: the bytes received "
                                  "are not the ones the peer sealed (altered, replayed or "
                                  "reordered on the way)");
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

namespace seal_testing {
void SetInsideHook(void (*hook)()) { g_inside_hook.store(hook); }
}  // namespace seal_testing

Status NextRecordKey(const unsigned char key[kSealKeySize], uint64_t epoch,
                     unsigned char next[kSealKeySize]) {
  static const char kLabel[] = "dyad-record-rekey";
  unsigned char msg[sizeof kLabel - 1 + 8];
  std::copy(kLabel, kLabel + sizeof kLabel - 1, msg);
  for (int i = 0; i < 8; ++i)
    msg[sizeof kLabel - 1 + i] = static_cast<unsigned char>(epoch >> (56 - 8 * i));
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key, static_cast<int>(kSealKeySize), msg, sizeof msg, next, &len) ==
          nullptr ||
      len != kSealKeySize)
    return CryptoFailure("rekeying");
  return Status::OK();
}

// Counts the calls inside one cipher: a second one at the same time means
// two threads share it, which could reuse a nonce. Both calls then fail and
// the cipher stays failed.
class RecordCipher::Use {
 public:
  explicit Use(RecordCipher* c) : c_(c) {
    if (c_->users_.fetch_add(1) != 0) Overlap();
    if (void (*hook)() = g_inside_hook.load()) hook();
  }
  ~Use() { c_->users_.fetch_sub(1); }
  // True when another call overlapped this one (before or while it ran).
  bool overlapped() const { return c_->overlapped_.load(); }
  Status Refusal() const {
    return Status(DYAD_RC_SYSFAIL,
                  "record cipher used by two threads at once (a nonce could repeat); the "
                  "session is closed");
  }

 private:
  void Overlap() {
    if (!c_->overlapped_.exchange(true))
      DYAD_LOG_ERROR(
          "internal error: a %s record cipher was used by two threads at once; the "
          "session is closed",
          c_->sealing_ ? "sealing" : "opening");
  }
  RecordCipher* c_;
};

Result<std::unique_ptr<RecordCipher>> RecordCipher::Create(const unsigned char* key,
                                                           LinkProtection mode, bool sealing,
                                                           SealLimits limits) {
  if (mode == LinkProtection::kNone)
    return Status(DYAD_RC_BADREQUEST, "a record cipher needs integrity or encrypt protection");
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  if (ctx == nullptr) return CryptoFailure("context allocation");
  if (limits.records == 0 || limits.bytes == 0) {
    EVP_CIPHER_CTX_free(ctx);
    return Status(DYAD_RC_BADREQUEST, "record cipher limits must be positive");
  }
  std::unique_ptr<RecordCipher> c(new RecordCipher(ctx, mode, sealing, limits));
  std::copy(key, key + kSealKeySize, c->key_);
  // The key schedule is computed once; each record only sets a new nonce.
  if (EVP_CipherInit_ex(ctx, EVP_aes_256_gcm(), nullptr, key, nullptr, sealing ? 1 : 0) != 1)
    return CryptoFailure("key setup");
  return c;
}

RecordCipher::~RecordCipher() {
  OPENSSL_cleanse(key_, sizeof key_);
  EVP_CIPHER_CTX_free(ctx_);
}

Status RecordCipher::EndRecord(uint64_t bytes) {
  ++epoch_records_;
  epoch_bytes_ += bytes;
  if (epoch_records_ < limits_.records && epoch_bytes_ < limits_.bytes) return Status::OK();
  unsigned char next[kSealKeySize];
  Status st = NextRecordKey(key_, epoch_ + 1, next);
  if (st.ok() && EVP_CipherInit_ex(ctx_, nullptr, nullptr, next, nullptr, sealing_ ? 1 : 0) != 1)
    st = CryptoFailure("rekeying");
  std::copy(next, next + kSealKeySize, key_);
  OPENSSL_cleanse(next, sizeof next);
  if (!st.ok()) {
    failed_ = true;
    return st;
  }
  ++epoch_;
  epoch_records_ = 0;
  epoch_bytes_ = 0;
  return Status::OK();
}

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
  Use use(this);
  if (use.overlapped()) return use.Refusal();
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
  if (use.overlapped()) {
    failed_ = true;
    return use.Refusal();
  }
  return EndRecord(aad.size() + len);
}

Status RecordCipher::Open(std::string_view aad, char* data, size_t len,
                          const unsigned char tag[kSealTagSize]) {
  if (sealing_) return Status(DYAD_RC_SYSFAIL, "Open on a sending record cipher");
  Use use(this);
  if (use.overlapped()) return use.Refusal();
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
    return IntegrityFailure(record);
  }
  if (use.overlapped()) {
    failed_ = true;
    return use.Refusal();
  }
  return EndRecord(aad.size() + len);
}

Status RecordCipher::OpenBegin(std::string_view aad) {
  if (sealing_) return Status(DYAD_RC_SYSFAIL, "Open on a sending record cipher");
  Use use(this);
  if (use.overlapped()) return use.Refusal();
  opening_ = seq_;
  opening_bytes_ = aad.size();
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
  Use use(this);
  if (use.overlapped()) return use.Refusal();
  if (failed_) return Status(DYAD_RC_AUTH, "session integrity was already lost");
  const bool encrypt = mode_ == LinkProtection::kEncrypt;
  if (!Update(ctx_, false, data, encrypt ? data : nullptr, len)) {
    failed_ = true;
    return CryptoFailure("opening a record");
  }
  opening_bytes_ += len;
  return Status::OK();
}

Status RecordCipher::OpenFinish(const unsigned char tag[kSealTagSize]) {
  Use use(this);
  if (use.overlapped()) return use.Refusal();
  if (failed_) return Status(DYAD_RC_AUTH, "session integrity was already lost");
  unsigned char expected[kSealTagSize];
  std::copy(tag, tag + kSealTagSize, expected);
  int outl = 0;
  unsigned char scratch[16];
  if (EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_TAG, static_cast<int>(kSealTagSize), expected) !=
          1 ||
      EVP_DecryptFinal_ex(ctx_, scratch, &outl) != 1) {
    failed_ = true;
    return IntegrityFailure(opening_);
  }
  if (use.overlapped()) {
    failed_ = true;
    return use.Refusal();
  }
  return EndRecord(opening_bytes_);
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
