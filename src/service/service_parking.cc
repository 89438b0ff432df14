// service_parking.cc: requests that wait for a publication without a thread.
//
// A consume or a waiting locate of a key nobody has published yet would
// otherwise hold a worker for as long as the producer takes (minutes, in a
// workflow whose consumers start first). Such a request is parked instead:
// the store calls back when the key is put (Kvs::StartWait; stores without
// it wait on a thread of ThreadedWaits), and the request then runs again on
// a worker, finding the record in the node's cache.
#include "common/log.h"
#include "service/file_server.h"
#include "service/service.h"
#include "service/threaded_waits.h"

namespace dyad {

bool Service::ParkUntilPublished(RequestContext& ctx, const std::string& ns, const std::string& key,
                                 Deadline deadline, std::function<void(RequestContext&)> then,
                                 std::optional<std::string>* published) {
  if (ctx.parking == nullptr || deadline.expired() || cache_.Get(ns, key)) return false;
  // Published already (or the store fails): the ordinary path answers at
  // once, without asking the store again.
  Result<std::optional<std::string>> now = kvs_->Get(ns, key);
  if (!now.ok()) return false;
  if (now->has_value()) {
    *published = std::move(*now);
    return false;
  }

  std::shared_ptr<ParkedRequest> parked = ctx.parking->Park();
  KvsWaitCallback done = [this, parked, ns, key, then](Result<std::string> r) {
    if (r.ok()) {
      FileRecord rec;
      if (FileRecord::Decode(*r, &rec)) cache_.Put(ns, key, rec);
    } else if (r.status().code() == DYAD_RC_CANCELLED) {
      // The requester hung up, or the service is stopping.
      return parked->Resume([this, st = r.status()](RequestContext& c) { Reply(c.ch, st); });
    }
    // Published (the record is in the cache now) or timed out: the request
    // runs again and gives its usual answer, without waiting.
    parked->Resume(then);
  };
  Result<KvsWaitTicket> ticket = kvs_->StartWait(ns, key, deadline, done);
  if (ticket.ok()) {
    parked->OnHangup([this, t = *ticket] { kvs_->CancelWait(t); });
    return true;
  }
  if (ticket.status().code() == DYAD_RC_NOTSUP) {
    Result<std::shared_ptr<std::atomic<bool>>> flag =
        threaded_waits_->Start(ns, key, deadline, std::move(done));
    if (flag.ok()) {
      parked->OnHangup([f = *flag] { *f = true; });
      return true;
    }
    ticket = flag.status();
  }
  parked->Resume([this, st = ticket.status()](RequestContext& c) { Reply(c.ch, st); });
  return true;
}

}  // namespace dyad
