// fetcher.h: makes a published file complete in a consumer directory.
//
// Ensure() is called by the service for every consume that needs data. It
// guarantees one transfer per destination file on this node: a request for
// a destination already being fetched waits for that transfer and shares
// its result. Data lands in a temporary beside the destination and is
// renamed into place only when complete (AtomicFile), stamped with the
// producer's version, so a later request can tell the local copy is current.
// Thread-safe.
#pragma once

#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/fsutil.h"
#include "kvs/kvs.h"
#include "proto/protocol.h"
#include "service/peers.h"
#include "service/stats.h"
#include "transport/transport.h"

namespace dyad {

struct FetcherConfig {
  uint32_t rank = 0;
  uint32_t node_idx = 0;
  uint32_t service_mux = 1;
  std::string prod_real;  // this service's canonical producer path
  int64_t rpc_timeout_ms = 60000;
};

using TransportLookup = std::function<Result<Transport*>(const std::string& name)>;

class Fetcher {
 public:
  Fetcher(FetcherConfig config, PeerDirectory* peers, ServiceStats* stats,
          TransportLookup transports);

  // Ensures cons_root/rec.upath is a complete copy of `rec`'s file.
  // `transport` is the canonical transport name for remote owners.
  Result<ConsumeReply> Ensure(const FileRecord& rec, const std::string& cons_root,
                              const std::string& transport, Deadline deadline,
                              const CancelFn& cancel);

 private:
  struct InFlight {
    bool done = false;
    Status status;
    ConsumeReply reply;
    std::condition_variable cv;
  };

  Result<ConsumeReply> Transfer(const FileRecord& rec, const std::string& cons_root,
                                const std::string& transport);
  Status CopyOwnFile(const FileRecord& rec, AtomicFile& out, uint64_t* version, uint64_t* bytes);
  Status FetchRemote(const FileRecord& rec, const std::string& transport, AtomicFile& out,
                     uint64_t* version, uint64_t* bytes, bool* retryable);

  FetcherConfig cfg_;
  PeerDirectory* peers_;
  ServiceStats* stats_;
  TransportLookup transports_;
  std::mutex mu_;
  std::map<std::string, std::shared_ptr<InFlight>> inflight_;
};

// True if `path` exists as a regular file with exactly this size and mtime.
bool IsCompleteCopy(const std::string& path, uint64_t size, uint64_t version);

}  // namespace dyad
