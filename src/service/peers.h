// peers.h: how a service reaches the other services.
//
// PeerDirectory resolves a rank to its ServiceRecord (address, incarnation,
// producer path) from the membership records in the metadata store, caches
// it, and keeps a pool of authenticated TCP sessions per peer. A session is
// tied to the incarnation it authenticated with: when a peer restarts, its
// new record has a new incarnation and old sessions are discarded, so a
// restarted peer is never confused with the old one. An address that
// answers as another service even after the record was re-read (a wrong
// --advertise, two services on one address) is reported at ERROR, once per
// record. Probe() checks that a record's service is alive without pooling
// the session (rank claims at start-up, `dyad peers`). Thread-safe.
//
// A new session is dialled by DialPeer (peer_dial.h), a task on the
// service's runtime, so a fetch holds no thread while an owner is slow to
// accept or to answer its handshake. One dial per rank leads at a time:
// callers that need a new session to a rank already being dialled wait for
// that dial's outcome (a hung owner costs one connection attempt per
// --rpc-timeout, not one per consume); once it succeeded, up to
// kMaxDialsAlone of them dial beside the next one.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/net.h"
#include "common/runtime.h"
#include "kvs/kvs.h"
#include "proto/auth.h"
#include "proto/protocol.h"

namespace dyad {

// What a bounded probe of a registered service found.
// A refused handshake (DYAD_RC_AUTH) with `what` was being done: the real
// cause first, then the hint that fits it (MUNGE: the same munge key on
// both hosts; otherwise the cluster secret), e.g. "authenticate with rank 1
// at H:P: MUNGE credential refused: ... (every service must ...)".
Status CredentialFailure(const Status& st, const std::string& what);

struct ProbeResult {
  PeerState state = PeerState::kUnknown;
  PeerIdentity identity;  // who answered (kAlive, kOtherIdentity)
  Status status;          // why it is not alive
  uint64_t rtt_ns = 0;
};

class PeerWaits;

class PeerDirectory {
 public:
  PeerDirectory(Kvs* kvs, const Authenticator* auth, PeerIdentity self, int64_t rpc_timeout_ms);

  // Membership record of `rank`: the cached one, else (or with
  // `refresh`) the store's, read by a task on the runtime (no thread held
  // while the store answers).
  Task<Result<ServiceRecord>> Resolve(uint32_t rank, bool refresh);
  // The cached record of `rank`, if any (never asks the store).
  std::optional<ServiceRecord> Cached(uint32_t rank) const;

  // The runtime dials and store reads run on; set before use. A session
  // (DialPeer) goes back with Release when its conversation ended
  // cleanly; a broken channel is dropped.
  void SetRuntime(Runtime* rt) { rt_ = rt; }

  // The parts of a dial that belong to the directory (DialPeer uses them):
  // an idle pooled session (null: none); the flight of a dial to `rank`
  // (`*lead` true: the caller dials by `deadline` and must end it with
  // EndDial; false: it
  // waits for the flight's `done_fd`; null when no flight could be made:
  // the caller dials alone); and the end of a dial: the connect and
  // handshake outcome checked against the record (identity, Mismatch) and
  // its errors worded for the operator.
  struct DialFlight {
    UniqueFd done_fd;                       // an eventfd, readable once the dial ended
    Deadline deadline = Deadline::Never();  // by which it ends (its connect and handshake)
    bool done = false;                      // and `status` are guarded by the directory
    Status status;
  };
  std::unique_ptr<Channel> TakeIdle(uint32_t rank);
  // Dials outside a flight (once one succeeded: the owner answers), at
  // most kMaxDialsAlone per rank at once, so that a burst of requests
  // woken together (files published at once) does not open a handshake
  // each: an owner admits 16 at a time from one peer
  // (DYAD_MAX_UNAUTHENTICATED_PER_PEER) and drops the oldest beyond. The
  // others wait for a pooled session or the next flight.
  static constexpr int kMaxDialsAlone = 3;
  bool BeginDialAlone(uint32_t rank);
  void EndDialAlone(uint32_t rank);
  std::shared_ptr<DialFlight> JoinDial(uint32_t rank, Deadline deadline, bool* lead);
  // The outcome of `flight` (`*done` false while it is in flight).
  Status DialOutcome(const DialFlight& flight, bool* done);
  void EndDial(uint32_t rank, const std::shared_ptr<DialFlight>& flight, const Status& st);
  Task<Result<std::unique_ptr<Channel>>> FinishDial(uint32_t rank, const ServiceRecord& rec,
                                                    Result<std::unique_ptr<Channel>> ch,
                                                    const PeerIdentity& peer);
  const Authenticator& auth() const { return *auth_; }
  const PeerIdentity& self() const { return self_; }
  int64_t rpc_timeout_ms() const { return rpc_timeout_ms_; }
  // Gauges for `dyad status`: dials in flight (those that lead a flight
  // and those alongside), callers waiting on one.
  uint64_t dials_in_flight() const { return dialing_.load(); }
  uint64_t waiting_on_dial() const { return waiting_on_dial_.load(); }
  // A caller that joined a flight (JoinDial, `*lead` false) stops waiting
  // on it (its outcome seen, or the caller gone).
  void LeaveDial() { --waiting_on_dial_; }
  void Release(uint32_t rank, std::unique_ptr<Channel> ch);
  // Forgets cached record and idle sessions of `rank` (after a failure).
  void Invalidate(uint32_t rank);

  // Connects to rec.address, authenticates and pings, within `deadline`
  // (a task on the runtime; `waits`' Stop ends it). kAlive only when the
  // answer comes from rec.rank with rec.incarnation.
  Task<ProbeResult> Probe(const ServiceRecord& rec, Deadline deadline, PeerWaits& waits);
  // Wall clock of the last authenticated exchange with `rank` (0: never).
  uint64_t LastContact(uint32_t rank);

 private:
  struct Peer {
    bool have_record = false;
    ServiceRecord record;
    std::vector<std::unique_ptr<Channel>> idle;
    uint64_t last_contact_ns = 0;
    uint64_t reported_incarnation = 0;    // record already reported as answered by another
    std::shared_ptr<DialFlight> dialing;  // the dial in flight, if any
    int dials_alone = 0;                  // BeginDialAlone not yet ended
  };
  Task<Status> Mismatch(uint32_t rank, const ServiceRecord& rec, const PeerIdentity& peer);
  void Touch(uint32_t rank);
  Kvs* kvs_;
  const Authenticator* auth_;
  PeerIdentity self_;
  int64_t rpc_timeout_ms_;
  Runtime* rt_ = nullptr;
  mutable std::mutex mu_;
  std::map<uint32_t, Peer> peers_;
  std::atomic<uint64_t> dialing_{0};
  std::atomic<uint64_t> waiting_on_dial_{0};
};

}  // namespace dyad
