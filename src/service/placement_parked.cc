// placement_parked.cc: Place for a request that may park.
//
// The same decisions as Place (Prepare, Claim, Begin/Retry/Complete,
// Settle), with the two waits that depend on someone else done without a
// worker once they last: the fetch from the owner (a FetchOp run by
// RunParked, resumable.h) and the wait for another consume's transfer of
// the same file (a joiner registers a completion on the flight instead of
// sleeping on its condition variable).
#include <atomic>

#include "common/log.h"
#include "service/placement.h"
#include "service/resumable.h"

namespace dyad {
namespace {

// One parked joiner: whichever ends it first (the flight settled, its
// deadline, its requester hanging up) resumes it, exactly once.
struct JoinWait {
  std::atomic<bool> claimed{false};
  std::atomic<uint64_t> timer{0};
  bool Claim(FdWatcher* watcher) {
    if (claimed.exchange(true)) return false;
    if (const uint64_t t = timer.load()) watcher->Cancel(t);
    return true;
  }
};

}  // namespace

void Placement::PlaceParked(RequestContext& ctx, const PlacementRequest& req, Deadline deadline,
                            PlaceDone done) {
  if (ctx.parking == nullptr || watcher_ == nullptr)
    return done(ctx, Place(req, deadline, ctx.cancel));
  Result<Plan> plan = Prepare(req);
  if (!plan.ok()) return done(ctx, plan.status());
  if (plan->route == Route::kInPlace) return done(ctx, InPlace(req.record));
  const std::string dest = req.cons_root + "/" + req.record.upath;
  bool joined = false;
  std::shared_ptr<InFlight> flight = Claim(dest, req.record, &joined);
  if (!flight) return done(ctx, CurrentCopy(dest, req.record));
  if (joined) return JoinParked(ctx, flight, req, JoinBy(deadline), std::move(done));
  auto m = std::make_shared<Moving>();
  m->req = req;
  m->plan = *plan;
  m->dest = dest;
  m->flight = flight;
  Begin(*m);
  // A copy within this node (kOwnFile) waits on no one.
  if (!m->error.ok() || !m->fetch) return Conclude(ctx, *m, done);
  FetchParked(ctx, std::move(m), std::move(done));
}

void Placement::FetchParked(RequestContext& ctx, std::shared_ptr<Moving> m, PlaceDone done) {
  std::shared_ptr<Resumable> op = m->fetch;
  RunParked(ctx, std::move(op), watcher_, stats_,
            [this, m = std::move(m), done = std::move(done)](RequestContext& c) {
              if (Retry(*m)) return FetchParked(c, m, done);
              Conclude(c, *m, done);
            });
}

void Placement::Conclude(RequestContext& ctx, Moving& m, const PlaceDone& done) {
  Result<ConsumeReply> result = Complete(m);
  Settle(m.dest, m.flight, result);
  done(ctx, result);
}

void Placement::JoinParked(RequestContext& ctx, const std::shared_ptr<InFlight>& flight,
                           const PlacementRequest& req, Deadline deadline, PlaceDone done) {
  stats_->Add(ServiceStats::kConsumeJoined);
  std::unique_lock<std::mutex> lk(mu_);
  // The transfer may be about to end: wait for it on this worker first, as
  // a fetch of our own would.
  const Deadline brief = deadline.Min(kOwnerParkAfterMs);
  flight->cv.wait_until(lk, brief.time_point(), [&flight] { return flight->done; });
  if (flight->done) {
    const Result<ConsumeReply> r = Joined(flight->status, flight->reply);
    lk.unlock();
    return AfterJoin(ctx, req, deadline, r, done);
  }
  stats_->AddNamed("consume.parked_for_owner");
  std::shared_ptr<ParkedRequest> parked = ctx.parking->Park();
  auto wait = std::make_shared<JoinWait>();
  FdWatcher* watcher = watcher_;
  auto end = [this, wait, parked, watcher, req, deadline, done](const Result<ConsumeReply>& r) {
    if (!wait->Claim(watcher)) return;
    parked->Resume([this, req, deadline, done, r](RequestContext& c) {
      AfterJoin(c, req, deadline, r, done);
    });
  };
  flight->joiners.push_back(end);
  lk.unlock();
  Result<uint64_t> timer =
      watcher_->Watch(-1, deadline, [end, upath = req.record.upath](FdWatcher::Event ev) {
        end(ev == FdWatcher::Event::kTimeout
                ? Status(DYAD_RC_TIMEOUT, "timed out waiting for the transfer of '" + upath +
                                              "' started by another consumer")
                : Status(DYAD_RC_CANCELLED, "the service is stopping"));
      });
  if (!timer.ok()) return end(timer.status());
  wait->timer = *timer;
  if (wait->claimed) watcher_->Cancel(*timer);  // ended meanwhile
  parked->OnHangup([end] { end(Status(DYAD_RC_CANCELLED, "consumer went away")); });
}

void Placement::AfterJoin(RequestContext& ctx, const PlacementRequest& req, Deadline deadline,
                          const Result<ConsumeReply>& r, const PlaceDone& done) {
  // The consume that led the transfer went away (and took it along): this
  // one places the file itself, unless it is itself done waiting.
  if (!r.ok() && r.status().code() == DYAD_RC_CANCELLED && !deadline.expired() &&
      !(ctx.cancel && ctx.cancel()))
    return PlaceParked(ctx, req, deadline, done);
  done(ctx, r);
}

}  // namespace dyad
