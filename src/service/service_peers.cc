// service_peers.cc: `dyad peers` — the services registered in the metadata
// store, each with its liveness as this service sees it (a bounded,
// authenticated ping) and the last time it exchanged anything with it.
#include <algorithm>
#include <atomic>
#include <thread>

#include "common/format.h"
#include "common/log.h"
#include "service/dispatch.h"
#include "service/peers.h"
#include "service/service.h"

namespace dyad {

namespace {
// Probes run this many at a time, so a large cluster with many dead
// members answers within a few probe bounds.
constexpr size_t kProbeParallelism = 32;
constexpr int64_t kMaxProbeMs = 10000;
}  // namespace

void Service::HandlePeers(RequestContext& ctx, const PeersRequest& req) {
  Result<std::vector<KvsEntry>> all = kvs_->List(kMembersNamespace, "rank.", 0);
  if (!all.ok()) return Reply(ctx.ch, all.status().Annotate("list the registered services"));
  PeersReply reply;
  for (const auto& [key, value] : *all) {
    PeerInfo p;
    if (!ServiceRecord::Decode(value, &p.record)) continue;
    if (!req.ranks.empty() &&
        std::find(req.ranks.begin(), req.ranks.end(), p.record.rank) == req.ranks.end())
      continue;
    reply.peers.push_back(std::move(p));
  }
  std::sort(reply.peers.begin(), reply.peers.end(),
            [](const PeerInfo& a, const PeerInfo& b) { return a.record.rank < b.record.rank; });

  const Deadline deadline =
      Deadline::AfterMs(std::clamp<int64_t>(req.probe_timeout_ms, 1, kMaxProbeMs));
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < reply.peers.size(); i = next++) {
      PeerInfo& p = reply.peers[i];
      if (p.record.rank == opt_.rank && p.record.incarnation == incarnation_) {
        p.state = PeerState::kAlive;
        p.last_contact_ns = WallNs();
        p.detail = "this service";
        continue;
      }
      if (p.record.stopped_ns != 0) {
        // It deregistered on a clean stop: nothing to probe, nothing wrong.
        p.state = PeerState::kStopped;
        p.detail = "stopped cleanly " + LocalDateTime(p.record.stopped_ns, "");
        p.last_contact_ns = peers_->LastContact(p.record.rank);
        continue;
      }
      if (req.probe) {
        const ProbeResult r = peers_->Probe(p.record, deadline, ctx.cancel);
        p.state = r.state;
        p.rtt_ns = r.rtt_ns;
        if (r.state != PeerState::kAlive) p.detail = r.status.message();
      }
      p.last_contact_ns = peers_->LastContact(p.record.rank);
    }
  };
  std::vector<std::thread> pool;
  const size_t n = std::min(kProbeParallelism, reply.peers.size());
  for (size_t i = 1; i < n; ++i) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();

  Encoder e;
  reply.EncodeTo(e);
  Reply(ctx.ch, Status::OK(), e.data());
}

}  // namespace dyad
