#include "client/flux_link.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "client/service_pool.h"
#include "common/config.h"
#include "common/trace.h"

namespace dyad {
namespace {

constexpr const char* kLibName = "libflux-core.so.2";

// Where to look for libflux-core, best first: the library already in the
// process (a program that opened its own handle), the one of the running
// instance (FLUX_CONNECTOR_PATH=PREFIX/lib/flux/connectors, set by flux for
// its jobs and `flux start`), then the dynamic linker's search path.
std::vector<std::string> Candidates() {
  std::vector<std::string> out;
  if (std::optional<std::string> cp = GetEnv("FLUX_CONNECTOR_PATH"); cp && !cp->empty()) {
    size_t start = 0;
    while (start <= cp->size()) {
      const size_t colon = std::min(cp->find(':', start), cp->size());
      std::string dir = cp->substr(start, colon - start);
      start = colon + 1;
      while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
      // PREFIX/lib/flux/connectors -> PREFIX/lib
      for (int up = 0; up < 2 && !dir.empty(); ++up) {
        const size_t slash = dir.rfind('/');
        dir = slash == std::string::npos ? std::string() : dir.substr(0, slash);
      }
      if (!dir.empty()) out.push_back(dir + "/" + kLibName);
    }
  }
  out.push_back(kLibName);
  return out;
}

template <typename Fn>
bool Resolve(void* lib, const char* name, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(::dlsym(lib, name));
  if (*out == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
    return false;
  }
  return true;
}

Result<const FluxApi*> LoadOnce() {
  void* lib = ::dlopen(kLibName, RTLD_NOW | RTLD_NOLOAD);
  std::string tried;
  if (lib == nullptr) {
    for (const std::string& c : Candidates()) {
      lib = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
      const char* e = ::dlerror();
      tried += (tried.empty() ? "" : "; ") + std::string(e != nullptr ? e : c.c_str());
    }
  }
  if (lib == nullptr)
    return Status(DYAD_RC_FLUXFAIL, "FLUX_URI is set but libflux-core could not be loaded (" +
                                        tried + "); install flux-core or run under its prefix");
  auto* api = new FluxApi;  // never freed: the library is never unloaded either
  std::string missing;
  bool ok = true;
  ok &= Resolve(lib, "flux_open", &api->open, &missing);
  ok &= Resolve(lib, "flux_close", &api->close, &missing);
  ok &= Resolve(lib, "flux_attr_get", &api->attr_get, &missing);
  ok &= Resolve(lib, "flux_kvs_lookup", &api->kvs_lookup, &missing);
  ok &= Resolve(lib, "flux_kvs_lookup_get_raw", &api->kvs_lookup_get_raw, &missing);
  ok &= Resolve(lib, "flux_kvs_lookup_cancel", &api->kvs_lookup_cancel, &missing);
  ok &= Resolve(lib, "flux_rpc", &api->rpc, &missing);
  ok &= Resolve(lib, "flux_rpc_get_raw", &api->rpc_get_raw, &missing);
  ok &= Resolve(lib, "flux_future_wait_for", &api->future_wait_for, &missing);
  ok &= Resolve(lib, "flux_future_reset", &api->future_reset, &missing);
  ok &= Resolve(lib, "flux_future_destroy", &api->future_destroy, &missing);
  ok &= Resolve(lib, "flux_future_error_string", &api->future_error_string, &missing);
  ok &= Resolve(lib, "flux_future_get", &api->future_get, &missing);
  ok &= Resolve(lib, "flux_kvs_namespace_create", &api->kvs_namespace_create, &missing);
  std::string optional_missing;
  (void)Resolve(lib, "flux_open_ex", &api->open_ex, &optional_missing);
  if (!ok) {
    delete api;
    return Status(DYAD_RC_FLUXFAIL,
                  "libflux-core lacks " + missing + " (flux-core too old for DYAD's Flux path)");
  }
  return static_cast<const FluxApi*>(api);
}

// A flux_error_t holds 160 characters in every release so far; leave room.
struct FluxErrorBuf {
  alignas(16) char text[1024] = {0};
};

}  // namespace

Result<const FluxApi*> FluxApi::Load() {
  static const Result<const FluxApi*> loaded = LoadOnce();
  return loaded;
}

FluxLink::FluxLink(std::string uri, void* user_handle)
    : uri_(std::move(uri)), user_(user_handle), pid_(::getpid()) {
  for (auto& slot : idle_) slot.store(nullptr);
}

FluxLink::~FluxLink() {
  delete known_ns_.load();
  const FluxApi* api = api_.load();
  if (api == nullptr || ::getpid() != pid_) return;  // a child leaves its parent's handles
  for (auto& slot : idle_)
    if (void* h = slot.exchange(nullptr)) api->close(h);
}

Result<FluxLink::Held> FluxLink::Borrow() {
  if (api_.load(std::memory_order_acquire) == nullptr) {
    Result<const FluxApi*> api = FluxApi::Load();
    if (!api.ok()) return api.status();
    api_.store(*api, std::memory_order_release);
  }
  const pid_t self = ::getpid();
  if (self != pid_) {
    // A forked child: the idle handles are its parent's connections (they
    // are dropped, never closed: that could disturb the parent), and so is
    // the caller's handle.
    for (auto& slot : idle_) slot.store(nullptr);
    pid_ = self;
    user_ = nullptr;
  }
  if (user_ != nullptr) return Held{user_, true};
  for (auto& slot : idle_)
    if (void* h = slot.exchange(nullptr)) return Held{h, false};
  const char* uri = uri_.empty() ? nullptr : uri_.c_str();
  FluxErrorBuf err;
  errno = 0;
  void* h = api()->open_ex != nullptr ? api()->open_ex(uri, 0, &err) : api()->open(uri, 0);
  if (h == nullptr) {
    const int e = errno;
    const std::string why = err.text[0] != '\0' ? std::string(err.text) : std::strerror(e);
    return Status(DYAD_RC_FLUXFAIL, "cannot connect to the Flux broker at '" +
                                        (uri_.empty() ? GetEnv("FLUX_URI").value_or("") : uri_) +
                                        "': " + why);
  }
  return Held{h, false};
}

void FluxLink::Return(Held held, bool reusable) {
  if (held.user || held.h == nullptr) return;
  if (reusable && ::getpid() == pid_) {
    for (auto& slot : idle_) {
      void* expected = nullptr;
      if (slot.compare_exchange_strong(expected, held.h)) return;
    }
  }
  api()->close(held.h);
}

std::unique_lock<std::mutex> FluxLink::Guard(const Held& held) {
  if (held.user) return std::unique_lock<std::mutex>(user_mu_);
  return std::unique_lock<std::mutex>();
}

Status FluxLink::FluxError(void* f, int err, const std::string& what) const {
  std::string text;
  if (f != nullptr) {
    const char* s = api()->future_error_string(f);
    if (s != nullptr) text = s;
  }
  if (text.empty()) text = std::strerror(err);
  dyad_rc_t code = DYAD_RC_FLUXFAIL;
  switch (err) {
    case ENOSYS:
      code = DYAD_RC_NOSERVICE;
      break;
    case EPERM:
    case EACCES:
      code = DYAD_RC_PERM;
      break;
    case ENOENT:
      code = DYAD_RC_NOTFOUND;
      break;
    case ETIMEDOUT:
      code = DYAD_RC_TIMEOUT;
      break;
    default:
      break;
  }
  return Status(code, what + ": " + text);
}

Status FluxLink::Wait(const Held& held, void* f, Deadline deadline, const std::string& what,
                      const char* waiting_for) {
  for (;;) {
    if (InterruptRequested()) return Status(DYAD_RC_CANCELLED, what + ": interrupted");
    const int64_t slice = deadline.RemainingMs(ServicePool::kInterruptSliceMs);
    int rc;
    int err;
    {
      std::unique_lock<std::mutex> lk = Guard(held);
      rc = api()->future_wait_for(f, static_cast<double>(slice) / 1000.0);
      err = errno;
    }
    if (rc == 0) return Status::OK();
    if (err != ETIMEDOUT) return FluxError(f, err, what);
    if (deadline.expired())
      return Status(DYAD_RC_TIMEOUT, what + ": " + waiting_for + " did not come in time");
  }
}

Result<std::string> FluxLink::Attr(const std::string& name) {
  Result<Held> held = Borrow();
  if (!held.ok()) return held.status();
  std::string value;
  bool found = false;
  int err = 0;
  {
    std::unique_lock<std::mutex> lk = Guard(*held);
    const char* v = api()->attr_get(held->h, name.c_str());
    err = errno;
    if (v != nullptr) {
      value = v;
      found = true;
    }
  }
  Return(*held, true);
  if (!found)
    return Status(DYAD_RC_FLUXFAIL, "flux attribute '" + name + "': " + std::strerror(err));
  return value;
}

Status FluxLink::EnsureNamespace(const Held& held, const std::string& ns, Deadline deadline,
                                 const std::string& what) {
  if (const std::string* known = known_ns_.load(std::memory_order_acquire); known && *known == ns)
    return Status::OK();
  void* f;
  int err;
  {
    std::unique_lock<std::mutex> lk = Guard(held);
    f = api()->kvs_namespace_create(held.h, ns.c_str(), static_cast<uint32_t>(::getuid()), 0);
    err = errno;
  }
  if (f == nullptr) return FluxError(nullptr, err, what + ": create KVS namespace '" + ns + "'");
  Status st = Wait(held, f, deadline, what, "the KVS namespace");
  int rc = -1;
  {
    std::unique_lock<std::mutex> lk = Guard(held);
    if (st.ok()) {
      rc = api()->future_get(f, nullptr);
      err = errno;
    }
    api()->future_destroy(f);
  }
  if (!st.ok()) return st;
  // EEXIST: made already (by the user, the module or another consumer);
  // EPERM: not the instance owner, who must make it (the lookup then waits
  // as before).
  if (rc != 0 && err != EEXIST && err != EPERM)
    return FluxError(nullptr, err, what + ": create KVS namespace '" + ns + "'");
  // A client has one namespace: remember the first (never replaced, so a
  // reader never sees it freed).
  auto* mine = new std::string(ns);
  std::string* expected = nullptr;
  if (!known_ns_.compare_exchange_strong(expected, mine, std::memory_order_acq_rel)) delete mine;
  return Status::OK();
}

Result<std::string> FluxLink::Lookup(const std::string& ns, const std::string& key, bool wait,
                                     Deadline deadline, const std::string& what) {
  Result<Held> held = Borrow();
  if (!held.ok()) return held.status().Annotate(what);
  // The service's default namespace is Flux's primary one; name it, so a
  // FLUX_KVS_NAMESPACE in the environment cannot redirect the lookup.
  const char* nsp = ns.empty() ? "primary" : ns.c_str();
  if (wait && std::strcmp(nsp, "primary") != 0) {
    Status made = EnsureNamespace(*held, nsp, deadline, what);
    if (!made.ok()) {
      Return(*held, made.code() != DYAD_RC_TIMEOUT && made.code() != DYAD_RC_CANCELLED);
      return made;
    }
  }
  void* f;
  int err;
  {
    std::unique_lock<std::mutex> lk = Guard(*held);
    f = api()->kvs_lookup(held->h, nsp, wait ? kFluxKvsWaitCreate : 0, key.c_str());
    err = errno;
  }
  if (f == nullptr) {
    Return(*held, true);
    return FluxError(nullptr, err, what + ": KVS lookup of '" + key + "'");
  }
  Status st = Wait(*held, f, deadline, what, "its publication");
  if (!st.ok()) {
    // Cancel the lookup and collect its ENODATA, so the handle can be
    // reused; a handle whose lookup did not end is closed instead (the
    // broker then drops the watch with the connection).
    bool ended = false;
    {
      std::unique_lock<std::mutex> lk = Guard(*held);
      if (wait && api()->kvs_lookup_cancel(f) == 0) ended = api()->future_wait_for(f, 1.0) == 0;
      api()->future_destroy(f);
    }
    Return(*held, ended);
    return st;
  }
  std::string value;
  int rc;
  {
    std::unique_lock<std::mutex> lk = Guard(*held);
    const void* data = nullptr;
    size_t len = 0;
    rc = api()->kvs_lookup_get_raw(f, &data, &len);
    err = errno;
    if (rc == 0 && data != nullptr) value.assign(static_cast<const char*>(data), len);
    if (rc != 0) st = FluxError(f, err, what + ": KVS lookup of '" + key + "'");
    api()->future_destroy(f);
  }
  Return(*held, true);
  if (rc != 0) {
    // Without a wait, an absent key (or namespace) is simply not published.
    if (!wait && (err == ENOENT || err == ENOTSUP))
      return Status(DYAD_RC_NOTFOUND,
                    what + ": not published (no '" + key + "' in KVS namespace '" + nsp + "')");
    return st;
  }
  return value;
}

Result<uint64_t> FluxLink::Fetch(uint32_t rank, const std::string& upath, int fd, Deadline deadline,
                                 int64_t response_ms, const std::string& what) {
  Result<Held> held = Borrow();
  if (!held.ok()) return held.status().Annotate(what);
  const std::string request = "{\"upath\":" + JsonQuote(upath) + "}";
  void* f;
  int err;
  {
    std::unique_lock<std::mutex> lk = Guard(*held);
    f = api()->rpc(held->h, "dyad.fetch", request.c_str(), rank, kFluxRpcStreaming);
    err = errno;
  }
  if (f == nullptr) {
    Return(*held, true);
    return FluxError(nullptr, err, what + ": dyad.fetch to rank " + std::to_string(rank));
  }
  const std::string from = "dyad.fetch from rank " + std::to_string(rank);
  uint64_t total = 0;
  for (;;) {
    const Deadline step = response_ms < 0 ? deadline : deadline.Min(response_ms);
    Status st = Wait(*held, f, step, what, "the next response of dyad.fetch");
    if (!st.ok()) {
      {
        std::unique_lock<std::mutex> lk = Guard(*held);
        api()->future_destroy(f);
      }
      // Responses may still arrive for the abandoned stream: a pooled
      // handle is closed rather than reused.
      Return(*held, false);
      return st;
    }
    Status wrote;
    bool end = false;
    {
      std::unique_lock<std::mutex> lk = Guard(*held);
      const void* data = nullptr;
      size_t len = 0;
      const int rc = api()->rpc_get_raw(f, &data, &len);
      err = errno;
      if (rc != 0) {
        end = true;
        if (err != ENODATA) {
          wrote = FluxError(f, err, what + ": " + from);
          if (err == ENOSYS)
            wrote =
                Status(DYAD_RC_NOSERVICE, what + ": broker rank " + std::to_string(rank) +
                                              " runs no dyad module (ENOSYS); load it there with "
                                              "`flux module load dyad.so PRODUCER_DIR`");
        }
      } else {
        const char* p = static_cast<const char*>(data);
        size_t left = len;
        while (left > 0) {
          const ssize_t n = ::write(fd, p, left);
          if (n < 0 && errno == EINTR) continue;
          if (n <= 0) {
            wrote = StatusFromErrno(n < 0 ? errno : EIO, what + ": write the copy", DYAD_RC_BADFIO);
            break;
          }
          p += n;
          left -= static_cast<size_t>(n);
        }
        total += len - left;
        api()->future_reset(f);
      }
      if (end || !wrote.ok()) api()->future_destroy(f);
    }
    if (end) {
      // An error response ends the stream: the handle is clean.
      Return(*held, true);
      if (!wrote.ok()) return wrote;
      return total;
    }
    if (!wrote.ok()) {
      Return(*held, false);
      return wrote;
    }
  }
}

}  // namespace dyad
