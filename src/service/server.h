// server.h: the service's connections, each a task on the runtime.
//
// Every connection, local (the node's application processes, Unix socket)
// or a peer's (other services, TCP), is one task on the service's loop
// (common/runtime.h): it admits the connection (the caps below, a local
// client's credentials), runs a peer's handshake, then reads one request
// at a time and serves it. Reading waits without a thread, so a silent or
// slow client or peer costs a buffer and a descriptor, never a thread; a
// peer that does not finish its handshake within handshake_ms is closed.
//
// How a request is served depends on its route (proto/router.h):
//  * inline (never blocks: the embedded store's put, get, list): on the
//    loop, its reply sent without blocking (a peer that does not read
//    holds its own connection only, which gets no more service until it
//    reads);
//  * task (waits: a consume, a locate, a store wait, a fetch response): a
//    task on the loop; its Stop fires when the requester hangs up or the
//    service stops, and its waits end then;
//  * blocking (a store's client, the disk): on the runtime's bounded pool.
//
// Threads: none of its own; the loop and the runtime's pool.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <unordered_map>

#include "common/net.h"
#include "common/runtime.h"
#include "common/status.h"
#include "proto/auth.h"
#include "proto/router.h"

namespace dyad {

struct ServerConfig {
  int unix_listener = -1;  // accepted connections are local clients
  int tcp_listener = -1;   // accepted connections are other services
  uint32_t max_connections = 2048;
  uint32_t max_unauthenticated = 64;  // peers in their handshake
  uint32_t max_per_peer = 16;         // of those, from one remote address
  const Authenticator* auth = nullptr;
  PeerIdentity self;
  int64_t handshake_ms = kHandshakeTimeoutMs;
};

// How the service serves a request type (its route).
enum class Handling { kInline, kBlocking, kTask, kStreaming };

struct ServerHooks {
  std::function<Handling(bool local, uint16_t type)> handling;
  // Serves an inline or blocking request (sends its reply).
  std::function<void(RequestContext&, uint16_t type, const std::string& payload)> serve;
  // Serves a task request.
  std::function<Task<void>(RequestContext&, uint16_t type, const std::string& payload)> serve_task;
  // Sends an error reply (a malformed frame, a refused local client).
  std::function<void(Channel&, const Status&)> reply_error;
  // A connection refused or a handshake failed: counted and logged.
  std::function<void(const std::string& why)> refused;
};

class Server {
 public:
  Server(Runtime& rt, ServerConfig config, ServerHooks hooks);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Starts accepting (the listeners' tasks).
  Status Start();
  // Closes every connection (their tasks end: a waiting request is told to
  // end first). From any thread; the runtime's Shutdown then waits for the
  // tasks. Idempotent.
  void Stop();

  // Connections open, in their handshake, and requests being served by a
  // task (for status replies).
  uint64_t live() const { return live_.load(); }
  uint64_t unauthenticated() const { return unauthenticated_.load(); }
  uint64_t parked() const { return parked_.load(); }

  // Scheduling of the calling thread (the loop): `on` while it serves a
  // pipeline of asynchronous publications (DYAD_ASYNC_PUBLISH), off for
  // every other request. On, the thread runs as SCHED_BATCH: its wake-up
  // by a producer's next request does not preempt the producer (a Unix
  // socket's send is a synchronous wake-up that places the reader on the
  // writer's CPU), so the requests queue in the socket and are served in
  // bursts instead of one preemption each. Changes the policy only on a
  // transition (one system call); a refusal leaves the policy as it is.
  static void PreferThroughput(bool on);

  struct Conn;
  struct PendingRead;

 private:
  Task<void> Accept(int listen_fd, bool local);
  // "" when a new connection may be served, else why not.
  std::string Admit(bool local, const std::string& peer_host);
  // Closes the oldest connection still in its handshake (from `host`, when
  // given), if it has waited long enough that a real peer would have
  // finished; false when none has.
  bool DisplaceOldestHandshake(const std::string& host = std::string());
  Task<void> Serve(std::shared_ptr<Conn> c);
  Task<bool> Handshake(Conn& c);
  // How ReadFrame ended.
  enum class FrameRead {
    kFrame,    // *type and *payload are the next frame
    kFailed,   // *error: the link failed (CONNLOST) or sent a malformed frame
    kTimeout,  // `deadline` passed
    kStopped,  // the service stops, or the connection was closed
  };
  // The one frame reader of a connection, for the handshake as for the
  // requests: takes what the socket holds without blocking the loop (at
  // most the frame limit of the link's trust: small until the handshake
  // succeeded), waiting for readability until `deadline` in between.
  Task<FrameRead> ReadFrame(Conn& c, Deadline deadline, uint16_t* type, std::string* payload,
                            Status* error);
  // The next request's frame; false when the connection ends (closed,
  // malformed: the peer is told why, stopped).
  Task<bool> NextFrame(Conn& c, uint16_t* type, std::string* payload);
  Task<void> Handle(std::shared_ptr<Conn> conn, uint16_t type, const std::string& payload);

  // Sends the replies collected in c.out without blocking the loop.
  Task<bool> Flush(Conn& c);
  void EndHandshake(Conn& c);
  // Sends a connection closed at the handshake caps HandshakeBusy
  // (proto/auth.h), if its socket takes it at once.
  void TellBusy(Channel& ch);
  void Close(Conn& c);
  std::string Who(const Conn& c) const;

  Runtime& rt_;
  const ServerConfig cfg_;
  const ServerHooks hooks_;

  // Loop thread only.
  std::unordered_map<Conn*, std::shared_ptr<Conn>> conns_;
  std::list<Conn*> handshaking_;                        // in arrival order
  std::unordered_map<std::string, uint32_t> per_peer_;  // handshaking, by address
  bool stopped_ = false;

  std::atomic<uint64_t> live_{0};
  std::atomic<uint64_t> unauthenticated_{0};
  std::atomic<uint64_t> parked_{0};
};

}  // namespace dyad
