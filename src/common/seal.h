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
// Threading: a RecordCipher belongs to one direction of one Channel and is
// used by one thread at a time.
#pragma once

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

class RecordCipher {
 public:
  // `key` holds kSealKeySize bytes; `mode` is kIntegrity or kEncrypt. A
  // cipher either seals (the sending direction) or opens (the receiving one).
  static Result<std::unique_ptr<RecordCipher>> Create(const unsigned char* key, LinkProtection mode,
                                                      bool sealing);
  ~RecordCipher();
  RecordCipher(const RecordCipher&) = delete;
  RecordCipher& operator=(const RecordCipher&) = delete;

  LinkProtection mode() const { return mode_; }
  // Records sealed or opened so far (the next record's nonce).
  uint64_t sequence() const { return seq_; }

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
  RecordCipher(evp_cipher_ctx_st* ctx, LinkProtection mode, bool sealing)
      : ctx_(ctx), mode_(mode), sealing_(sealing) {}
  Status NextNonce(unsigned char nonce[12]);

  evp_cipher_ctx_st* ctx_;
  const LinkProtection mode_;
  const bool sealing_;
  uint64_t seq_ = 0;
  uint64_t opening_ = 0;  // record being opened piece by piece
  bool failed_ = false;
};

// Fills `len` bytes with cryptographically random data (getrandom).
Status RandomBytes(void* buf, size_t len);

}  // namespace dyad
