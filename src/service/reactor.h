// reactor.h: the service's connection layer, an event loop and two worker pools.
//
// One thread (the loop, epoll) owns every connection that is not being
// served: it accepts on both listeners, applies the connection caps, checks
// a local client's credentials (SO_PEERCRED), starts a peer's handshake, and
// assembles frames without blocking, each connection's partial frame kept
// in its own buffer under the limit of its trust state (4 KiB before
// authentication). A silent or slow peer therefore costs a buffer and a
// descriptor, never a thread; one that does not finish its handshake within
// kHandshakeTimeoutMs is closed by the loop's timer.
//
// A complete frame goes to a worker pool: one for the node's application
// processes (local link), one for other services (peer link), so that a
// consume waiting on a remote owner's transfer never holds the workers the
// owner's own requests need (services fetch from each other: with one
// shared pool, two busy services could wait on each other forever). Peer
// requests never wait on another service, so the peer pool always drains.
// The handshake's last step (checking the peer's proofs, MUNGE included)
// runs on the peer pool once its message has fully arrived.
//
// A handler that waits for something else than its requester (a consume
// waiting for a publication) parks its request (router.h, RequestParking):
// its worker is released, the loop watches the connection for a hang-up,
// and the request resumes on a worker when the wait ends.
//
// Requests whose handler never blocks (RouteInline: the embedded store's
// put, get, remove and list) skip the workers: the loop runs them itself
// and writes their replies without blocking, keeping what the socket does
// not take in the connection's output buffer (and reading nothing more from
// that connection until it drained). A small store operation then costs a
// read and a write, not two thread hand-offs.
//
// Threads: 1 (loop) + up to 2 x workers, started as requests need them and
// ended after worker_idle_ms without work, whatever the number of connections.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/net.h"
#include "common/status.h"
#include "proto/auth.h"
#include "proto/router.h"
#include "service/worker_pool.h"

namespace dyad {

struct ReactorConfig {
  int unix_listener = -1;  // accepted connections are local clients
  int tcp_listener = -1;   // accepted connections are other services
  uint32_t max_connections = 2048;
  uint32_t max_unauthenticated = 64;  // peers in their handshake
  uint32_t max_per_peer = 16;         // of those, from one remote address
  size_t workers = 8;                 // threads of each pool, at most
  int64_t worker_idle_ms = 30000;     // a worker idle this long ends
  const Authenticator* auth = nullptr;
  PeerIdentity self;
  int64_t handshake_ms = kHandshakeTimeoutMs;
  // After answering, a worker waits this long for the same connection's
  // next request before handing it back to the loop, while another worker
  // is idle: a client issuing requests back to back (a consumer reading
  // file after file) then costs one thread wake-up per request instead of
  // three (loop, worker, loop). It first polls for DYAD_SPIN_US without
  // sleeping (yielding the CPU), then sleeps in ppoll. 0 disables.
  int64_t linger_us = 300;
};

struct ReactorHooks {
  // Serves one request (sends its reply, or parks it).
  std::function<void(RequestContext&, uint16_t type, const std::string& payload)> dispatch;
  // Sends an error reply (a malformed frame, a refused local client).
  std::function<void(Channel&, const Status&)> reply_error;
  // A connection refused or a handshake failed: counted and logged.
  std::function<void(const std::string& why)> refused;
  // True for request types whose handler never blocks (RouteInline): the
  // loop serves them itself. Null: every request goes to a worker.
  std::function<bool(bool local, uint16_t type)> runs_inline;
};

class Reactor {
 public:
  Reactor(ReactorConfig config, ReactorHooks hooks);
  ~Reactor();
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;

  Status Start();
  // Closes every connection (parked requests are told to end), then runs
  // what the pools still hold and joins every thread. Idempotent.
  void Stop();

  // Connections open, in their handshake, and parked (for status replies).
  uint64_t live() const { return live_.load(); }
  uint64_t unauthenticated() const { return unauthenticated_.load(); }
  uint64_t parked() const { return parked_.load(); }

  struct Conn;

 private:
  class Parking;
  class Parked;
  enum class Post { kReturn, kWatchParked };

  void Loop();
  void AcceptAll(int listen_fd, bool local);
  // "" when a new connection may be served, else why not.
  std::string Admit(bool local, const std::string& peer_host);
  // Closes the oldest connection still in its handshake, if it has waited
  // long enough that a real peer would have finished; false when none has.
  bool DisplaceOldestHandshake();
  void Register(std::shared_ptr<Conn> conn);
  void OnReadable(Conn* c);
  // Dispatches the frame at the head of c's buffer if it is complete, else
  // waits for more bytes; closes c on a malformed header.
  void TryFrame(Conn* c);
  // Serves the complete frame at the head of c's buffer on the loop (its
  // handler never blocks), replies captured into c's output buffer and
  // written without blocking. False when c was closed or must first drain
  // its replies to a peer that is not reading (it is then armed for output
  // only, so such a peer gets no more service until it reads).
  bool ServeInline(Conn* c);
  enum class Flushed { kAll, kPending, kClosed };
  Flushed Flush(Conn* c);
  void Arm(Conn* c, uint32_t events);
  void Close(Conn* c);
  void ExpireHandshakes();
  int NextTimeoutMs() const;
  void DrainPosts();
  void OnReturned(Conn* c);
  void OnHangupWhileParked(Conn* c);
  // An event on a parked connection: room for a response parked until the
  // socket takes more resumes it; anything else is a hang-up.
  void OnEventWhileParked(Conn* c, uint32_t events);
  // Ends the responses whose requester took no bytes within their bound.
  void ExpireWriteParks();

  // Worker side.
  void Serve(const std::shared_ptr<Conn>& c);
  // Serves the frame buffered in c; true when c stays with this worker
  // (answered), false when it was parked or handed back to the loop.
  bool ServeOne(const std::shared_ptr<Conn>& c);
  // Runs `handler` with a context that may park the request; true when it
  // did not (c stays with this worker), false when it parked.
  bool RunHandler(const std::shared_ptr<Conn>& c,
                  const std::function<void(RequestContext&)>& handler);
  // Waits up to linger_us for c's next complete frame and leaves it
  // buffered in c's channel; false hands c back (its partial frame kept).
  bool NextFrameArrives(Conn& c);
  void FinishHandshake(const std::shared_ptr<Conn>& c);
  void Resume(const std::shared_ptr<Conn>& c, std::function<void(RequestContext&)> finish);
  void PostBack(Post what, std::shared_ptr<Conn> c);
  WorkerPool& PoolOf(const Conn& c);
  RequestContext ContextOf(Conn& c, RequestParking* parking);

  const ReactorConfig cfg_;
  const ReactorHooks hooks_;
  UniqueFd epoll_;
  UniqueFd wake_;  // eventfd: posts to the loop, and Stop
  std::thread loop_;
  std::unique_ptr<WorkerPool> local_pool_;
  std::unique_ptr<WorkerPool> peer_pool_;
  std::atomic<bool> stopping_{false};
  bool started_ = false;

  // Loop thread only.
  std::unordered_map<Conn*, std::shared_ptr<Conn>> conns_;
  std::vector<Conn*> handshaking_;
  std::vector<Conn*> write_parked_;  // parked until writable, for their deadlines
  std::unordered_map<std::string, uint32_t> per_peer_;  // handshaking, by address
  std::string inline_payload_;                          // reused by ServeInline

  std::mutex post_mu_;
  std::vector<std::pair<Post, std::shared_ptr<Conn>>> posts_;
  bool loop_gone_ = false;  // under post_mu_: nothing may be posted any more

  std::atomic<uint64_t> live_{0};
  std::atomic<uint64_t> unauthenticated_{0};
  std::atomic<uint64_t> parked_{0};
};

}  // namespace dyad
