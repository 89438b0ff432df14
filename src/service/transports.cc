#include "service/transports.h"

#include "common/log.h"

namespace dyad {

Status TransportSet::Init(const std::string& dtl_mode) {
  Result<std::string> name = TransportNameForMode(dtl_mode);
  if (!name.ok()) return name.status();
  Result<Transport*> t = ByName(*name);
  if (!t.ok()) return t.status();
  default_ = *t;
  // Not fatal: fetches with other transports still work, and each fetch
  // with this one reports the error itself.
  if (Status ws = default_->Warm(); !ws.ok())
    DYAD_LOG_WARN("transport %s is not ready: %s", default_->name().c_str(), ws.ToString().c_str());
  return Status::OK();
}

Result<Transport*> TransportSet::ForMode(const std::string& mode_or_name) {
  if (mode_or_name.empty()) return default_;
  Result<std::string> name = TransportNameForMode(mode_or_name);
  if (!name.ok()) return name.status();
  return ByName(*name);
}

Result<Transport*> TransportSet::SameNode() {
  Result<const BackendRow*> row = SameNodeTransportRow();
  if (!row.ok()) return row.status();
  return ByName((*row)->name);
}

Result<Transport*> TransportSet::ByName(const std::string& name) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = all_.find(name);
  if (it != all_.end()) return it->second.get();
  Result<std::unique_ptr<Transport>> t = CreateTransport(name, options_);
  if (!t.ok()) return t.status();
  Transport* raw = t->get();
  all_[name] = std::move(*t);
  return raw;
}

}  // namespace dyad
