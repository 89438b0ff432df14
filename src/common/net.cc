#include "common/net.h"

#include "common/config.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace dyad {

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string SocketAddress::ToString() const {
  if (is_unix) return "unix:" + host;
  return host + ":" + std::to_string(port);
}

Result<SocketAddress> ParseAddress(std::string_view text) {
  SocketAddress a;
  if (text.rfind("unix:", 0) == 0 || (!text.empty() && text[0] == '/')) {
    a.is_unix = true;
    a.host = std::string(text.rfind("unix:", 0) == 0 ? text.substr(5) : text);
    if (a.host.empty() || a.host.size() >= sizeof(sockaddr_un::sun_path))
      return Status(DYAD_RC_BADREQUEST, "bad unix socket path '" + std::string(text) + "'");
    return a;
  }
  const size_t colon = text.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size())
    return Status(DYAD_RC_BADREQUEST,
                  "bad address '" + std::string(text) + "' (expected HOST:PORT or unix:/path)");
  a.host = std::string(text.substr(0, colon));
  const std::string port(text.substr(colon + 1));
  char* end = nullptr;
  const unsigned long p = std::strtoul(port.c_str(), &end, 10);
  if (*end != '\0' || p > 65535)
    return Status(DYAD_RC_BADREQUEST, "bad port in address '" + std::string(text) + "'");
  a.port = static_cast<uint16_t>(p);
  return a;
}

namespace {

Status ResolveInet(const SocketAddress& addr, sockaddr_in* out) {
  std::memset(out, 0, sizeof *out);
  out->sin_family = AF_INET;
  out->sin_port = htons(addr.port);
  if (addr.host == "*" || addr.host == "0.0.0.0") {
    out->sin_addr.s_addr = htonl(INADDR_ANY);
    return Status::OK();
  }
  if (inet_pton(AF_INET, addr.host.c_str(), &out->sin_addr) == 1) return Status::OK();
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = getaddrinfo(addr.host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    return Status(DYAD_RC_BADREQUEST,
                  "cannot resolve host '" + addr.host + "': " + gai_strerror(rc));
  out->sin_addr = reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr;
  freeaddrinfo(res);
  return Status::OK();
}

void TuneTcp(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

}  // namespace

Result<UniqueFd> Listen(const SocketAddress& addr, int backlog) {
  if (addr.is_unix) {
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd.valid()) return StatusFromErrno(errno, "socket(AF_UNIX)");
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::strncpy(sa.sun_path, addr.host.c_str(), sizeof sa.sun_path - 1);
    // A socket file left by a dead service would make bind fail; a live one
    // answers connect, and we must not steal its address.
    UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (::connect(probe.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0)
      return Status(DYAD_RC_SYSFAIL, "another process is listening on " + addr.ToString());
    ::unlink(addr.host.c_str());
    if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0)
      return StatusFromErrno(errno, "bind " + addr.ToString());
    ::chmod(addr.host.c_str(), 0600);
    if (::listen(fd.get(), backlog) != 0)
      return StatusFromErrno(errno, "listen " + addr.ToString());
    return fd;
  }
  sockaddr_in sa;
  DYAD_RETURN_IF_ERROR(ResolveInet(addr, &sa));
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return StatusFromErrno(errno, "socket(AF_INET)");
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0)
    return StatusFromErrno(errno, "bind " + addr.ToString());
  if (::listen(fd.get(), backlog) != 0) return StatusFromErrno(errno, "listen " + addr.ToString());
  return fd;
}

Result<SocketAddress> BoundAddress(int listen_fd) {
  sockaddr_in sa{};
  socklen_t len = sizeof sa;
  if (getsockname(listen_fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0)
    return StatusFromErrno(errno, "getsockname");
  SocketAddress a;
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof buf);
  a.host = buf;
  a.port = ntohs(sa.sin_port);
  return a;
}

Result<UniqueFd> Accept(int listen_fd, Deadline deadline) {
  for (;;) {
    pollfd p{listen_fd, POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(deadline.RemainingMs(1000)));
    if (n < 0) {
      if (errno == EINTR) continue;
      return StatusFromErrno(errno, "poll(accept)");
    }
    if (n == 0) {
      if (deadline.expired()) return Status(DYAD_RC_TIMEOUT, "accept timed out");
      continue;
    }
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      return StatusFromErrno(errno, "accept");
    }
    sockaddr_storage ss{};
    socklen_t sl = sizeof ss;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl) == 0 && ss.ss_family == AF_INET)
      TuneTcp(fd);
    return UniqueFd(fd);
  }
}

Result<UniqueFd> ConnectStart(const SocketAddress& addr, bool* connected) {
  UniqueFd fd;
  int rc;
  if (addr.is_unix) {
    fd.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return StatusFromErrno(errno, "socket(AF_UNIX)");
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    std::strncpy(sa.sun_path, addr.host.c_str(), sizeof sa.sun_path - 1);
    rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  } else {
    sockaddr_in sa;
    DYAD_RETURN_IF_ERROR(ResolveInet(addr, &sa));
    fd.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) return StatusFromErrno(errno, "socket(AF_INET)");
    TuneTcp(fd.get());
    rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa);
  }
  if (rc != 0 && errno != EINPROGRESS && errno != EAGAIN)
    return StatusFromErrno(errno, "connect " + addr.ToString(), DYAD_RC_CONNLOST);
  *connected = rc == 0;
  if (*connected) DYAD_RETURN_IF_ERROR(ConnectFinish(fd.get(), addr));
  return fd;
}

Status ConnectFinish(int fd, const SocketAddress& addr) {
  int err = 0;
  socklen_t len = sizeof err;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
  if (err != 0) return StatusFromErrno(err, "connect " + addr.ToString(), DYAD_RC_CONNLOST);
  // Channels use blocking calls bounded by poll; clear O_NONBLOCK.
  const int flags = fcntl(fd, F_GETFL);
  fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return Status::OK();
}

Result<UniqueFd> Connect(const SocketAddress& addr, Deadline deadline) {
  bool connected = false;
  Result<UniqueFd> fd = ConnectStart(addr, &connected);
  if (!fd.ok() || connected) return fd;
  for (;;) {
    pollfd p{fd->get(), POLLOUT, 0};
    const int n = ::poll(&p, 1, static_cast<int>(deadline.RemainingMs(1000)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return StatusFromErrno(errno, "poll(connect)");
    if (n > 0) break;
    if (deadline.expired())
      return Status(DYAD_RC_TIMEOUT, "connect " + addr.ToString() + " timed out");
  }
  DYAD_RETURN_IF_ERROR(ConnectFinish(fd->get(), addr));
  return fd;
}

Result<bool> IsLoopbackAddress(const SocketAddress& addr) {
  if (addr.is_unix) return false;
  sockaddr_in sa;
  DYAD_RETURN_IF_ERROR(ResolveInet(addr, &sa));
  return (ntohl(sa.sin_addr.s_addr) >> 24) == 127;
}

Result<PeerCred> UnixPeerCredentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    return StatusFromErrno(errno, "getsockopt(SO_PEERCRED)");
  PeerCred out;
  out.pid = cred.pid;
  out.uid = cred.uid;
  out.gid = cred.gid;
  return out;
}

Channel::Channel(UniqueFd fd, Trust trust) : fd_(std::move(fd)), trust_(trust) {}

Channel::~Channel() { attachment_.reset(); }

Channel& Channel::operator=(Channel&& other) noexcept {
  if (this == &other) return *this;
  attachment_.reset();  // before this channel's descriptor closes
  fd_ = std::move(other.fd_);
  trust_ = other.trust_;
  protection_ = other.protection_;
  send_cipher_ = std::move(other.send_cipher_);
  recv_cipher_ = std::move(other.recv_cipher_);
  protected_at_ms_ = other.protected_at_ms_;
  broken_ = other.broken_;
  capture_ = other.capture_;
  read_ahead_ = other.read_ahead_;
  unread_ = std::move(other.unread_);
  unread_pos_ = other.unread_pos_;
  attachment_ = std::move(other.attachment_);
  return *this;
}

size_t Channel::frame_limit() const {
  return trust_ == Trust::kUnauthenticated ? kHandshakeFramePayload : kMaxFramePayload;
}

void Channel::Protect(LinkProtection level, std::unique_ptr<RecordCipher> send,
                      std::unique_ptr<RecordCipher> recv) {
  protection_ = level;
  send_cipher_ = std::move(send);
  recv_cipher_ = std::move(recv);
  protected_at_ms_ = static_cast<int64_t>(MonoNs() / 1000000) + 1;
}

bool Channel::Retired() const {
  return protected_at_ms_ != 0 &&
         static_cast<int64_t>(MonoNs() / 1000000) + 1 - protected_at_ms_ > kMaxSessionAgeMs;
}

Status Channel::WaitFor(short events, Deadline deadline) {
  for (;;) {
    pollfd p{fd_.get(), events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(deadline.RemainingMs(1000)));
    if (n < 0) {
      if (errno == EINTR) continue;
      broken_ = true;
      return StatusFromErrno(errno, "poll");
    }
    if (n > 0) return Status::OK();
    if (deadline.expired()) return Status(DYAD_RC_TIMEOUT, "timed out waiting for peer");
  }
}

Status Channel::SendAll(const void* buf, size_t len, Deadline deadline) {
  return SendParts({std::string_view(static_cast<const char*>(buf), len)}, deadline);
}

Status Channel::SendParts(std::initializer_list<std::string_view> parts, Deadline deadline) {
  if (capture_ != nullptr) {
    for (std::string_view p : parts) capture_->append(p.data(), p.size());
    return Status::OK();
  }
  iovec iov[8];
  size_t n_iov = 0;
  for (std::string_view p : parts) {
    if (p.empty()) continue;
    if (n_iov == sizeof iov / sizeof iov[0]) {
      broken_ = true;
      return Status(DYAD_RC_BADPACK, "too many pieces for one send");
    }
    iov[n_iov++] = iovec{const_cast<char*>(p.data()), p.size()};
  }
  size_t first = 0;
  while (first < n_iov) {
    msghdr msg{};
    msg.msg_iov = iov + first;
    msg.msg_iovlen = n_iov - first;
    const ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        Status st = WaitFor(POLLOUT, deadline);
        if (!st.ok()) {
          broken_ = true;
          return st;
        }
        continue;
      }
      broken_ = true;
      return StatusFromErrno(errno, "send", DYAD_RC_CONNLOST);
    }
    // Skip what went out: whole pieces, then the start of a partial one.
    size_t sent = static_cast<size_t>(n);
    while (first < n_iov && sent >= iov[first].iov_len) sent -= iov[first++].iov_len;
    if (first < n_iov) {
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + sent;
      iov[first].iov_len -= sent;
    }
  }
  return Status::OK();
}

void Channel::Unread(std::string bytes) {
  if (bytes.empty()) return;
  if (has_unread()) {
    bytes.insert(0, unread_, unread_pos_, std::string::npos);
  }
  unread_ = std::move(bytes);
  unread_pos_ = 0;
}

std::string Channel::TakeUnread() {
  std::string out = unread_pos_ == 0 ? std::move(unread_) : unread_.substr(unread_pos_);
  unread_.clear();
  unread_pos_ = 0;
  return out;
}

Result<size_t> Channel::RecvSome(void* buf, size_t len, Deadline deadline) {
  // RecvNow (net_now.cc) takes what is there; only its "nothing yet" waits.
  for (;;) {
    Result<size_t> n = RecvNow(buf, len);
    if (!n.ok() || *n > 0 || len == 0) return n;
    Status st = WaitFor(POLLIN, deadline);
    if (!st.ok()) {
      broken_ = true;
      return st;
    }
  }
}

Status Channel::RecvAll(void* buf, size_t len, Deadline deadline) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    Result<size_t> n = RecvSome(p, len, deadline);
    if (!n.ok()) return n.status();
    p += *n;
    len -= *n;
  }
  return Status::OK();
}

void EncodeFrameHeader(char hdr[kFrameHeaderSize], uint16_t type, uint32_t wire_len) {
  const uint32_t magic = kFrameMagic;
  const uint16_t version = kWireVersion;
  std::memcpy(hdr, &magic, 4);
  std::memcpy(hdr + 4, &version, 2);
  std::memcpy(hdr + 6, &type, 2);
  std::memcpy(hdr + 8, &wire_len, 4);
}

Status Channel::SendSealed(const char* hdr, const char* payload, char* out, size_t len,
                           Deadline deadline) {
  unsigned char tag[kSealTagSize];
  Status st = send_cipher_->Seal(std::string_view(hdr, kFrameHeaderSize), payload, out, len, tag);
  if (!st.ok()) {
    broken_ = true;
    return st;
  }
  const char* body = protection_ == LinkProtection::kEncrypt ? out : payload;
  return SendParts({std::string_view(hdr, kFrameHeaderSize), std::string_view(body, len),
                    std::string_view(reinterpret_cast<const char*>(tag), kSealTagSize)},
                   deadline);
}

Status Channel::SendFrame(uint16_t type, std::string_view payload, Deadline deadline) {
  if (payload.size() > kMaxFramePayload)
    return Status(DYAD_RC_BADPACK,
                  "message too large (" + std::to_string(payload.size()) + " bytes)");
  char hdr[kFrameHeaderSize];
  if (send_cipher_) {
    EncodeFrameHeader(hdr, type, static_cast<uint32_t>(payload.size() + kSealTagSize));
    if (protection_ != LinkProtection::kEncrypt)
      return SendSealed(hdr, payload.data(), nullptr, payload.size(), deadline);
    std::string cipher(payload.size(), '\0');
    return SendSealed(hdr, payload.data(), cipher.data(), payload.size(), deadline);
  }
  EncodeFrameHeader(hdr, type, static_cast<uint32_t>(payload.size()));
  return SendParts({std::string_view(hdr, kFrameHeaderSize), payload}, deadline);
}

Status Channel::SealFrame(uint16_t type, char* payload, size_t len, char hdr[kFrameHeaderSize],
                          unsigned char tag[kSealTagSize]) {
  if (!send_cipher_) return Status(DYAD_RC_BADREQUEST, "SealFrame needs a protected session");
  if (len > kMaxFramePayload)
    return Status(DYAD_RC_BADPACK, "message too large (" + std::to_string(len) + " bytes)");
  EncodeFrameHeader(hdr, type, static_cast<uint32_t>(len + kSealTagSize));
  char* out = protection_ == LinkProtection::kEncrypt ? payload : nullptr;
  Status st = send_cipher_->Seal(std::string_view(hdr, kFrameHeaderSize), payload, out, len, tag);
  if (!st.ok()) broken_ = true;
  return st;
}

Result<size_t> Channel::CheckHeader(const char hdr[kFrameHeaderSize]) const {
  uint32_t magic;
  uint16_t version;
  uint32_t wire_len;
  std::memcpy(&magic, hdr, 4);
  std::memcpy(&version, hdr + 4, 2);
  std::memcpy(&wire_len, hdr + 8, 4);
  if (magic != kFrameMagic || version != kWireVersion)
    return Status(DYAD_RC_BADUNPACK, "not a DYAD peer (bad frame magic or wire version)");
  const size_t overhead = recv_cipher_ ? kSealTagSize : 0;
  if (wire_len < overhead || wire_len - overhead > frame_limit())
    return Status(DYAD_RC_BADUNPACK,
                  "frame length " + std::to_string(wire_len) + " exceeds the limit of " +
                      std::to_string(frame_limit()) + " bytes" +
                      (trust_ == Trust::kUnauthenticated ? " before authentication" : ""));
  return static_cast<size_t>(wire_len);
}

// The blocking receive is the non-blocking one (net_now.cc) with a wait
// between calls: one frame reader, whichever way it is driven.
Status Channel::RecvFrame(uint16_t* type, std::string* payload, Deadline deadline) {
  PartialFrame f;
  for (;;) {
    Result<bool> r = RecvFrameNow(&f, type, payload);
    if (!r.ok()) return r.status();
    if (*r) return Status::OK();
    Status st = WaitFor(POLLIN, deadline);
    if (!st.ok()) {
      // Waiting for the first byte may time out without harm (idle loops
      // poll with short deadlines); a frame that stopped half-way leaves
      // the stream out of step.
      if (f.hdr_got > 0) broken_ = true;
      return st;
    }
  }
}

Status Channel::SendFileRange(int file_fd, uint64_t offset, uint64_t len, int64_t idle_ms,
                              uint64_t* sent) {
  if (capture_ != nullptr) {
    broken_ = true;
    return Status(DYAD_RC_BADREQUEST, "a file range cannot be sent from an inline handler");
  }
  off_t off = static_cast<off_t>(offset);
  uint64_t done = 0;
  // sendfile blocks on this (blocking) socket; SO_SNDTIMEO turns "no
  // progress for idle_ms" into EAGAIN so a stalled peer cannot hang us.
  timeval tv{};
  tv.tv_sec = idle_ms / 1000;
  tv.tv_usec = (idle_ms % 1000) * 1000;
  setsockopt(fd_.get(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  while (done < len) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(len - done, 1u << 30));
    const ssize_t n = ::sendfile(fd_.get(), file_fd, &off, chunk);
    if (n > 0) {
      done += static_cast<uint64_t>(n);
      continue;
    }
    if (n == 0) {
      broken_ = true;
      if (sent) *sent = done;
      return Status(DYAD_RC_BADFIO, "file shrank while being sent (" + std::to_string(done) +
                                        " of " + std::to_string(len) + " bytes)");
    }
    if (errno == EINTR) continue;
    broken_ = true;
    if (sent) *sent = done;
    if (errno == EAGAIN)
      return Status(DYAD_RC_TIMEOUT,
                    "peer made no progress for " + std::to_string(idle_ms) + " ms");
    const dyad_rc_t code =
        (errno == EPIPE || errno == ECONNRESET) ? DYAD_RC_CONNLOST : DYAD_RC_BADFIO;
    return StatusFromErrno(errno, "sendfile", code);
  }
  if (sent) *sent = done;
  return Status::OK();
}

bool IsConnectionLost(int err) {
  return err == ECONNRESET || err == EPIPE || err == ENOTCONN || err == ECONNABORTED ||
         err == ETIMEDOUT || err == EHOSTUNREACH || err == ENETRESET;
}

bool Channel::PeerClosed() const {
  if (has_unread()) return false;  // a request is still to be read
  pollfd p{fd_.get(), POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) return true;
  return false;
}

Status TrustLocalService(Channel& ch) {
  Result<PeerCred> cred = UnixPeerCredentials(ch.fd());
  if (!cred.ok()) {
    ch.MarkBroken();
    return cred.status();
  }
  const uid_t me = ::geteuid();
  if (cred->uid != me && cred->uid != 0) {
    ch.MarkBroken();
    return Status(DYAD_RC_PERM, "the process listening on the dyad-service socket (pid " +
                                    std::to_string(cred->pid) + ") runs as uid " +
                                    std::to_string(cred->uid) + ", neither this user (uid " +
                                    std::to_string(me) + ") nor root; refusing to trust it");
  }
  if (cred->uid != me) {
    // A service run by root admits root's clients only (AdmitLocalClient):
    // said here, rather than as a connection it closes on us.
    ch.MarkBroken();
    return Status(DYAD_RC_PERM, "the dyad-service listening on this socket (pid " +
                                    std::to_string(cred->pid) +
                                    ") runs as root and serves root's clients only; run a "
                                    "dyad-service as this user (uid " +
                                    std::to_string(me) + ") for them");
  }
  ch.SetTrust(Trust::kLocalPeer);
  return Status::OK();
}

Status AdmitLocalClient(Channel& ch, PeerCred* out) {
  Result<PeerCred> cred = UnixPeerCredentials(ch.fd());
  if (!cred.ok()) {
    ch.MarkBroken();
    return cred.status();
  }
  if (out) *out = *cred;
  const uid_t me = ::geteuid();
  if (cred->uid != me && cred->uid != 0)
    return Status(DYAD_RC_PERM, "dyad-service belongs to another user");
  ch.SetTrust(Trust::kLocalPeer);
  return Status::OK();
}

Status WriteFully(int fd, const void* buf, size_t len) {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    const ssize_t n = ::write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return StatusFromErrno(errno, "write");
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::OK();
}

}  // namespace dyad
