// stats.h: the counters `dyad status` shows (see docs/service.md), and the
// metric table: one row per value it shows, with its kind (counter or
// gauge), Prometheus name and help (MetricRows, below).
// The fixed counters are lock-free atomics; counters named at run time (one
// per transport: "transfers.in.tcp") sit in a small map under a mutex. Safe
// to bump from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace dyad {

struct MetricRow;

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

  // The declared metric called `name` (a per-transport one by its family:
  // "transfers.in.tcp" finds "transfers.in.<transport>" and sets
  // `*transport` to "tcp"), or nullptr when no row declares it.
  static const MetricRow* FindMetric(const std::string& name, std::string* transport = nullptr);
  // The help sentence of `name` (docs/operations.md, Prometheus HELP).
  static std::string Help(const std::string& name);
  // True for metrics that go up and down (Prometheus gauges).
  static bool IsGauge(const std::string& name);

 private:
  std::atomic<uint64_t> v_[kNumCounters] = {};
  mutable std::mutex named_mu_;
  std::map<std::string, uint64_t> named_;
};

// --- the metric table -----------------------------------------------------
//
// Every value `dyad status` shows under "counters" has ONE row here: its
// name there, its kind, its Prometheus name and its help sentence. To add a
// metric: bump or set it (an enum Counter above, AddNamed, or a value that
// HandleStatus/AddCounters fills in), then add its row below and a line in
// docs/operations.md ("Metrics"); tests check that every name the service
// reports has a row, that the export passes `promtool check metrics`, and
// that the docs list every row.
//  * kCounter: only grows; exported as dyad_<prometheus>_total.
//  * kGauge: a level that also goes down (open, pending, bytes held);
//    exported as dyad_<prometheus>, no _total.
//  * <prometheus>: lower_snake_case, the unit last when there is one
//    (_bytes, _seconds); no _total (added for counters).
//  * A name ending in ".<transport>" is a per-transport family: one metric
//    with a transport="..." label.

enum class MetricType { kCounter, kGauge };

struct MetricRow {
  const char* name;  // as in `dyad status` and its --json
  MetricType type;
  const char* prometheus;  // without the "dyad_" prefix and the "_total" suffix
  const char* help;        // one sentence, ending with a period
};

inline const std::vector<MetricRow>& MetricRows() {
  using T = MetricType;
  static const std::vector<MetricRow> kRows = {
      // requests from local clients and other services
      {"requests.publish", T::kCounter, "requests_publish", "Publish requests from local clients."},
      {"requests.locate", T::kCounter, "requests_locate",
       "Locate (metadata lookup) requests from local clients."},
      {"requests.consume", T::kCounter, "requests_consume", "Consume requests from local clients."},
      {"requests.list", T::kCounter, "requests_list", "List requests from local clients."},
      {"requests.status", T::kCounter, "requests_status", "Status requests from local clients."},
      {"requests.fetch", T::kCounter, "requests_fetch",
       "Fetch requests from other services (this service as owner)."},
      {"requests.fetch_batch", T::kCounter, "requests_fetch_batch",
       "Batched fetch requests (many small files each) from other services' prefetch."},
      {"requests.kvs", T::kCounter, "requests_kvs",
       "Embedded metadata store requests served (root only), batched reads excepted."},
      {"requests.kvs.multi_get", T::kCounter, "requests_kvs_multi_get",
       "Batched reads of many keys served by the embedded store (root only)."},
      {"requests.parked", T::kGauge, "requests_parked",
       "Requests waiting now without a thread (for a publication, a slow owner or a slow "
       "requester)."},
      {"errors", T::kCounter, "errors", "Requests answered with an error."},
      // publication and the metadata cache
      {"publish.async_pending", T::kGauge, "publish_async_pending",
       "Asynchronous publications not yet confirmed by the store."},
      {"cache.hits", T::kCounter, "cache_hits",
       "Lookups answered by the node-local metadata cache."},
      {"cache.misses", T::kCounter, "cache_misses", "Lookups that went to the metadata store."},
      {"cache.entries", T::kGauge, "cache_entries", "Records in the node-local metadata cache."},
      // consumes
      {"consume.local", T::kCounter, "consume_local",
       "Consumes that needed no transfer (complete copy, same directory or shared storage)."},
      {"consume.joined", T::kCounter, "consume_joined",
       "Consumes that waited for a transfer another request started."},
      {"consume.parked_for_owner", T::kCounter, "consume_parked_for_owner",
       "Times a consume's wait on an owner (or on another consume's transfer) was parked, "
       "holding no worker."},
      {"consume.waiting_on_owner", T::kGauge, "consume_waiting_on_owner",
       "Consumes parked on an owner's answer now."},
      // transfers and bytes
      {"transfers.in", T::kCounter, "transfers_in",
       "Files received into a consumer directory of this node."},
      {"bytes.in", T::kCounter, "received_bytes",
       "Bytes received into consumer directories of this node."},
      {"transfers.out", T::kCounter, "transfers_out", "Files sent to other services."},
      {"bytes.out", T::kCounter, "sent_bytes", "Bytes sent to other services."},
      {"bytes.out.direct", T::kCounter, "sent_direct_bytes",
       "Bytes sent straight into a peer's memory on the same host."},
      {"transfers.in.<transport>", T::kCounter, "transport_transfers_in",
       "Files received into a consumer directory of this node, by transport."},
      {"bytes.in.<transport>", T::kCounter, "transport_received_bytes",
       "Bytes received into consumer directories of this node, by transport."},
      {"transfers.out.<transport>", T::kCounter, "transport_transfers_out",
       "Files sent to other services, by transport."},
      {"bytes.out.<transport>", T::kCounter, "transport_sent_bytes",
       "Bytes sent to other services, by transport."},
      // serving fetches
      {"fetch.refused", T::kCounter, "fetch_refused",
       "Fetches refused (outside the producer directory, not a regular file, malformed)."},
      {"fetch.parked_for_room", T::kCounter, "fetch_parked_for_room",
       "Times a fetch this service sends waited, holding no worker, for the requester to take "
       "bytes."},
      {"fetch.parked_for_peer", T::kCounter, "fetch_parked_for_peer",
       "Times a fetch this service sends off the session (UCX, libfabric) was parked, holding no "
       "worker, on the requester or the transfer's completions."},
      {"notices.parked_for_peer", T::kCounter, "notices_parked_for_peer",
       "Times a publication's version notices were parked, holding no worker, on a slow "
       "receiver."},
      // connections and peers
      {"connections.refused", T::kCounter, "connections_refused",
       "Connections closed at accept because the service had DYAD_MAX_CONNECTIONS open."},
      {"connections.open", T::kGauge, "connections_open",
       "Connections (local clients and peers) open now."},
      {"connections.handshaking", T::kGauge, "connections_handshaking",
       "Open connections whose peer has not finished its handshake yet."},
      {"peers.dialing", T::kGauge, "peers_dialing",
       "New sessions to other services being connected and authenticated now."},
      {"peers.waiting_on_dial", T::kGauge, "peers_waiting_on_dial",
       "Requests waiting now for another request's new session to the same service."},
      // the node's copies (node cache)
      {"node_cache.hits", T::kCounter, "node_cache_hits",
       "Consumes answered from a copy of the current version already on this node."},
      {"node_cache.evictions", T::kCounter, "node_cache_evictions",
       "Copies removed to keep within the node cache's byte budget."},
      {"node_cache.superseded", T::kCounter, "node_cache_superseded",
       "Copies removed because another version of the file was published."},
      {"node_cache.bytes", T::kGauge, "node_cache_bytes",
       "Bytes of the copies placed in consumer directories of this node and indexed."},
      {"node_cache.files", T::kGauge, "node_cache_files",
       "Copies placed in consumer directories of this node and indexed."},
      {"node_cache.budget", T::kGauge, "node_cache_budget_bytes",
       "The node cache's byte budget (--cache-bytes); 0 means no limit."},
      // prefetch (docs/prefetch.md)
      {"prefetch.queued", T::kCounter, "prefetch_queued", "Files queued for prefetch."},
      {"prefetch.fetched", T::kCounter, "prefetch_fetched", "Files prefetched."},
      {"prefetch.present", T::kCounter, "prefetch_present",
       "Prefetches that found the file already complete on this node."},
      {"prefetch.failed", T::kCounter, "prefetch_failed", "Prefetches that failed."},
      {"prefetch.refused_budget", T::kCounter, "prefetch_refused_budget",
       "Times a prefetch was held back because the node cache's byte budget was full."},
      {"prefetch.dropped", T::kCounter, "prefetch_dropped",
       "Files not queued for prefetch because the queue was full."},
      {"prefetch.pending", T::kGauge, "prefetch_pending",
       "Files in the prefetch queue now, not yet fetched."},
      {"prefetch.deferred", T::kGauge, "prefetch_deferred",
       "Prefetches waiting now for room in the node cache's byte budget."},
      {"prefetch.declarations", T::kGauge, "prefetch_declarations",
       "Prefetch declarations held by this service now."},
      {"fetch.unsent_bytes", T::kGauge, "fetch_unsent_bytes",
       "Reply bytes held in memory now by responses waiting for their requester to read."},
      {"fetch.closed_for_output", T::kCounter, "fetch_closed_for_output",
       "Sessions closed because their unread replies would take the bytes held for requesters "
       "that do not read past the service's cap."},
      {"fetch_batch.busy", T::kCounter, "fetch_batch_busy",
       "Items of batched fetches answered busy at once because their producer held the file's "
       "lock (the requester fetches them alone)."},
      {"notices.confirmed", T::kCounter, "notices_confirmed",
       "Version notices acted on: the store holds the version they name."},
      {"notices.unconfirmed", T::kCounter, "notices_unconfirmed",
       "Version notices ignored: the store does not hold the version they name (forged, "
       "replayed or outdated)."},
      {"consume.stale_record_reread", T::kCounter, "consume_stale_record_reread",
       "Consumes whose cached record the owner refused as stale, placed again from the store's "
       "record."},
      {"records.fed", T::kCounter, "records_fed",
       "Records of followed namespaces the store's watch feed brought to this service, so that "
       "their consumes skip the store."},
      {"records.seeded", T::kCounter, "records_seeded",
       "Records of followed namespaces listed from the store when this service started following "
       "them (or after a resync)."},
      {"records.followed", T::kGauge, "records_followed",
       "Namespaces this service follows without a gap: it learns each of their publications, so "
       "its copies of their files in the producer directory carry revocable version stamps that "
       "clients trust without a message."},
      {"node_cache.pinned_bytes", T::kGauge, "node_cache_pinned_bytes",
       "Bytes of copies the node cache cannot remove (permission, read-only file system); not "
       "counted against the budget."},
      {"waits.publication", T::kGauge, "waits_publication",
       "Local requests (consumes, waiting locates) waiting now for a file's publication; `dyad "
       "status` lists each."},
      {"waits.publication.unpublished_local", T::kGauge, "waits_publication_unpublished_local",
       "Of those, waits whose file exists on this node but was never published (written outside "
       "DYAD)."},
      {"waits.publication.oldest_s", T::kGauge, "waits_publication_oldest_seconds",
       "Seconds the oldest wait for a publication has lasted."},
  };
  return kRows;
}

inline const MetricRow* ServiceStats::FindMetric(const std::string& name, std::string* transport) {
  static const std::string kFamily = ".<transport>";
  for (const MetricRow& r : MetricRows())
    if (name == r.name) return &r;
  for (const MetricRow& r : MetricRows()) {
    const std::string row = r.name;
    if (row.size() <= kFamily.size() ||
        row.compare(row.size() - kFamily.size(), kFamily.size(), kFamily) != 0)
      continue;
    const std::string base = row.substr(0, row.size() - kFamily.size() + 1);  // "bytes.in."
    if (name.size() > base.size() && name.compare(0, base.size(), base) == 0 &&
        name.find('.', base.size()) == std::string::npos) {
      if (transport != nullptr) *transport = name.substr(base.size());
      return &r;
    }
  }
  return nullptr;
}

inline std::string ServiceStats::Help(const std::string& name) {
  const MetricRow* r = FindMetric(name);
  return r != nullptr ? r->help : "";
}

inline bool ServiceStats::IsGauge(const std::string& name) {
  const MetricRow* r = FindMetric(name);
  return r != nullptr && r->type == MetricType::kGauge;
}

}  // namespace dyad
