// flux_link.h: the client's own way to Flux, for consumers on nodes whose
// broker runs no dyad.so module (docs/flux.md, "Consumers on nodes without
// the module").
//
// Such a consumer does what upstream DYAD's consumers do: a bounded
// FLUX_KVS_WAITCREATE lookup of the file's record in the instance's KVS,
// then a streaming `dyad.fetch` RPC to the module of the owner's broker,
// whose raw responses carry the bytes (end of stream: ENODATA).
//
// libflux-core is never linked: FluxApi::Load() dlopens libflux-core.so.2
// the first time a FluxLink is used, so the client libraries keep working
// (and export nothing new) where flux-core is absent. Only programs that run
// under Flux (FLUX_URI set, or a flux_t handed to dyad_init) get here.
//
// Handles and threads: a flux_t is not thread-safe. A FluxLink opens its own
// handles (flux_open of its URI) and lends each to one operation at a time
// from a small lock-free pool, so concurrent consumes never share one. A
// handle the caller gave (dyad_init's flux_handle) is used instead, one
// operation step at a time under a mutex (waits are sliced, so other
// threads interleave); it is never closed by us. Fork: a child never uses
// a handle of its parent (its pool is dropped, and the caller's handle is
// not used in a child: the child opens its own from FLUX_URI).
//
// Every wait is sliced (ServicePool::kInterruptSliceMs) so the process's
// interrupt check (SetInterruptCheck) can cancel it, and bounded by the
// caller's deadline.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>

#include "common/status.h"
#include "common/time.h"

namespace dyad {

// The libflux-core functions the client uses, resolved with dlopen/dlsym.
struct FluxApi {
  void* (*open)(const char* uri, int flags) = nullptr;
  // flux_open_ex (0.40 and later): errors into a buffer instead of stderr.
  void* (*open_ex)(const char* uri, int flags, void* error) = nullptr;
  void (*close)(void* h) = nullptr;
  const char* (*attr_get)(void* h, const char* name) = nullptr;
  void* (*kvs_lookup)(void* h, const char* ns, int flags, const char* key) = nullptr;
  int (*kvs_lookup_get_raw)(void* f, const void** data, size_t* len) = nullptr;
  int (*kvs_lookup_cancel)(void* f) = nullptr;
  void* (*rpc)(void* h, const char* topic, const char* s, uint32_t nodeid, int flags) = nullptr;
  int (*rpc_get_raw)(void* f, const void** data, size_t* len) = nullptr;
  int (*future_wait_for)(void* f, double timeout) = nullptr;
  void (*future_reset)(void* f) = nullptr;
  void (*future_destroy)(void* f) = nullptr;
  const char* (*future_error_string)(void* f) = nullptr;
  int (*future_get)(void* f, const void** result) = nullptr;
  void* (*kvs_namespace_create)(void* h, const char* ns, uint32_t owner, int flags) = nullptr;

  // Loads libflux-core.so.2 once per process (never unloaded). The error
  // says what was missing.
  static Result<const FluxApi*> Load();
};

// Values of flux-core's public headers (stable since 0.1x; the tests check
// them against the installed headers).
inline constexpr int kFluxKvsWaitCreate = 8;   // FLUX_KVS_WAITCREATE
inline constexpr int kFluxRpcStreaming = 2;    // FLUX_RPC_STREAMING
inline constexpr uint32_t kFluxNodeAny = ~0u;  // FLUX_NODEID_ANY

class FluxLink {
 public:
  // `uri`: the broker to open handles on ("" = flux_open's default, i.e.
  // FLUX_URI). `user_handle`: the caller's flux_t, or null. Cheap: nothing
  // is loaded or opened until the first operation.
  FluxLink(std::string uri, void* user_handle);
  ~FluxLink();
  FluxLink(const FluxLink&) = delete;
  FluxLink& operator=(const FluxLink&) = delete;

  const std::string& uri() const { return uri_; }
  bool has_user_handle() const { return user_ != nullptr; }

  // The broker attribute `name` ("local-uri", "rank"), or an error.
  Result<std::string> Attr(const std::string& name);

  // Waits until `key` exists in KVS namespace `ns` ("" = the primary
  // namespace) and returns its value. A named namespace is created first
  // when it does not exist (owned by this user; EEXIST and EPERM are
  // fine): flux-core's kvs-watch aborts the broker when two WAITCREATE
  // lookups wait for a namespace that is not there yet (0.73.0 and
  // 0.88; see src/kvs/flux/flux_kvs.h). DYAD_RC_TIMEOUT when `deadline`
  // passes first, DYAD_RC_CANCELLED when interrupted; the lookup is
  // cancelled either way. `wait` false: one plain lookup (DYAD_RC_NOTFOUND
  // when absent).
  Result<std::string> Lookup(const std::string& ns, const std::string& key, bool wait,
                             Deadline deadline, const std::string& what);

  // Streams `upath` (relative to the owner's producer directory) from the
  // dyad.fetch service of broker `rank` into `fd` (written from its
  // current offset). Each response must come within `response_ms` (< 0:
  // no limit); `deadline` bounds the whole transfer. Returns the bytes
  // written. A rank without the module gives DYAD_RC_NOSERVICE.
  Result<uint64_t> Fetch(uint32_t rank, const std::string& upath, int fd, Deadline deadline,
                         int64_t response_ms, const std::string& what);

 private:
  struct Held {
    void* h = nullptr;
    bool user = false;
  };
  Result<Held> Borrow();
  // `reusable` false closes an own handle (a future left pending on it).
  void Return(Held held, bool reusable);
  std::unique_lock<std::mutex> Guard(const Held& held);
  // Waits for the next fulfilment of `f`, in interruptible slices.
  Status Wait(const Held& held, void* f, Deadline deadline, const std::string& what,
              const char* waiting_for);
  Status FluxError(void* f, int err, const std::string& what) const;
  // Creates namespace `ns` unless it exists (see Lookup).
  Status EnsureNamespace(const Held& held, const std::string& ns, Deadline deadline,
                         const std::string& what);
  const FluxApi* api() const { return api_.load(std::memory_order_acquire); }

  static constexpr int kSlots = 8;
  // Set by the first Borrow (libflux is loaded on first use, not when the
  // link is made): every other method runs after a successful Borrow.
  std::atomic<const FluxApi*> api_{nullptr};
  std::string uri_;
  void* user_ = nullptr;
  pid_t pid_;
  std::mutex user_mu_;  // serializes steps on user_ (a leaf lock)
  std::atomic<void*> idle_[kSlots];
  // The first namespace known to exist (owned; null: none; set once), so
  // the create is sent once rather than per consume.
  std::atomic<std::string*> known_ns_{nullptr};
};

}  // namespace dyad
