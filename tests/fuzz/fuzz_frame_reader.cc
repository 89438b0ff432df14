// Fuzz target: Channel::RecvFrame, the frame reader every DYAD link uses,
// in each trust state and on sealed sessions.
//
// Input: byte 0 picks the mode; the rest is what the peer sends.
//   0 unauthenticated, 1 local peer, 2 authenticated: raw bytes, read frame
//     after frame until an error; a frame may never exceed frame_limit().
//   3 integrity, 4 encrypt: raw bytes at a sealed channel (every record must
//     fail its check unless it is a real one, which random bytes are not).
//   5 integrity, 6 encrypt: the rest is a list of (u16 type, u16 len, bytes)
//     frames that a sealing peer sends properly; the reader must return
//     each exactly. A trailing odd byte flips a bit of the sealed stream:
//     then the altered record must fail with DYAD_RC_AUTH, never be
//     returned altered.
//   7, 8: as 5 and 6, received with RecvFrameStreamingNow (the tcp
//     transport's file data path) through a small buffer, polling between calls.
//   9, 10: as 5 and 6, received with RecvFrameNow (a fetch's reply and
//     verdict, taken without blocking), polling between calls.
#include <poll.h>

#include <cstring>
#include <vector>

#include "fuzz/fuzz_util.h"

using namespace dyad;
using dyad::fuzz::Check;

namespace {

struct Frame {
  uint16_t type;
  std::string payload;
};

void ReadAll(Channel& ch) {
  for (int i = 0; i < 64; ++i) {
    uint16_t type = 0;
    std::string payload;
    Status st = ch.RecvFrame(&type, &payload, Deadline::AfterMs(1000));
    if (!st.ok()) {
      Check(st.code() != DYAD_RC_TIMEOUT);  // the peer closed: never a wait
      return;
    }
    Check(payload.size() <= ch.frame_limit());
  }
}

// Seals `frames` as a peer would and returns the bytes on the wire.
std::string SealFrames(const std::vector<Frame>& frames, LinkProtection level) {
  int fds[2];
  Check(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) == 0);
  const int room = 1 << 20;
  ::setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &room, sizeof room);
  Channel sender(UniqueFd(fds[0]), Trust::kAuthenticated);
  UniqueFd sink(fds[1]);
  dyad::fuzz::FixedCiphers keys(level);
  sender.Protect(level, std::move(keys.send), nullptr);
  for (const Frame& f : frames)
    Check(sender.SendFrame(f.type, f.payload, Deadline::AfterMs(1000)).ok());
  std::string wire;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::recv(sink.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n <= 0) break;
    wire.append(buf, static_cast<size_t>(n));
  }
  return wire;
}

enum class How { kWhole, kStreaming, kNow };

// RecvFrameNow until the frame is complete; the fed peer has closed, so
// the socket is always readable and every call makes progress or fails.
Status ReceiveNow(Channel& ch, uint16_t* type, std::string* payload) {
  Channel::PartialFrame pf;
  for (;;) {
    Result<bool> r = ch.RecvFrameNow(&pf, type, payload);
    if (!r.ok()) return r.status();
    if (*r) return Status::OK();
    pollfd p{ch.fd(), POLLIN, 0};
    Check(::poll(&p, 1, 1000) == 1);
  }
}

// Receives one frame as Structured expects it, whole, streamed or without blocking.
Status Receive(Channel& ch, How how, const Frame& want, uint16_t* type, std::string* payload) {
  if (how == How::kWhole) return ch.RecvFrame(type, payload, Deadline::AfterMs(1000));
  if (how == How::kNow) return ReceiveNow(ch, type, payload);
  char buf[97];  // odd on purpose: pieces never align with anything
  size_t len = 0;
  payload->clear();
  Channel::PartialFrame pf;
  Status st;
  for (;;) {
    Result<bool> r = ch.RecvFrameStreamingNow(&pf, want.type, &len, kMaxFramePayload, buf,
                                              sizeof buf, [&](const char* p, size_t n) {
                                                payload->append(p, n);
                                                return Status::OK();
                                              });
    st = r.status();
    if (!r.ok() || *r) break;
    pollfd p{ch.fd(), POLLIN, 0};
    Check(::poll(&p, 1, 1000) == 1);
  }
  if (st.ok()) {
    Check(len == payload->size());
    *type = want.type;
  }
  return st;
}

void Structured(const uint8_t* data, size_t size, LinkProtection level, How how) {
  // The whole sealed stream must fit in a socket buffer (about 200 KiB by
  // default), since nothing reads it while it is written.
  constexpr size_t kMaxWire = 96u << 10;
  std::vector<Frame> frames;
  size_t pos = 0, wire_bytes = 0;
  while (pos + 4 <= size && frames.size() < 32) {
    uint16_t type, len;
    std::memcpy(&type, data + pos, 2);
    std::memcpy(&len, data + pos + 2, 2);
    len = static_cast<uint16_t>(std::min<size_t>(len, size - pos - 4));
    const size_t record = kFrameHeaderSize + len + kSealTagSize;
    if (wire_bytes + record > kMaxWire) break;
    pos += 4;
    frames.push_back({type, std::string(reinterpret_cast<const char*>(data + pos), len)});
    pos += len;
    wire_bytes += record;
  }
  std::string wire = SealFrames(frames, level);
  size_t flip = std::string::npos;
  if (pos < size && !wire.empty()) {
    flip = (static_cast<size_t>(data[pos]) * 7919 + (size - pos)) % wire.size();
    wire[flip] ^= static_cast<char>(1u << (data[pos] % 8));
  }
  dyad::fuzz::FedChannel fed(wire, Trust::kAuthenticated);
  dyad::fuzz::FixedCiphers keys(level);
  fed.channel().Protect(level, nullptr, std::move(keys.recv));
  size_t offset = 0;  // where the current record starts on the wire
  for (const Frame& f : frames) {
    const size_t record = kFrameHeaderSize + f.payload.size() + kSealTagSize;
    uint16_t type = 0;
    std::string payload;
    Status st = Receive(fed.channel(), how, f, &type, &payload);
    const bool altered = flip >= offset && flip < offset + record;
    if (altered) {
      // A flip in the length can make the reader wait for bytes that never
      // come (the peer then closes) or refuse the size; any other change
      // fails the tag. Never may the altered record come back as valid.
      Check(!st.ok());
      return;
    }
    Check(st.ok());
    Check(type == f.type && payload == f.payload);
    offset += record;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t mode = data[0] % 11;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (mode) {
    case 0:
    case 1:
    case 2: {
      const Trust trust = mode == 0   ? Trust::kUnauthenticated
                          : mode == 1 ? Trust::kLocalPeer
                                      : Trust::kAuthenticated;
      dyad::fuzz::FedChannel fed(rest, trust);
      ReadAll(fed.channel());
      break;
    }
    case 3:
    case 4: {
      const LinkProtection level =
          mode == 3 ? LinkProtection::kIntegrity : LinkProtection::kEncrypt;
      dyad::fuzz::FedChannel fed(rest, Trust::kAuthenticated);
      dyad::fuzz::FixedCiphers keys(level);
      fed.channel().Protect(level, nullptr, std::move(keys.recv));
      ReadAll(fed.channel());
      break;
    }
    default:
      Structured(data + 1, size - 1,
                 mode % 2 == 1 ? LinkProtection::kIntegrity : LinkProtection::kEncrypt,
                 mode >= 9   ? How::kNow
                 : mode >= 7 ? How::kStreaming
                             : How::kWhole);
  }
  return 0;
}
