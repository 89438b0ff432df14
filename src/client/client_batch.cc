// client_batch.cc: dyad::Client's calls that move many files at once:
// prefetch declarations and batch consumes (see client.h).
#include <sys/stat.h>
#include <unistd.h>

#include "client/client.h"
#include "common/backend.h"
#include "common/fsutil.h"
#include "common/time.h"

namespace dyad {

Result<std::string> Client::PrefetchPattern(const std::string& pattern) const {
  if (!has_consumer_path())
    return Status(DYAD_RC_BADMANAGEDPATH,
                  "prefetch needs a consumer directory (DYAD_PATH_CONSUMER)");
  std::string rel = pattern;
  if (!pattern.empty() && pattern[0] == '/') {
    // Absolute: must lie under the consumer directory, spelled either way.
    rel.clear();
    bool under = false;
    for (const std::string* dir : {&cons_.given(), &cons_.canonical()}) {
      if (pattern == *dir || pattern == *dir + "/") {
        under = true;
        break;
      }
      if (pattern.size() > dir->size() && pattern.compare(0, dir->size(), *dir) == 0 &&
          pattern[dir->size()] == '/') {
        rel = pattern.substr(dir->size() + 1);
        under = true;
        break;
      }
    }
    if (!under)
      return Status(DYAD_RC_UNTRACKED, "prefetch pattern '" + pattern +
                                           "' is not under the consumer directory '" +
                                           cons_.given() + "'");
  }
  while (rel.compare(0, 2, "./") == 0) rel.erase(0, 2);
  if (rel == ".") rel.clear();
  if (rel == ".." || rel.compare(0, 3, "../") == 0 || rel.find("/../") != std::string::npos)
    return Status(DYAD_RC_PERM,
                  "prefetch pattern '" + pattern + "' escapes the consumer directory");
  return rel;
}

Result<uint32_t> Client::Prefetch(const std::string& pattern, bool cancel) {
  Result<std::string> rel = PrefetchPattern(pattern);
  if (!rel.ok()) return Finish(rel.status(), "prefetch", pattern);
  PrefetchRequest req;
  req.ns = config_.kvs_namespace;
  req.pattern = *rel;
  req.cons_path = EnsureConsumerDir(/*recheck=*/true);  // rare: looked at each time
  const bool chosen = config_.dtl_mode_chosen || config_.dtl_mode != DefaultDtlMode();
  req.dtl_mode = chosen ? config_.dtl_mode : std::string();
  req.cancel = cancel;
  Encoder e;
  req.EncodeTo(e);
  std::string body;
  Status st = pool_->Call(MsgType::kPrefetch, e.data(), &body, RpcDeadline(),
                          config_.rpc_timeout_ms, "prefetch '" + pattern + "'");
  if (st.code() == DYAD_RC_NOSERVICE) st = NoModule(st, "prefetch");
  if (!st.ok()) return Finish(st, "prefetch", pattern);
  Decoder d(body);
  const uint32_t n = d.U32();
  if (d.failed()) return Status(DYAD_RC_BADUNPACK, "prefetch: malformed reply from dyad-service");
  return n;
}

void Client::DeclareConfiguredPrefetch() {
  if (prefetch_declared_.exchange(true)) return;
  for (const std::string& p : config_.prefetch) {
    // Prefetch only speeds consumes up: a refused declaration (an older
    // service, a bad pattern; logged with DYAD_SYNC_DEBUG) leaves them
    // working as before.
    (void)Prefetch(p);
  }
}

Status Client::ConsumeBatch(const std::vector<std::string>& fnames, std::vector<Status>* results,
                            int64_t timeout_ms) {
  results->assign(fnames.size(), Status::OK());
  if (fnames.size() > kMaxBatchItems)
    return Status(DYAD_RC_BADREQUEST, "batch of " + std::to_string(fnames.size()) +
                                          " files exceeds the limit of " +
                                          std::to_string(kMaxBatchItems));
  if (!config_.prefetch.empty()) DeclareConfiguredPrefetch();
  ConsumeBatchRequest req;
  std::vector<size_t> sent;         // index in `fnames` of each item
  std::vector<std::string> upaths;  // and its path
  std::string cons;
  for (size_t i = 0; i < fnames.size(); ++i) {
    Result<std::string> upath = Resolve(fnames[i], Side::kConsumer);
    if (!upath.ok()) {
      (*results)[i] = Finish(upath.status(), "consume", fnames[i]);
      continue;
    }
    if (Level1(cons_.given() + "/" + *upath)) continue;            // complete already
    if (cons.empty()) cons = EnsureConsumerDir(/*recheck=*/true);  // once a batch
    req.items.push_back(BuildConsumeRequest(*upath, cons));
    if (timeout_ms != kConfiguredTimeout)
      req.items.back().timeout_ms = timeout_ms < 0 ? -1 : timeout_ms;
    sent.push_back(i);
    upaths.push_back(*upath);
  }
  if (req.items.empty()) return Status::OK();
  AwaitPublications();
  Encoder e;
  req.EncodeTo(e);
  std::string body;
  const Deadline deadline =
      timeout_ms == kConfiguredTimeout || timeout_ms < 0 || config_.rpc_timeout_ms < 0
          ? WaitDeadline()
          : Deadline::AfterMs(SaturatingAddMs(timeout_ms, config_.rpc_timeout_ms));
  Status st = pool_->Call(MsgType::kConsumeBatch, e.data(), &body, deadline, config_.rpc_timeout_ms,
                          "consume " + std::to_string(req.items.size()) + " files");
  if (st.code() == DYAD_RC_NOSERVICE && flux_ != nullptr) {
    // No dyad.so on this broker: one file after the other from the owners'
    // modules, each with the batch's wait.
    const int64_t wait_ms =
        timeout_ms == kConfiguredTimeout ? config_.consume_timeout_ms : timeout_ms;
    for (size_t j = 0; j < sent.size(); ++j)
      (*results)[sent[j]] =
          Finish(ConsumeViaFlux(upaths[j], nullptr, wait_ms, nullptr), "consume", fnames[sent[j]]);
    return Status::OK();
  }
  if (!st.ok()) {
    for (size_t i : sent) (*results)[i] = st;
    return Finish(st, "consume batch", fnames[sent[0]]);
  }
  ConsumeBatchReply reply;
  Decoder d(body);
  if (!reply.DecodeFrom(d) || reply.results.size() != sent.size())
    return Status(DYAD_RC_BADUNPACK, "batch consume: malformed reply from dyad-service");
  for (size_t j = 0; j < sent.size(); ++j) {
    const ConsumeBatchResult& r = reply.results[j];
    if (r.code != DYAD_RC_OK)
      (*results)[sent[j]] =
          Finish(Status(static_cast<dyad_rc_t>(r.code), r.message), "consume", fnames[sent[j]]);
  }
  return Status::OK();
}

}  // namespace dyad
