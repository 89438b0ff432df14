// seal.h: protected records on the links between services.
//
// After the handshake (common/auth.h) each direction of a service-to-service
// session has its own 256-bit key, derived from that handshake alone. Every
// frame the session carries from then on, control messages and file data
// alike, is a sealed record: AES-256-GCM over the frame header (associated
// data) and the payload, with a 16-byte tag after the payload. The 96-bit
// nonce is the direction's record counter, never sent: a record that is
// altered, replayed, reordered, dropped or moved to the other direction
// fails its tag, and a cut stream is caught by the message framing above
// (a FetchReply says how many data bytes follow).
//
// LinkProtection says how much a session protects:
//   kIntegrity (default)  payloads travel in clear, every byte authenticated;
//   kEncrypt              payloads are also encrypted (confidentiality);
//   kNone                 nothing after the handshake: frames in clear and
//                         file bytes moved zero-copy (sendfile/splice), for a
//                         fabric where nobody can alter traffic.
// Both ends announce their level in the handshake and use the stronger one.
//
// Rekeying: each direction's key is replaced after a bounded volume
// (SealLimits: 2^20 records or 1 GiB of associated data and payload,
// whichever comes first), by both ends at the same record, without a
// message: the next key is HMAC-SHA256(key, "dyad-record-rekey" || epoch as
// 8 bytes big-endian), the old one is erased, and the record counter (the
// nonce) goes on. So no key ever protects more than the limits, a key
// taken from memory opens no earlier record, and a session that runs for
// days needs no new handshake. Sessions are also retired by age
// (kMaxSessionAgeMs; Channel::Retired, the peer pool).
//
// Threading: a RecordCipher belongs to one direction of one Channel and is
// used by one thread at a time. It checks that: a call that starts while
// another is inside the same cipher fails with DYAD_RC_SYSFAIL ("used by two
// threads at once"), as does the call it overlapped, an ERROR is logged,
// and the cipher is unusable from then on (a nonce may have been reused).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

struct evp_cipher_ctx_st;

namespace dyad {

enum class LinkProtection : uint8_t { kNone = 0, kIntegrity = 1, kEncrypt = 2 };

// "none", "integrity", "encrypt".
const char* LinkProtectionName(LinkProtection p);
// One line for operators (`dyad status`, `dyad info`): the level and what
// it does and does not protect.
const char* LinkProtectionDescription(LinkProtection p);
// Accepts the names above (any case); anything else is DYAD_RC_BADREQUEST.
Result<LinkProtection> ParseLinkProtection(std::string_view text);

constexpr size_t kSealKeySize = 32;
constexpr size_t kSealTagSize = 16;

// When a direction's key is replaced: after `records` records or `bytes`
// bytes (associated data and payload) under one key, whichever first.
struct SealLimits {
  uint64_t records = uint64_t{1} << 20;
  uint64_t bytes = uint64_t{1} << 30;
};
// Age after which a pooled session is not used again (one hour).
constexpr int64_t kMaxSessionAgeMs = 3600 * 1000;

// The key that follows `key` at the start of `epoch` (1, 2, ...):
// HMAC-SHA256(key, "dyad-record-rekey" || epoch, 8 bytes big-endian).
Status NextRecordKey(const unsigned char key[kSealKeySize], uint64_t epoch,
                     unsigned char next[kSealKeySize]);

class RecordCipher {
 public:
  // `key` holds kSealKeySize bytes; `mode` is kIntegrity or kEncrypt. A
  // cipher either seals (the sending direction) or opens (the receiving one).
  static Result<std::unique_ptr<RecordCipher>> Create(const unsigned char* key, LinkProtection mode,
                                                      bool sealing, SealLimits limits = {});
  ~RecordCipher();
  RecordCipher(const RecordCipher&) = delete;
  RecordCipher& operator=(const RecordCipher&) = delete;

  LinkProtection mode() const { return mode_; }
  // Records sealed or opened so far (the next record's nonce).
  uint64_t sequence() const { return seq_; }
  // Keys replaced so far (0: still the handshake's key).
  uint64_t epoch() const { return epoch_; }

  // Seals the next record: computes `tag` over `aad` and the `len` bytes at
  // `in`. With kEncrypt the ciphertext goes to `out` (which may equal `in`);
  // with kIntegrity `out` is not touched and may be null.
  Status Seal(std::string_view aad, const char* in, char* out, size_t len,
              unsigned char tag[kSealTagSize]);
  // Opens the next record in place: verifies `tag` and, with kEncrypt,
  // decrypts `data`. A mismatch is DYAD_RC_AUTH, and the cipher is then
  // unusable (its counter no longer matches the peer's).
  Status Open(std::string_view aad, char* data, size_t len, const unsigned char tag[kSealTagSize]);

  // Opens the next record piece by piece, as its bytes arrive: OpenBegin
  // with the associated data, OpenUpdate for each piece (decrypted in place
  // with kEncrypt), OpenFinish with the tag. Until OpenFinish succeeds the
  // pieces are unverified: the caller must be able to discard them.
  Status OpenBegin(std::string_view aad);
  Status OpenUpdate(char* data, size_t len);
  Status OpenFinish(const unsigned char tag[kSealTagSize]);

 private:
  class Use;  // the one-thread-at-a-time check around each call
  friend class Use;
  RecordCipher(evp_cipher_ctx_st* ctx, LinkProtection mode, bool sealing, SealLimits limits)
      : ctx_(ctx), mode_(mode), sealing_(sealing), limits_(limits) {}
  Status NextNonce(unsigned char nonce[12]);
  // Counts a finished record of `bytes` and replaces the key at the limits.
  Status EndRecord(uint64_t bytes);

  evp_cipher_ctx_st* ctx_;
  const LinkProtection mode_;
  const bool sealing_;
  const SealLimits limits_;
  unsigned char key_[kSealKeySize] = {};
  uint64_t seq_ = 0;
  uint64_t opening_ = 0;        // record being opened piece by piece
  uint64_t opening_bytes_ = 0;  // its bytes so far
  uint64_t epoch_ = 0;
  uint64_t epoch_records_ = 0;  // under the current key
  uint64_t epoch_bytes_ = 0;
  bool failed_ = false;
  std::atomic<int> users_{0};  // calls inside the cipher right now
  std::atomic<bool> overlapped_{false};
};

namespace seal_testing {
// Called inside every Seal/Open while the cipher counts the call as in
// use (null: nothing). Tests use it to hold one call open deterministically.
void SetInsideHook(void (*hook)());
}  // namespace seal_testing

// Fills `len` bytes with cryptographically random data (getrandom).
Status RandomBytes(void* buf, size_t len);

}  // namespace dyad
