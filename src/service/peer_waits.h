// peer_waits.h: the service's waits on other services
// (transport/transfer_waits.h), counted: a wait that outlasts its
// operation's budget bumps a named counter of ServiceStats.
#pragma once

#include "service/stats.h"
#include "transport/transfer_waits.h"

namespace dyad {

class PeerWaits : public TransferWaits {
 public:
  // `stop` (may be null) ends the waits; `counter` names the parked count
  // (stats may be null: not counted).
  PeerWaits(Runtime& rt, Stop* stop, ServiceStats* stats,
            const char* counter = "consume.parked_for_owner")
      : TransferWaits(rt, stop), stats_(stats), counter_(counter) {}

 protected:
  void Parked() override {
    if (stats_ != nullptr) stats_->AddNamed(counter_);
  }

 private:
  ServiceStats* const stats_;
  const char* const counter_;
};

}  // namespace dyad
