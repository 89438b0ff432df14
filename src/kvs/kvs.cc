// kvs.cc: what every store shares (the Kvs base class).
#include "kvs/kvs.h"

#include <chrono>
#include <condition_variable>

#include "common/backend.h"
#include "common/thread_annotations.h"

namespace dyad {

KvsCaps Kvs::caps() const {
  const BackendRow* row = FindRow(BackendKind::kStore, name());
  return row != nullptr ? row->store_caps : KvsCaps{};
}

Result<KvsValues> Kvs::MultiGet(const std::string& ns, const std::vector<std::string>& keys) {
  KvsValues out;
  out.reserve(keys.size());
  for (const std::string& key : keys) {
    Result<std::optional<std::string>> v = Get(ns, key);
    if (!v.ok()) return v.status();
    out.push_back(std::move(*v));
  }
  return out;
}

Task<Result<std::optional<std::string>>> Kvs::GetTask(Runtime& rt, const std::string& ns,
                                                      const std::string& key) {
  return Run(rt, [this, &ns, &key] { return Get(ns, key); });
}

Task<Status> Kvs::PutTask(Runtime& rt, const std::string& ns, const std::string& key,
                          const std::string& value) {
  return Run(rt, [this, &ns, &key, &value] { return Put(ns, key, value); });
}

Task<Status> Kvs::RemoveTask(Runtime& rt, const std::string& ns, const std::string& key) {
  return Run(rt, [this, &ns, &key] { return Remove(ns, key); });
}

Task<Result<std::vector<KvsEntry>>> Kvs::ListTask(Runtime& rt, const std::string& ns,
                                                  const std::string& prefix, uint32_t limit) {
  return Run(rt, [this, &ns, &prefix, limit] { return List(ns, prefix, limit); });
}

Task<Result<KvsValues>> Kvs::MultiGetTask(Runtime& rt, const std::string& ns,
                                          const std::vector<std::string>& keys) {
  return Run(rt, [this, &ns, &keys] { return MultiGet(ns, keys); });
}

Result<std::string> Kvs::Wait(const std::string& ns, const std::string& key, Deadline deadline,
                              const CancelFn& cancel) {
  return AwaitStarted(
      [&](KvsWaitCallback done) { return StartWait(ns, key, deadline, std::move(done)); }, cancel,
      100, [this](KvsWaitTicket t) { CancelWait(t); });
}

Result<std::string> Kvs::AwaitStarted(
    const std::function<Result<KvsWaitTicket>(KvsWaitCallback)>& start, const CancelFn& cancel,
    int64_t poll_ms, const std::function<void(KvsWaitTicket)>& end) {
  struct Outcome {
    Mutex mu;
    std::condition_variable cv;
    std::optional<Result<std::string>> result GUARDED_BY(mu);
  };
  auto out = std::make_shared<Outcome>();
  Result<KvsWaitTicket> ticket = start([out](Result<std::string> r) {
    MutexLock lk(out->mu);
    out->result = std::move(r);
    out->cv.notify_one();
  });
  if (!ticket.ok()) return ticket.status();
  MutexLock lk(out->mu);
  while (!out->result) {
    // The deadline and a shutdown arrive through the callback; only
    // `cancel` needs polling, so a wait without one sleeps until it runs.
    if (!cancel) {
      lk.Wait(out->cv, [&]() REQUIRES(out->mu) { return out->result.has_value(); });
      break;
    }
    lk.WaitFor(out->cv, std::chrono::milliseconds(poll_ms));
    if (out->result) break;
    lk.Unlock();
    if (cancel()) end(*ticket);  // calls back (CANCELLED) unless the wait just ended
    lk.Lock();
  }
  return std::move(*out->result);
}

Result<KvsWatchTicket> Kvs::Watch(const std::string& ns, KvsWatchCallback on_change) {
  (void)ns;
  (void)on_change;
  return Status(DYAD_RC_NOTSUP,
                "metadata store '" + name() + "' cannot watch a namespace (KvsCaps::watch)");
}

}  // namespace dyad
