// stats.h: the counters `dyad status` shows (see docs/service.md).
// The fixed counters are lock-free atomics; counters named at run time (one
// per transport: "transfers.in.tcp") sit in a small map under a mutex. Safe
// to bump from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace dyad {

class ServiceStats {
 public:
  enum Counter {
    kReqPublish,
    kReqLocate,
    kReqConsume,
    kReqList,
    kReqStatus,
    kReqFetch,
    kReqKvs,
    kAsyncPending,
    kCacheHits,
    kCacheMisses,
    kConsumeLocal,
    kConsumeJoined,
    kTransfersIn,
    kBytesIn,
    kTransfersOut,
    kBytesOut,
    kBytesOutDirect,
    kFetchRefused,
    kErrors,
    kConnRefused,
    kNodeCacheHits,
    kNodeCacheEvictions,
    kNodeCacheSuperseded,
    kReqKvsMultiGet,
    kNumCounters
  };

  void Add(Counter c, uint64_t n = 1) { v_[c].fetch_add(n, std::memory_order_relaxed); }
  void Sub(Counter c, uint64_t n = 1) { v_[c].fetch_sub(n, std::memory_order_relaxed); }
  uint64_t Get(Counter c) const { return v_[c].load(std::memory_order_relaxed); }

  static const char* Name(Counter c) {
    static const char* const kNames[kNumCounters] = {"requests.publish",
                                                     "requests.locate",
                                                     "requests.consume",
                                                     "requests.list",
                                                     "requests.status",
                                                     "requests.fetch",
                                                     "requests.kvs",
                                                     "publish.async_pending",
                                                     "cache.hits",
                                                     "cache.misses",
                                                     "consume.local",
                                                     "consume.joined",
                                                     "transfers.in",
                                                     "bytes.in",
                                                     "transfers.out",
                                                     "bytes.out",
                                                     "bytes.out.direct",
                                                     "fetch.refused",
                                                     "errors",
                                                     "connections.refused",
                                                     "node_cache.hits",
                                                     "node_cache.evictions",
                                                     "node_cache.superseded",
                                                     "requests.kvs.multi_get"};
    return kNames[c];
  }
  // The counter called `name`, or kNumCounters when there is none.
  static Counter Find(const std::string& name) {
    for (int i = 0; i < kNumCounters; ++i)
      if (name == Name(static_cast<Counter>(i))) return static_cast<Counter>(i);
    return kNumCounters;
  }

  // A counter named at run time, e.g. "bytes.in." + transport name.
  void AddNamed(const std::string& name, uint64_t n = 1) {
    std::lock_guard<std::mutex> lk(named_mu_);
    named_[name] += n;
  }

  std::map<std::string, uint64_t> Snapshot() const {
    std::map<std::string, uint64_t> out;
    for (int i = 0; i < kNumCounters; ++i)
      out[Name(static_cast<Counter>(i))] = Get(static_cast<Counter>(i));
    std::lock_guard<std::mutex> lk(named_mu_);
    for (const auto& [k, v] : named_) out[k] = v;
    return out;
  }

  // One sentence per counter, for `dyad status --prometheus` (HELP lines)
  // and docs/operations.md. Per-transport counters are described by their
  // family ("transfers.in.<transport>").
  static std::string Help(const std::string& name);
  // True for counters that go up and down (Prometheus gauges).
  static bool IsGauge(const std::string& name) {
    return name == "publish.async_pending" || name == "cache.entries" ||
           name == "consume.waiting_on_owner" || name == "peers.dialing" ||
           name == "peers.waiting_on_dial" || name == "fetch.unsent_bytes" ||
           name == "node_cache.pinned_bytes" || name == "waits.publication" ||
           name == "waits.publication.unpublished_local" || name == "waits.publication.oldest_s";
  }

 private:
  std::atomic<uint64_t> v_[kNumCounters] = {};
  mutable std::mutex named_mu_;
  std::map<std::string, uint64_t> named_;
};

inline std::string ServiceStats::Help(const std::string& name) {
  static const std::map<std::string, std::string> kHelp = {
      {"requests.publish", "Publish requests from local clients."},
      {"requests.locate", "Locate (metadata lookup) requests from local clients."},
      {"requests.consume", "Consume requests from local clients."},
      {"requests.list", "List requests from local clients."},
      {"requests.status", "Status requests from local clients."},
      {"requests.fetch", "Fetch requests from other services (this service as owner)."},
      {"requests.kvs",
       "Embedded metadata store requests served (root only), batched reads excepted."},
      {"requests.kvs.multi_get",
       "Batched reads of many keys served by the embedded store (root only)."},
      {"publish.async_pending", "Asynchronous publications not yet confirmed by the store."},
      {"cache.hits", "Lookups answered by the node-local metadata cache."},
      {"cache.misses", "Lookups that went to the metadata store."},
      {"cache.entries", "Records in the node-local metadata cache."},
      {"consume.local",
       "Consumes that needed no transfer (complete copy, same directory or "
       "shared storage)."},
      {"consume.joined", "Consumes that waited for a transfer another request started."},
      {"consume.parked_for_owner",
       "Times a consume's wait on an owner (or on another consume's transfer) was parked, "
       "holding no worker."},
      {"consume.waiting_on_owner", "Consumes parked on an owner's answer now."},
      {"fetch.parked_for_room",
       "Times a fetch this service sends waited, holding no worker, for the requester to "
       "take bytes."},
      {"fetch.parked_for_peer",
       "Times a fetch this service sends off the session (UCX, libfabric) was parked, "
       "holding no worker, on the requester or the transfer's completions."},
      {"fetch.unsent_bytes",
       "Reply bytes held in memory now by responses waiting for their requester to read."},
      {"fetch.closed_for_output",
       "Sessions closed because their unread replies would take the bytes held for "
       "requesters that do not read past the service's cap."},
      {"fetch_batch.busy",
       "Items of batched fetches answered busy at once because their producer held the "
       "file's lock (the requester fetches them alone)."},
      {"notices.confirmed", "Version notices acted on: the store holds the version they name."},
      {"notices.unconfirmed",
       "Version notices ignored: the store does not hold the version they name (forged, "
       "replayed or outdated)."},
      {"consume.stale_record_reread",
       "Consumes whose cached record the owner refused as stale, placed again from the "
       "store's record."},
      {"notices.parked_for_peer",
       "Times a publication's version notices were parked, holding no worker, on a "
       "slow receiver."},
      {"peers.dialing", "New sessions to other services being connected and authenticated now."},
      {"peers.waiting_on_dial",
       "Requests waiting now for another request's new session to the same service."},
      {"transfers.in", "Files received into a consumer directory of this node."},
      {"bytes.in", "Bytes received into consumer directories of this node."},
      {"transfers.out", "Files sent to other services."},
      {"bytes.out", "Bytes sent to other services."},
      {"bytes.out.direct", "Bytes sent straight into a peer's memory on the same host."},
      {"fetch.refused",
       "Fetches refused (outside the producer directory, not a regular file, "
       "malformed)."},
      {"errors", "Requests answered with an error."},
      {"node_cache.pinned_bytes",
       "Bytes of copies the node cache cannot remove (permission, read-only file system); "
       "not counted against the budget."},
      {"waits.publication",
       "Local requests (consumes, waiting locates) waiting now for a file's publication; "
       "`dyad status` lists each."},
      {"waits.publication.unpublished_local",
       "Of those, waits whose file exists on this node but was never published (written "
       "outside DYAD)."},
      {"waits.publication.oldest_s", "Seconds the oldest of those has waited."},
  };
  if (auto it = kHelp.find(name); it != kHelp.end()) return it->second;
  for (const char* family : {"transfers.in.", "bytes.in.", "transfers.out.", "bytes.out."}) {
    const std::string f = family;
    if (name.compare(0, f.size(), f) == 0) {
      const std::string base = f.substr(0, f.size() - 1);
      return kHelp.at(base).substr(0, kHelp.at(base).size() - 1) + ", by transport.";
    }
  }
  return "DYAD counter " + name + ".";
}

}  // namespace dyad
