// net.h: sockets and the framed connection (Channel) every DYAD link uses.
//
// Addresses are "HOST:PORT" (TCP, IPv4 or a resolvable name) or
// "unix:/path" / "/path" (Unix domain socket). A Channel owns one connected
// socket and moves frames (a 12-byte header: magic, version, type, payload
// length; then the payload) and raw bytes. Every blocking call takes a
// Deadline and fails with DYAD_RC_TIMEOUT when it passes; a peer that closes
// gives DYAD_RC_CONNLOST. A Channel is used by one thread at a time.
//
// Bounded before trusted: what a Channel accepts depends on how far it
// trusts its peer (Trust). Until the peer is authenticated (a TCP peer that
// completed the handshake of common/auth.h) or admitted (a Unix-socket peer
// whose credentials were checked), a frame may carry at most
// kHandshakeFramePayload bytes. In every state the receive buffer grows as
// bytes actually arrive, never from the length a header announces, so a
// peer that announces a large frame and sends nothing costs nothing.
//
// After the handshake a service-to-service Channel may also be protected
// (common/seal.h): every frame is then a sealed record, transparently to
// SendFrame/RecvFrame. The raw-byte calls (SendAll, RecvSome, SendFileRange)
// bypass that protection; they serve unprotected sessions (the zero-copy
// path) and tests.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include "common/seal.h"
#include "common/status.h"
#include "common/time.h"

namespace dyad {

// Owns a file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) reset(o.release());
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct SocketAddress {
  bool is_unix = false;
  std::string host;  // TCP host or Unix socket path
  uint16_t port = 0;
  std::string ToString() const;
};

// Parses "HOST:PORT", "unix:/path" or "/path".
Result<SocketAddress> ParseAddress(std::string_view text);

// Listening socket. For TCP, port 0 picks a free port (see BoundAddress).
Result<UniqueFd> Listen(const SocketAddress& addr, int backlog = 512);
// The address a listening TCP socket is bound to (resolves port 0).
Result<SocketAddress> BoundAddress(int listen_fd);
// Accepts one connection, waiting at most until `deadline`.
Result<UniqueFd> Accept(int listen_fd, Deadline deadline);
// Connects with a bounded wait.
Result<UniqueFd> Connect(const SocketAddress& addr, Deadline deadline);
// The same in two steps, for callers that must not block (an address whose
// SYNs are dropped would hold the caller for the whole deadline):
// ConnectStart starts the connection without waiting, `*connected` true
// when it completed at once; otherwise the caller waits for the socket to
// be writable (POLLOUT) however it likes and calls ConnectFinish, which
// reports the outcome (SO_ERROR) and makes the socket blocking as every
// Channel expects. Connect() is the two steps with a poll between them.
Result<UniqueFd> ConnectStart(const SocketAddress& addr, bool* connected);
Status ConnectFinish(int fd, const SocketAddress& addr);
// True if a TCP address resolves to a loopback address (127.0.0.0/8);
// "0.0.0.0" and "*" (every interface) are not loopback.
Result<bool> IsLoopbackAddress(const SocketAddress& addr);

// Credentials of the process at the other end of a Unix socket.
struct PeerCred {
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};
Result<PeerCred> UnixPeerCredentials(int fd);

constexpr uint32_t kFrameMagic = 0x44594144;  // "DYAD"
constexpr uint16_t kWireVersion = 1;
// A frame's header: u32 magic, u16 wire version, u16 type, u32 length of
// what follows (payload, plus the tag of a sealed record), host order.
// Written by EncodeFrameHeader, checked by Channel::CheckHeader.
constexpr size_t kFrameHeaderSize = 12;
void EncodeFrameHeader(char hdr[kFrameHeaderSize], uint16_t type, uint32_t wire_len);
inline uint16_t FrameType(const char hdr[kFrameHeaderSize]) {
  uint16_t type;
  std::memcpy(&type, hdr + 6, sizeof type);
  return type;
}
constexpr uint32_t kMaxFramePayload = 16u << 20;
// Largest frame payload accepted before the peer is trusted: the handshake
// messages are a few hundred bytes.
constexpr uint32_t kHandshakeFramePayload = 4096;

// How far a Channel trusts its peer; decides the largest frame it accepts.
enum class Trust : uint8_t {
  kUnauthenticated,  // only the handshake, frames of <= kHandshakeFramePayload
  kLocalPeer,        // a Unix-socket peer whose credentials were checked
  kAuthenticated,    // a TCP peer that completed the handshake
};

class Channel {
 public:
  // Every creator says how far it trusts the peer; a new connection from
  // the network is kUnauthenticated until its handshake completes.
  Channel(UniqueFd fd, Trust trust);
  Channel(Channel&&) = default;
  Channel& operator=(Channel&& other) noexcept;
  ~Channel();

  int fd() const { return fd_.get(); }
  bool broken() const { return broken_; }
  // Marks the channel unusable (e.g. after a protocol error); pools drop it.
  void MarkBroken() { broken_ = true; }

  Trust trust() const { return trust_; }
  // Raises (or lowers) the trust, e.g. once the handshake succeeded.
  void SetTrust(Trust trust) { trust_ = trust; }
  // Largest frame payload RecvFrame accepts in the current trust state.
  size_t frame_limit() const;

  // Seals every later frame in both directions (see common/seal.h). Called
  // by the handshake with the keys it derived; kNone leaves frames in clear.
  void Protect(LinkProtection level, std::unique_ptr<RecordCipher> send,
               std::unique_ptr<RecordCipher> recv);
  LinkProtection protection() const { return protection_; }
  // True once the session authenticated more than kMaxSessionAgeMs ago
  // (common/seal.h): pools stop reusing it, and the next use dials a new
  // session with a new handshake and new keys.
  bool Retired() const;
  // Makes the session look `ms` older (tests of retirement).
  void AgeForTest(int64_t ms) { protected_at_ms_ -= ms; }

  Status SendFrame(uint16_t type, std::string_view payload, Deadline deadline);
  // Protected sessions only: seals one frame of `type` around `len` bytes
  // of `payload` for a caller that sends the pieces itself (WireQueue): the
  // header into `hdr`, the tag into `tag`, and on an encrypting session the
  // ciphertext over `payload` in place. Frames must go out in the order
  // they were sealed, with nothing sent on the session in between.
  Status SealFrame(uint16_t type, char* payload, size_t len, char hdr[kFrameHeaderSize],
                   unsigned char tag[kSealTagSize]);
  // A frame received over several calls without blocking (the *Now calls):
  // how much of its header, payload and tag arrived so far. Reset() before
  // the next frame.
  struct PartialFrame {
    char hdr[kFrameHeaderSize];
    size_t hdr_got = 0;
    size_t body = 0;  // payload length (without a sealed record's tag)
    size_t done = 0;  // payload bytes taken
    unsigned char tag[kSealTagSize];
    size_t tag_got = 0;
    bool begun = false;  // header checked (and the record's check begun)
    void Reset() { *this = PartialFrame(); }
  };
  // Receives one frame of type `want_type` whose payload is handed to
  // `sink` piece by piece as it arrives (at most `buf_len` bytes at a time,
  // through `buf`), so a large payload is never held whole and the socket
  // keeps draining. On a protected session the pieces are authenticated
  // (and decrypted) on the way; they are unverified until the frame is
  // complete, so `sink` must write somewhere the caller can discard
  // (DYAD_RC_AUTH otherwise). Another type (DYAD_RC_BADRPC) or a payload
  // above `max_len` (DYAD_RC_BADUNPACK) is refused before any byte reaches
  // `sink`. Never waits: takes what the socket holds now. OK(true) once the
  // frame is complete (`*len` set), OK(false) when it needs more bytes
  // (wait until the socket is readable, then call again with the same `*f`).
  Result<bool> RecvFrameStreamingNow(PartialFrame* f, uint16_t want_type, size_t* len,
                                     size_t max_len, char* buf, size_t buf_len,
                                     const std::function<Status(const char*, size_t)>& sink);
  // As RecvFrame, but never waits (see RecvFrameStreamingNow); `payload`
  // holds the part received so far between calls. OK(true): `*type` and
  // `*payload` are the frame.
  Result<bool> RecvFrameNow(PartialFrame* f, uint16_t* type, std::string* payload);
  // Waits until the socket is ready for `events` (a hang-up counts) or
  // until `deadline` (DYAD_RC_TIMEOUT): how a caller of the *Now calls
  // blocks between them.
  Status WaitFor(short events, Deadline deadline);
  // Receives one frame. A bad magic/version or a length above frame_limit()
  // gives DYAD_RC_BADUNPACK, a sealed record that fails its check
  // DYAD_RC_AUTH; both mark the channel broken. `payload` is reused: a
  // buffer kept across calls is not reallocated for frames that fit.
  Status RecvFrame(uint16_t* type, std::string* payload, Deadline deadline);

  // While `sink` is set, every send appends its bytes (sealed when the
  // session is) to *sink instead of writing the socket: a service's event
  // loop serves a request inline and then writes the reply itself without
  // ever blocking on a peer that does not read. Not for SendFileRange.
  void CaptureSends(std::string* sink) { capture_ = sink; }
  // The slot of an event loop's state for this channel (common/runtime.h);
  // dropped before the descriptor is closed.
  std::shared_ptr<void>& attachment() { return attachment_; }

  Status SendAll(const void* buf, size_t len, Deadline deadline);
  // Sends the pieces back to back (one system call when they fit).
  Status SendParts(std::initializer_list<std::string_view> parts, Deadline deadline);
  Status RecvAll(void* buf, size_t len, Deadline deadline);
  // Receives up to `len` bytes (at least 1); returns the count.
  Result<size_t> RecvSome(void* buf, size_t len, Deadline deadline);
  // Sends `len` bytes of `file_fd` from `offset` with sendfile(2).
  // `idle_ms` bounds the time without progress, not the whole transfer.
  Status SendFileRange(int file_fd, uint64_t offset, uint64_t len, int64_t idle_ms,
                       uint64_t* sent = nullptr);

  // True if the peer hung up (checked without blocking).
  bool PeerClosed() const;

  // Reads ahead: a receive that wants fewer than `bytes` bytes asks the
  // socket for up to `bytes` (at most 16 KiB: one recv then usually takes a
  // frame's header and payload, and those of the frames behind it) and
  // keeps the surplus as unread bytes, which every receive call takes
  // first. Only for a link whose bytes are all read through this Channel
  // (frames, RecvSome): nobody may read its descriptor directly, nor wait
  // for it to be readable without first taking what has_unread() holds.
  // 0 (the default): every receive asks the socket for what it wants, no
  // more. The surplus is held only while it waits: an idle link keeps no
  // buffer.
  void SetReadAhead(size_t bytes) { read_ahead_ = bytes; }

  // Bytes read from the socket by someone else (a service's event loop
  // assembling frames without blocking) that the receive calls must see
  // first, in order, before reading the socket again.
  void Unread(std::string bytes);
  // Hands back the bytes received but not consumed yet (see Unread).
  std::string TakeUnread();
  bool has_unread() const { return unread_pos_ < unread_.size(); }
  // The bytes read ahead and not taken yet (valid until the next call).
  std::string_view unread_view() const {
    return has_unread() ? std::string_view(unread_).substr(unread_pos_) : std::string_view();
  }
  // Checks a frame header as RecvFrame would (magic, version, the size
  // limit of the current trust state) without consuming anything; returns
  // the number of bytes that follow the header on the wire (payload and,
  // on a protected session, the tag). Malformed: DYAD_RC_BADUNPACK.
  Result<size_t> CheckHeader(const char hdr[12]) const;

 private:
  // Receive buffers start at most this large and then double as bytes
  // come: memory follows what the peer sent, not what its header announced.
  static constexpr size_t kRecvGrowStep = 64u << 10;

  // Receives up to `len` bytes without waiting (unread bytes first); 0 when
  // the socket holds none now, DYAD_RC_CONNLOST when the peer closed.
  Result<size_t> RecvNow(void* buf, size_t len);
  // Takes the header of `f` as far as it arrived, then checks it (once).
  // OK(false) while it is incomplete.
  Result<bool> HeaderNow(PartialFrame* f);
  Status SendSealed(const char* hdr, const char* payload, char* out, size_t len, Deadline deadline);

  UniqueFd fd_;
  Trust trust_ = Trust::kUnauthenticated;
  LinkProtection protection_ = LinkProtection::kNone;
  std::unique_ptr<RecordCipher> send_cipher_;
  std::unique_ptr<RecordCipher> recv_cipher_;
  int64_t protected_at_ms_ = 0;  // monotonic; 0: not protected by a handshake yet
  bool broken_ = false;
  std::string* capture_ = nullptr;  // see CaptureSends()
  size_t read_ahead_ = 0;           // see SetReadAhead()
  std::string unread_;              // see Unread(); consumed from unread_pos_
  size_t unread_pos_ = 0;
  // What an event loop keeps with this channel (its registration of the
  // descriptor, common/runtime.h); released before the descriptor closes.
  std::shared_ptr<void> attachment_;
};

// Client side of a local service's Unix socket: checks (SO_PEERCRED) that
// the listening process runs as this user or as root before any of its
// replies is trusted, then raises `ch` to kLocalPeer. Anyone else squatting
// the socket gives DYAD_RC_PERM.
Status TrustLocalService(Channel& ch);
// Service side: checks that the connecting process runs as this user or as
// root, then raises `ch` to kLocalPeer. DYAD_RC_PERM otherwise; `*cred`
// (when not null) receives the peer's credentials either way.
Status AdmitLocalClient(Channel& ch, PeerCred* cred);

// True for the errno values that mean the peer or the path to it is gone
// (reset, closed, unreachable), as opposed to a local failure.
bool IsConnectionLost(int err);

// Writes all of `len` bytes to a file descriptor (retries short writes/EINTR).
Status WriteFully(int fd, const void* buf, size_t len);

}  // namespace dyad
