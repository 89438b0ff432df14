// placement_batch.cc: Placement::PlaceBatch, several files placed with one
// request per owner (see placement.h). De-duplication is the same as for
// Place(): each destination is registered in flight before its batch is
// sent, so a consume of one of these files meanwhile joins the batch's
// transfer of it instead of starting its own.
#include <map>

#include "common/log.h"
#include "common/net.h"
#include "common/time.h"
#include "service/peer_waits.h"
#include "service/placement.h"

namespace dyad {

Task<std::vector<Result<ConsumeReply>>> Placement::PlaceBatch(std::vector<PlacementRequest> reqs,
                                                              Deadline deadline, Stop* stop,
                                                              size_t parallelism) {
  std::vector<Result<ConsumeReply>> out(reqs.size(), Status(DYAD_RC_SYSFAIL, "not placed"));
  // The work, as tasks: a group (up to one kFetchBatch) of small files one
  // owner sends together, or one file placed alone.
  std::vector<std::vector<size_t>> groups;
  std::vector<size_t> single;
  std::map<uint32_t, size_t> open_group;  // owner -> its group being filled
  Transport* transport = nullptr;
  std::vector<std::shared_ptr<void>> rooms;  // released when the batch returns
  for (size_t i = 0; i < reqs.size(); ++i) {
    const PlacementRequest& r = reqs[i];
    Result<Route> route = co_await Decide(r);
    if (!route.ok()) {
      out[i] = route.status();
      continue;
    }
    Result<Transport*> t = *route == Route::kRemote && r.record.size <= kBatchInline
                               ? transports_->ForMode(r.dtl_mode)
                               : Result<Transport*>(Status(DYAD_RC_NOTSUP, "not batched"));
    // Batched: remote small files whose transport streams on the session
    // anyway (the bytes then ride in the replies); one transport per call.
    if (!t.ok() || !(*t)->caps().data_on_session || (transport != nullptr && *t != transport)) {
      single.push_back(i);
      continue;
    }
    // Room for it, reserved until the batch is done (a file placed alone
    // is checked by Place).
    if (!IsCurrentCopy(r.cons_root + "/" + r.record.upath, r.record)) {
      std::shared_ptr<void> hold;
      if (Status room = Room(r, &hold); !room.ok()) {
        out[i] = room;
        continue;
      }
      rooms.push_back(std::move(hold));
    }
    transport = *t;
    auto g = open_group.find(r.record.owner_rank);
    if (g == open_group.end() || groups[g->second].size() >= kMaxFetchBatchItems) {
      g = open_group.insert_or_assign(r.record.owner_rank, groups.size()).first;
      groups.emplace_back();
    }
    groups[g->second].push_back(i);
  }
  std::vector<std::shared_ptr<InFlight>> flights(reqs.size());
  // Singles go last: one that joins a transfer of this batch (the same
  // file twice) then finds it done, or in flight in another task.
  co_await ForEachTask(
      *rt_, groups.size() + single.size(), parallelism, [&](size_t k) -> Task<void> {
        if (k < groups.size()) {
          co_await PlaceGroup(reqs, groups[k], transport, deadline, stop, &flights, &out);
          co_return;
        }
        const size_t i = single[k - groups.size()];
        out[i] = co_await Place(reqs[i], deadline, stop);
      });
  co_return out;
}

Task<void> Placement::PlaceGroup(const std::vector<PlacementRequest>& reqs,
                                 const std::vector<size_t>& group, Transport* transport,
                                 Deadline deadline, Stop* stop,
                                 std::vector<std::shared_ptr<InFlight>>* flights,
                                 std::vector<Result<ConsumeReply>>* out) {
  std::vector<size_t> mine, hits, joins;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t i : group) {
      const std::string dest = reqs[i].cons_root + "/" + reqs[i].record.upath;
      if (inflight_.count(dest) != 0) {
        joins.push_back(i);
      } else if (IsCurrentCopy(dest, reqs[i].record)) {
        hits.push_back(i);
      } else {
        (*flights)[i] = std::make_shared<InFlight>();
        inflight_[dest] = (*flights)[i];
        mine.push_back(i);
      }
    }
  }
  for (size_t i : hits) {
    if (cache_ != nullptr) cache_->NoteHit(reqs[i].cons_root + "/" + reqs[i].record.upath);
    ConsumeReply r;
    r.record = reqs[i].record;
    r.local = true;
    stats_->Add(ServiceStats::kConsumeLocal);
    (*out)[i] = r;
  }
  if (!mine.empty()) co_await FetchTogether(reqs, mine, transport, stop, *flights, out);
  // In flight elsewhere (another consume, a prefetch, or this batch's own
  // copy of the same file): wait for it as Place() would.
  for (size_t i : joins) (*out)[i] = co_await Place(reqs[i], deadline, stop);
}

Task<void> Placement::FetchTogether(const std::vector<PlacementRequest>& reqs,
                                    const std::vector<size_t>& mine, Transport* transport,
                                    Stop* stop,
                                    const std::vector<std::shared_ptr<InFlight>>& flights,
                                    std::vector<Result<ConsumeReply>>* out) {
  const uint64_t t0 = MonoNs();
  auto dest = [&reqs](size_t i) { return reqs[i].cons_root + "/" + reqs[i].record.upath; };
  std::vector<const FileRecord*> recs;
  for (size_t i : mine) recs.push_back(&reqs[i].record);
  std::vector<bool> settled(mine.size(), false);
  size_t answered = 0;
  const uint32_t owner = reqs[mine.front()].record.owner_rank;
  PeerWaits waits(*rt_, stop, stats_);
  Status st = co_await fetcher_.FetchBatch(
      owner, recs, kBatchInline,
      [&](size_t k, const Status& s, FetchBatchPart* part) {
        // Too large to go inline, or busy (its producer holds it locked,
        // and the owner does not wait for it in a batch): alone, below.
        if (s.code() == DYAD_RC_NOTSUP) return;
        const size_t i = mine[k];
        Result<ConsumeReply> r =
            s.ok() ? Land(reqs[i], transport, *part, t0) : Result<ConsumeReply>(s);
        (*out)[i] = r;
        Settle(dest(i), flights[i], r);
        settled[k] = true;
      },
      &answered, waits);
  // What the batch did not deliver goes one fetch each, as Place() would:
  // files too large to go inline or busy, all of them for an owner without batches,
  // and all of them when the batch got no answer at all (a pooled session
  // that outlived its peer; the single fetch retries on a fresh one). A
  // session lost halfway is a failure of the rest: retrying each file
  // against an owner that just failed would wait for as many timeouts.
  const bool one_by_one = st.ok() || st.code() == DYAD_RC_NOTSUP || answered == 0;
  if (!st.ok())
    DYAD_LOG_DEBUG("%s; %zu files left%s", st.ToString().c_str(), mine.size() - answered,
                   one_by_one ? ", fetched one by one" : "");
  for (size_t k = 0; k < mine.size(); ++k) {
    if (settled[k]) continue;
    const size_t i = mine[k];
    Result<ConsumeReply> r = st;
    if (one_by_one) r = co_await Transfer(reqs[i], Route::kRemote, transport, stop);
    (*out)[i] = r;
    Settle(dest(i), flights[i], r);
  }
}

Result<ConsumeReply> Placement::Land(const PlacementRequest& req, Transport* transport,
                                     const FetchBatchPart& part, uint64_t t0) {
  AtomicFile file;
  Status st = file.Create(req.cons_root, req.record.upath);
  if (!st.ok()) return st.Annotate("prepare '" + req.record.upath + "' in consumer directory");
  st = WriteFully(file.fd(), part.data.data(), part.data.size());
  if (!st.ok()) {
    file.Abort();
    return st.Annotate("write '" + req.record.upath + "' in consumer directory");
  }
  FetchOutcome outcome;
  outcome.version = part.version;
  outcome.bytes = part.data.size();
  outcome.mode = part.mode;
  return Finish(req, Route::kRemote, transport, file, outcome, t0);
}

}  // namespace dyad
