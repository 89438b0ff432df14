// Fuzz target: the service-to-service handshake (proto/auth.cc and the
// message decoders of common/handshake.cc).
//
// Input: byte 0 picks the mode; the rest is the hostile side's bytes.
//   0, 1, 2: ChallengeMsg / AuthenticateMsg / ServerProofMsg decoders; what
//            decodes must encode back to something that decodes the same.
//   3, 4:    the accepting side (Authenticator::Accept) facing a peer that
//            sends the rest: with a secret (proofs cannot match) and without
//            any credential (so the fuzzer reaches key agreement with its
//            own public keys).
//   5, 6:    the connecting side (Authenticator::Connect), the same two ways.
// Whatever comes, the handshake ends with an error or, only without
// credentials, a protected and authenticated channel; never a crash.
#include "common/handshake.h"
#include "fuzz/fuzz_util.h"
#include "proto/auth.h"

using namespace dyad;
using dyad::fuzz::Check;

namespace {

template <typename Msg>
void RoundTrip(std::string_view in) {
  Msg m;
  bool older = false;
  bool ok;
  if constexpr (std::is_same_v<Msg, ChallengeMsg>)
    ok = Msg::Decode(in, &m, &older);
  else
    ok = Msg::Decode(in, &m);
  if (!ok) return;
  const std::string again = m.Encode();
  Msg m2;
  if constexpr (std::is_same_v<Msg, ChallengeMsg>)
    Check(Msg::Decode(again, &m2, &older));
  else
    Check(Msg::Decode(again, &m2));
  Check(m2.Encode() == again);
}

void Drive(std::string_view peer_bytes, bool accepting, bool with_secret) {
  dyad::fuzz::FedChannel fed(peer_bytes, Trust::kUnauthenticated);
  Authenticator auth(with_secret ? std::string("fuzz-secret") : std::string());
  PeerIdentity peer;
  Status st = accepting
                  ? auth.Accept(fed.channel(), PeerIdentity{0, 1}, Deadline::AfterMs(1000), &peer)
                  : auth.Connect(fed.channel(), PeerIdentity{1, 2}, Deadline::AfterMs(1000), &peer);
  if (st.ok()) {
    // Only a peer without credentials can be "authenticated" by bytes that
    // know no secret; the channel must then be trusted and protected.
    Check(!with_secret);
    Check(fed.channel().trust() == Trust::kAuthenticated);
    // We asked for integrity; a peer can raise the level, never lower it.
    Check(fed.channel().protection() >= LinkProtection::kIntegrity);
  } else {
    Check(fed.channel().trust() == Trust::kUnauthenticated);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 7) {
    case 0:
      RoundTrip<ChallengeMsg>(rest);
      break;
    case 1:
      RoundTrip<AuthenticateMsg>(rest);
      break;
    case 2:
      RoundTrip<ServerProofMsg>(rest);
      break;
    case 3:
      Drive(rest, true, true);
      break;
    case 4:
      Drive(rest, true, false);
      break;
    case 5:
      Drive(rest, false, true);
      break;
    default:
      Drive(rest, false, false);
      break;
  }
  return 0;
}
