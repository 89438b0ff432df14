// service_parking.cc: requests that wait for a publication without a thread.
//
// A consume or a waiting locate of a key nobody has published yet would
// otherwise hold a worker for as long as the producer takes (minutes, in a
// workflow whose consumers start first). Such a request is parked instead:
// the store calls back when the key is put (Kvs::StartWait; stores without
// it wait on a thread of ThreadedWaits), and the request then runs again on
// a worker, finding the record in the node's cache. A parked wait holds no
// thread but is not invisible: it is registered (waits.h) with its file,
// namespace, client pid and age for `dyad status`, and the housekeeping
// thread below logs it once it has lasted --wait-log seconds.
#include "common/log.h"
#include "service/file_server.h"
#include "service/node_cache.h"
#include "service/prefetch.h"
#include "service/service.h"
#include "service/threaded_waits.h"
#include "service/waits.h"

namespace dyad {

bool Service::ParkUntilPublished(RequestContext& ctx, const std::string& ns, const std::string& key,
                                 Deadline deadline, std::function<void(RequestContext&)> then,
                                 std::optional<std::string>* published, const std::string& upath,
                                 const std::string& cons_path) {
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
  // Listed in `dyad status` while it waits (the client's pid from the
  // socket's credentials).
  WaitRegistry::Wait what;
  what.kind = upath.empty() ? "locate" : "consume";
  what.ns = ns;
  what.upath = upath.empty() ? key : upath;
  what.cons_path = cons_path;
  if (Result<PeerCred> cred = UnixPeerCredentials(ctx.ch.fd()); cred.ok())
    what.pid = static_cast<uint32_t>(cred->pid);
  const uint64_t wait_id = waits_->Add(std::move(what));
  KvsWaitCallback done = [this, parked, ns, key, then, wait_id](Result<std::string> r) {
    waits_->Remove(wait_id);
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
  waits_->Remove(wait_id);  // no wait started: `done` never runs
  parked->Resume([this, st = ticket.status()](RequestContext& c) { Reply(c.ch, st); });
  return true;
}

void Service::Housekeep() {
  // The budget holds without waiting for the next consume: copies kept
  // by the grace period or by a reader go once that is over.
  const uint64_t before = node_cache_->bytes();
  node_cache_->Trim();
  if (node_cache_->bytes() < before && prefetch_) prefetch_->Kick();
  if (opt_.wait_log_ms <= 0) return;
  for (const WaitInfo& w :
       waits_->LongWaits(static_cast<uint64_t>(opt_.wait_log_ms) * 1000000ull)) {
    std::string why;
    if (!w.local.empty())
      why = "; '" + w.local +
            "' exists on this node but was never published (written outside DYAD? publish it "
            "with `dyad produce`)";
    DYAD_LOG_INFO("%s of '%s' (namespace '%s', pid %u) has waited %llu s for its publication%s",
                  w.kind.c_str(), w.upath.c_str(), w.ns.c_str(), w.pid,
                  static_cast<unsigned long long>(w.age_ns / 1000000000ull), why.c_str());
  }
}

}  // namespace dyad
