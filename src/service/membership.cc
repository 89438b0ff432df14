// membership.cc: how a service takes its rank in the metadata store and
// keeps it: waiting (interruptibly) for a store that is not up yet, refusing
// a rank that a live service holds, replacing a dead holder, checking that
// the advertised address leads back here, and noticing later when the
// record disappears or is taken over.
#include <pthread.h>
#include <unistd.h>

#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <functional>
#include <memory>
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

// The store calls of registration and deregistration: they run one after
// another on one thread of their own, and each caller (a task on the
// runtime) waits for its call on the loop, a wait that ends at once when its
// Stop fires or its deadline passes, leaving the call to finish alone. A
// store call can block for the whole RPC timeout (a root host that drops
// packets), and a stop must not wait for that.
//
// Why a thread of its own and not the runtime's pool (Runtime::Offload):
// the stop that ends the wait then shuts the runtime down, which joins the
// pool, and no store's Shutdown() ends a Get, Put or List in progress
// (kvs.h: it ends waits), so a hung call on the pool would hold the stop
// for up to the RPC timeout. This thread is detached and owns what it uses
// (the store, by shared_ptr, and its queue); it is started at the first
// call, serves every attempt of a registration, and ends once its owner is
// gone and no call is queued. The root's own store answers in this process
// at once: its calls run inline, with no thread at all.
class StoreCallThread {
 public:
  explicit StoreCallThread(std::shared_ptr<Kvs> kvs);
  ~StoreCallThread();
  StoreCallThread(const StoreCallThread&) = delete;
  StoreCallThread& operator=(const StoreCallThread&) = delete;

  // `fn(kvs)`'s result, or nullopt when `deadline` passed or `stop` fired
  // (may be null) first. On the runtime's loop.
  template <typename T>
  Task<std::optional<T>> Call(std::function<T(Kvs&)> fn, Deadline deadline, dyad::Stop* stop);

 private:
  struct Queue;
  bool in_process() const;
  Kvs& kvs();
  // Queues `job` for the thread (started by the first one).
  void Post(std::function<void(Kvs&)> job);
  std::shared_ptr<Queue> q_;
};

template <typename T>
Task<std::optional<T>> StoreCallThread::Call(std::function<T(Kvs&)> fn, Deadline deadline,
                                             dyad::Stop* stop) {
  if (stop != nullptr && stop->fired()) co_return std::nullopt;
  if (in_process()) co_return fn(kvs());
  // The result reaches the waiting task only while it waits: once it has
  // gone, the loop (and the runtime) may be gone too.
  struct Handoff {
    explicit Handoff(asio::any_io_executor ex)
        : result(std::make_shared<Rendezvous<T>>(std::move(ex))) {}
    std::shared_ptr<Rendezvous<T>> result;
    std::mutex mu;
    bool abandoned = false;  // guarded by mu
  };
  asio::any_io_executor ex = co_await asio::this_coro::executor;
  auto h = std::make_shared<Handoff>(std::move(ex));
  Post([h, fn = std::move(fn)](Kvs& kvs) {
    {
      std::lock_guard<std::mutex> lk(h->mu);
      if (h->abandoned) return;  // nobody waits for it any more
    }
    T r = fn(kvs);
    std::lock_guard<std::mutex> lk(h->mu);
    if (!h->abandoned) h->result->Deliver(std::move(r));
  });
  std::optional<T> r = co_await h->result->Take(deadline, stop);
  if (!r) {
    std::lock_guard<std::mutex> lk(h->mu);
    h->abandoned = true;
  }
  co_return r;
}

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

Status Stopped() { return Status(DYAD_RC_CANCELLED, "stopped during start-up"); }

}  // namespace

// --- StoreCallThread ----------------------------------------------------------

// What the thread and its owner share; the thread keeps it (and the store)
// alive after the owner is gone.
struct StoreCallThread::Queue {
  explicit Queue(std::shared_ptr<Kvs> k) : kvs(std::move(k)) {}
  std::shared_ptr<Kvs> kvs;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void(Kvs&)>> jobs;  // guarded by mu
  bool closed = false;                         // guarded by mu
  bool running = false;                        // the thread was started; guarded by mu
};

StoreCallThread::StoreCallThread(std::shared_ptr<Kvs> kvs)
    : q_(std::make_shared<Queue>(std::move(kvs))) {}

StoreCallThread::~StoreCallThread() {
  {
    std::lock_guard<std::mutex> lk(q_->mu);
    q_->closed = true;
  }
  q_->cv.notify_all();
}

bool StoreCallThread::in_process() const { return q_->kvs->in_process(); }
Kvs& StoreCallThread::kvs() { return *q_->kvs; }

void StoreCallThread::Post(std::function<void(Kvs&)> job) {
  std::unique_lock<std::mutex> lk(q_->mu);
  q_->jobs.push_back(std::move(job));
  if (q_->running) {
    lk.unlock();
    q_->cv.notify_all();
    return;
  }
  q_->running = true;
  lk.unlock();
  // Detached: it may outlive the service while a call hangs (see the header).
  std::thread t([q = q_] {
    std::unique_lock<std::mutex> l(q->mu);
    for (;;) {
      q->cv.wait(l, [&q] { return q->closed || !q->jobs.empty(); });
      if (q->jobs.empty()) return;  // closed and nothing left
      std::function<void(Kvs&)> job = std::move(q->jobs.front());
      q->jobs.pop_front();
      l.unlock();
      job(*q->kvs);
      job = nullptr;  // its captures go before the lock is taken again
      l.lock();
    }
  });
  pthread_setname_np(t.native_handle(), "dyad-storecall");
  t.detach();
}

// --- Service -----------------------------------------------------------------

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

Status Service::RegisterMembership() {
  StoreCallThread calls(kvs_);
  return runtime_->RunSync(Register(calls));
}

Task<Status> Service::Register(StoreCallThread& calls) {
  dyad::Stop* stop = startup_stop_.get();
  DYAD_CO_RETURN_IF_ERROR(co_await CheckOwnAddress());
  member_value_ = OwnRecord().Encode();
  // The root may still be starting (services are launched in parallel).
  const int64_t wait_ms = std::max<int64_t>(opt_.rpc_timeout_ms, 30000);
  const Deadline deadline = Deadline::AfterMs(wait_ms);
  const std::string what =
      "register rank " + std::to_string(opt_.rank) + " in the metadata store " + StoreDescription();
  int64_t pause = 100;
  bool told = false;
  for (;;) {
    if (stop->fired()) co_return Stopped();
    Status st = co_await CheckSameHostPeers(calls);
    if (st.ok()) st = co_await ClaimRank(calls);
    if (st.ok()) co_return st;
    if (!StoreNotReady(st)) {
      if (st.code() == DYAD_RC_AUTH && kvs_->caps().hosted_by_service)
        co_return CredentialFailure(st, what);
      co_return st.Annotate(what);
    }
    if (deadline.expired())
      co_return st.Annotate(what + ": gave up after " + std::to_string(wait_ms / 1000) +
                            " s; is the store (the root dyad-service or Redis) running and "
                            "reachable from this host?");
    if (!told) {
      DYAD_LOG_WARN(
          "metadata store not reachable yet (%s); waiting up to %lld s for it "
          "(SIGTERM or SIGINT stops the wait)",
          st.ToString().c_str(), static_cast<long long>(wait_ms / 1000));
      told = true;
    }
    if (!co_await Sleep(Deadline::AfterMs(pause), stop)) co_return Stopped();
    pause = std::min<int64_t>(pause * 2, 2000);
  }
}

// A transport that reaches only this host (libfabric's shm) cannot serve a
// cluster with services on other hosts: refused here, at start, rather than
// at the first fetch.
Task<Status> Service::CheckSameHostPeers(StoreCallThread& calls) {
  const std::string why = transports_->Default().SameHostOnly();
  if (why.empty()) co_return Status::OK();
  using Listing = Result<std::vector<KvsEntry>>;
  // Named, not a temporary of the co_await expression (GCC 12 destroys
  // some of those twice).
  std::function<Listing(Kvs&)> list = [](Kvs& kvs) {
    return kvs.List(kMembersNamespace, "rank.", 0);
  };
  std::optional<Listing> all =
      co_await calls.Call<Listing>(std::move(list), Deadline::Never(), startup_stop_.get());
  if (!all) co_return Stopped();
  if (!all->ok()) co_return all->status();
  for (const auto& [key, value] : **all) {
    ServiceRecord r;
    if (!ServiceRecord::Decode(value, &r) || r.rank == opt_.rank || r.stopped_ns != 0 ||
        r.hostname.empty() || r.hostname == hostname_)
      continue;
    co_return Status(DYAD_RC_MARGO_BAD_PROTO,
                     why + ", and rank " + std::to_string(r.rank) + " is registered from host " +
                         r.hostname + " (this is " + hostname_ +
                         "): set DYAD_OFI_PROVIDER to a provider that reaches other hosts (tcp, "
                         "verbs, cxi, ...) on every service, or use -m TCP");
  }
  co_return Status::OK();
}

Task<ProbeResult> Service::ProbeNow(const ServiceRecord& rec) {
  PeerWaits waits(*runtime_, startup_stop_.get(), nullptr);
  co_return co_await peers_->Probe(rec, Deadline::AfterMs(kProbeMs), waits);
}

// Takes the rank unless a live service holds it.
Task<Status> Service::ClaimRank(StoreCallThread& calls) {
  dyad::Stop* stop = startup_stop_.get();
  const std::string key = MemberKey(opt_.rank);
  using Lookup = Result<std::optional<std::string>>;
  std::function<Lookup(Kvs&)> get = [key](Kvs& kvs) { return kvs.Get(kMembersNamespace, key); };
  std::optional<Lookup> cur = co_await calls.Call<Lookup>(std::move(get), Deadline::Never(), stop);
  if (!cur) co_return Stopped();
  if (!cur->ok()) co_return cur->status();
  ServiceRecord holder;
  if ((*cur)->has_value() && ServiceRecord::Decode(***cur, &holder) &&
      holder.incarnation != incarnation_ && holder.stopped_ns != 0) {
    // Its last holder stopped cleanly (a planned restart): nothing alarming.
    DYAD_LOG_INFO("rank %u: the previous service (%s) stopped cleanly at %s; registering",
                  opt_.rank, DescribeHolder(holder).c_str(),
                  LocalDateTime(holder.stopped_ns, "?").c_str());
  } else if ((*cur)->has_value() && ServiceRecord::Decode(***cur, &holder) &&
             holder.incarnation != incarnation_) {
    const ProbeResult probe = co_await ProbeNow(holder);
    if (stop->fired()) co_return Stopped();
    if (probe.state == PeerState::kAlive)
      co_return Status(DYAD_RC_PERM, "rank " + std::to_string(opt_.rank) +
                                         " is held by a live dyad-service (" +
                                         DescribeHolder(holder) +
                                         "); stop that service first, or give this one "
                                         "another rank (-r / DYAD_SERVICE_RANK)");
    if (probe.state == PeerState::kRefused)
      co_return Status(DYAD_RC_AUTH, "rank " + std::to_string(opt_.rank) +
                                         " is registered by a service that refuses this "
                                         "service's credential (" +
                                         DescribeHolder(holder) + "): " + probe.status.message());
    DYAD_LOG_WARN(
        "rank %u was registered by a service that no longer answers (%s: %s); "
        "replacing its registration",
        opt_.rank, DescribeHolder(holder).c_str(), probe.status.ToString().c_str());
  }
  std::function<Status(Kvs&)> put = [key, value = member_value_](Kvs& kvs) {
    return kvs.Put(kMembersNamespace, key, value);
  };
  std::optional<Status> done = co_await calls.Call<Status>(std::move(put), Deadline::Never(), stop);
  if (!done) co_return Stopped();
  co_return *done;
}

// Peers will connect to advertise_: it must lead back here. Another service
// answering there is fatal (two services on one address, or a wrong
// --advertise); no answer at all is only suspicious (a firewall may treat
// this host differently from its peers).
Task<Status> Service::CheckOwnAddress() {
  ServiceRecord self = OwnRecord();
  const ProbeResult probe = co_await ProbeNow(self);
  if (startup_stop_->fired()) co_return Stopped();
  switch (probe.state) {
    case PeerState::kAlive:
      co_return Status::OK();
    case PeerState::kOtherIdentity:
      co_return Status(DYAD_RC_BADREQUEST,
                       "the address this service advertises (" + advertise_ +
                           ") reaches another dyad-service (rank " +
                           std::to_string(probe.identity.rank) + ", incarnation " +
                           Hex64(probe.identity.incarnation) +
                           "): two services on one address, or a "
                           "wrong --advertise; give this service its own --listen/--advertise");
    case PeerState::kRefused:
      co_return probe.status.Annotate("check of this service's own address " + advertise_);
    default:
      DYAD_LOG_WARN(
          "this service cannot reach its own advertised address %s (%s); peers may "
          "not reach it either: check --advertise and the firewall",
          advertise_.c_str(), probe.status.ToString().c_str());
      co_return Status::OK();
  }
}

void Service::Deregister() {
  if (member_value_.empty() || !kvs_) return;  // never registered
  // Stop() calls this before Teardown fires the runtime's stop, so the
  // runtime still runs; should it not, the store is not asked.
  if (!runtime_ || !runtime_->running()) return;
  // Bounded: a store that is down must not hold the stop up.
  const int64_t bound_ms = std::min<int64_t>(opt_.rpc_timeout_ms, 2000);
  ServiceRecord rec = OwnRecord();
  rec.stopped_ns = WallNs();
  const std::string key = MemberKey(opt_.rank);
  const std::string value = rec.Encode();
  const uint64_t incarnation = incarnation_;
  // On the thread of StoreCallThread, not the pool: the runtime's
  // shutdown, right after this, joins the pool, and a call that hangs
  // there would hold the stop for the whole RPC timeout.
  StoreCallThread calls(kvs_);
  std::function<Status(Kvs&)> mark = [key, value, incarnation](Kvs& kvs) -> Status {
    // Only our own record: a service that took the rank over keeps its own.
    Result<std::optional<std::string>> cur = kvs.Get(kMembersNamespace, key);
    ServiceRecord holder;
    if (!cur.ok()) return cur.status();
    if (cur->has_value() && ServiceRecord::Decode(**cur, &holder) &&
        holder.incarnation == incarnation)
      return kvs.Put(kMembersNamespace, key, value);
    return Status::OK();
  };
  std::optional<Status> done =
      runtime_->RunSync(calls.Call<Status>(std::move(mark), Deadline::AfterMs(bound_ms), nullptr));
  if (!done) {
    DYAD_LOG_WARN("could not mark rank %u as stopped in the metadata store within %lld ms",
                  opt_.rank, static_cast<long long>(bound_ms));
    return;
  }
  if (!done->ok())
    DYAD_LOG_WARN("could not mark rank %u as stopped in the metadata store: %s", opt_.rank,
                  done->ToString().c_str());
}

Task<void> Service::Upkeep() {
  constexpr int64_t kCheckEveryMs = 3000;
  int64_t since_check = 0;
  uint64_t reported = 0;  // incarnation of a usurper already reported
  dyad::Stop& stop = runtime_->stopping();
  while (co_await Sleep(Deadline::AfterMs(kHousekeepingMs), &stop)) {
    const bool check = (since_check += kHousekeepingMs) >= kCheckEveryMs;
    if (check) since_check = 0;
    // Housekeeping touches the disk: on the pool, and only when it has
    // work. The membership check waits on the store: on the loop, holding
    // no thread.
    if (HousekeepingDue()) co_await runtime_->Offload([this] { Housekeep(); });
    if (check) co_await CheckMembership(&reported);
  }
}

Task<void> Service::CheckMembership(uint64_t* reported) {
  Result<std::optional<std::string>> v =
      co_await kvs_->GetTask(*runtime_, kMembersNamespace, MemberKey(opt_.rank));
  ServiceRecord other;
  if (v.ok() && !v->has_value()) {
    Status st =
        co_await kvs_->PutTask(*runtime_, kMembersNamespace, MemberKey(opt_.rank), member_value_);
    if (st.ok())
      DYAD_LOG_WARN(
          "membership record was missing from the metadata store (root restarted?); "
          "registered again");
  } else if (v.ok() && (!ServiceRecord::Decode(**v, &other) || other.rank != opt_.rank)) {
    // Corrupted (not a record of this rank): write it again.
    if ((co_await kvs_->PutTask(*runtime_, kMembersNamespace, MemberKey(opt_.rank), member_value_))
            .ok())
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
