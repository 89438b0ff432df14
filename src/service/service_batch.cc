// service_batch.cc: the local requests that move many files at once:
// prefetch declarations (service/prefetch.h) and batch consumes.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <vector>

#include "common/log.h"
#include "service/dispatch.h"
#include "service/prefetch.h"
#include "service/service.h"

namespace dyad {

namespace {

// Items of one batch placed at once: enough to hide round trips to a few
// owners, few enough that one batch cannot take every connection.
constexpr size_t kBatchParallelism = 8;

}  // namespace

void Service::HandlePrefetch(RequestContext& ctx, const std::string& payload) {
  Channel& ch = ctx.ch;
  PrefetchRequest req;
  Decoder d(payload);
  if (!req.DecodeFrom(d) || !d.done())
    return Reply(ch, Status(DYAD_RC_BADUNPACK, "malformed prefetch"));
  if (req.ns == kMembersNamespace)
    return Reply(ch, Status(DYAD_RC_PERM,
                            "namespace '" + std::string(kMembersNamespace) + "' holds no files"));
  struct stat st;
  if (req.cons_path.empty() || req.cons_path[0] != '/' || ::stat(req.cons_path.c_str(), &st) != 0 ||
      !S_ISDIR(st.st_mode))
    return Reply(ch, Status(DYAD_RC_BADMANAGEDPATH,
                            "prefetch needs an existing absolute consumer directory, not '" +
                                req.cons_path + "'"));
  if (req.pattern.size() > 4096 || req.pattern.find('\0') != std::string::npos)
    return Reply(ch, Status(DYAD_RC_BADREQUEST, "prefetch pattern too long or not text"));
  Result<uint32_t> n = prefetch_->Declare(req);
  if (!n.ok()) return Reply(ch, n.status());
  if (!req.cancel)
    DYAD_LOG_DEBUG("prefetch of '%s' into %s declared (%u already published)", req.pattern.c_str(),
                   req.cons_path.c_str(), *n);
  Encoder e;
  e.U32(*n);
  Reply(ch, Status::OK(), e.data());
}

void Service::HandleConsumeBatch(RequestContext& ctx, const std::string& payload) {
  Channel& ch = ctx.ch;
  ConsumeBatchRequest req;
  Decoder d(payload);
  if (!req.DecodeFrom(d) || !d.done())
    return Reply(ch, Status(DYAD_RC_BADUNPACK, "malformed batch consume"));
  ConsumeBatchReply reply;
  reply.results.resize(req.items.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < req.items.size(); i = next++) {
      const ConsumeRequest& item = req.items[i];
      ConsumeBatchResult& out = reply.results[i];
      if (item.ns == kMembersNamespace) {
        out.code = DYAD_RC_PERM;
        out.message = "namespace '" + std::string(kMembersNamespace) + "' holds no files";
        continue;
      }
      Result<ConsumeReply> r = Consume(item, Deadline::AfterMs(item.timeout_ms), ctx.cancel);
      if (r.ok()) {
        out.reply = std::move(*r);
      } else {
        out.code = r.status().code();
        out.message = "'" + item.upath + "': " + r.status().message();
      }
    }
  };
  const size_t helpers =
      std::min(kBatchParallelism, req.items.size()) - (req.items.empty() ? 0 : 1);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < helpers; ++i) threads.emplace_back(work);
  work();
  for (std::thread& t : threads) t.join();
  Encoder e;
  reply.EncodeTo(e);
  Reply(ch, Status::OK(), e.data());
}

}  // namespace dyad
