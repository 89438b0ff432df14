// fetch_op.h: one fetch of one file from its owner, as a Resumable.
//
// The conversation (transport.h): take a pooled (or new) authenticated
// session to the owner (a PeerDial, service/peer_dial.h), send the
// FetchRequest with the transport's arguments, receive the FetchReply, let
// the transport land the bytes in the sink, receive the owner's verdict
// (the file did not change while it was sent). Each wait on the owner is a
// step boundary: a new session's connect and handshake (or another fetch's
// dial to the same owner) wait on their descriptors, the reply and the
// verdict are assembled without blocking (Channel::RecvFrameNow), the bytes
// land through the transport's PullOp (tcp on the session; UCX and
// libfabric, whose ops signal their completions on a wake_fd watched with
// the session). What still blocks inside a step: the lookup of the owner's
// membership record when it is not cached (the metadata store, not the
// owner) and the Pull of transports without a PullOp (the same-node copy,
// bounded by its idle limit).
//
// Bounds: the session (connect and handshake, or the wait for another's
// dial) and the reply together --rpc-timeout, the verdict --rpc-timeout;
// the bytes the transport's idle limit without progress. Errors name the
// file and the owner; `retryable` says the session died before the owner
// answered (a pooled session that outlived its peer: a fresh one may well
// succeed).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/trace.h"
#include "proto/protocol.h"
#include "service/fetcher.h"
#include "service/peer_dial.h"
#include "service/peers.h"
#include "service/resumable.h"
#include "service/transfers.h"
#include "transport/transport.h"

namespace dyad {

class FetchOp final : public Resumable {
 public:
  // `transfers` may be null. `transport` and the sink must outlive the op.
  FetchOp(PeerDirectory* peers, int64_t rpc_timeout_ms, TransferRegistry* transfers,
          const FileRecord& rec, Transport* transport, int sink_fd);
  ~FetchOp() override;

  bool Step(Wait* wait) override;
  void Expired() override;
  // A step that may ask the store for the owner's address, or land the
  // bytes with a transport that copies on this node's disk (no PullOp).
  bool NextStepBlocks() const override;
  void Abandon(const Status& why) override;

  // Once Step returned true.
  const Status& status() const { return status_; }
  const FetchOutcome& outcome() const { return outcome_; }

 private:
  enum class Stage { kStart, kSession, kReply, kPull, kVerdict, kDone };
  // Each stage's step: true when it must wait (`*wait` set); otherwise it
  // moved on to another stage (or ended).
  bool Start();
  bool TakeSession(Wait* wait);
  bool ReadReply(Wait* wait);
  bool BeginPull(const FetchReply& fr);
  bool StepPull(Wait* wait);
  bool ReadVerdict(Wait* wait);
  // The ends: a failed exchange of frames (the reply), a failed pull, and
  // the end of every fetch.
  void FailRpc(const Status& st);
  void PullDone(const Status& st);
  void End(const Status& st);
  void Release();
  // The next reply frame, if it is all here (`*done` false otherwise).
  Status NextReply(bool* done, std::string* body);

  PeerDirectory* const peers_;
  const int64_t rpc_timeout_ms_;
  TransferRegistry* const transfers_;
  const FileRecord rec_;
  Transport* const transport_;
  const int sink_fd_;
  const std::string what_;

  Stage stage_ = Stage::kStart;
  Status status_;
  FetchOutcome outcome_;
  std::unique_ptr<TraceSpan> span_;
  std::unique_ptr<PeerDial> dial_;  // while the session is taken
  std::unique_ptr<Channel> session_;
  Channel::PartialFrame frame_;
  std::string payload_;
  FetchReply reply_;
  Deadline deadline_ = Deadline::Never();  // of the current wait
  TransferStats ts_;
  TransferRegistry::Entry progress_;
  std::unique_ptr<PullOp> pull_;  // uses session_, ts_ and the sink
  uint64_t last_got_ = 0;
};

}  // namespace dyad
