// peer_dial.h: taking a session to another service, as a Resumable.
//
// A pooled session is taken at once. Otherwise the session is dialled in
// steps that never block (a non-blocking connect that waits for the socket
// to be writable, then the connecting side of the handshake, ClientHandshake,
// that waits for it to be readable), so a fetch driven on the loop parks its
// request while an owner is slow: an owner that accepts connections but
// never sends its challenge (hung, stopped) or an address whose SYNs are
// dropped holds no worker of the requesting service.
//
// One dial per rank at a time (PeerDirectory::JoinDial): a PeerDial that
// finds a dial to its rank in flight waits for that dial's outcome (on the
// flight's eventfd, so it parks like any other wait). A failed dial fails
// its waiters at once with its error; a successful one lets them go on
// (a pooled session, or a dial of their own, without waiting again: the
// owner answers); a dial abandoned by its requester lets one of them lead
// the next. Errors keep PeerDirectory's wording (FinishDial).
//
// Bounds: the connect and the handshake together min(deadline,
// --rpc-timeout); the wait for another's dial the caller's deadline, or
// the end of that dial when it comes at most 250 ms later.
#pragma once

#include <cstdint>
#include <memory>

#include "common/net.h"
#include "proto/auth.h"
#include "service/peers.h"
#include "service/resumable.h"

namespace dyad {

class PeerDial final : public Resumable {
 public:
  PeerDial(PeerDirectory* peers, uint32_t rank, Deadline deadline);
  ~PeerDial() override;

  bool Step(Wait* wait) override;
  void Expired() override;
  // Its first step may ask the store for the owner's address.
  bool NextStepBlocks() const override { return stage_ == Stage::kStart && !peers_->Known(rank_); }
  void Abandon(const Status& why) override;

  // The session, or why there is none; once Step returned true (once).
  Result<std::unique_ptr<Channel>> Take();

 private:
  enum class Stage { kStart, kJoined, kConnecting, kHandshake, kDone };
  bool Start(Wait* wait);
  void JoinBy();
  bool WaitJoined(Wait* wait);
  bool BeginConnect(Wait* wait);
  bool Connected(Wait* wait);
  bool Handshake(Wait* wait);
  // The dial (connect or handshake) ended with `st`: checked, worded.
  void DialEnded(const Status& st);
  void End(Result<std::unique_ptr<Channel>> r);
  void LeaveFlight();

  PeerDirectory* const peers_;
  const uint32_t rank_;
  const Deadline deadline_;                     // the caller's
  Deadline dial_deadline_;                      // of the connect and the handshake
  Deadline join_deadline_ = Deadline::Never();  // of the wait for another's dial
  Stage stage_ = Stage::kStart;
  bool alone_ = false;  // another's dial succeeded: dial without a flight
  ServiceRecord rec_;
  SocketAddress addr_;
  std::shared_ptr<PeerDirectory::DialFlight> flight_;
  bool lead_ = false;
  bool joined_ = false;  // waits for another's dial (counted by the directory)
  UniqueFd joined_fd_;   // a duplicate of the flight's eventfd (one watch per descriptor)
  UniqueFd connecting_;
  std::unique_ptr<Channel> ch_;
  std::unique_ptr<ClientHandshake> hs_;
  Result<std::unique_ptr<Channel>> result_;
};

}  // namespace dyad
