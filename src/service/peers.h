// peers.h: how a service reaches the other services.
//
// PeerDirectory resolves a rank to its ServiceRecord (address, incarnation,
// producer path) from the membership records in the metadata store, caches
// it, and keeps a pool of authenticated TCP sessions per peer. A session is
// tied to the incarnation it authenticated with: when a peer restarts, its
// new record has a new incarnation and old sessions are discarded, so a
// restarted peer is never confused with the old one. Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/auth.h"
#include "common/net.h"
#include "kvs/kvs.h"
#include "proto/protocol.h"

namespace dyad {

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

 private:
  struct Peer {
    bool have_record = false;
    ServiceRecord record;
    std::vector<std::unique_ptr<Channel>> idle;
  };
  Kvs* kvs_;
  const Authenticator* auth_;
  PeerIdentity self_;
  int64_t rpc_timeout_ms_;
  std::mutex mu_;
  std::map<uint32_t, Peer> peers_;
};

}  // namespace dyad
