// service_batch.cc: the local requests that move many files at once:
// prefetch declarations (service/prefetch.h) and batch consumes.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
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

// Store reads of one batch consume at once: one per CPU (2 to 8); more
// readers than CPUs cost the service CPU for no earlier look-ahead.
size_t LocateParallelism() {
  static const size_t n =
      std::clamp<size_t>(std::thread::hardware_concurrency(), 2, kBatchParallelism);
  return n;
}

// What the batch's store reads said about its items.
struct BatchRecords {
  std::vector<std::optional<std::string>> value;  // the published record read
  std::vector<bool> absent;                       // read, and not published
  // Items ConsumeRecord may still read the store for: those whose batched
  // read failed, and cached records it confirms when the copy is current.
  size_t own_reads = 0;
};

// One MultiGet per namespace for the items whose record is neither carried
// by the request nor in the node's metadata cache, instead of one store
// round trip per item. A failed read leaves its items to ConsumeRecord,
// which reads (and reports) each on its own.
BatchRecords ReadBatchRecords(Kvs& kvs, const MetadataCache& cache,
                              const std::vector<ConsumeRequest>& items) {
  BatchRecords out;
  out.value.resize(items.size());
  out.absent.assign(items.size(), false);
  std::map<std::string, std::vector<size_t>> by_ns;
  for (size_t i = 0; i < items.size(); ++i) {
    const ConsumeRequest& item = items[i];
    if (item.have_record || item.ns == kMembersNamespace) continue;
    if (cache.Get(item.ns, item.key)) {
      ++out.own_reads;
      continue;
    }
    by_ns[item.ns].push_back(i);
  }
  for (const auto& [ns, idx] : by_ns) {
    std::vector<std::string> keys;
    keys.reserve(idx.size());
    for (size_t i : idx) keys.push_back(items[i].key);
    Result<KvsValues> values = kvs.MultiGet(ns, keys);
    if (!values.ok()) {
      DYAD_LOG_DEBUG("batch consume: reading %zu records of namespace '%s' at once failed (%s)",
                     keys.size(), ns.c_str(), values.status().ToString().c_str());
      out.own_reads += idx.size();
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
  return out;
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
  // without waiting; reads still made per item run several at once, since
  // each is a round trip (on the pool: they block on the store).
  std::vector<std::optional<FileRecord>> records(items.size());
  std::vector<size_t> unpublished;
  BatchRecords read = co_await StoreCall([&] { return ReadBatchRecords(*kvs_, cache_, items); });
  // Items whose record must still be read or confirmed go to the store
  // (on the pool for a store of another process), several at once.
  const bool own_reads = read.own_reads > 0;
  co_await ForEachTask(
      *runtime_, items.size(), own_reads ? LocateParallelism() : 1, [&](size_t i) -> Task<void> {
        if (items[i].ns == kMembersNamespace) {
          settle(i, Status(DYAD_RC_PERM,
                           "namespace '" + std::string(kMembersNamespace) + "' holds no files"));
          co_return;
        }
        Result<FileRecord> rec = Status(DYAD_RC_NOTFOUND, "not published");
        auto find = [&] {
          return ConsumeRecord(items[i], false, Deadline::AfterMs(items[i].timeout_ms), ctx.cancel,
                               read.value[i]);
        };
        if (!read.absent[i] && own_reads) rec = co_await StoreCall(find);
        if (!read.absent[i] && !own_reads) rec = find();
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
        settle(unpublished[k - 1],
               co_await Consume(item, Deadline::AfterMs(item.timeout_ms), ctx.stop, ctx.cancel));
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
