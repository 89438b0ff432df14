#include "common/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "common/wire.h"
#include "proto/protocol.h"

namespace dyad {
namespace {
constexpr size_t kNonceSize = 32;
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

std::string Authenticator::Mac(const std::string& label, const std::string& nonce) const {
  std::string msg = "dyad-auth-v1/" + label + "/" + nonce;
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  static const unsigned char kEmptyKey[1] = {0};
  const void* key = secret_.empty() ? static_cast<const void*>(kEmptyKey) : secret_.data();
  HMAC(EVP_sha256(), key, static_cast<int>(secret_.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out, &out_len);
  return std::string(reinterpret_cast<char*>(out), out_len);
}

namespace {

bool MacEqual(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

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

}  // namespace

Status Authenticator::Accept(Channel& ch, const PeerIdentity& self, Deadline deadline,
                             PeerIdentity* peer) const {
  std::string nonce(kNonceSize, '\0');
  DYAD_RETURN_IF_ERROR(RandomBytes(nonce.data(), nonce.size()));
  Encoder ch_msg;
  ch_msg.Str(nonce).U32(self.rank).U64(self.incarnation);
  DYAD_RETURN_IF_ERROR(
      ch.SendFrame(static_cast<uint16_t>(MsgType::kChallenge), ch_msg.data(), deadline));

  std::string payload;
  DYAD_RETURN_IF_ERROR(Expect(ch, MsgType::kAuthenticate, &payload, deadline));
  Decoder d(payload);
  const std::string mac = d.Str(256);
  PeerIdentity who;
  who.rank = d.U32();
  who.incarnation = d.U64();
  const std::string peer_nonce = d.Str(256);
  if (!d.done() || peer_nonce.size() != kNonceSize) {
    ch.MarkBroken();
    (void)ch.SendFrame(static_cast<uint16_t>(MsgType::kReply),
                       EncodeReply(Status(DYAD_RC_BADUNPACK, "malformed authentication")),
                       deadline);
    return Status(DYAD_RC_BADUNPACK, "malformed authentication message");
  }
  if (!MacEqual(mac, Mac("client", nonce))) {
    ch.MarkBroken();
    (void)ch.SendFrame(static_cast<uint16_t>(MsgType::kReply),
                       EncodeReply(Status(DYAD_RC_AUTH, "wrong cluster secret")), deadline);
    return Status(DYAD_RC_AUTH, "peer claiming rank " + std::to_string(who.rank) +
                                    " failed authentication (wrong cluster secret)");
  }
  Encoder ok;
  ok.Str(Mac("server", peer_nonce));
  DYAD_RETURN_IF_ERROR(ch.SendFrame(static_cast<uint16_t>(MsgType::kReply),
                                    EncodeReply(Status::OK(), ok.data()), deadline));
  if (peer) *peer = who;
  return Status::OK();
}

Status Authenticator::Connect(Channel& ch, const PeerIdentity& self, Deadline deadline,
                              PeerIdentity* peer) const {
  std::string payload;
  DYAD_RETURN_IF_ERROR(Expect(ch, MsgType::kChallenge, &payload, deadline));
  Decoder d(payload);
  const std::string nonce = d.Str(256);
  PeerIdentity who;
  who.rank = d.U32();
  who.incarnation = d.U64();
  if (!d.done() || nonce.size() != kNonceSize) {
    ch.MarkBroken();
    return Status(DYAD_RC_BADUNPACK, "malformed challenge from peer");
  }
  std::string my_nonce(kNonceSize, '\0');
  DYAD_RETURN_IF_ERROR(RandomBytes(my_nonce.data(), my_nonce.size()));
  Encoder e;
  e.Str(Mac("client", nonce)).U32(self.rank).U64(self.incarnation).Str(my_nonce);
  std::string body;
  Status st = CallRpc(ch, MsgType::kAuthenticate, e.data(), &body, deadline);
  if (!st.ok()) {
    ch.MarkBroken();
    return st.code() == DYAD_RC_AUTH ? Status(DYAD_RC_AUTH, "peer rejected our credential: " + st.message())
                                     : st;
  }
  Decoder rd(body);
  const std::string server_mac = rd.Str(256);
  if (!rd.done() || !MacEqual(server_mac, Mac("server", my_nonce))) {
    ch.MarkBroken();
    return Status(DYAD_RC_AUTH, "peer failed to prove it holds the cluster secret");
  }
  if (peer) *peer = who;
  return Status::OK();
}

Result<std::string> LoadClusterSecret(const std::string& file) {
  std::string path = file;
  if (path.empty()) {
    if (const char* f = std::getenv("DYAD_SECRET_FILE"); f && *f) path = f;
  }
  if (path.empty()) {
    if (const char* s = std::getenv("DYAD_SECRET"); s && *s) return std::string(s);
    return std::string();
  }
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return StatusFromErrno(errno, "open secret file '" + path + "'", DYAD_RC_AUTH);
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return StatusFromErrno(errno, "stat secret file '" + path + "'");
  if (st.st_mode & (S_IRWXG | S_IRWXO))
    return Status(DYAD_RC_AUTH, "secret file '" + path +
                                    "' is accessible by group or others; chmod 600 it");
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
  while (!secret.empty() && (secret.back() == '\n' || secret.back() == '\r')) secret.pop_back();
  if (secret.empty()) return Status(DYAD_RC_AUTH, "secret file '" + path + "' is empty");
  return secret;
}

}  // namespace dyad
