// auth_connect.cc: the connecting side of the handshake (auth.h), in steps
// that never wait, and Authenticator::Connect, which runs them in a row.
#include <poll.h>

#include "common/handshake.h"
#include "proto/auth.h"
#include "proto/auth_internal.h"
#include "proto/protocol.h"

namespace dyad {

using namespace auth_internal;

struct ClientHandshake::State {
  std::unique_ptr<EphemeralKey> eph;
  ChallengeMsg challenge;
  std::string transcript;
};

ClientHandshake::ClientHandshake(const Authenticator& auth, const PeerIdentity& self)
    : auth_(auth), self_(self), s_(std::make_unique<State>()) {}

ClientHandshake::~ClientHandshake() = default;

bool ClientHandshake::Step(Channel& ch, Deadline deadline) {
  if (done_) return true;
  return answered_ ? ReadProof(ch) : ReadChallenge(ch, deadline);
}

void ClientHandshake::Expired(Channel& ch) {
  if (done_) return;
  End(ch, Status(DYAD_RC_TIMEOUT, answered_ ? "timed out waiting for the peer's handshake reply"
                                            : "timed out waiting for the peer's handshake "
                                              "challenge (is the service hung?)"));
}

bool ClientHandshake::End(Channel& ch, const Status& st) {
  if (!st.ok()) ch.MarkBroken();
  status_ = st;
  done_ = true;
  return true;
}

bool ClientHandshake::ReadChallenge(Channel& ch, Deadline deadline) {
  uint16_t type = 0;
  Result<bool> got = ch.RecvFrameNow(&frame_, &type, &payload_);
  if (!got.ok()) return End(ch, got.status());
  if (!*got) return false;
  frame_.Reset();
  if (type == static_cast<uint16_t>(MsgType::kReply)) {
    // Refused before the challenge: an owner at its cap of handshakes says
    // so (HandshakeBusy), which the caller may dial again after.
    Status verdict;
    std::string body;
    if (DecodeReply(payload_, &verdict, &body) && IsHandshakeBusy(verdict)) return End(ch, verdict);
  }
  if (type != static_cast<uint16_t>(MsgType::kChallenge))
    return End(ch,
               Status(DYAD_RC_AUTH, std::string("handshake: expected '") +
                                        MsgTypeName(static_cast<uint16_t>(MsgType::kChallenge)) +
                                        "', got '" + MsgTypeName(type) + "'"));
  bool older = false;
  if (!ChallengeMsg::Decode(payload_, &s_->challenge, &older)) {
    if (older)
      return End(ch, Status(DYAD_RC_AUTH,
                            "the peer speaks an older DYAD handshake; run the same DYAD "
                            "version on every node"));
    return End(ch, Status(DYAD_RC_BADUNPACK, "malformed challenge from peer"));
  }
  if (Status st = Answer(ch, payload_, deadline); !st.ok()) return End(ch, st);
  answered_ = true;
  return ReadProof(ch);  // a peer on this host may have answered already
}

// Our hello and proofs over the transcript of both hellos.
Status ClientHandshake::Answer(Channel& ch, const std::string& challenge_payload,
                               Deadline deadline) {
  Result<std::unique_ptr<EphemeralKey>> eph = EphemeralKey::Generate();
  if (!eph.ok()) return eph.status();
  s_->eph = std::move(*eph);
  const AuthConfig& cfg = auth_.config();
  AuthenticateMsg m;
  m.hello.nonce.assign(kHandshakeNonceSize, '\0');
  DYAD_RETURN_IF_ERROR(RandomBytes(m.hello.nonce.data(), m.hello.nonce.size()));
  m.hello.rank = self_.rank;
  m.hello.incarnation = self_.incarnation;
  m.hello.credentials = auth_.credentials();
  m.hello.protection = static_cast<uint8_t>(cfg.protection);
  Result<std::string> pub = s_->eph->PublicKey();
  if (!pub.ok()) return pub.status();
  m.hello.public_key = *pub;
  s_->transcript = HandshakeTranscript(challenge_payload, m.hello);
  if (s_->transcript.empty()) return CryptoError("transcript hash");
  DYAD_RETURN_IF_ERROR(MakeProofs(cfg, kClientRole, s_->transcript, &m.munge, &m.mac));
  // What lets the accepting side tell an altered handshake from a wrong
  // secret (handshake.h).
  m.challenge_hash = Sha256(challenge_payload);
  if (m.challenge_hash.empty()) return CryptoError("challenge hash");
  if (!cfg.secret.empty()) m.secret_check = SecretCheck(cfg.secret, s_->challenge.hello.nonce);
  return ch.SendFrame(static_cast<uint16_t>(MsgType::kAuthenticate), m.Encode(), deadline);
}

bool ClientHandshake::ReadProof(Channel& ch) {
  uint16_t type = 0;
  Result<bool> got = ch.RecvFrameNow(&frame_, &type, &payload_);
  if (!got.ok()) return End(ch, got.status());
  if (!*got) return false;
  frame_.Reset();
  if (type != static_cast<uint16_t>(MsgType::kReply))
    return End(ch, Status(DYAD_RC_BADRPC,
                          std::string("expected a reply, got '") + MsgTypeName(type) + "'"));
  return End(ch, Finish(ch, payload_));
}

// The server's verdict and proofs; on success the channel is protected.
Status ClientHandshake::Finish(Channel& ch, const std::string& reply_payload) {
  Status verdict;
  std::string body;
  if (!DecodeReply(reply_payload, &verdict, &body))
    return Status(DYAD_RC_BADUNPACK, "malformed reply");
  const Hello& announced = s_->challenge.hello;
  // The challenge said which credentials the peer requires: a mismatch is
  // named from it (the refusal itself says nothing).
  if (!verdict.ok() && announced.credentials != auth_.credentials())
    return Status(DYAD_RC_AUTH, "credential mismatch: this service requires " +
                                    auth_.credential_names() + ", the peer presents " +
                                    CredentialSetName(announced.credentials));
  if (!verdict.ok()) {
    if (verdict.code() != DYAD_RC_AUTH) return verdict;
    // Both sides use the same kinds of credential (checked above): the
    // likely cause is another value of those.
    const uint8_t both = auth_.credentials();
    const char* which = (both & kCredSecret) != 0 && (both & kCredMunge) != 0
                            ? "another cluster secret or MUNGE key"
                        : (both & kCredMunge) != 0 ? "another MUNGE key"
                                                   : "another cluster secret";
    return Status(DYAD_RC_AUTH, "the peer refused our handshake (it says only '" +
                                    verdict.message() + "'; its log names the cause: " + which +
                                    ", or a handshake altered in transit)");
  }
  ServerProofMsg proof;
  if (!ServerProofMsg::Decode(body, &proof))
    return Status(DYAD_RC_BADUNPACK, "malformed handshake reply from peer");
  const Hello& theirs = s_->challenge.hello;
  const AuthConfig& cfg = auth_.config();
  if (theirs.credentials != auth_.credentials())
    return Status(DYAD_RC_AUTH, "credential mismatch: this service requires " +
                                    auth_.credential_names() + ", the peer presents " +
                                    CredentialSetName(theirs.credentials));
  if (Status ps = CheckProofs(cfg, kServerRole, s_->transcript, proof.munge, proof.mac); !ps.ok())
    return Status(DYAD_RC_AUTH, "peer failed to prove its identity (" + ps.message() + ")");
  Secret dh, okm;
  DYAD_RETURN_IF_ERROR(s_->eph->Agree(theirs.public_key, &dh));
  DYAD_RETURN_IF_ERROR(DeriveSessionKeys(dh, cfg.secret, s_->transcript, &okm));
  DYAD_RETURN_IF_ERROR(ProtectSession(ch, okm, Stronger(cfg.protection, theirs.protection),
                                      /*accepting=*/false));
  peer_ = PeerIdentity{theirs.rank, theirs.incarnation};
  return Status::OK();
}

Status Authenticator::Connect(Channel& ch, const PeerIdentity& self, Deadline deadline,
                              PeerIdentity* peer) const {
  ClientHandshake hs(*this, self);
  while (!hs.Step(ch, deadline)) {
    Status st = ch.WaitFor(POLLIN, deadline);
    if (st.code() == DYAD_RC_TIMEOUT) hs.Expired(ch);
    if (!st.ok() && st.code() != DYAD_RC_TIMEOUT) {
      ch.MarkBroken();
      return st;
    }
  }
  if (hs.status().ok() && peer) *peer = hs.peer();
  return hs.status();
}

}  // namespace dyad
