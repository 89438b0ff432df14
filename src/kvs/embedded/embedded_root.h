// embedded_root.h: the "embedded" store as seen by the service that hosts it.
//
// The root dyad-service keeps the cluster's metadata in a MemoryKvs of its
// own process and serves the other services' store requests from it
// (EmbeddedKvsServer). EmbeddedRoot is the Kvs the root itself uses: the
// same MemoryKvs, with the server's handlers registered on the service's
// peer link when it is opened (OpenKvs_embedded with KvsOptions::router).
// Waits, its own and its peers', hold no thread (MemoryKvs::StartWait; a
// peer's wait is a task on the service's runtime).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kvs/embedded/embedded_server.h"
#include "kvs/kvs.h"
#include "kvs/memory/memory_kvs.h"
#include "proto/router.h"

namespace dyad {

class EmbeddedRoot final : public Kvs {
 public:
  // Registers the store's request handlers with `router` (peer link). The
  // store's and its feeds' timers run on `loop` (the service's runtime,
  // which outlives this store), else on loops of their own.
  explicit EmbeddedRoot(RequestRouter& router,
                        std::optional<asio::any_io_executor> loop = std::nullopt);

  std::string name() const override { return "embedded"; }
  bool in_process() const override { return true; }
  Status Put(const std::string& ns, const std::string& key, const std::string& value) override {
    return store_->Put(ns, key, value);
  }
  Result<std::optional<std::string>> Get(const std::string& ns, const std::string& key) override {
    return store_->Get(ns, key);
  }
  Result<KvsValues> MultiGet(const std::string& ns, const std::vector<std::string>& keys) override {
    return store_->MultiGet(ns, keys);
  }
  Status Remove(const std::string& ns, const std::string& key) override {
    return store_->Remove(ns, key);
  }
  Result<std::vector<KvsEntry>> List(const std::string& ns, const std::string& prefix,
                                     uint32_t limit = 0) override {
    return store_->List(ns, prefix, limit);
  }
  void Shutdown() override { store_->Shutdown(); }
  Result<KvsWaitTicket> StartWait(const std::string& ns, const std::string& key, Deadline deadline,
                                  KvsWaitCallback done) override {
    return store_->StartWait(ns, key, deadline, std::move(done));
  }
  void CancelWait(KvsWaitTicket ticket) override { store_->CancelWait(ticket); }
  Result<KvsWatchTicket> Watch(const std::string& ns, KvsWatchCallback on_change) override {
    return store_->Watch(ns, std::move(on_change));
  }
  void Unwatch(KvsWatchTicket ticket) override { store_->Unwatch(ticket); }

 private:
  std::shared_ptr<MemoryKvs> store_;
  std::shared_ptr<EmbeddedKvsServer> server_;
};

}  // namespace dyad
