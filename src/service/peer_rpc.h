// peer_rpc.h: one request to another service and its reply, as a Resumable.
//
// Takes a session to the rank (PeerDial: pooled, or dialled in steps that
// never block), sends the request, and assembles the reply without waiting
// (Channel::RecvFrameNow). Driven on the loop (Drive, service/resumable.h), a request that must
// hear from another service (a version notice before a publication returns) parks while that
// service is slow or silent instead of holding its worker.
//
// Bounds: the session and the reply together `timeout_ms`. A session that
// answered is returned to the pool; one that timed out or broke is not.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/net.h"
#include "proto/protocol.h"
#include "service/peer_dial.h"
#include "service/peers.h"
#include "service/resumable.h"

namespace dyad {

class PeerRpcOp final : public Resumable {
 public:
  PeerRpcOp(PeerDirectory* peers, uint32_t rank, MsgType type, std::string request,
            int64_t timeout_ms);
  ~PeerRpcOp() override;

  bool Step(Wait* wait) override;
  void Expired() override;
  bool NextStepBlocks() const override { return dial_ && dial_->NextStepBlocks(); }
  void Abandon(const Status& why) override;

  // Once Step returned true: the reply's status, and its body on success.
  const Status& status() const { return status_; }
  const std::string& body() const { return body_; }

 private:
  // The session is there: send the request (true: sent).
  bool Send();
  void End(const Status& st);

  PeerDirectory* const peers_;
  const uint32_t rank_;
  const MsgType type_;
  const std::string request_;
  const int64_t timeout_ms_;
  const Deadline deadline_;
  std::unique_ptr<PeerDial> dial_;
  std::unique_ptr<Channel> session_;
  Channel::PartialFrame frame_;
  std::string payload_;
  bool replied_ = false;  // a whole reply frame arrived
  bool done_ = false;
  Status status_;
  std::string body_;
};

}  // namespace dyad
