// c_api.cc: the context functions of the C API (dyad/core/dyad_ctx.h) and
// dyad_last_error(). See ctx_internal.h for the threading design.
#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>

#include "client/ctx_internal.h"
#include "common/config.h"
#include "dyad/core/dyad_ctx.h"

namespace dyad {
namespace capi {
namespace {

thread_local std::string t_last_error;

// Serializes dyad_init/dyad_finalize and the setters (which build a new
// client from the current one). Not held across fork: the child handler
// re-initializes it, because a thread of the parent may have held it.
pthread_mutex_t g_init_mu = PTHREAD_MUTEX_INITIALIZER;

class InitLock {
 public:
  InitLock() { pthread_mutex_lock(&g_init_mu); }
  ~InitLock() { pthread_mutex_unlock(&g_init_mu); }
  InitLock(const InitLock&) = delete;
  InitLock& operator=(const InitLock&) = delete;
};

// (Held from the prepare handler to the parent's or child's: beyond what
// the analysis follows.)
void ForkPrepare() NO_THREAD_SAFETY_ANALYSIS { Context()->mu.lock(); }
void ForkParent() NO_THREAD_SAFETY_ANALYSIS { Context()->mu.unlock(); }
void ForkChild() NO_THREAD_SAFETY_ANALYSIS {
  Context()->mu.unlock();
  pthread_mutex_init(&g_init_mu, nullptr);
}

// Replaces the context's client (nullptr: uninitialized). The old client is
// released after the lock is dropped (its pool takes other locks).
void Install(std::shared_ptr<Client> client, dyad_dtl_comm_mode_t comm_mode) {
  dyad_ctx* ctx = Context();
  std::shared_ptr<Client> old;
  {
    MutexLock lk(ctx->mu);
    old = std::move(ctx->client);
    ctx->client = std::move(client);
    ctx->comm_mode = comm_mode;
    ctx->initialized.store(ctx->client != nullptr);
  }
}

std::shared_ptr<Client> Current(dyad_dtl_comm_mode_t* comm_mode = nullptr) {
  dyad_ctx* ctx = Context();
  MutexLock lk(ctx->mu);
  if (comm_mode != nullptr) *comm_mode = ctx->comm_mode;
  return ctx->client;
}

// C callers may pass any integer as a dyad_dtl_comm_mode_t; reading an
// out-of-range value as the enum is undefined in C++, so look at its bits.
Status CheckCommMode(const dyad_dtl_comm_mode_t& m) {
  std::underlying_type_t<dyad_dtl_comm_mode_t> v;
  static_assert(sizeof v == sizeof m, "enum layout");
  std::memcpy(&v, &m, sizeof v);
  if (static_cast<long long>(v) >= DYAD_COMM_NONE && static_cast<long long>(v) < DYAD_COMM_END)
    return Status::OK();
  return Status(DYAD_RC_BAD_COMM_MODE,
                "invalid dtl_comm_mode " + std::to_string(static_cast<long long>(v)) +
                    " (expected DYAD_COMM_NONE, DYAD_COMM_RECV or DYAD_COMM_SEND)");
}

Status NoCtx() {
  return Status(DYAD_RC_NOCTX, "DYAD is not initialized (call dyad_init or dyad_init_env first)");
}

// Shared by dyad_init and dyad_init_env. `c` uses "" for an absent path;
// `comm_mode` has been checked.
dyad_rc_t Init(ClientConfig c, dyad_dtl_comm_mode_t comm_mode) {
  InitLock lock;
  if (Context()->initialized.load() && !c.reinit) return DYAD_RC_OK;
  // Re-initialization releases the old context first; if the new settings
  // fail, the process is left uninitialized (as upstream). Its asynchronous
  // publications are waited for (so the new context's calls come after
  // them), but a failure among them is not reported here: dyad_finalize
  // before dyad_init reports it.
  if (std::shared_ptr<Client> old = Current()) (void)old->FlushPublications();
  Install(nullptr, DYAD_COMM_NONE);
  if (c.prod_managed_path.empty() && c.cons_managed_path.empty()) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      std::fprintf(stderr,
                   "dyad: warning: neither DYAD_PATH_PRODUCER nor DYAD_PATH_CONSUMER is set; "
                   "DYAD will not synchronize or move any file\n");
  }
  const bool debug = c.debug;
  Result<std::shared_ptr<Client>> client = Client::Create(std::move(c));
  if (!client.ok()) {
    if (debug)
      std::fprintf(stderr, "dyad: initialization failed: %s\n", client.status().ToString().c_str());
    return Fail(client.status());
  }
  Install(std::move(*client), comm_mode);
  return DYAD_RC_OK;
}

// Builds a new client from the current one's settings, changed by `edit`,
// keeping its connections.
template <typename Edit>
dyad_rc_t Reconfigure(Edit&& edit) {
  InitLock lock;
  dyad_dtl_comm_mode_t comm_mode = DYAD_COMM_NONE;
  std::shared_ptr<Client> cur = Current(&comm_mode);
  if (cur == nullptr) return Fail(NoCtx());
  ClientConfig c = cur->config();
  Status st = edit(c, comm_mode);
  if (!st.ok()) return Fail(st);
  Result<std::shared_ptr<Client>> next = Client::Create(std::move(c), cur->pool());
  if (!next.ok()) return Fail(next.status());
  Install(std::move(*next), comm_mode);
  return DYAD_RC_OK;
}

Status CheckPathArg(const char* path, const char* which) {
  if (path != nullptr && *path == '\0')
    return Status(DYAD_RC_BADMANAGEDPATH, std::string(which) + " managed path is empty");
  return Status::OK();
}

}  // namespace

dyad_ctx* Context() {
  static dyad_ctx* const ctx = [] {
    auto* c = new dyad_ctx;  // never destroyed: threads may outlive static destructors
    pthread_atfork(&ForkPrepare, &ForkParent, &ForkChild);
    return c;
  }();
  return ctx;
}

Result<std::shared_ptr<Client>> ClientOf(dyad_ctx_t* ctx) {
  if (ctx == nullptr) return NoCtx();
  if (ctx != Context())
    return Status(DYAD_RC_NOCTX, "not the DYAD context of this process (use dyad_ctx_get())");
  std::shared_ptr<Client> c = Current();
  if (c == nullptr) return NoCtx();
  return c;
}

dyad_rc_t Fail(const Status& st) {
  try {
    t_last_error = st.message().empty() ? dyad_rc_message(st.code()) : st.message();
  } catch (...) {
  }
  return st.code();
}

}  // namespace capi
}  // namespace dyad

using dyad::ClientConfig;
using dyad::Status;
using dyad::capi::Fail;
using dyad::capi::Guard;

extern "C" {

const char* dyad_last_error(void) { return dyad::capi::t_last_error.c_str(); }

dyad_ctx_t* dyad_ctx_get(void) {
  dyad_ctx* ctx = dyad::capi::Context();
  return ctx->initialized.load() ? ctx : nullptr;
}

dyad_rc_t dyad_init(bool debug, bool check, bool shared_storage, bool reinit, bool async_publish,
                    bool fsync_write, unsigned int key_depth, unsigned int key_bins,
                    unsigned int service_mux, const char* kvs_namespace,
                    const char* prod_managed_path, const char* cons_managed_path,
                    bool relative_to_managed_path, const char* dtl_mode_str,
                    const dyad_dtl_comm_mode_t dtl_comm_mode, void* flux_handle) {
  return Guard("dyad_init", [&]() -> dyad_rc_t {
    Status st = dyad::capi::CheckCommMode(dtl_comm_mode);
    if (!st.ok()) return Fail(st);
    st = dyad::capi::CheckPathArg(prod_managed_path, "producer");
    if (!st.ok()) return Fail(st);
    st = dyad::capi::CheckPathArg(cons_managed_path, "consumer");
    if (!st.ok()) return Fail(st);
    ClientConfig c;
    c.debug = debug;
    c.check = check;
    c.shared_storage = shared_storage;
    c.reinit = reinit;
    c.async_publish = async_publish;
    c.fsync_write = fsync_write;
    c.key_depth = key_depth;
    c.key_bins = key_bins;
    c.service_mux = service_mux;
    c.kvs_namespace = kvs_namespace != nullptr ? kvs_namespace : "";
    c.prod_managed_path = prod_managed_path != nullptr ? prod_managed_path : "";
    c.cons_managed_path = cons_managed_path != nullptr ? cons_managed_path : "";
    c.relative_to_managed_path = relative_to_managed_path;
    c.dtl_mode = dtl_mode_str != nullptr ? dtl_mode_str : "";
    c.dtl_mode_chosen = !c.dtl_mode.empty();
    // The timeouts and the socket have no dyad_init parameter: they come
    // from the environment, with the same defaults as dyad_init_env.
    c.service_socket = dyad::DefaultServiceSocket();
    c.flux_uri = dyad::GetEnv("FLUX_URI").value_or("");
    c.flux_handle = flux_handle;
    dyad::Result<int64_t> consume = dyad::EnvTimeoutMs("DYAD_CONSUME_TIMEOUT", -1);
    if (!consume.ok()) return Fail(consume.status());
    c.consume_timeout_ms = *consume;
    dyad::Result<int64_t> rpc = dyad::EnvTimeoutMs("DYAD_RPC_TIMEOUT", 60000);
    if (!rpc.ok()) return Fail(rpc.status());
    c.rpc_timeout_ms = *rpc;
    return dyad::capi::Init(std::move(c), dtl_comm_mode);
  });
}

dyad_rc_t dyad_init_env(const dyad_dtl_comm_mode_t dtl_comm_mode, void* flux_handle) {
  return Guard("dyad_init_env", [&]() -> dyad_rc_t {
    Status st = dyad::capi::CheckCommMode(dtl_comm_mode);
    if (!st.ok()) return Fail(st);
    dyad::Result<ClientConfig> c = ClientConfig::FromEnv();
    if (!c.ok()) return Fail(c.status());
    c->flux_handle = flux_handle;
    return dyad::capi::Init(std::move(*c), dtl_comm_mode);
  });
}

void dyad_ctx_init(dyad_dtl_comm_mode_t dtl_comm_mode, void* flux_handle) {
  const dyad_rc_t rc = dyad_init_env(dtl_comm_mode, flux_handle);
  if (DYAD_IS_ERROR(rc)) {
    // Upstream's contract: report and leave DYAD inert, never abort the
    // program that loaded us.
    std::fprintf(stderr, "dyad: initialization failed (%s: %s); DYAD is disabled in this process\n",
                 dyad_rc_name(rc), dyad_last_error());
  }
}

void dyad_ctx_fini(void) { dyad_finalize(); }

dyad_rc_t dyad_set_prod_path(const char* path) {
  return Guard("dyad_set_prod_path", [&]() -> dyad_rc_t {
    return dyad::capi::Reconfigure([&](ClientConfig& c, dyad_dtl_comm_mode_t&) {
      DYAD_RETURN_IF_ERROR(dyad::capi::CheckPathArg(path, "producer"));
      c.prod_managed_path = path != nullptr ? path : "";
      return Status::OK();
    });
  });
}

dyad_rc_t dyad_set_cons_path(const char* path) {
  return Guard("dyad_set_cons_path", [&]() -> dyad_rc_t {
    return dyad::capi::Reconfigure([&](ClientConfig& c, dyad_dtl_comm_mode_t&) {
      DYAD_RETURN_IF_ERROR(dyad::capi::CheckPathArg(path, "consumer"));
      c.cons_managed_path = path != nullptr ? path : "";
      return Status::OK();
    });
  });
}

dyad_rc_t dyad_set_and_init_dtl_mode(const char* dtl_mode_name,
                                     dyad_dtl_comm_mode_t dtl_comm_mode) {
  return Guard("dyad_set_and_init_dtl_mode", [&]() -> dyad_rc_t {
    return dyad::capi::Reconfigure([&](ClientConfig& c, dyad_dtl_comm_mode_t& comm) {
      DYAD_RETURN_IF_ERROR(dyad::capi::CheckCommMode(dtl_comm_mode));
      dyad::Result<std::string> mode =
          dyad::NormalizeDtlMode(dtl_mode_name != nullptr ? dtl_mode_name : "");
      if (!mode.ok()) return mode.status();
      c.dtl_mode = *mode;
      c.dtl_mode_chosen = dtl_mode_name != nullptr && *dtl_mode_name != '\0';
      comm = dtl_comm_mode;
      return Status::OK();
    });
  });
}

dyad_rc_t dyad_clear(void) {
  return Guard("dyad_clear", [&]() -> dyad_rc_t {
    dyad::capi::InitLock lock;
    // Asynchronous publications still unanswered are waited for (bounded
    // by the RPC timeout); a failure among them is this call's result. The
    // context is released either way.
    Status st;
    if (std::shared_ptr<dyad::Client> cur = dyad::capi::Current()) st = cur->FlushPublications();
    dyad::capi::Install(nullptr, DYAD_COMM_NONE);
    return st.ok() ? DYAD_RC_OK : Fail(st);
  });
}

dyad_rc_t dyad_finalize(void) { return dyad_clear(); }

}  // extern "C"
