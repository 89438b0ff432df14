// service_batch.cc: the local requests that move many files at once:
// prefetch declarations (service/prefetch.h) and batch consumes.
#include <sys/stat.h>

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "common/log.h"
#include "service/dispatch.h"
#include "service/placement.h"
#include "service/prefetch.h"
#include "service/record_feed.h"
#include "service/service.h"

namespace dyad {

namespace {

// Owners' batches (or large files) of one batch consume placed at once:
// enough to hide round trips to a few owners, few enough that one batch
// cannot take every connection.
constexpr size_t kBatchParallelism = 8;

// What the batch's store reads said about its items.
struct BatchRecords {
  std::vector<std::optional<std::string>> value;  // the published record read
  std::vector<bool> absent;                       // read, and not published
};

// One MultiGet per namespace for the items whose record is neither carried
// by the request nor in the node's metadata cache, instead of one store
// round trip per item (tasks: no thread held while the store answers). A
// failed read leaves its items to ConsumeRecord, which reads (and
// reports) each on its own.
Task<BatchRecords> ReadBatchRecords(Kvs& kvs, Runtime& rt, const MetadataCache& cache,
                                    const std::vector<ConsumeRequest>& items) {
  BatchRecords out;
  out.value.resize(items.size());
  out.absent.assign(items.size(), false);
  std::map<std::string, std::vector<size_t>> by_ns;
  for (size_t i = 0; i < items.size(); ++i) {
    const ConsumeRequest& item = items[i];
    if (item.have_record || item.ns == kMembersNamespace || cache.Contains(item.ns, item.key))
      continue;
    by_ns[item.ns].push_back(i);
  }
  for (const auto& [ns, idx] : by_ns) {
    std::vector<std::string> keys;
    keys.reserve(idx.size());
    for (size_t i : idx) keys.push_back(items[i].key);
    Result<KvsValues> values = co_await kvs.MultiGetTask(rt, ns, keys);
    if (!values.ok()) {
      DYAD_LOG_DEBUG("batch consume: reading %zu records of namespace '%s' at once failed (%s)",
                     keys.size(), ns.c_str(), values.status().ToString().c_str());
      continue;
    }
    for (size_t k = 0; k < idx.size(); ++k) {
      if ((*values)[k]) {
        out.value[idx[k]] = std::move((*values)[k]);
      } else {
        out.absent[idx[k]] = true;
      }
    }
  }
  co_return out;
}

}  // namespace

void Service::HandlePrefetch(RequestContext& ctx, const PrefetchRequest& req) {
  Channel& ch = ctx.ch;
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
  // Followed as by a consume: the copies fetched ahead can then be taken
  // as current from their stamps (NodeCache::StampRevocable).
  if (record_feed_ && !req.cancel) record_feed_->Follow(req.ns);
  if (!req.cancel)
    DYAD_LOG_DEBUG("prefetch of '%s' into %s declared (%u already published)", req.pattern.c_str(),
                   req.cons_path.c_str(), *n);
  Encoder e;
  e.U32(*n);
  Reply(ch, Status::OK(), e.data());
}

Task<void> Service::HandleConsumeBatch(RequestContext& ctx, ConsumeBatchRequest req) {
  const std::vector<ConsumeRequest>& items = req.items;
  ConsumeBatchReply reply;
  reply.results.resize(items.size());
  auto settle = [&](size_t i, const Result<ConsumeReply>& r) {
    ConsumeBatchResult& out = reply.results[i];
    if (r.ok()) {
      out.reply = *r;
    } else {
      out.code = r.status().code();
      out.message = "'" + items[i].upath + "': " + r.status().message();
    }
  };
  // Every item's record, from the locate cache or the batch's store reads,
  // without waiting; records still read per item (a failed batched read,
  // a cached record to confirm) several at once, each a task.
  std::vector<std::optional<FileRecord>> records(items.size());
  std::vector<size_t> unpublished;
  BatchRecords read = co_await ReadBatchRecords(*kvs_, *runtime_, cache_, items);
  co_await ForEachTask(*runtime_, items.size(), kBatchParallelism, [&](size_t i) -> Task<void> {
    if (items[i].ns == kMembersNamespace) {
      settle(i, Status(DYAD_RC_PERM,
                       "namespace '" + std::string(kMembersNamespace) + "' holds no files"));
      co_return;
    }
    Result<FileRecord> rec = Status(DYAD_RC_NOTFOUND, "not published");
    if (!read.absent[i]) rec = co_await ConsumeRecord(ctx, items[i], std::nullopt, read.value[i]);
    if (rec.ok()) {
      records[i] = std::move(*rec);
    } else {
      unpublished.push_back(i);
    }
  });
  // Files not published yet (or whose record could not be read now): each
  // consumed as alone, a task of its own with its own deadline, waiting for
  // its publication and reporting what a single consume would, beside the
  // placement of the others (small files of one owner in one request
  // each). None holds a thread while it waits.
  co_await ForEachTask(
      *runtime_, 1 + unpublished.size(), 1 + unpublished.size(), [&](size_t k) -> Task<void> {
        if (k == 0) {
          co_await PlacePublished(items, records, ctx.stop, settle);
          co_return;
        }
        const ConsumeRequest& item = items[unpublished[k - 1]];
        settle(unpublished[k - 1], co_await Consume(ctx, item, Deadline::AfterMs(item.timeout_ms)));
      });
  Encoder e;
  reply.EncodeTo(e);
  Reply(ctx.ch, Status::OK(), e.data());
}

Task<void> Service::PlacePublished(
    const std::vector<ConsumeRequest>& items, const std::vector<std::optional<FileRecord>>& records,
    dyad::Stop* stop, const std::function<void(size_t, const Result<ConsumeReply>&)>& settle) {
  std::vector<size_t> placed;
  std::vector<PlacementRequest> preqs;
  int64_t longest_ms = 0;  // the batch's placement waits (joins) as long as its most patient item
  for (size_t i = 0; i < items.size(); ++i) {
    if (!records[i]) continue;
    placed.push_back(i);
    preqs.push_back(PlacementFor(items[i], *records[i]));
    longest_ms =
        items[i].timeout_ms < 0 || longest_ms < 0 ? -1 : std::max(longest_ms, items[i].timeout_ms);
  }
  if (preqs.empty()) co_return;
  // Small files of one owner travel in one request (Placement::PlaceBatch)
  // rather than a fetch conversation each.
  std::vector<Result<ConsumeReply>> results = co_await placement_->PlaceBatch(
      std::move(preqs), Deadline::AfterMs(longest_ms), stop, kBatchParallelism);
  for (size_t k = 0; k < placed.size(); ++k) {
    ForgetFailedRecord(items[placed[k]], results[k]);
    settle(placed[k], results[k]);
  }
}

}  // namespace dyad
