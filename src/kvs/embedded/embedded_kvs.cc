#include "kvs/embedded/embedded_kvs.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <utility>

#include "common/log.h"
#include "common/thread_annotations.h"
#include "common/wire.h"
#include "kvs/embedded/exchange.h"

namespace dyad {
namespace {

// A pooled link idle for less than this is reused without checking it.
constexpr int64_t kTrustIdleMs = 1000;

std::string EncodeRequest(const KvsRequest& req) {
  Encoder e;
  req.EncodeTo(e);
  return e.Take();
}

std::string Describe(const std::string& ns, const std::string& key) {
  return "key '" + key + "' in namespace '" + ns + "'";
}

Status CheckField(const char* what, const std::string& s) {
  if (s.size() <= EmbeddedKvs::kMaxFieldBytes) return Status::OK();
  return Status(DYAD_RC_BADREQUEST, std::string(what) + " of " + std::to_string(s.size()) +
                                        " bytes exceeds the embedded store's limit of " +
                                        std::to_string(EmbeddedKvs::kMaxFieldBytes) + " bytes");
}

Status CheckFields(const std::string& ns, const std::string& key, const std::string& value) {
  DYAD_RETURN_IF_ERROR(CheckField("namespace", ns));
  DYAD_RETURN_IF_ERROR(CheckField("key", key));
  return CheckField("value", value);
}

// An idle pooled channel is usable only if nothing arrived on it: a hang-up
// means the root closed it (e.g. restarted), and unexpected bytes mean the
// link lost its request/reply framing.
bool IdleChannelUsable(const Channel& ch, SteadyClock::time_point since) {
  if (ch.broken() || ch.has_unread()) return false;
  // A link used moments ago is taken as it is (one system call less per
  // operation): should the root have closed it just now, the call fails as
  // on a stale link and is retried on a fresh one.
  if (SteadyClock::now() - since < std::chrono::milliseconds(kTrustIdleMs)) return true;
  pollfd p{ch.fd(), POLLIN | POLLRDHUP, 0};
  const int n = ::poll(&p, 1, 0);
  return n == 0;
}

}  // namespace

Result<std::unique_ptr<EmbeddedKvs>> EmbeddedKvs::Open(const std::string& address,
                                                       const KvsOptions& options) {
  Result<SocketAddress> addr = ParseAddress(address);
  if (!addr.ok()) return addr.status().Annotate("embedded store");
  if (!addr->is_unix && addr->port == 0) {
    return Status(DYAD_RC_BADREQUEST, "embedded store address '" + address + "' has no port");
  }
  return std::unique_ptr<EmbeddedKvs>(new EmbeddedKvs(std::move(*addr), options));
}

EmbeddedKvs::EmbeddedKvs(SocketAddress address, const KvsOptions& options)
    : address_(std::move(address)),
      address_text_(address_.ToString()),
      auth_(options.auth ? *options.auth : Authenticator(options.secret)),
      self_{options.self_rank, options.self_incarnation},
      rpc_timeout_ms_(options.rpc_timeout_ms > 0 ? options.rpc_timeout_ms : 60000),
      service_rt_(options.runtime),
      waits_(std::make_unique<EmbeddedWaits>(this)) {}

// --- connections -------------------------------------------------------------

namespace {
Status StopReason(Stop* stop) {
  return stop != nullptr ? stop->why() : Status(DYAD_RC_CANCELLED, "stopped");
}
}  // namespace

Task<Result<std::unique_ptr<Channel>>> EmbeddedKvs::DialTask(Deadline deadline, Stop* stop) {
  bool connected = false;
  Result<UniqueFd> fd = ConnectStart(address_, &connected);
  if (!fd.ok()) co_return fd.status();
  if (!connected) {
    const Ready r = co_await WaitReady(fd->get(), POLLOUT, deadline, stop);
    if (r == Ready::kStopped) co_return StopReason(stop);
    if (r == Ready::kTimeout)
      co_return Status(DYAD_RC_TIMEOUT, "connect " + address_text_ + " timed out");
    DYAD_CO_RETURN_IF_ERROR(ConnectFinish(fd->get(), address_));
  }
  auto ch = std::make_unique<Channel>(std::move(*fd), Trust::kUnauthenticated);
  ClientHandshake hs(auth_, self_);
  while (!hs.Step(*ch, deadline)) {
    const Ready r = co_await WaitReady(*ch, POLLIN, deadline, stop);
    if (r == Ready::kStopped) co_return StopReason(stop);
    if (r == Ready::kTimeout) {
      hs.Expired(*ch);
      break;
    }
  }
  if (!hs.status().ok()) co_return hs.status().Annotate("authenticating to " + address_text_);
  DYAD_LOG_DEBUG("connected to the embedded store at %s (root rank %u)", address_text_.c_str(),
                 hs.peer().rank);
  co_return std::move(ch);
}

std::unique_ptr<Channel> EmbeddedKvs::TakeIdle() {
  std::unique_ptr<Channel> ch;
  std::vector<std::unique_ptr<Channel>> stale;  // closed outside the lock
  MutexLock lk(pool_mu_);
  while (!idle_.empty() && !ch) {
    IdleChannel c = std::move(idle_.back());
    idle_.pop_back();
    if (IdleChannelUsable(*c.ch, c.since)) {
      ch = std::move(c.ch);
    } else {
      stale.push_back(std::move(c.ch));
    }
  }
  lk.Unlock();
  return ch;
}

void EmbeddedKvs::Release(std::unique_ptr<Channel> ch) {
  if (!ch || ch->broken() || stopping_.load()) return;
  MutexLock lk(pool_mu_);
  if (idle_.size() < kMaxIdle) idle_.push_back(IdleChannel{std::move(ch), SteadyClock::now()});
  // Otherwise `ch` closes here: enough idle links for the usual concurrency.
}

void EmbeddedKvs::DropIdle() {
  std::vector<IdleChannel> dropped;
  MutexLock lk(pool_mu_);
  dropped.swap(idle_);
}

void EmbeddedKvs::Shutdown() {
  stopping_.store(true);
  waits_->Shutdown();
  StopFeeds();
  DropIdle();
  AwaitTasksEnded();
}

EmbeddedKvs::~EmbeddedKvs() { Shutdown(); }

Result<KvsWaitTicket> EmbeddedKvs::StartWait(const std::string& ns, const std::string& key,
                                             Deadline deadline, KvsWaitCallback done) {
  DYAD_RETURN_IF_ERROR(CheckFields(ns, key, {}));
  if (stopping_.load()) {
    return Status(DYAD_RC_CANCELLED,
                  "wait for " + Describe(ns, key) + " cancelled: the store is shutting down");
  }
  return waits_->Start(ns, key, deadline, std::move(done));
}

void EmbeddedKvs::CancelWait(KvsWaitTicket ticket) { waits_->Cancel(ticket); }

void EmbeddedKvs::NoteOutage(const Status& st) {
  if (!outage_.exchange(true)) {
    DYAD_LOG_WARN("embedded store at %s unreachable (%s); retrying", address_text_.c_str(),
                  st.ToString().c_str());
  }
}

void EmbeddedKvs::NoteRecovered() {
  if (outage_.load(std::memory_order_relaxed) && outage_.exchange(false)) {
    DYAD_LOG_INFO("embedded store at %s reachable again", address_text_.c_str());
  }
}

// --- requests ----------------------------------------------------------------

bool EmbeddedKvs::IsConnectionFailure(const Status& st) {
  return st.code() == DYAD_RC_CONNLOST || st.code() == DYAD_RC_TIMEOUT;
}

Task<Status> EmbeddedKvs::TakeCallSlot(Deadline deadline, Stop* stop) {
  std::shared_ptr<Rendezvous<bool>> turn;
  {
    MutexLock lk(pool_mu_);
    if (calls_in_flight_ < kMaxCallsInFlight) {
      ++calls_in_flight_;
      co_return Status::OK();
    }
    turn = std::make_shared<Rendezvous<bool>>(co_await asio::this_coro::executor);
    call_waiters_.push_back(turn);
  }
  if (co_await turn->Take(deadline, stop)) co_return Status::OK();
  bool handed = true;  // GiveCallSlot chose us meanwhile: pass it on
  {
    MutexLock lk(pool_mu_);
    for (auto it = call_waiters_.begin(); it != call_waiters_.end(); ++it) {
      if (*it == turn) {
        call_waiters_.erase(it);
        handed = false;
        break;
      }
    }
  }
  if (handed) GiveCallSlot();
  if (stop != nullptr && stop->fired()) co_return StopReason(stop);
  co_return Status(DYAD_RC_TIMEOUT, std::to_string(kMaxCallsInFlight) +
                                        " requests to the embedded store at " + address_text_ +
                                        " were in flight the whole time");
}

void EmbeddedKvs::GiveCallSlot() {
  std::shared_ptr<Rendezvous<bool>> next;
  {
    MutexLock lk(pool_mu_);
    if (call_waiters_.empty()) {
      --calls_in_flight_;
      return;
    }
    next = std::move(call_waiters_.front());
    call_waiters_.pop_front();
  }
  next->Deliver(true);
}

Task<Status> EmbeddedKvs::CallTask(MsgType type, std::string request, std::string* body,
                                   Stop* stop) {
  const Deadline deadline = Deadline::AfterMs(rpc_timeout_ms_);
  DYAD_CO_RETURN_IF_ERROR(co_await TakeCallSlot(deadline, stop));
  struct Slot {
    EmbeddedKvs* kvs;
    ~Slot() { kvs->GiveCallSlot(); }
  } slot{this};
  // Built only for an error: this path runs for every store operation.
  auto context = [&] {
    return std::string(MsgTypeName(static_cast<uint16_t>(type))) + " on the embedded store at " +
           address_text_;
  };
  Status last;
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::unique_ptr<Channel> ch = TakeIdle();
    const bool reused = ch != nullptr;
    if (!ch) {
      Result<std::unique_ptr<Channel>> dialled = co_await DialTask(deadline, stop);
      if (!dialled.ok()) {
        last = dialled.status();
        if (!IsConnectionFailure(last) || attempt == 1 || deadline.expired()) break;
        NoteOutage(last);
        // The root may be restarting: give it a moment before the one retry.
        if (!co_await Sleep(deadline.Min(kBackoffFirstMs), stop)) break;
        continue;
      }
      ch = std::move(*dialled);
    }
    Status st = co_await EmbeddedExchange(*ch, type, request, body, deadline, stop);
    // A blocking caller's loop ends with the call: the link leaves it.
    if (stop == nullptr) ch->attachment().reset();
    if (!ch->broken()) {
      // The root answered (possibly with an error of the request itself).
      Release(std::move(ch));
      NoteRecovered();
      co_return st.ok() ? st : st.Annotate(context());
    }
    last = st;
    // A link that broke suggests the root restarted, which kills every
    // pooled link; the retry must not pick up another dead one.
    DropIdle();
    if (!IsConnectionFailure(st) || deadline.expired()) break;
    if (!reused) NoteOutage(st);
  }
  if (IsConnectionFailure(last)) NoteOutage(last);
  co_return last.Annotate(context());
}

// Each operation once, as a task; `stop` null for a blocking caller.
Task<Status> EmbeddedKvs::PutOn(Stop* stop, const std::string& ns, const std::string& key,
                                const std::string& value) {
  DYAD_CO_RETURN_IF_ERROR(CheckFields(ns, key, value));
  KvsRequest req;
  req.ns = ns;
  req.key = key;
  req.value = value;
  std::string body;
  co_return co_await CallTask(MsgType::kKvsPut, EncodeRequest(req), &body, stop);
}

Task<Result<std::optional<std::string>>> EmbeddedKvs::GetOn(Stop* stop, const std::string& ns,
                                                            const std::string& key) {
  DYAD_CO_RETURN_IF_ERROR(CheckFields(ns, key, {}));
  KvsRequest req;
  req.ns = ns;
  req.key = key;
  std::string body;
  DYAD_CO_RETURN_IF_ERROR(co_await CallTask(MsgType::kKvsGet, EncodeRequest(req), &body, stop));
  co_return DecodeGet(body);
}

Task<Status> EmbeddedKvs::RemoveOn(Stop* stop, const std::string& ns, const std::string& key) {
  DYAD_CO_RETURN_IF_ERROR(CheckFields(ns, key, {}));
  KvsRequest req;
  req.ns = ns;
  req.key = key;
  std::string body;
  co_return co_await CallTask(MsgType::kKvsRemove, EncodeRequest(req), &body, stop);
}

Task<Result<std::vector<KvsEntry>>> EmbeddedKvs::ListOn(Stop* stop, const std::string& ns,
                                                        const std::string& prefix, uint32_t limit) {
  DYAD_CO_RETURN_IF_ERROR(CheckFields(ns, prefix, {}));
  KvsRequest req;
  req.ns = ns;
  req.key = prefix;
  req.limit = limit;
  std::string body;
  DYAD_CO_RETURN_IF_ERROR(co_await CallTask(MsgType::kKvsList, EncodeRequest(req), &body, stop));
  co_return DecodeList(body);
}

Status EmbeddedKvs::Put(const std::string& ns, const std::string& key, const std::string& value) {
  return RunOnThisThread(PutOn(nullptr, ns, key, value));
}
Task<Status> EmbeddedKvs::PutTask(Runtime& rt, const std::string& ns, const std::string& key,
                                  const std::string& value) {
  return PutOn(&rt.stopping(), ns, key, value);
}
Result<std::optional<std::string>> EmbeddedKvs::Get(const std::string& ns, const std::string& key) {
  return RunOnThisThread(GetOn(nullptr, ns, key));
}
Task<Result<std::optional<std::string>>> EmbeddedKvs::GetTask(Runtime& rt, const std::string& ns,
                                                              const std::string& key) {
  return GetOn(&rt.stopping(), ns, key);
}
Status EmbeddedKvs::Remove(const std::string& ns, const std::string& key) {
  return RunOnThisThread(RemoveOn(nullptr, ns, key));
}
Task<Status> EmbeddedKvs::RemoveTask(Runtime& rt, const std::string& ns, const std::string& key) {
  return RemoveOn(&rt.stopping(), ns, key);
}
Result<std::vector<KvsEntry>> EmbeddedKvs::List(const std::string& ns, const std::string& prefix,
                                                uint32_t limit) {
  return RunOnThisThread(ListOn(nullptr, ns, prefix, limit));
}
Task<Result<std::vector<KvsEntry>>> EmbeddedKvs::ListTask(Runtime& rt, const std::string& ns,
                                                          const std::string& prefix,
                                                          uint32_t limit) {
  return ListOn(&rt.stopping(), ns, prefix, limit);
}

Result<std::optional<std::string>> EmbeddedKvs::DecodeGet(const std::string& body) const {
  Decoder d(body);
  const bool found = d.Bool();
  std::string value = d.Str(kMaxFramePayload);
  if (!d.done()) {
    return Status(DYAD_RC_BADUNPACK, "malformed kvs.get reply from " + address_text_);
  }
  if (!found) return std::optional<std::string>();
  return std::optional<std::string>(std::move(value));
}

Result<std::vector<KvsEntry>> EmbeddedKvs::DecodeList(const std::string& body) const {
  Decoder d(body);
  const uint32_t count = d.U32();
  std::vector<KvsEntry> out;
  // Every entry takes at least 8 bytes, which bounds a lying count.
  out.reserve(std::min<size_t>(count, body.size() / 8));
  for (uint32_t i = 0; i < count && !d.failed(); ++i) {
    std::string k = d.Str(kMaxFramePayload);
    std::string v = d.Str(kMaxFramePayload);
    out.emplace_back(std::move(k), std::move(v));
  }
  if (!d.done()) {
    return Status(DYAD_RC_BADUNPACK, "malformed kvs.list reply from " + address_text_);
  }
  return out;
}

}  // namespace dyad
