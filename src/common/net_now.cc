// net_now.cc: the Channel's receive calls that never wait (net.h, the *Now
// calls): a frame taken piece by piece as the socket holds it, for callers
// that wait for readability themselves (a fetch parked on an event loop).
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/net.h"

namespace dyad {

Result<size_t> Channel::RecvNow(void* buf, size_t len) {
  if (len == 0) return size_t{0};
  if (has_unread()) {
    const size_t n = std::min(len, unread_.size() - unread_pos_);
    std::memcpy(buf, unread_.data() + unread_pos_, n);
    unread_pos_ += n;
    if (unread_pos_ == unread_.size()) TakeUnread();  // releases the buffer
    return n;
  }
  // Reading ahead: the socket's bytes go to a buffer of read_ahead_ bytes
  // first; what the caller did not want stays unread (copied off the
  // stack only when there is any).
  constexpr size_t kStackAhead = 16384;
  char ahead[kStackAhead];
  const bool read_ahead = len < read_ahead_;
  char* into = read_ahead ? ahead : static_cast<char*>(buf);
  const size_t want = read_ahead ? std::min(read_ahead_, kStackAhead) : len;
  for (;;) {
    const ssize_t n = ::recv(fd_.get(), into, want, MSG_DONTWAIT);
    if (n > 0 && read_ahead) {
      const size_t got = static_cast<size_t>(n);
      const size_t mine = std::min(len, got);
      std::memcpy(buf, ahead, mine);
      if (got > mine) {
        unread_.assign(ahead + mine, got - mine);
        unread_pos_ = 0;
      }
      return mine;
    }
    if (n > 0) return static_cast<size_t>(n);
    if (n == 0) {
      broken_ = true;
      return Status(DYAD_RC_CONNLOST, "peer closed the connection");
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return size_t{0};
    broken_ = true;
    return StatusFromErrno(errno, "recv", DYAD_RC_CONNLOST);
  }
}

Result<bool> Channel::HeaderNow(PartialFrame* f) {
  while (f->hdr_got < kFrameHeaderSize) {
    Result<size_t> n = RecvNow(f->hdr + f->hdr_got, kFrameHeaderSize - f->hdr_got);
    if (!n.ok()) return n.status();
    if (*n == 0) return false;
    f->hdr_got += *n;
  }
  Result<size_t> wire_len = CheckHeader(f->hdr);
  if (!wire_len.ok()) {
    broken_ = true;
    return wire_len.status();
  }
  f->body = *wire_len - (recv_cipher_ ? kSealTagSize : 0);
  return true;
}

Result<bool> Channel::RecvFrameStreamingNow(
    PartialFrame* f, uint16_t want_type, size_t* len, size_t max_len, char* buf, size_t buf_len,
    const std::function<Status(const char*, size_t)>& sink) {
  auto fail = [this](const Status& st) -> Result<bool> {
    broken_ = true;
    return st;
  };
  if (!f->begun) {
    Result<bool> h = HeaderNow(f);
    if (!h.ok() || !*h) return h;
    const uint16_t rtype = FrameType(f->hdr);
    if (rtype != want_type)
      return fail(Status(DYAD_RC_BADRPC, "expected a frame of type " + std::to_string(want_type) +
                                             ", got type " + std::to_string(rtype)));
    if (f->body > max_len)
      return fail(Status(DYAD_RC_BADUNPACK, "frame of " + std::to_string(f->body) +
                                                " bytes where at most " + std::to_string(max_len) +
                                                " were expected"));
    if (recv_cipher_) {
      Status st = recv_cipher_->OpenBegin(std::string_view(f->hdr, kFrameHeaderSize));
      if (!st.ok()) return fail(st);
    }
    f->begun = true;
  }
  while (f->done < f->body) {
    Result<size_t> n = RecvNow(buf, std::min(buf_len, f->body - f->done));
    if (!n.ok()) return n.status();
    if (*n == 0) return false;
    if (recv_cipher_) {
      Status st = recv_cipher_->OpenUpdate(buf, *n);
      if (!st.ok()) return fail(st);
    }
    Status ss = sink(buf, *n);
    if (!ss.ok()) return fail(ss);
    f->done += *n;
  }
  if (recv_cipher_) {
    while (f->tag_got < kSealTagSize) {
      Result<size_t> n = RecvNow(f->tag + f->tag_got, kSealTagSize - f->tag_got);
      if (!n.ok()) return n.status();
      if (*n == 0) return false;
      f->tag_got += *n;
    }
    Status st = recv_cipher_->OpenFinish(f->tag);
    if (!st.ok()) return fail(st);
  }
  *len = f->body;
  return true;
}

Result<bool> Channel::RecvFrameNow(PartialFrame* f, uint16_t* type, std::string* payload) {
  if (!f->begun) {
    Result<bool> h = HeaderNow(f);
    if (!h.ok() || !*h) return h;
    f->begun = true;
    payload->clear();
  }
  const size_t overhead = recv_cipher_ ? kSealTagSize : 0;
  const size_t wire = f->body + overhead;
  while (f->done < wire) {
    // Grow only for bytes on their way: double what arrived so far, so
    // memory follows what the peer sent, not what its header announced.
    if (payload->size() <= f->done)
      payload->resize(std::min(wire, std::max(Channel::kRecvGrowStep, f->done * 2)));
    const size_t room = std::min(payload->size(), wire) - f->done;
    Result<size_t> n = RecvNow(payload->data() + f->done, room);
    if (!n.ok()) return n.status();
    if (*n == 0) return false;
    f->done += *n;
  }
  payload->resize(wire);
  if (recv_cipher_) {
    unsigned char tag[kSealTagSize];
    std::memcpy(tag, payload->data() + f->body, kSealTagSize);
    Status st = recv_cipher_->Open(std::string_view(f->hdr, kFrameHeaderSize), payload->data(),
                                   f->body, tag);
    if (!st.ok()) {
      broken_ = true;
      return st;
    }
    payload->resize(f->body);
  }
  *type = FrameType(f->hdr);
  return true;
}

}  // namespace dyad
