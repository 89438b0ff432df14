// kvs.cc: what every store shares (the Kvs base class).
#include "kvs/kvs.h"

#include "common/backend.h"

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
  KvsWaitTicket ticket = 0;
  return AwaitCallback<Result<std::string>>(
      [&](KvsWaitCallback done) {
        return Parked(StartWait(ns, key, deadline, std::move(done)), &ticket);
      },
      cancel, kCancelAskMs, [&] { CancelWait(ticket); });
}

Result<KvsWatchTicket> Kvs::Watch(const std::string& ns, KvsWatchCallback on_change) {
  (void)ns;
  (void)on_change;
  return Status(DYAD_RC_NOTSUP,
                "metadata store '" + name() + "' cannot watch a namespace (KvsCaps::watch)");
}

}  // namespace dyad
