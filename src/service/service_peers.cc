// service_peers.cc: `dyad peers` — the services registered in the metadata
// store, each with its liveness as this service sees it (a bounded,
// authenticated ping) and the last time it exchanged anything with it.
#include <algorithm>

#include "common/format.h"
#include "common/log.h"
#include "service/dispatch.h"
#include "service/peer_waits.h"
#include "service/peers.h"
#include "service/service.h"

namespace dyad {

namespace {
// Probes run this many at a time, so a large cluster with many dead
// members answers within a few probe bounds.
constexpr size_t kProbeParallelism = 32;
constexpr int64_t kMaxProbeMs = 10000;
}  // namespace

Task<void> Service::HandlePeers(RequestContext& ctx, PeersRequest req) {
  Result<std::vector<KvsEntry>> all =
      co_await kvs_->ListTask(*runtime_, kMembersNamespace, "rank.", 0);
  if (!all.ok()) {
    Reply(ctx.ch, all.status().Annotate("list the registered services"));
    co_return;
  }
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
  // Probed as tasks, kProbeParallelism at a time: none holds a thread.
  PeerWaits waits(*runtime_, ctx.stop, nullptr);
  co_await ForEachTask(*runtime_, reply.peers.size(), kProbeParallelism,
                       [&](size_t i) -> Task<void> {
                         PeerInfo& p = reply.peers[i];
                         if (p.record.rank == opt_.rank && p.record.incarnation == incarnation_) {
                           p.state = PeerState::kAlive;
                           p.last_contact_ns = WallNs();
                           p.detail = "this service";
                           co_return;
                         }
                         if (p.record.stopped_ns != 0) {
                           // It deregistered on a clean stop: nothing to
                           // probe, nothing wrong.
                           p.state = PeerState::kStopped;
                           p.detail = "stopped cleanly " + LocalDateTime(p.record.stopped_ns, "");
                           p.last_contact_ns = peers_->LastContact(p.record.rank);
                           co_return;
                         }
                         if (req.probe) {
                           const ProbeResult r = co_await peers_->Probe(p.record, deadline, waits);
                           p.state = r.state;
                           p.rtt_ns = r.rtt_ns;
                           if (r.state != PeerState::kAlive) p.detail = r.status.message();
                         }
                         p.last_contact_ns = peers_->LastContact(p.record.rank);
                       });

  Encoder e;
  reply.EncodeTo(e);
  Reply(ctx.ch, Status::OK(), e.data());
}

}  // namespace dyad
