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
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/cancel.h"
#include "common/net.h"
#include "kvs/kvs.h"
#include "proto/auth.h"
#include "proto/protocol.h"

namespace dyad {

// What a bounded probe of a registered service found.
struct ProbeResult {
  PeerState state = PeerState::kUnknown;
  PeerIdentity identity;  // who answered (kAlive, kOtherIdentity)
  Status status;          // why it is not alive
  uint64_t rtt_ns = 0;
};

class PeerDirectory {
 public:
  PeerDirectory(Kvs* kvs, const Authenticator* auth, PeerIdentity self, int64_t rpc_timeout_ms);

  // Membership record of `rank` (cached; `refresh` forces a store lookup).
  Result<ServiceRecord> Resolve(uint32_t rank, bool refresh);

  // A session to `rank` (pooled or new). Return it with Release when the
  // conversation ended cleanly; a broken channel is dropped.
  Result<std::unique_ptr<Channel>> Acquire(uint32_t rank, Deadline deadline);
  void Release(uint32_t rank, std::unique_ptr<Channel> ch);
  // Forgets cached record and idle sessions of `rank` (after a failure).
  void Invalidate(uint32_t rank);

  // Connects to rec.address, authenticates and pings, within `deadline`
  // (connection attempts are sliced so `cancel` is honoured within 250 ms).
  // kAlive only when the answer comes from rec.rank with rec.incarnation.
  ProbeResult Probe(const ServiceRecord& rec, Deadline deadline, const CancelFn& cancel = nullptr);
  // Wall clock of the last authenticated exchange with `rank` (0: never).
  uint64_t LastContact(uint32_t rank);

 private:
  struct Peer {
    bool have_record = false;
    ServiceRecord record;
    std::vector<std::unique_ptr<Channel>> idle;
    uint64_t last_contact_ns = 0;
    uint64_t reported_incarnation = 0;  // record already reported as answered by another
  };
  Result<std::unique_ptr<Channel>> Dial(const std::string& address, Deadline deadline,
                                        const CancelFn& cancel, PeerIdentity* peer);
  Status Mismatch(uint32_t rank, const ServiceRecord& rec, const PeerIdentity& peer);
  void Touch(uint32_t rank);
  Kvs* kvs_;
  const Authenticator* auth_;
  PeerIdentity self_;
  int64_t rpc_timeout_ms_;
  std::mutex mu_;
  std::map<uint32_t, Peer> peers_;
};

}  // namespace dyad
