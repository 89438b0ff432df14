// stats.h: the counters `dyad status` shows (see docs/service.md).
// Lock-free atomics; safe to bump from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
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
    kNumCounters
  };

  void Add(Counter c, uint64_t n = 1) { v_[c].fetch_add(n, std::memory_order_relaxed); }
  void Sub(Counter c, uint64_t n = 1) { v_[c].fetch_sub(n, std::memory_order_relaxed); }
  uint64_t Get(Counter c) const { return v_[c].load(std::memory_order_relaxed); }

  static const char* Name(Counter c) {
    static const char* const kNames[kNumCounters] = {
        "requests.publish", "requests.locate",  "requests.consume",      "requests.list",
        "requests.status",  "requests.fetch",   "requests.kvs",          "publish.async_pending",
        "cache.hits",       "cache.misses",     "consume.local",         "consume.joined",
        "transfers.in",     "bytes.in",         "transfers.out",         "bytes.out",
        "bytes.out.direct", "fetch.refused",    "errors",                "connections.refused",
        "node_cache.hits",  "node_cache.evictions", "node_cache.superseded"};
    return kNames[c];
  }
  // The counter called `name`, or kNumCounters when there is none.
  static Counter Find(const std::string& name) {
    for (int i = 0; i < kNumCounters; ++i)
      if (name == Name(static_cast<Counter>(i))) return static_cast<Counter>(i);
    return kNumCounters;
  }

  std::map<std::string, uint64_t> Snapshot() const {
    std::map<std::string, uint64_t> out;
    for (int i = 0; i < kNumCounters; ++i)
      out[Name(static_cast<Counter>(i))] = Get(static_cast<Counter>(i));
    return out;
  }

 private:
  std::atomic<uint64_t> v_[kNumCounters] = {};
};

}  // namespace dyad
