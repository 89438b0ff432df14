// embedded_multi_get.cc: EmbeddedKvs::MultiGet, many keys per request to
// the root (kKvsMultiGet), with the fallback for a root that predates it.
#include <chrono>
#include <string>
#include <vector>

#include "common/log.h"
#include "common/wire.h"
#include "kvs/embedded/embedded_kvs.h"

namespace dyad {
namespace {

// Keys per request are bounded by count (kMaxMultiGetKeys) and by bytes,
// well inside one frame.
constexpr size_t kMaxRequestKeyBytes = 8u << 20;

int64_t SteadyMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// How a root without kKvsMultiGet answers it: the service's dispatcher
// knows no route (DYAD_RC_BADREQUEST), a bare server no such request
// (DYAD_RC_BADRPC). A current root answers neither to a well-formed one.
bool RefusedAsUnknown(const Status& st) {
  return st.code() == DYAD_RC_BADREQUEST || st.code() == DYAD_RC_BADRPC;
}

}  // namespace

bool EmbeddedKvs::MultiGetRefused() const {
  const int64_t at = multi_get_refused_ms_.load(std::memory_order_relaxed);
  return at != 0 && SteadyMs() - at < kMultiGetRetryMs;
}

Result<KvsValues> EmbeddedKvs::MultiGet(const std::string& ns,
                                        const std::vector<std::string>& keys) {
  return RunOnThisThread(MultiGetOn(nullptr, ns, keys));
}

Task<Result<KvsValues>> EmbeddedKvs::MultiGetTask(Runtime& rt, const std::string& ns,
                                                  const std::vector<std::string>& keys) {
  return MultiGetOn(&rt.stopping(), ns, keys);
}

Task<Result<KvsValues>> EmbeddedKvs::MultiGetOn(Stop* stop, const std::string& ns,
                                                const std::vector<std::string>& keys) {
  if (ns.size() > kMaxFieldBytes)
    co_return Status(DYAD_RC_BADREQUEST, "namespace of " + std::to_string(ns.size()) +
                                             " bytes exceeds the embedded store's limit");
  for (const std::string& key : keys)
    if (key.size() > kMaxFieldBytes)
      co_return Status(DYAD_RC_BADREQUEST, "key of " + std::to_string(key.size()) +
                                               " bytes exceeds the embedded store's limit");
  KvsValues out;
  out.reserve(keys.size());
  while (out.size() < keys.size()) {
    if (MultiGetRefused()) {
      for (size_t i = out.size(); i < keys.size(); ++i) {
        Result<std::optional<std::string>> v = co_await GetOn(stop, ns, keys[i]);
        if (!v.ok()) co_return v.status();
        out.push_back(std::move(*v));
      }
      break;
    }
    Status st = co_await MultiGetStep(stop, ns, keys, out.size(), &out);
    if (st.ok()) continue;
    if (!RefusedAsUnknown(st)) co_return st;
    if (multi_get_refused_ms_.exchange(SteadyMs()) == 0)
      DYAD_LOG_INFO("the embedded store at %s has no batched reads (%s); reading key by key",
                    address_text_.c_str(), st.ToString().c_str());
  }
  co_return out;
}

Task<Status> EmbeddedKvs::MultiGetStep(Stop* stop, const std::string& ns,
                                       const std::vector<std::string>& keys, size_t next,
                                       KvsValues* out) {
  KvsMultiGetRequest req;
  req.ns = ns;
  size_t bytes = 0;
  for (size_t i = next; i < keys.size() && req.keys.size() < kMaxMultiGetKeys; ++i) {
    if (!req.keys.empty() && bytes + keys[i].size() > kMaxRequestKeyBytes) break;
    bytes += keys[i].size();
    req.keys.push_back(keys[i]);
  }
  Encoder e;
  req.EncodeTo(e);
  std::string body;
  DYAD_CO_RETURN_IF_ERROR(co_await CallTask(MsgType::kKvsMultiGet, e.data(), &body, stop));
  Decoder d(body);
  const uint32_t answered = d.U32();
  if (d.failed() || answered == 0 || answered > req.keys.size())
    co_return Status(DYAD_RC_BADUNPACK, "malformed kvs.multi_get reply from " + address_text_);
  for (uint32_t i = 0; i < answered && !d.failed(); ++i) {
    const bool found = d.Bool();
    std::string value = d.Str(kMaxFramePayload);
    out->push_back(found ? std::optional<std::string>(std::move(value)) : std::nullopt);
  }
  if (!d.done()) {
    out->resize(next);
    co_return Status(DYAD_RC_BADUNPACK, "malformed kvs.multi_get reply from " + address_text_);
  }
  co_return Status::OK();
}

}  // namespace dyad
