// service.h: dyad-service, the per-node DYAD daemon.
//
// A Service listens on a Unix socket for the node's application processes
// (publish, locate, consume, list, status) and on TCP for the other
// services (fetch requests for files in its producer directory, and, on the
// root, the embedded metadata store). Every connection is served by its own
// thread, so a long wait or transfer never blocks another request. Fetches
// this service makes for its clients go through the Fetcher (one transfer
// per destination file; atomic placement).
//
// Start() returns once both listeners are open and the service is
// registered in the metadata store; Stop() (also from a signal-handling
// thread) cancels waits, closes connections and joins all threads.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "common/auth.h"
#include "common/net.h"
#include "common/status.h"
#include "kvs/kvs.h"
#include "proto/protocol.h"
#include "service/metadata_cache.h"
#include "service/stats.h"
#include "transport/transport.h"

namespace dyad {

class EmbeddedKvsServer;
class MemoryKvs;
class Fetcher;
class PeerDirectory;

struct ServiceOptions {
  uint32_t rank = 0;
  uint32_t service_mux = 1;
  std::string prod_path;       // producer-managed directory served ("" = none)
  std::string cons_path;       // consumer directory to clean at start ("" = none)
  std::string listen = "0.0.0.0:7590";
  std::string advertise;       // "" = derived from listen
  std::string socket_path;     // Unix socket for local clients
  std::string kvs_url = "embedded";
  bool host_root = false;      // host the embedded store
  std::string dtl_mode = "FLUX_RPC";
  std::string secret;
  bool munge = false;          // MUNGE credentials for peers (with or instead of the secret)
  std::string munge_socket;    // munged's socket ("" = libmunge's default)
  LinkProtection protection = LinkProtection::kIntegrity;  // of the links between services
  bool insecure = false;       // allow listening beyond loopback without any credential
  size_t chunk_size = 4u << 20;
  int64_t rpc_timeout_ms = 60000;
  std::string ready_file;
  bool debug = false;
};

class Service {
 public:
  explicit Service(ServiceOptions options);
  ~Service();
  Service(const Service&) = delete;
  Service& operator=(const Service&) = delete;

  Status Start();
  // Idempotent; safe from any thread.
  void Stop();
  // Blocks until Stop() has been called and everything is joined.
  void Wait();

  const ServiceOptions& options() const { return opt_; }
  std::string tcp_address() const { return advertise_; }
  uint64_t incarnation() const { return incarnation_; }
  ServiceStats& stats() { return stats_; }
  bool stopping() const { return stopping_.load(); }

 private:
  // Connection plumbing.
  void AcceptLoop(int listen_fd, bool local);
  void ServeLocal(Channel& ch);
  void ServePeer(Channel& ch);
  void SpawnConnection(UniqueFd fd, bool local);
  void ReapFinished();

  // Local client requests; each sends exactly one reply on `ch`.
  void HandlePublish(Channel& ch, const std::string& payload);
  void HandleLocate(Channel& ch, const std::string& payload);
  void HandleConsume(Channel& ch, const std::string& payload);
  void HandleList(Channel& ch, const std::string& payload);
  void HandleRemove(Channel& ch, const std::string& payload);
  void HandleStatus(Channel& ch);
  // Peer requests.
  void HandleFetch(Channel& ch, const std::string& payload, const PeerIdentity& peer);

  void Reply(Channel& ch, const Status& st, const std::string& body = {});

  // Cache, then global store (waiting when asked).
  Result<FileRecord> Locate(const std::string& ns, const std::string& key, bool wait,
                            Deadline deadline, const CancelFn& cancel, bool* from_cache = nullptr);
  Result<ConsumeReply> Consume(const ConsumeRequest& req, Deadline deadline,
                               const CancelFn& cancel);

  Result<Transport*> GetTransport(const std::string& name);
  Status RegisterMembership();
  Status WriteReadyFile();
  void AsyncPublishLoop();
  // Re-registers this service when its membership record disappears (a
  // restarted in-memory root) so peers can still resolve it.
  void MembershipLoop();

  ServiceOptions opt_;
  std::string prod_real_;  // canonical producer path ("" = none)
  uint64_t incarnation_ = 0;
  uint32_t node_idx_ = 0;
  std::string advertise_;
  std::string hostname_;
  uint64_t started_ns_ = 0;
  std::shared_ptr<const Authenticator> auth_;  // set by Start()

  std::shared_ptr<Kvs> kvs_;                   // the store this service uses
  std::shared_ptr<MemoryKvs> root_store_;      // set when the store lives in this process
  std::unique_ptr<EmbeddedKvsServer> root_server_;
  std::unique_ptr<Transport> transport_;       // default transport for fetches
  std::mutex transports_mu_;
  std::map<std::string, std::unique_ptr<Transport>> extra_transports_;
  std::unique_ptr<PeerDirectory> peers_;
  std::unique_ptr<Fetcher> fetcher_;
  MetadataCache cache_;
  ServiceStats stats_;

  UniqueFd unix_listener_;
  UniqueFd tcp_listener_;
  std::thread unix_acceptor_;
  std::thread tcp_acceptor_;

  struct Conn {
    std::thread thread;
    int fd = -1;
    std::atomic<bool> done{false};
  };
  std::mutex conns_mu_;
  std::list<std::unique_ptr<Conn>> conns_;

  // Asynchronous publication queue.
  struct PendingPublish {
    std::string ns, key, value;
  };
  std::mutex async_mu_;
  std::condition_variable async_cv_;
  std::list<PendingPublish> async_queue_;
  std::thread async_thread_;
  std::thread membership_thread_;
  std::string member_value_;

  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stopped_ = false;
  bool started_ = false;
};

}  // namespace dyad
