// embedded_kvs.h: client of the store hosted by the root dyad-service
// (the "embedded" backend, URL "embedded://HOST:PORT").
//
// Every operation is one request/reply on an authenticated TCP Channel to
// the root's EmbeddedKvsServer. Channels come from a small pool (at most
// kMaxIdle kept idle) and are dialled lazily, so a service may start before
// its root does. A reply is read with one system call where it fits
// (reading ahead is safe here: the root sends one reply per request, and a
// link with bytes after its reply leaves the pool). All operations are
// idempotent: a call that loses its connection is retried once on a fresh
// one. The root keeps its data in memory: after a restart the store is
// empty until services publish again.
//
// Watch: each watched namespace long-polls the root's change feed
// (kKvsWatch, change_feed.h) on a channel of its own, from a position that
// survives reconnections; a restarted root (or a watcher that fell behind)
// makes it deliver a resync. Each feed is a task on one runtime, which
// runs the feeds of every namespace and the waits below: the service's
// (KvsOptions::runtime), or, for a store opened without one (tools,
// tests), a runtime of the store's own, started with the first Watch or
// wait and ended at Shutdown.
//
// StartWait: a table of waits served by the namespace's feed (one feed per
// namespace however many waits; see embedded_waits.h), so a service parks
// thousands of consumes on a remote root without a thread or link each.
// They keep asking, with back-off, across connection failures until their
// deadline (so waiting consumers survive a restart of the root), and a
// deadline reached meanwhile says the root was unreachable; a refused
// credential ends them at once. The blocking Wait is Kvs::Wait over them.
//
// Threading: all methods are thread-safe; each concurrent call uses its own
// pooled channel.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/net.h"
#include "kvs/embedded/embedded_waits.h"
#include "kvs/kvs.h"
#include "kvs/watch.h"
#include "proto/auth.h"
#include "proto/protocol.h"

namespace dyad {

class EmbeddedKvs final : public Kvs {
 public:
  static constexpr size_t kMaxIdle = 8;
  // Requests (CallTask) in flight to the root at once, each on its own
  // link: more wait for one of them to end, holding no thread, so a slow
  // root is not flooded with connections (it admits 16 handshakes per
  // peer at a time).
  static constexpr size_t kMaxCallsInFlight = 12;
  // Longest server-side wait one long-poll of a feed asks for.
  static constexpr int64_t kWaitSliceMs = 2000;
  // Reconnect back-off during a wait: doubles from the first to the last.
  static constexpr int64_t kBackoffFirstMs = 100;
  static constexpr int64_t kBackoffMaxMs = 2000;
  // Largest ns, key or value the root accepts (its request decoder's bound).
  static constexpr size_t kMaxFieldBytes = 1u << 20;
  // How long a root that refused kKvsMultiGet is read key by key.
  static constexpr int64_t kMultiGetRetryMs = 60000;

  // `address` is "HOST:PORT". Does not connect: the first call does.
  static Result<std::unique_ptr<EmbeddedKvs>> Open(const std::string& address,
                                                   const KvsOptions& options);
  ~EmbeddedKvs() override;
  EmbeddedKvs(const EmbeddedKvs&) = delete;
  EmbeddedKvs& operator=(const EmbeddedKvs&) = delete;

  std::string name() const override { return "embedded"; }

  // Every request to the root is one task (CallTask): the *Task calls run
  // it on the caller's runtime, holding no thread while the root answers
  // (or does not); the blocking calls run it to completion on the calling
  // thread (RunOnThisThread).
  Status Put(const std::string& ns, const std::string& key, const std::string& value) override;
  Result<std::optional<std::string>> Get(const std::string& ns, const std::string& key) override;
  Task<Result<std::optional<std::string>>> GetTask(Runtime& rt, const std::string& ns,
                                                   const std::string& key) override;
  Task<Status> PutTask(Runtime& rt, const std::string& ns, const std::string& key,
                       const std::string& value) override;
  Task<Status> RemoveTask(Runtime& rt, const std::string& ns, const std::string& key) override;
  Task<Result<std::vector<KvsEntry>>> ListTask(Runtime& rt, const std::string& ns,
                                               const std::string& prefix,
                                               uint32_t limit = 0) override;
  // One kKvsMultiGet per up to kMaxMultiGetKeys keys (or per frame of
  // values). A root from before kKvsMultiGet refuses it: then one kKvsGet
  // per key, and the root is asked again kMultiGetRetryMs later (it may
  // have been upgraded meanwhile). embedded_multi_get.cc.
  Result<KvsValues> MultiGet(const std::string& ns, const std::vector<std::string>& keys) override;
  Task<Result<KvsValues>> MultiGetTask(Runtime& rt, const std::string& ns,
                                       const std::vector<std::string>& keys) override;
  Status Remove(const std::string& ns, const std::string& key) override;
  Result<std::vector<KvsEntry>> List(const std::string& ns, const std::string& prefix,
                                     uint32_t limit = 0) override;

  // Waits without a thread or a connection each: they share the
  // namespace's change feed (embedded_waits.h).
  Result<KvsWaitTicket> StartWait(const std::string& ns, const std::string& key, Deadline deadline,
                                  KvsWaitCallback done) override;
  void CancelWait(KvsWaitTicket ticket) override;

  Result<KvsWatchTicket> Watch(const std::string& ns, KvsWatchCallback on_change) override;
  void Unwatch(KvsWatchTicket ticket) override;

  // Makes waits in progress and later ones return
  // DYAD_RC_CANCELLED, and closes idle connections. For service shutdown.
  void Shutdown() override;

  // "HOST:PORT" of the root.
  const std::string& address() const { return address_text_; }
  // Failures that a fresh connection may cure: the root closed or reset the
  // link, refused the connection (restarting), or did not answer in time.
  static bool IsConnectionFailure(const Status& st);

 private:
  friend class EmbeddedWaits;  // its checks, the loop it runs on, its feeds' state
  EmbeddedKvs(SocketAddress address, const KvsOptions& options);

  // A pooled link still usable, or null.
  std::unique_ptr<Channel> TakeIdle();
  // The body of a kvs.get reply, of a kvs.list reply.
  Result<std::optional<std::string>> DecodeGet(const std::string& body) const;
  Result<std::vector<KvsEntry>> DecodeList(const std::string& body) const;
  // A new authenticated link to the root, connected and handshaken on the
  // loop that awaits it.
  Task<Result<std::unique_ptr<Channel>>> DialTask(Deadline deadline, Stop* stop);
  void Release(std::unique_ptr<Channel> ch);
  void DropIdle();

  // One non-wait request with the retry policy (a stale pooled link or a
  // root restarting: one more attempt on a fresh link); `body` gets the
  // reply body. The only implementation of a request; the
  // blocking operations run it on the calling thread with no `stop`:
  // links then leave the call unregistered from its passing loop.
  Task<Status> CallTask(MsgType type, std::string request, std::string* body, Stop* stop);
  // The operations, each once; the public calls run them with the loop's
  // Stop (*Task) or none (blocking, on the calling thread).
  Task<Status> PutOn(Stop* stop, const std::string& ns, const std::string& key,
                     const std::string& value);
  Task<Result<std::optional<std::string>>> GetOn(Stop* stop, const std::string& ns,
                                                 const std::string& key);
  Task<Status> RemoveOn(Stop* stop, const std::string& ns, const std::string& key);
  Task<Result<std::vector<KvsEntry>>> ListOn(Stop* stop, const std::string& ns,
                                             const std::string& prefix, uint32_t limit);
  Task<Result<KvsValues>> MultiGetOn(Stop* stop, const std::string& ns,
                                     const std::vector<std::string>& keys);
  // A place among the kMaxCallsInFlight, waited for on the caller's loop
  // until `deadline` or `stop`; GiveCallSlot hands it to the next waiter.
  Task<Status> TakeCallSlot(Deadline deadline, Stop* stop);
  void GiveCallSlot();

  // One kKvsMultiGet for keys [next, ...) of `keys` (as many as one request
  // carries); appends the values answered to `out`.
  Task<Status> MultiGetStep(Stop* stop, const std::string& ns, const std::vector<std::string>& keys,
                            size_t next, KvsValues* out);
  // Whether the root is taken to lack kKvsMultiGet now (it refused one in
  // the last kMultiGetRetryMs).
  bool MultiGetRefused() const;

  // One namespace's feed (embedded_watch.cc): its link to the root and its
  // position there, a task on the feeds' runtime (RunFeed). The fields
  // marked "feed task" are used by that task only; the others are
  // guarded by feed_mu_.
  struct Feed {
    std::string ns;
    std::unique_ptr<Stop> stop;  // fired when nobody watches it any more
    bool established = false;    // first position known
    bool quiet_first = true;     // Watch is still waiting for it
    // The root's refusal of the latest poll (at its limit of watched
    // namespaces, say); OK once a poll is answered.
    Status refused;
    // Feed task:
    std::unique_ptr<Channel> ch;  // null until dialled, and after a failure
    KvsWatchRequest cursor;       // the position asked for next
    bool gap_told = false;        // watchers heard a resync for the current loss
  };
  // A feed: dial, long-poll, deliver, again, until its Stop fires.
  Task<void> RunFeed(std::shared_ptr<Feed> f);
  // Acts on a poll's reply; false when it is malformed.
  bool FeedReply(Feed& f, const std::string& body);
  // `f`'s link failed: dial again.
  void FeedLost(Feed& f);
  // The runtime of the feeds and of the waits' task: the service's, or
  // the store's own, started at its first use (ended by StopFeeds).
  Result<Runtime*> LoopRuntimeLocked() REQUIRES(feed_mu_);
  Result<Runtime*> LoopRuntime();
  // Ends feed `f`'s task: fires its stop on `rt`'s loop, saying `why`.
  static void EndFeed(Runtime& rt, std::shared_ptr<Feed> f, const char* why);
  // Starts `task` (a feed, the waits' task) on `rt`, counted in live_ until
  // it ends or its frame is destroyed.
  void SpawnCounted(Runtime* rt, Task<void> task);
  // `ns`'s feed: `*established` once it knows its position; the root's
  // refusal while it does not.
  Status FeedState(const std::string& ns, bool* established);
  void StopFeeds();
  // Shutdown's wait for the tasks on the service's runtime.
  void AwaitTasksEnded();

  void NoteOutage(const Status& st);
  void NoteRecovered();

  const SocketAddress address_;
  const std::string address_text_;
  const Authenticator auth_;
  const PeerIdentity self_;
  const int64_t rpc_timeout_ms_;

  struct IdleChannel {
    std::unique_ptr<Channel> ch;
    SteadyClock::time_point since;  // released then
  };
  Mutex pool_mu_;
  std::vector<IdleChannel> idle_ GUARDED_BY(pool_mu_);

  std::atomic<bool> outage_{false};  // an outage was logged and not yet recovered
  std::atomic<bool> stopping_{false};
  // Steady-clock ms when the root last refused kKvsMultiGet (0: never).
  std::atomic<int64_t> multi_get_refused_ms_{0};

  WatchList watchers_;
  Mutex feed_mu_;
  std::condition_variable feed_cv_;
  std::map<std::string, std::shared_ptr<Feed>> feeds_ GUARDED_BY(feed_mu_);
  // The service's runtime, which outlives this store (null: none given).
  Runtime* const service_rt_;
  // Without one, the store's own: started with the first watch or wait,
  // ended by StopFeeds.
  std::unique_ptr<Runtime> own_rt_ GUARDED_BY(feed_mu_);
  bool feeds_closed_ GUARDED_BY(feed_mu_) = false;  // StopFeeds ran: no more watches
  // This store's tasks not ended yet (a feed, the waits' task); on the
  // service's runtime, the destructor waits for them, as they use `this`.
  struct LiveTasks {
    Mutex mu;
    std::condition_variable cv;
    size_t count GUARDED_BY(mu) = 0;
  };
  const std::shared_ptr<LiveTasks> live_ = std::make_shared<LiveTasks>();
  // AwaitTasksEnded has waited: service_rt_ is not touched again.
  std::atomic<bool> rt_released_{false};

  size_t calls_in_flight_ GUARDED_BY(pool_mu_) = 0;
  std::deque<std::shared_ptr<Rendezvous<bool>>> call_waiters_ GUARDED_BY(pool_mu_);

  // Declared last: destroyed first, while the feeds it uses still exist.
  std::unique_ptr<EmbeddedWaits> waits_;
};

}  // namespace dyad
