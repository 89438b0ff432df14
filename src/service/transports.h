// transports.h: the transports one service uses, created once each.
//
// The service's default (its -m/--mode) is created and warmed at start;
// others (a client's DYAD_DTL_MODE, the transport a requester names in a
// fetch, the same-node copy) are created from their rows on first use and
// kept. Handed to the parts that move data (placement, file server), so
// none of them calls back into the service. Thread-safe.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "transport/transport.h"

namespace dyad {

class TransportSet {
 public:
  explicit TransportSet(TransportOptions options) : options_(options) {}

  // Creates the default transport for `dtl_mode` and warms it.
  Status Init(const std::string& dtl_mode);

  Transport& Default() { return *default_; }
  // The transport a DTL mode or transport name selects ("" = the default).
  Result<Transport*> ForMode(const std::string& mode_or_name);
  // The transport between services on one node (its row says same_node_only).
  Result<Transport*> SameNode();

 private:
  Result<Transport*> ByName(const std::string& name);

  const TransportOptions options_;
  Transport* default_ = nullptr;
  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Transport>> all_;
};

}  // namespace dyad
