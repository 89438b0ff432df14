// membership.cc: how a service takes its rank in the metadata store and
// keeps it: waiting (interruptibly) for a store that is not up yet, refusing
// a rank that a live service holds, replacing a dead holder, checking that
// the advertised address leads back here, and noticing later when the
// record disappears or is taken over.
#include <unistd.h>
#include <future>

#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <optional>
#include <thread>

#include "common/format.h"
#include "common/log.h"
#include "common/time.h"
#include "service/advertise.h"
#include "service/peer_waits.h"
#include "service/peers.h"
#include "service/service.h"
#include "service/transports.h"

namespace dyad {

namespace {

// Bound on probing the current holder of our rank, or our own address.
constexpr int64_t kProbeMs = 3000;

// Failures that mean "the store is not there yet": worth waiting for. Any
// other (a refused credential, a bad URL, a malformed answer) fails at once.
bool StoreNotReady(const Status& st) {
  return st.code() == DYAD_RC_CONNLOST || st.code() == DYAD_RC_TIMEOUT ||
         st.code() == DYAD_RC_NOSERVICE;
}

// "host node3, address 10.0.0.3:7590, pid 4242, started 2024-05-01 12:00:00"
std::string DescribeHolder(const ServiceRecord& r) {
  std::string s =
      "host " + (r.hostname.empty() ? std::string("?") : r.hostname) + ", address " + r.address;
  if (r.pid != 0) s += ", pid " + std::to_string(r.pid);
  return s + ", started " + LocalDateTime(r.started_ns, "unknown") + ", incarnation " +
         Hex64(r.incarnation);
}

// Runs `fn(kvs)` on a helper thread and waits for it unless `stopping`
// turns true first (polled every 50 ms); then returns nullopt and leaves
// the helper to finish on its own. A store call can block for the whole RPC
// timeout (a root host that drops packets), and a stop request must not
// wait for that. The helper shares nothing with the caller but `kvs` and
// the result slot, so abandoning it is safe.
template <typename T, typename Fn>
std::optional<T> CallUnlessStopped(const std::shared_ptr<Kvs>& kvs,
                                   const std::atomic<bool>& stopping, Fn fn) {
  struct Slot {
    std::mutex mu;
    std::condition_variable cv;
    std::optional<T> result;
  };
  auto slot = std::make_shared<Slot>();
  std::thread([slot, kvs, fn] {
    T r = fn(*kvs);
    std::lock_guard<std::mutex> lk(slot->mu);
    slot->result.emplace(std::move(r));
    slot->cv.notify_all();
  }).detach();
  std::unique_lock<std::mutex> lk(slot->mu);
  while (!slot->result.has_value()) {
    if (stopping.load()) return std::nullopt;
    slot->cv.wait_for(lk, std::chrono::milliseconds(50));
  }
  return std::move(slot->result);
}

Status Stopped() { return Status(DYAD_RC_CANCELLED, "stopped during start-up"); }

}  // namespace

ServiceRecord Service::OwnRecord() const {
  ServiceRecord rec;
  rec.rank = opt_.rank;
  rec.node_idx = node_idx_;
  rec.incarnation = incarnation_;
  rec.address = advertise_;
  rec.prod_path = prod_real_;
  rec.hostname = hostname_;
  rec.started_ns = started_ns_;
  rec.pid = static_cast<uint32_t>(getpid());
  return rec;
}

bool Service::PauseUnlessStopping(int64_t ms) {
  std::unique_lock<std::mutex> lk(stop_mu_);
  stop_cv_.wait_for(lk, std::chrono::milliseconds(ms), [this] { return stopping_.load(); });
  return !stopping_;
}

Status Service::RegisterMembership() {
  DYAD_RETURN_IF_ERROR(CheckOwnAddress());
  member_value_ = OwnRecord().Encode();
  // The root may still be starting (services are launched in parallel).
  const int64_t wait_ms = std::max<int64_t>(opt_.rpc_timeout_ms, 30000);
  const Deadline deadline = Deadline::AfterMs(wait_ms);
  const std::string what =
      "register rank " + std::to_string(opt_.rank) + " in the metadata store " + StoreDescription();
  int64_t pause = 100;
  bool told = false;
  for (;;) {
    if (stopping_) return Stopped();
    Status st = CheckSameHostPeers();
    if (st.ok()) st = ClaimRank();
    if (st.ok()) return st;
    if (!StoreNotReady(st)) {
      if (st.code() == DYAD_RC_AUTH && kvs_->caps().hosted_by_service)
        return CredentialFailure(st, what);
      return st.Annotate(what);
    }
    if (deadline.expired())
      return st.Annotate(what + ": gave up after " + std::to_string(wait_ms / 1000) +
                         " s; is the store (the root dyad-service or Redis) running and "
                         "reachable from this host?");
    if (!told) {
      DYAD_LOG_WARN(
          "metadata store not reachable yet (%s); waiting up to %lld s for it "
          "(SIGTERM or SIGINT stops the wait)",
          st.ToString().c_str(), static_cast<long long>(wait_ms / 1000));
      told = true;
    }
    if (!PauseUnlessStopping(pause)) return Stopped();
    pause = std::min<int64_t>(pause * 2, 2000);
  }
}

// A transport that reaches only this host (libfabric's shm) cannot serve a
// cluster with services on other hosts: refused here, at start, rather than
// at the first fetch.
Status Service::CheckSameHostPeers() {
  const std::string why = transports_->Default().SameHostOnly();
  if (why.empty()) return Status::OK();
  using Listing = Result<std::vector<KvsEntry>>;
  std::optional<Listing> all = CallUnlessStopped<Listing>(
      kvs_, stopping_, [](Kvs& kvs) { return kvs.List(kMembersNamespace, "rank.", 0); });
  if (!all) return Stopped();
  if (!all->ok()) return all->status();
  for (const auto& [key, value] : **all) {
    ServiceRecord r;
    if (!ServiceRecord::Decode(value, &r) || r.rank == opt_.rank || r.stopped_ns != 0 ||
        r.hostname.empty() || r.hostname == hostname_)
      continue;
    return Status(DYAD_RC_MARGO_BAD_PROTO,
                  why + ", and rank " + std::to_string(r.rank) + " is registered from host " +
                      r.hostname + " (this is " + hostname_ +
                      "): set DYAD_OFI_PROVIDER to a provider that reaches other hosts (tcp, "
                      "verbs, cxi, ...) on every service, or use -m TCP");
  }
  return Status::OK();
}

ProbeResult Service::ProbeNow(const ServiceRecord& rec) {
  PeerWaits waits(*runtime_, startup_stop_.get(), nullptr);
  return runtime_->RunSync(peers_->Probe(rec, Deadline::AfterMs(kProbeMs), waits));
}

// Takes the rank unless a live service holds it.
Status Service::ClaimRank() {
  const std::string key = MemberKey(opt_.rank);
  using Lookup = Result<std::optional<std::string>>;
  std::optional<Lookup> cur = CallUnlessStopped<Lookup>(
      kvs_, stopping_, [key](Kvs& kvs) { return kvs.Get(kMembersNamespace, key); });
  if (!cur) return Stopped();
  if (!cur->ok()) return cur->status();
  ServiceRecord holder;
  if ((*cur)->has_value() && ServiceRecord::Decode(***cur, &holder) &&
      holder.incarnation != incarnation_ && holder.stopped_ns != 0) {
    // Its last holder stopped cleanly (a planned restart): nothing alarming.
    DYAD_LOG_INFO("rank %u: the previous service (%s) stopped cleanly at %s; registering",
                  opt_.rank, DescribeHolder(holder).c_str(),
                  LocalDateTime(holder.stopped_ns, "?").c_str());
  } else if ((*cur)->has_value() && ServiceRecord::Decode(***cur, &holder) &&
             holder.incarnation != incarnation_) {
    const ProbeResult probe = ProbeNow(holder);
    if (stopping_) return Stopped();
    if (probe.state == PeerState::kAlive)
      return Status(DYAD_RC_PERM, "rank " + std::to_string(opt_.rank) +
                                      " is held by a live dyad-service (" + DescribeHolder(holder) +
                                      "); stop that service first, or give this one "
                                      "another rank (-r / DYAD_SERVICE_RANK)");
    if (probe.state == PeerState::kRefused)
      return Status(DYAD_RC_AUTH, "rank " + std::to_string(opt_.rank) +
                                      " is registered by a service that refuses this service's "
                                      "credential (" +
                                      DescribeHolder(holder) + "): " + probe.status.message());
    DYAD_LOG_WARN(
        "rank %u was registered by a service that no longer answers (%s: %s); "
        "replacing its registration",
        opt_.rank, DescribeHolder(holder).c_str(), probe.status.ToString().c_str());
  }
  std::optional<Status> put = CallUnlessStopped<Status>(
      kvs_, stopping_,
      [key, value = member_value_](Kvs& kvs) { return kvs.Put(kMembersNamespace, key, value); });
  return put ? *put : Stopped();
}

// Peers will connect to advertise_: it must lead back here. Another service
// answering there is fatal (two services on one address, or a wrong
// --advertise); no answer at all is only suspicious (a firewall may treat
// this host differently from its peers).
Status Service::CheckOwnAddress() {
  ServiceRecord self = OwnRecord();
  const ProbeResult probe = ProbeNow(self);
  if (stopping_) return Stopped();
  switch (probe.state) {
    case PeerState::kAlive:
      return Status::OK();
    case PeerState::kOtherIdentity:
      return Status(DYAD_RC_BADREQUEST,
                    "the address this service advertises (" + advertise_ +
                        ") reaches another dyad-service (rank " +
                        std::to_string(probe.identity.rank) + ", incarnation " +
                        Hex64(probe.identity.incarnation) +
                        "): two services on one address, or a "
                        "wrong --advertise; give this service its own --listen/--advertise");
    case PeerState::kRefused:
      return probe.status.Annotate("check of this service's own address " + advertise_);
    default:
      DYAD_LOG_WARN(
          "this service cannot reach its own advertised address %s (%s); peers may "
          "not reach it either: check --advertise and the firewall",
          advertise_.c_str(), probe.status.ToString().c_str());
      return Status::OK();
  }
}

void Service::Deregister() {
  if (member_value_.empty() || !kvs_) return;  // never registered
  // Bounded: a store that is down must not hold the stop up.
  const int64_t bound_ms = std::min<int64_t>(opt_.rpc_timeout_ms, 2000);
  std::shared_ptr<Kvs> kvs = kvs_;
  ServiceRecord rec = OwnRecord();
  rec.stopped_ns = WallNs();
  const std::string key = MemberKey(opt_.rank);
  const std::string value = rec.Encode();
  const uint64_t incarnation = incarnation_;
  // The store call runs on its own thread so that this wait is bounded
  // whatever the store does; the thread owns what it uses.
  auto outcome = std::make_shared<std::promise<Status>>();
  std::future<Status> done = outcome->get_future();
  std::thread([kvs, key, value, incarnation, outcome] {
    // Only our own record: a service that took the rank over keeps its own.
    Status st;
    Result<std::optional<std::string>> cur = kvs->Get(kMembersNamespace, key);
    ServiceRecord holder;
    if (!cur.ok()) {
      st = cur.status();
    } else if (cur->has_value() && ServiceRecord::Decode(**cur, &holder) &&
               holder.incarnation == incarnation) {
      st = kvs->Put(kMembersNamespace, key, value);
    }
    outcome->set_value(st);
  }).detach();
  if (done.wait_for(std::chrono::milliseconds(bound_ms)) != std::future_status::ready) {
    DYAD_LOG_WARN("could not mark rank %u as stopped in the metadata store within %lld ms",
                  opt_.rank, static_cast<long long>(bound_ms));
    return;
  }
  const Status st = done.get();
  if (!st.ok())
    DYAD_LOG_WARN("could not mark rank %u as stopped in the metadata store: %s", opt_.rank,
                  st.ToString().c_str());
}

Task<void> Service::Upkeep() {
  constexpr int64_t kCheckEveryMs = 3000;
  int64_t since_check = 0;
  uint64_t reported = 0;  // incarnation of a usurper already reported
  dyad::Stop& stop = runtime_->stopping();
  while (co_await Sleep(Deadline::AfterMs(kHousekeepingMs), &stop)) {
    // Both touch the disk or the store: on the pool.
    const bool check = (since_check += kHousekeepingMs) >= kCheckEveryMs;
    if (check) since_check = 0;
    co_await runtime_->Offload([this, check, &reported] {
      Housekeep();
      if (check) CheckMembership(&reported);
    });
  }
}

void Service::CheckMembership(uint64_t* reported) {
  Result<std::optional<std::string>> v = kvs_->Get(kMembersNamespace, MemberKey(opt_.rank));
  ServiceRecord other;
  if (v.ok() && !v->has_value()) {
    Status st = kvs_->Put(kMembersNamespace, MemberKey(opt_.rank), member_value_);
    if (st.ok())
      DYAD_LOG_WARN(
          "membership record was missing from the metadata store (root restarted?); "
          "registered again");
  } else if (v.ok() && (!ServiceRecord::Decode(**v, &other) || other.rank != opt_.rank)) {
    // Corrupted (not a record of this rank): write it again.
    if (kvs_->Put(kMembersNamespace, MemberKey(opt_.rank), member_value_).ok())
      DYAD_LOG_WARN(
          "membership record of rank %u was corrupted in the metadata store; "
          "repaired",
          opt_.rank);
  } else if (v.ok() && other.incarnation != incarnation_ && other.incarnation != *reported) {
    *reported = other.incarnation;
    DYAD_LOG_ERROR(
        "rank %u is now registered by another dyad-service (%s): two services were "
        "started with this rank and peers now reach the other one; stop one of them",
        opt_.rank, DescribeHolder(other).c_str());
  }
}

}  // namespace dyad
