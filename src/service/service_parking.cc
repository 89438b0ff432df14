// service_parking.cc: requests that wait for a publication without a thread.
//
// A consume or a waiting locate of a key nobody has published yet would
// otherwise hold a thread for as long as the producer takes (minutes, in a
// workflow whose consumers start first). Its task waits instead: the store
// calls back when the key is put (Kvs::StartWait). A wait holds no thread but is
// not invisible: it is registered (waits.h) with its file, namespace,
// client pid and age for `dyad status`, and the housekeeping below logs it
// once it has lasted --wait-log seconds.
#include "common/log.h"
#include "service/file_server.h"
#include "service/node_cache.h"
#include "service/prefetch.h"
#include "service/service.h"
#include "service/waits.h"

namespace dyad {

Task<Result<std::string>> Service::WaitPublished(RequestContext& ctx, const std::string& ns,
                                                 const std::string& key, Deadline deadline,
                                                 const std::string& upath,
                                                 const std::string& cons_path) {
  Result<std::optional<std::string>> now = co_await kvs_->GetTask(*runtime_, ns, key);
  if (now.ok() && now->has_value()) co_return std::move(**now);
  // The store unreachable now is waited out like an unpublished key (its
  // waits retry); a timeout then says why it may have come.
  const Status failure = now.ok() ? Status::OK() : now.status();
  auto timed_out = [&failure](const Status& st) {
    if (failure.ok()) return st;
    return Status(DYAD_RC_TIMEOUT, "the store was unreachable: " + failure.message())
        .WithCause(failure.cause() != DYAD_RC_OK ? failure.cause() : DYAD_RC_CONNLOST);
  };
  if (deadline.expired())
    co_return timed_out(Status(DYAD_RC_TIMEOUT, "'" + key + "' is not published"));

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
  struct Unlist {
    WaitRegistry* waits;
    uint64_t id;
    ~Unlist() { waits->Remove(id); }
  } unlist{waits_.get(), wait_id};

  auto rv = std::make_shared<Rendezvous<Result<std::string>>>(runtime_->executor());
  Result<KvsWaitTicket> ticket = kvs_->StartWait(
      ns, key, deadline, [rv](Result<std::string> v) { rv->Deliver(std::move(v)); });
  if (!ticket.ok()) co_return ticket.status();
  std::optional<Result<std::string>> got = co_await rv->Take(Deadline::Never(), ctx.stop);
  if (!got) {
    kvs_->CancelWait(*ticket);  // its callback runs before this returns
    got = co_await rv->Take(Deadline::AfterMs(0), nullptr);
  }
  if (!got) co_return Status(DYAD_RC_CANCELLED, "the requester went away");
  if (got->ok()) {
    FileRecord rec;
    if (FileRecord::Decode(**got, &rec)) cache_.Put(ns, key, rec);
    co_return std::move(**got);
  }
  // The requester hung up, or the service is stopping.
  if (got->status().code() == DYAD_RC_CANCELLED) co_return got->status();
  co_return got->status().code() == DYAD_RC_TIMEOUT ? timed_out(got->status()) : got->status();
}

bool Service::HousekeepingDue() const {
  return node_cache_->OverBudget() || (opt_.wait_log_ms > 0 && waits_->size() > 0);
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
