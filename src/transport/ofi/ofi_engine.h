// ofi_engine.h: what an OfiTransport opens on first use (private to the
// transport's files): the fabric and its two registered pools.
#pragma once

#include <memory>

#include "transport/ofi/ofi_fabric.h"
#include "transport/ofi/ofi_pool.h"
#include "transport/ofi/ofi_transport.h"

namespace dyad {

struct OfiTransport::Engine {
  std::shared_ptr<OfiFabric> fabric;
  std::unique_ptr<OfiPool> send;
  std::unique_ptr<OfiPool> receive;
};

// Marks a transfer as running for the fabric's polled mode (see
// OfiFabric::BeginActivity) for the life of this object.
class OfiActivity {
 public:
  explicit OfiActivity(OfiFabric& fabric) : fabric_(fabric) { fabric_.BeginActivity(); }
  ~OfiActivity() { fabric_.EndActivity(); }
  OfiActivity(const OfiActivity&) = delete;
  OfiActivity& operator=(const OfiActivity&) = delete;

 private:
  OfiFabric& fabric_;
};

}  // namespace dyad
