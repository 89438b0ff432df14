// versions.h: how a new version of a file reaches the services holding
// copies of an older one (read-write ownership, docs/consistency.md).
//
// When a node publishes a file it holds a copy of (a consumer wrote a
// consumed file and became its owner), its service tells the previous
// owner (kSupersede); the previous owner passes the notice on to every
// service that fetched the file from it. Each receiver updates its
// metadata cache and removes its copies of other versions (NodeCache::
// Supersede), so its clients' level-1 shortcut (file present, no message)
// cannot hand out the old bytes again. All of this happens before the
// writer's publication returns, so a consume that starts on any node after
// the writer's close returned gets the new version. Notices are bounded
// waits; an unreachable service is logged and skipped (its copies then
// stay until the store's notifications or its own next lookup say more).
// The owner side remembers who fetched what in a bounded table (the oldest
// half is forgotten when it fills). Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "proto/protocol.h"
#include "service/peer_waits.h"
#include "service/peers.h"

namespace dyad {

class VersionNotices {
 public:
  VersionNotices(uint32_t self_rank, PeerDirectory* peers, int64_t rpc_timeout_ms,
                 size_t capacity = 1u << 16);

  // Owner side: `rank` is being sent our file `upath`.
  void NoteReader(const std::string& upath, uint32_t rank);
  // Owner side: the services that fetched `upath` since the last call
  // (they are forgotten: their next fetch goes to the new owner).
  std::vector<uint32_t> TakeReaders(const std::string& upath);

  // Notices to send: (rank, encoded notice) pairs.
  using Addressed = std::vector<std::pair<uint32_t, std::string>>;
  // Appends `notice` for every rank in `ranks` but this one to `*to`.
  void Address(const std::set<uint32_t>& ranks, const SupersedeNotice& notice, Addressed* to) const;
  // Sends `to` one after the other, each bounded by the RPC timeout
  // (service/peer_rpc.h): a slow or silent receiver holds no thread. A
  // receiver that does not accept it is logged and skipped.
  Task<void> Send(Addressed to, std::string upath, PeerWaits& waits);

 private:
  const uint32_t self_;
  PeerDirectory* peers_;
  const int64_t rpc_timeout_ms_;
  const size_t capacity_;
  std::mutex mu_;
  std::unordered_map<std::string, std::set<uint32_t>> readers_;
  std::deque<std::string> order_;  // insertion order of readers_' keys
};

}  // namespace dyad
