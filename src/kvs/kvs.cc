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
  if (in_process()) co_return Get(ns, key);
  co_return co_await rt.Offload([this, &ns, &key] { return Get(ns, key); });
}

Result<KvsWaitTicket> Kvs::StartWait(const std::string& ns, const std::string& key,
                                     Deadline deadline, KvsWaitCallback done) {
  (void)ns;
  (void)key;
  (void)deadline;
  (void)done;
  return Status(DYAD_RC_NOTSUP, "metadata store '" + name() +
                                    "' has no asynchronous wait (KvsCaps::async_wait); use Wait");
}

Result<KvsWatchTicket> Kvs::Watch(const std::string& ns, KvsWatchCallback on_change) {
  (void)ns;
  (void)on_change;
  return Status(DYAD_RC_NOTSUP,
                "metadata store '" + name() + "' cannot watch a namespace (KvsCaps::watch)");
}

}  // namespace dyad
