// flux_kvs.cc: the flux:// store (flux_kvs.h; layout in flux_keys.h).
#include "kvs/flux/flux_kvs.h"

#include <flux/core.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <set>
#include <utility>

#include "kvs/flux/flux_keys.h"

namespace dyad {
namespace {

constexpr int64_t kCancelPollMs = 100;  // a watch feed's check of its stop flag
constexpr size_t kPipelineDepth = 256;  // lookups in flight on one handle

bool ConnectionErrno(int err) {
  return err == ECONNRESET || err == EPIPE || err == EHOSTUNREACH || err == ENOTCONN ||
         err == ECONNREFUSED || err == ESHUTDOWN;
}

Status FluxStatus(int err, const std::string& what, dyad_rc_t code) {
  if (err == ETIMEDOUT) code = DYAD_RC_TIMEOUT;
  if (err == EPERM || err == EACCES) code = DYAD_RC_PERM;
  if (ConnectionErrno(err)) code = DYAD_RC_CONNLOST;
  if (err == ENOSYS) {
    return Status(DYAD_RC_NOTSUP,
                  what + ": the Flux instance has no KVS service (" + std::strerror(err) + ")");
  }
  return Status(code, what + ": " + std::strerror(err));
}

double Seconds(int64_t ms) { return static_cast<double>(ms) / 1000.0; }

// Waits for `f` at most `ms`; false with errno set (ETIMEDOUT) otherwise.
bool FutureReady(flux_future_t* f, int64_t ms) { return flux_future_wait_for(f, Seconds(ms)) == 0; }

// A lookup's raw value as a string (the JSON text the store wrote).
bool LookupText(flux_future_t* f, std::string* out) {
  const void* data = nullptr;
  size_t len = 0;
  if (flux_kvs_lookup_get_raw(f, &data, &len) < 0) return false;
  out->assign(static_cast<const char*>(data), len);
  return true;
}

Status DecodeStored(const std::string& text, const std::string& fkey, std::string* value) {
  std::string why;
  if (!FluxDecodeValue(text, value, &why)) {
    return Status(DYAD_RC_BADMETADATA,
                  "flux:// value of '" + fkey + "' is not one the store wrote (" + why + ")");
  }
  return Status::OK();
}

// The entries of a Flux directory object ({"data":{name:treeobj},"type":"dir"}).
bool DirEntries(const char* treeobj, std::map<std::string, std::string>* out) {
  out->clear();
  std::vector<std::pair<std::string, std::string>> top;
  if (!JsonObjectMembers(treeobj, &top)) return false;
  for (const auto& kv : top) {
    if (kv.first != "data") continue;
    std::vector<std::pair<std::string, std::string>> entries;
    if (!JsonObjectMembers(kv.second, &entries)) return false;
    for (auto& e : entries) out->emplace(std::move(e.first), std::move(e.second));
    return true;
  }
  return false;
}

// The type of a tree object ("val", "valref", "dir", "dirref", "symlink").
std::string TreeobjType(const std::string& treeobj) {
  std::vector<std::pair<std::string, std::string>> members;
  std::string type;
  if (!JsonObjectMembers(treeobj, &members)) return type;
  for (const auto& kv : members)
    if (kv.first == "type" && JsonStringValue(kv.second, &type)) break;
  return type;
}

// What the store itself writes: bin directories ("00".."ff") under the top
// directory, values in them. Anything else someone put there is skipped.
bool IsBin(const std::string& name, const std::string& treeobj) {
  if (name.size() != 2 || name.find_first_not_of("0123456789abcdef") != std::string::npos)
    return false;
  const std::string type = TreeobjType(treeobj);
  return type == "dirref" || type == "dir";
}
bool IsValue(const std::string& treeobj) {
  const std::string type = TreeobjType(treeobj);
  return type == "val" || type == "valref";
}

// The bytes of a "val" tree object (inline value); false for other types.
bool InlineValue(const std::string& treeobj, std::string* bytes) {
  std::vector<std::pair<std::string, std::string>> members;
  if (!JsonObjectMembers(treeobj, &members)) return false;
  std::string type, data;
  bool have_data = false;
  for (const auto& kv : members) {
    if (kv.first == "type" && !JsonStringValue(kv.second, &type)) return false;
    if (kv.first == "data") have_data = JsonStringValue(kv.second, &data);
  }
  return type == "val" && have_data && Base64Decode(data, bytes);
}

// Reads directory `key` of the snapshot `root` (a dirref tree object):
// its entries, or none when it does not exist there.
Status ReadDirAt(flux_t* h, const std::string& root, const std::string& key, int64_t timeout_ms,
                 std::map<std::string, std::string>* out) {
  out->clear();
  flux_future_t* f = flux_kvs_lookupat(h, FLUX_KVS_READDIR, key.c_str(), root.c_str());
  if (f == nullptr)
    return FluxStatus(errno, "flux:// read directory '" + key + "'", DYAD_RC_FLUXFAIL);
  const char* obj = nullptr;
  Status st;
  if (!FutureReady(f, timeout_ms) || flux_kvs_lookup_get_treeobj(f, &obj) < 0) {
    const int err = errno;
    if (err != ENOENT)
      st = FluxStatus(err, "flux:// read directory '" + key + "'", DYAD_RC_FLUXFAIL);
  } else if (!DirEntries(obj, out)) {
    st = Status(DYAD_RC_BADMETADATA, "flux:// directory '" + key + "' is not a directory object");
  }
  flux_future_destroy(f);
  return st;
}

// The current root of namespace `fns` (a dirref), or "" when it does not exist.
Status RootOf(flux_t* h, const std::string& fns, int64_t timeout_ms, std::string* root) {
  root->clear();
  flux_future_t* f = flux_kvs_lookup(h, fns.c_str(), FLUX_KVS_TREEOBJ, ".");
  if (f == nullptr) return FluxStatus(errno, "flux:// namespace '" + fns + "'", DYAD_RC_FLUXFAIL);
  const char* obj = nullptr;
  Status st;
  if (!FutureReady(f, timeout_ms) || flux_kvs_lookup_get_treeobj(f, &obj) < 0) {
    const int err = errno;
    if (err != ENOTSUP) st = FluxStatus(err, "flux:// namespace '" + fns + "'", DYAD_RC_FLUXFAIL);
  } else {
    *root = obj;
  }
  flux_future_destroy(f);
  return st;
}

Status CreateNamespace(flux_t* h, const std::string& fns, int64_t timeout_ms) {
  // Owner: the instance owner (FLUX_USERID_UNKNOWN), who alone may read it.
  flux_future_t* f = flux_kvs_namespace_create(h, fns.c_str(), FLUX_USERID_UNKNOWN, 0);
  if (f == nullptr)
    return FluxStatus(errno, "flux:// create namespace '" + fns + "'", DYAD_RC_FLUXFAIL);
  Status st;
  if (!FutureReady(f, timeout_ms) || flux_future_get(f, nullptr) < 0) {
    const int err = errno;
    if (err != EEXIST)
      st = FluxStatus(err, "flux:// create namespace '" + fns + "'", DYAD_RC_FLUXFAIL);
  }
  flux_future_destroy(f);
  return st;
}

}  // namespace

// --- URL -----------------------------------------------------------------------

Result<FluxUrl> ParseFluxUrl(const std::string& url) {
  FluxUrl out;
  out.top = kFluxDefaultTopDir;
  if (url == "flux" || url == "flux://") return out;
  const std::string scheme = "flux://";
  if (url.rfind(scheme, 0) != 0)
    return Status(DYAD_RC_BADREQUEST, "metadata store '" + url + "': not a flux:// URL");
  std::string rest = url.substr(scheme.size());
  if (rest.empty() || rest[0] != '?') {
    return Status(DYAD_RC_BADREQUEST,
                  "metadata store '" + url +
                      "': flux:// names no host; write flux:// (the instance of $FLUX_URI) or "
                      "flux://?uri=URI");
  }
  rest.erase(0, 1);
  size_t pos = 0;
  while (pos <= rest.size()) {
    size_t amp = rest.find('&', pos);
    if (amp == std::string::npos) amp = rest.size();
    const std::string item = rest.substr(pos, amp - pos);
    pos = amp + 1;
    if (item.empty()) continue;
    const size_t eq = item.find('=');
    const std::string name = item.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : item.substr(eq + 1);
    if (name == "uri" && !value.empty()) {
      out.uri = value;
    } else if (name == "dir") {
      if (!FluxValidTopDir(value)) {
        return Status(DYAD_RC_BADREQUEST, "metadata store '" + url + "': dir=" + value +
                                              " is not 1-64 characters of [A-Za-z0-9_-]");
      }
      out.top = value;
    } else {
      return Status(DYAD_RC_BADREQUEST, "metadata store '" + url + "': unknown parameter '" + item +
                                            "' (flux://?uri=URI&dir=NAME)");
    }
  }
  return out;
}

Result<std::unique_ptr<Kvs>> OpenKvs_flux(const std::string& url, const KvsOptions& options) {
  Result<std::unique_ptr<FluxKvs>> kvs = FluxKvs::Open(url, options);
  if (!kvs.ok()) return kvs.status();
  return std::unique_ptr<Kvs>(std::move(*kvs));
}

struct FluxKvs::WatchFeed {
  KvsWatchTicket ticket = 0;
  std::string ns, fns;
  KvsWatchCallback cb;
  flux_t* h = nullptr;
  flux_future_t* f = nullptr;               // the kvs-watch of the namespace's root
  std::string root;                         // the last snapshot compared
  std::map<std::string, std::string> bins;  // its top directory
  std::atomic<bool> stop{false};
  std::thread thread;
};

// --- the handle pool --------------------------------------------------------------

class FluxKvs::Lease {
 public:
  explicit Lease(FluxKvs* kvs) : kvs_(kvs) {
    Result<flux_t*> h = kvs->Borrow();
    if (h.ok()) {
      h_ = *h;
    } else {
      status_ = h.status();
    }
  }
  ~Lease() {
    if (h_ != nullptr) kvs_->GiveBack(h_, broken_);
  }
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  bool ok() const { return h_ != nullptr; }
  const Status& status() const { return status_; }
  flux_t* get() const { return h_; }
  // A status whose cause is a lost connection retires the handle.
  void Note(const Status& st) {
    if (!st.ok() && st.code() == DYAD_RC_CONNLOST) broken_ = true;
  }

 private:
  FluxKvs* kvs_;
  flux_t* h_ = nullptr;
  bool broken_ = false;
  Status status_;
};

Result<flux_t*> FluxKvs::OpenHandle() {
  flux_error_t error;
  std::memset(&error, 0, sizeof error);
  flux_t* h = flux_open_ex(url_.uri.empty() ? nullptr : url_.uri.c_str(), 0, &error);
  if (h == nullptr) {
    const char* env = std::getenv("FLUX_URI");
    const std::string where = !url_.uri.empty() ? url_.uri
                              : env != nullptr  ? std::string(env) + " ($FLUX_URI)"
                                                : "the system instance ($FLUX_URI is not set)";
    return Status(DYAD_RC_CONNLOST, "flux:// cannot connect to the Flux instance at " + where +
                                        ": " + (error.text[0] ? error.text : std::strerror(errno)));
  }
  return h;
}

Result<flux_t*> FluxKvs::Borrow() {
  std::unique_lock<std::mutex> lk(pool_mu_);
  const Deadline deadline = Deadline::AfterMs(options_.rpc_timeout_ms);
  while (idle_.empty() && open_ >= kMaxPooledHandles) {
    if (pool_cv_.wait_for(lk, std::chrono::milliseconds(deadline.RemainingMs())) ==
            std::cv_status::timeout &&
        deadline.expired() && idle_.empty()) {
      return Status(DYAD_RC_TIMEOUT, "flux:// all " + std::to_string(kMaxPooledHandles) +
                                         " connections to the Flux instance stayed busy for " +
                                         std::to_string(options_.rpc_timeout_ms) + " ms");
    }
  }
  if (!idle_.empty()) {
    flux_t* h = idle_.back();
    idle_.pop_back();
    return h;
  }
  ++open_;
  lk.unlock();
  Result<flux_t*> h = OpenHandle();
  if (!h.ok()) {
    lk.lock();
    --open_;
    pool_cv_.notify_one();
  }
  return h;
}

void FluxKvs::GiveBack(flux_t* h, bool broken) {
  if (broken) flux_close(h);
  std::lock_guard<std::mutex> lk(pool_mu_);
  if (broken) {
    --open_;
  } else {
    idle_.push_back(h);
  }
  pool_cv_.notify_one();
}

size_t FluxKvs::PooledHandles() {
  std::lock_guard<std::mutex> lk(pool_mu_);
  return open_;
}

// --- open / close -------------------------------------------------------------------

FluxKvs::FluxKvs(FluxUrl url, const KvsOptions& options)
    : url_(std::move(url)), options_(options) {}

Result<std::unique_ptr<FluxKvs>> FluxKvs::Open(const std::string& url, const KvsOptions& options) {
  Result<FluxUrl> parsed = ParseFluxUrl(url);
  if (!parsed.ok()) return parsed.status();
  std::unique_ptr<FluxKvs> kvs(new FluxKvs(std::move(*parsed), options));
  Status st = kvs->Start();
  if (!st.ok()) return st;
  return kvs;
}

Status FluxKvs::Start() {
  // One handle now, so that a wrong URI fails at open with a clear message.
  Result<flux_t*> h = Borrow();
  if (!h.ok()) return h.status();
  GiveBack(*h, false);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return StatusFromErrno(errno, "flux:// eventfd");
  std::promise<Status> ready;
  std::future<Status> started = ready.get_future();
  reactor_thread_ = std::thread([this, &ready] { ReactorMain(&ready); });
  Status st = started.get();
  if (!st.ok()) {
    reactor_thread_.join();
    return st;
  }
  return Status::OK();
}

FluxKvs::~FluxKvs() {
  Shutdown();
  // Every watch told to stop first, so that they stop together.
  std::map<KvsWatchTicket, std::unique_ptr<WatchFeed>> feeds;
  {
    std::lock_guard<std::mutex> lk(watch_mu_);
    feeds.swap(watches_);
  }
  for (auto& kv : feeds) kv.second->stop.store(true);
  for (auto& kv : feeds)
    if (kv.second->thread.joinable()) kv.second->thread.join();
  if (reactor_thread_.joinable()) {
    Post([this] { flux_reactor_stop(reactor_); });
    reactor_thread_.join();
  }
  if (wake_fd_ >= 0) close(wake_fd_);
  std::lock_guard<std::mutex> lk(pool_mu_);
  for (flux_t* h : idle_) flux_close(h);
  idle_.clear();
}

std::string FluxKvs::FluxKey(const std::string& key) const { return FluxKeyPath(url_.top, key); }

// --- simple operations ----------------------------------------------------------------

Status FluxKvs::Commit(flux_t* h, const std::string& fns, const std::string& fkey,
                       const std::string* json, bool create, const std::string& what) {
  for (int attempt = 0;; ++attempt) {
    flux_kvs_txn_t* txn = flux_kvs_txn_create();
    if (txn == nullptr) return StatusFromErrno(errno, what);
    const int rc = json != nullptr ? flux_kvs_txn_put(txn, 0, fkey.c_str(), json->c_str())
                                   : flux_kvs_txn_unlink(txn, 0, fkey.c_str());
    if (rc < 0) {
      const int err = errno;
      flux_kvs_txn_destroy(txn);
      return FluxStatus(err, what, DYAD_RC_BADCOMMIT);
    }
    flux_future_t* f = flux_kvs_commit(h, fns.c_str(), 0, txn);
    flux_kvs_txn_destroy(txn);
    if (f == nullptr) return FluxStatus(errno, what, DYAD_RC_BADCOMMIT);
    int err = 0;
    if (!FutureReady(f, options_.rpc_timeout_ms) || flux_future_get(f, nullptr) < 0) err = errno;
    flux_future_destroy(f);
    if (err == 0) return Status::OK();
    if (err == ENOTSUP && attempt == 0) {  // no such namespace
      if (!create) return Status::OK();    // (an unlink in a missing namespace)
      Status st = CreateNamespace(h, fns, options_.rpc_timeout_ms);
      if (!st.ok()) return st.Annotate(what);
      continue;
    }
    return FluxStatus(err, what, DYAD_RC_BADCOMMIT);
  }
}

Status FluxKvs::Put(const std::string& ns, const std::string& key, const std::string& value) {
  Lease h(this);
  if (!h.ok()) return h.status();
  const std::string fkey = FluxKey(key);
  const std::string json = FluxEncodeValue(value);
  Status st = Commit(h.get(), FluxNamespace(ns), fkey, &json, true,
                     "flux:// put '" + fkey + "' in namespace '" + FluxNamespace(ns) + "'");
  h.Note(st);
  if (st.ok()) MarkNamespace(FluxNamespace(ns), true);  // (waits need not create it)
  return st;
}

Status FluxKvs::Remove(const std::string& ns, const std::string& key) {
  Lease h(this);
  if (!h.ok()) return h.status();
  const std::string fkey = FluxKey(key);
  Status st = Commit(h.get(), FluxNamespace(ns), fkey, nullptr, false,
                     "flux:// remove '" + fkey + "' in namespace '" + FluxNamespace(ns) + "'");
  h.Note(st);
  return st;
}

Result<std::optional<std::string>> FluxKvs::Get(const std::string& ns, const std::string& key) {
  Result<KvsValues> v = MultiGet(ns, {key});
  if (!v.ok()) return v.status();
  return std::move((*v)[0]);
}

Result<KvsValues> FluxKvs::MultiGet(const std::string& ns, const std::vector<std::string>& keys) {
  KvsValues out(keys.size());
  if (keys.empty()) return out;
  Lease h(this);
  if (!h.ok()) return h.status();
  const std::string fns = FluxNamespace(ns);
  // Up to kPipelineDepth lookups in flight at once on the one handle.
  for (size_t base = 0; base < keys.size(); base += kPipelineDepth) {
    const size_t n = std::min(kPipelineDepth, keys.size() - base);
    std::vector<flux_future_t*> fs(n, nullptr);
    Status st;
    for (size_t i = 0; i < n && st.ok(); ++i) {
      fs[i] = flux_kvs_lookup(h.get(), fns.c_str(), 0, FluxKey(keys[base + i]).c_str());
      if (fs[i] == nullptr) st = FluxStatus(errno, "flux:// lookup", DYAD_RC_FLUXFAIL);
    }
    for (size_t i = 0; i < n; ++i) {
      if (fs[i] == nullptr) continue;
      if (st.ok()) {
        const std::string fkey = FluxKey(keys[base + i]);
        std::string text;
        if (FutureReady(fs[i], options_.rpc_timeout_ms) && LookupText(fs[i], &text)) {
          std::string value;
          st = DecodeStored(text, fkey, &value);
          if (st.ok()) out[base + i] = std::move(value);
        } else if (errno != ENOENT && errno != ENOTSUP) {  // absent, or no such namespace
          st = FluxStatus(errno, "flux:// get '" + fkey + "' in namespace '" + fns + "'",
                          DYAD_RC_FLUXFAIL);
        }
      }
      flux_future_destroy(fs[i]);
    }
    h.Note(st);
    if (!st.ok()) return st;
  }
  return out;
}

Result<std::vector<KvsEntry>> FluxKvs::List(const std::string& ns, const std::string& prefix,
                                            uint32_t limit) {
  Lease h(this);
  if (!h.ok()) return h.status();
  const std::string fns = FluxNamespace(ns);
  const int64_t tmo = options_.rpc_timeout_ms;
  // One snapshot of the namespace: every directory and value is read at it.
  std::string root;
  Status st = RootOf(h.get(), fns, tmo, &root);
  if (st.ok() && root.empty()) return std::vector<KvsEntry>{};
  std::map<std::string, std::string> bins;
  if (st.ok()) st = ReadDirAt(h.get(), root, url_.top, tmo, &bins);
  // key -> (flux key, tree object of its value)
  std::map<std::string, std::pair<std::string, std::string>> found;
  // The bin directories, all requested at once (at most 256).
  std::vector<std::pair<std::string, flux_future_t*>> reads;
  for (const auto& bin : bins) {
    if (!IsBin(bin.first, bin.second)) continue;
    const std::string dir = url_.top + "." + bin.first;
    reads.emplace_back(dir,
                       flux_kvs_lookupat(h.get(), FLUX_KVS_READDIR, dir.c_str(), root.c_str()));
  }
  for (auto& [dir, f] : reads) {
    const char* obj = nullptr;
    std::map<std::string, std::string> leaves;
    if (st.ok()) {
      if (f == nullptr || !FutureReady(f, tmo) || flux_kvs_lookup_get_treeobj(f, &obj) < 0) {
        st = FluxStatus(errno, "flux:// read directory '" + dir + "'", DYAD_RC_FLUXFAIL);
      } else if (!DirEntries(obj, &leaves)) {
        st = Status(DYAD_RC_BADMETADATA, "flux:// '" + dir + "' is not a directory object");
      }
    }
    if (f != nullptr) flux_future_destroy(f);
    for (auto& leaf : leaves) {
      std::string key;
      if (!IsValue(leaf.second) || !FluxUnescapeKey(leaf.first, &key)) continue;  // not ours
      if (key.compare(0, prefix.size(), prefix) != 0) continue;
      found.emplace(std::move(key), std::make_pair(dir + "." + leaf.first, leaf.second));
    }
  }
  if (!st.ok()) {
    h.Note(st);
    return st.Annotate("flux:// list namespace '" + fns + "'");
  }
  // (A value that is not in the store's form was written by someone else
  // with `flux kvs put`: left out of the listing; a Get of it says why.)
  std::vector<KvsEntry> out;
  std::vector<std::pair<size_t, std::string>> by_ref;  // (index in out, flux key)
  std::vector<bool> foreign;
  for (auto& kv : found) {
    if (limit != 0 && out.size() >= limit) break;
    std::string bytes, value;
    if (InlineValue(kv.second.second, &bytes)) {
      if (!DecodeStored(bytes, kv.second.first, &value).ok()) continue;
    } else {
      by_ref.emplace_back(out.size(), kv.second.first);
    }
    out.emplace_back(kv.first, std::move(value));
  }
  foreign.assign(out.size(), false);
  // Values too large to sit in their directory: read at the same snapshot.
  for (size_t base = 0; base < by_ref.size() && st.ok(); base += kPipelineDepth) {
    const size_t n = std::min(kPipelineDepth, by_ref.size() - base);
    std::vector<flux_future_t*> fs(n, nullptr);
    for (size_t i = 0; i < n; ++i)
      fs[i] = flux_kvs_lookupat(h.get(), 0, by_ref[base + i].second.c_str(), root.c_str());
    for (size_t i = 0; i < n; ++i) {
      std::string text;
      if (st.ok()) {
        if (fs[i] == nullptr || !FutureReady(fs[i], tmo) || !LookupText(fs[i], &text)) {
          st = FluxStatus(errno, "flux:// list: read '" + by_ref[base + i].second + "'",
                          DYAD_RC_FLUXFAIL);
        } else if (!DecodeStored(text, by_ref[base + i].second, &out[by_ref[base + i].first].second)
                        .ok()) {
          foreign[by_ref[base + i].first] = true;
        }
      }
      if (fs[i] != nullptr) flux_future_destroy(fs[i]);
    }
  }
  h.Note(st);
  if (!st.ok()) return st;
  size_t kept = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (foreign[i]) continue;
    if (kept != i) out[kept] = std::move(out[i]);
    ++kept;
  }
  out.resize(kept);
  return out;
}

// --- waits ------------------------------------------------------------------------------

struct FluxKvs::AsyncWait {
  KvsWaitTicket ticket = 0;
  std::string fns, fkey, key;
  Deadline deadline = Deadline::Never();
  KvsWaitCallback done;
  bool claimed = false;  // guarded by waits_mu_: `done` was (being) called
  // Reactor thread only.
  FluxKvs* kvs = nullptr;
  flux_future_t* create = nullptr;  // namespace create, before the lookup
  flux_future_t* f = nullptr;       // the lookup
  flux_watcher_t* timer = nullptr;
  bool timed_out = false;
  bool waitcreate = false;
};

void FluxKvs::Post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lk(cmd_mu_);
    cmds_.push_back(std::move(fn));
  }
  const uint64_t one = 1;
  ssize_t n = write(wake_fd_, &one, sizeof one);
  (void)n;  // EAGAIN: the counter is already non-zero, the reactor will look
}

void FluxKvs::RunPosted() {
  uint64_t count = 0;
  ssize_t n = read(wake_fd_, &count, sizeof count);
  (void)n;
  std::deque<std::function<void()>> todo;
  {
    std::lock_guard<std::mutex> lk(cmd_mu_);
    todo.swap(cmds_);
  }
  for (auto& fn : todo) fn();
}

void FluxKvs::ReactorMain(std::promise<Status>* ready) {
  Result<flux_t*> h = OpenHandle();
  if (!h.ok()) {
    ready->set_value(h.status());
    return;
  }
  rh_ = *h;
  reactor_ = flux_get_reactor(rh_);
  wake_watcher_ = reactor_ == nullptr ? nullptr
                                      : flux_fd_watcher_create(
                                            reactor_, wake_fd_, FLUX_POLLIN,
                                            [](flux_reactor_t*, flux_watcher_t*, int, void* arg) {
                                              static_cast<FluxKvs*>(arg)->RunPosted();
                                            },
                                            this);
  if (wake_watcher_ == nullptr) {
    ready->set_value(StatusFromErrno(errno, "flux:// reactor"));
    flux_close(rh_);
    rh_ = nullptr;
    return;
  }
  flux_watcher_start(wake_watcher_);
  ready->set_value(Status::OK());
  if (flux_reactor_run(reactor_, 0) < 0) {
    // The reactor failed (the handle's connection broke): waits can no
    // longer end by themselves; end them with an error.
    const Status lost(DYAD_RC_CONNLOST, "flux:// lost its connection to the Flux instance");
    std::vector<std::shared_ptr<AsyncWait>> pending;
    {
      std::lock_guard<std::mutex> lk(waits_mu_);
      shutdown_ = true;
      for (auto& kv : waits_)
        if (!kv.second->claimed) {
          kv.second->claimed = true;
          pending.push_back(kv.second);
        }
    }
    for (auto& w : pending) w->done(lost);
    // Keep serving commands (e.g. the destructor's stop) until told to stop.
    flux_reactor_run(reactor_, 0);
  }
  for (auto& kv : live_) {
    if (kv.second->timer != nullptr) flux_watcher_destroy(kv.second->timer);
    if (kv.second->f != nullptr) flux_future_destroy(kv.second->f);
    if (kv.second->create != nullptr) flux_future_destroy(kv.second->create);
  }
  live_.clear();
  flux_watcher_destroy(wake_watcher_);
  flux_close(rh_);
  rh_ = nullptr;
}

bool FluxKvs::Claim(AsyncWait* w) {
  std::lock_guard<std::mutex> lk(waits_mu_);
  if (w->claimed) return false;
  w->claimed = true;
  return true;
}

bool FluxKvs::NamespaceSeen(const std::string& fns) {
  if (fns == "primary") return true;
  std::lock_guard<std::mutex> lk(ns_mu_);
  auto it = ns_seen_.find(fns);
  return it != ns_seen_.end() &&
         std::chrono::steady_clock::now() - it->second < std::chrono::seconds(1);
}

void FluxKvs::MarkNamespace(const std::string& fns, bool seen) {
  std::lock_guard<std::mutex> lk(ns_mu_);
  if (seen) {
    ns_seen_[fns] = std::chrono::steady_clock::now();
  } else {
    ns_seen_.erase(fns);
  }
}

Result<KvsWaitTicket> FluxKvs::StartWait(const std::string& ns, const std::string& key,
                                         Deadline deadline, KvsWaitCallback done) {
  auto w = std::make_shared<AsyncWait>();
  w->fns = FluxNamespace(ns);
  w->fkey = FluxKey(key);
  w->key = key;
  w->deadline = deadline;
  w->done = std::move(done);
  w->kvs = this;
  {
    std::lock_guard<std::mutex> lk(waits_mu_);
    if (shutdown_) {
      return Status(DYAD_RC_CANCELLED,
                    "flux:// store is shutting down: no new wait for '" + key + "'");
    }
    w->ticket = next_wait_++;
    waits_[w->ticket] = w;
  }
  Post([this, w] { BeginWait(w); });
  return w->ticket;
}

void FluxKvs::BeginWait(const std::shared_ptr<AsyncWait>& w) {
  {
    std::lock_guard<std::mutex> lk(waits_mu_);
    if (w->claimed) {  // cancelled before it began
      waits_.erase(w->ticket);
      return;
    }
  }
  live_[w->ticket] = w;
  // A deadline already past still returns a value that is there: a plain
  // lookup answers that without waiting.
  w->waitcreate = !w->deadline.expired();
  if (w->waitcreate && !w->deadline.never()) {
    w->timer = flux_timer_watcher_create(
        reactor_, Seconds(w->deadline.RemainingMs()), 0.,
        [](flux_reactor_t*, flux_watcher_t*, int, void* arg) {
          AsyncWait* aw = static_cast<AsyncWait*>(arg);
          aw->kvs->OnTimer(aw);
        },
        w.get());
    if (w->timer != nullptr) flux_watcher_start(w->timer);
  }
  if (!w->waitcreate || NamespaceSeen(w->fns)) {
    SendLookup(w.get());
    return;
  }
  // The namespace first (see EnsureNamespace in the header), without
  // blocking this thread: the lookup goes out when the broker has answered.
  w->create = flux_kvs_namespace_create(rh_, w->fns.c_str(), FLUX_USERID_UNKNOWN, 0);
  if (w->create == nullptr || flux_future_then(
                                  w->create, -1.,
                                  [](flux_future_t*, void* arg) {
                                    AsyncWait* aw = static_cast<AsyncWait*>(arg);
                                    aw->kvs->OnCreated(aw);
                                  },
                                  w.get()) < 0) {
    const Status st =
        FluxStatus(errno, "flux:// create namespace '" + w->fns + "'", DYAD_RC_FLUXFAIL);
    if (Claim(w.get())) w->done(st);
    FinishWait(w.get());
  }
}

void FluxKvs::OnCreated(AsyncWait* w) {
  const int err = flux_future_get(w->create, nullptr) < 0 ? errno : 0;
  flux_future_destroy(w->create);
  w->create = nullptr;
  if (err == 0 || err == EEXIST) MarkNamespace(w->fns, true);
  bool ended;
  {
    std::lock_guard<std::mutex> lk(waits_mu_);
    ended = w->claimed;  // cancelled or timed out meanwhile
  }
  if (ended) {
    FinishWait(w);
    return;
  }
  if (err != 0 && err != EEXIST) {
    const Status st =
        FluxStatus(err, "flux:// wait for '" + w->key + "': create namespace '" + w->fns + "'",
                   DYAD_RC_FLUXFAIL);
    if (Claim(w)) w->done(st);
    FinishWait(w);
    return;
  }
  SendLookup(w);
}

void FluxKvs::SendLookup(AsyncWait* w) {
  w->f = flux_kvs_lookup(rh_, w->fns.c_str(), w->waitcreate ? FLUX_KVS_WAITCREATE : 0,
                         w->fkey.c_str());
  if (w->f == nullptr || flux_future_then(
                             w->f, -1.,
                             [](flux_future_t*, void* arg) {
                               AsyncWait* aw = static_cast<AsyncWait*>(arg);
                               aw->kvs->OnLookup(aw);
                             },
                             w) < 0) {
    const Status st = FluxStatus(errno, "flux:// wait for '" + w->fkey + "'", DYAD_RC_FLUXFAIL);
    if (Claim(w)) w->done(st);
    FinishWait(w);
  }
}

void FluxKvs::OnTimer(AsyncWait* w) {
  w->timed_out = true;
  if (w->f == nullptr) {
    // Still creating the namespace: the waiter hears now, and OnCreated
    // lets go of the wait.
    if (Claim(w)) {
      w->done(Status(DYAD_RC_TIMEOUT, "flux:// '" + w->key + "' was not put before the deadline"));
    }
    return;
  }
  // The deadline: end the lookup; its answer (ENODATA, or the value if it
  // was already on its way) decides what the waiter hears.
  if (flux_kvs_lookup_cancel(w->f) < 0) {
    if (Claim(w)) {
      w->done(Status(DYAD_RC_TIMEOUT, "flux:// '" + w->key + "' was not put before the deadline"));
    }
    FinishWait(w);
  }
}

void FluxKvs::OnLookup(AsyncWait* w) {
  std::string text;
  const bool got = LookupText(w->f, &text);
  const int err = got ? 0 : errno;
  Result<std::string> result = Status(DYAD_RC_TIMEOUT, "");
  if (got) {
    std::string value;
    Status st = DecodeStored(text, w->fkey, &value);
    result = st.ok() ? Result<std::string>(std::move(value)) : Result<std::string>(st);
  } else if (err == ENODATA || ((err == ENOENT || err == ENOTSUP) && !w->waitcreate)) {
    result = Status(DYAD_RC_TIMEOUT, "flux:// '" + w->key + "' (" + w->fkey + " in namespace '" +
                                         w->fns + "') was not put before the deadline");
  } else if (err == ENOTSUP) {
    MarkNamespace(w->fns, false);
    result = Status(DYAD_RC_NOTFOUND, "flux:// wait for '" + w->key + "': namespace '" + w->fns +
                                          "' was removed while waiting");
  } else {
    result = FluxStatus(err, "flux:// wait for '" + w->fkey + "'", DYAD_RC_FLUXFAIL);
  }
  // (After CancelWait or Shutdown the waiter has heard already.)
  if (Claim(w)) w->done(std::move(result));
  FinishWait(w);
}

void FluxKvs::FinishWait(AsyncWait* w) {
  if (w->timer != nullptr) {
    flux_watcher_destroy(w->timer);
    w->timer = nullptr;
  }
  if (w->f != nullptr) {
    flux_future_destroy(w->f);
    w->f = nullptr;
  }
  if (w->create != nullptr) {
    flux_future_destroy(w->create);
    w->create = nullptr;
  }
  const KvsWaitTicket t = w->ticket;
  {
    std::lock_guard<std::mutex> lk(waits_mu_);
    waits_.erase(t);
  }
  live_.erase(t);  // may free `w`: last
}

void FluxKvs::AbortWait(KvsWaitTicket ticket) {
  auto it = live_.find(ticket);
  if (it == live_.end()) return;  // not begun (BeginWait drops it) or over
  AsyncWait* w = it->second.get();
  if (w->timer != nullptr) {
    flux_watcher_destroy(w->timer);
    w->timer = nullptr;
  }
  // A plain lookup cannot be cancelled (its answer comes soon anyway), and
  // one still creating its namespace ends in OnCreated.
  if (w->f != nullptr && w->waitcreate && flux_kvs_lookup_cancel(w->f) < 0) FinishWait(w);
}

void FluxKvs::CancelWait(KvsWaitTicket ticket) {
  std::shared_ptr<AsyncWait> w;
  {
    std::lock_guard<std::mutex> lk(waits_mu_);
    auto it = waits_.find(ticket);
    if (it == waits_.end() || it->second->claimed) return;
    w = it->second;
    w->claimed = true;
  }
  w->done(Status(DYAD_RC_CANCELLED, "flux:// wait for '" + w->key + "' was cancelled"));
  Post([this, ticket] { AbortWait(ticket); });
}

void FluxKvs::Shutdown() {
  std::vector<std::shared_ptr<AsyncWait>> pending;
  {
    std::lock_guard<std::mutex> lk(waits_mu_);
    shutdown_ = true;
    for (auto& kv : waits_) {
      if (kv.second->claimed) continue;
      kv.second->claimed = true;
      pending.push_back(kv.second);
    }
  }
  for (auto& w : pending) {
    w->done(Status(DYAD_RC_CANCELLED,
                   "flux:// store is shutting down: wait for '" + w->key + "' ended"));
    if (reactor_thread_.joinable()) {
      const KvsWaitTicket t = w->ticket;
      Post([this, t] { AbortWait(t); });
    }
  }
}

// --- watches ------------------------------------------------------------------------------

namespace {

// Starts a kvs-watch of the root of `fns` and waits for its first answer,
// the snapshot later changes are compared with. A missing namespace is
// created when `create` says so, else DYAD_RC_NOTFOUND.
Status StartRootWatch(flux_t* h, const std::string& fns, const std::string& top, int64_t tmo,
                      bool create, flux_future_t** f, std::string* root,
                      std::map<std::string, std::string>* bins) {
  *f = nullptr;
  Status st;
  if (create) {
    st = CreateNamespace(h, fns, tmo);
  } else {
    std::string now;
    st = RootOf(h, fns, tmo, &now);
    if (st.ok() && now.empty()) return Status(DYAD_RC_NOTFOUND, "no namespace '" + fns + "'");
  }
  if (!st.ok()) return st;
  flux_future_t* w = flux_kvs_lookup(
      h, fns.c_str(), FLUX_KVS_WATCH | FLUX_KVS_WATCH_FULL | FLUX_KVS_WATCH_UNIQ | FLUX_KVS_TREEOBJ,
      ".");
  if (w == nullptr)
    return FluxStatus(errno, "flux:// watch namespace '" + fns + "'", DYAD_RC_FLUXFAIL);
  const char* obj = nullptr;
  if (!FutureReady(w, tmo) || flux_kvs_lookup_get_treeobj(w, &obj) < 0) {
    st = FluxStatus(errno, "flux:// watch namespace '" + fns + "'", DYAD_RC_FLUXFAIL);
    flux_future_destroy(w);
    return st;
  }
  *root = obj;
  flux_future_reset(w);
  st = ReadDirAt(h, *root, top, tmo, bins);
  if (!st.ok()) {
    flux_kvs_lookup_cancel(w);
    flux_future_destroy(w);
    return st;
  }
  *f = w;
  return Status::OK();
}

void StopRootWatch(flux_future_t* f) {
  if (f == nullptr) return;
  // Cancel, and wait (briefly) for the end of the stream before letting go.
  if (flux_kvs_lookup_cancel(f) == 0) {
    for (int i = 0; i < 20; ++i) {
      if (!FutureReady(f, 50)) continue;
      const char* obj = nullptr;
      if (flux_kvs_lookup_get_treeobj(f, &obj) < 0) break;  // ENODATA: ended
      flux_future_reset(f);
    }
  }
  flux_future_destroy(f);
}

}  // namespace

Result<KvsWatchTicket> FluxKvs::Watch(const std::string& ns, KvsWatchCallback on_change) {
  {
    std::lock_guard<std::mutex> lk(watch_mu_);
    if (watches_.size() >= kMaxWatches) {
      return Status(DYAD_RC_BADREQUEST,
                    "flux:// store already follows " + std::to_string(watches_.size()) +
                        " watches, its limit (each holds a thread and a connection to the "
                        "broker); watch of namespace '" +
                        FluxNamespace(ns) + "' refused");
    }
  }
  auto feed = std::make_unique<WatchFeed>();
  feed->ns = ns;
  feed->fns = FluxNamespace(ns);
  feed->cb = std::move(on_change);
  Result<flux_t*> h = OpenHandle();
  if (!h.ok()) return h.status();
  feed->h = *h;
  Status st = StartRootWatch(feed->h, feed->fns, url_.top, options_.rpc_timeout_ms, true, &feed->f,
                             &feed->root, &feed->bins);
  if (!st.ok()) {
    flux_close(feed->h);
    return st;
  }
  WatchFeed* raw = feed.get();
  std::lock_guard<std::mutex> lk(watch_mu_);
  raw->ticket = next_watch_++;
  raw->thread = std::thread([this, raw] { FeedMain(raw); });
  watches_[raw->ticket] = std::move(feed);
  return raw->ticket;
}

void FluxKvs::Unwatch(KvsWatchTicket ticket) {
  std::unique_ptr<WatchFeed> feed;
  {
    std::lock_guard<std::mutex> lk(watch_mu_);
    auto it = watches_.find(ticket);
    if (it == watches_.end()) return;
    feed = std::move(it->second);
    watches_.erase(it);
  }
  feed->stop.store(true);
  if (feed->thread.joinable()) feed->thread.join();
}

void FluxKvs::FeedMain(WatchFeed* feed) {
  const int64_t tmo = options_.rpc_timeout_ms;
  const std::string& top = url_.top;
  auto resync = [&] { feed->cb(KvsChange{"", "", true}); };
  while (!feed->stop.load()) {
    if (feed->f == nullptr) {
      // Re-establish after an error (the namespace was removed, ...): a
      // new baseline, and a resync so the watcher lists again. A removed
      // namespace is not made again here (the user removed it, and may
      // create it again, which must not fail): the feed waits for it.
      for (int i = 0; i < 10 && !feed->stop.load(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(kCancelPollMs));
      if (feed->stop.load()) break;
      Status st =
          StartRootWatch(feed->h, feed->fns, top, tmo, false, &feed->f, &feed->root, &feed->bins);
      if (st.ok()) resync();
      continue;
    }
    if (!FutureReady(feed->f, kCancelPollMs)) {
      if (errno == ETIMEDOUT) continue;
    }
    const char* obj = nullptr;
    if (flux_kvs_lookup_get_treeobj(feed->f, &obj) < 0) {
      flux_future_destroy(feed->f);
      feed->f = nullptr;
      resync();
      continue;
    }
    const std::string root = obj;
    flux_future_reset(feed->f);
    // Compare the snapshots: directories whose tree object is unchanged
    // hold unchanged keys.
    std::map<std::string, std::string> bins;
    Status st = ReadDirAt(feed->h, root, top, tmo, &bins);
    for (auto b = bins.begin(); st.ok() && b != bins.end(); ++b) {
      if (!IsBin(b->first, b->second)) continue;
      auto old = feed->bins.find(b->first);
      if (old != feed->bins.end() && old->second == b->second) continue;
      const std::string dir = top + "." + b->first;
      std::map<std::string, std::string> now, before;
      st = ReadDirAt(feed->h, root, dir, tmo, &now);
      if (st.ok() && old != feed->bins.end())
        st = ReadDirAt(feed->h, feed->root, dir, tmo, &before);
      for (auto leaf = now.begin(); st.ok() && leaf != now.end(); ++leaf) {
        auto was = before.find(leaf->first);
        if (was != before.end() && was->second == leaf->second) continue;
        std::string key;
        if (!IsValue(leaf->second) || !FluxUnescapeKey(leaf->first, &key)) continue;
        std::string text, value;
        const std::string fkey = dir + "." + leaf->first;
        if (!InlineValue(leaf->second, &text)) {
          flux_future_t* f = flux_kvs_lookupat(feed->h, 0, fkey.c_str(), root.c_str());
          const bool ok = f != nullptr && FutureReady(f, tmo) && LookupText(f, &text);
          if (f != nullptr) flux_future_destroy(f);
          if (!ok) {
            st = FluxStatus(errno, "flux:// watch: read '" + fkey + "'", DYAD_RC_FLUXFAIL);
            break;
          }
        }
        if (!DecodeStored(text, fkey, &value).ok()) continue;  // not a value of ours
        feed->cb(KvsChange{key, value, false});
      }
    }
    if (!st.ok()) {
      // Could not read this snapshot: say changes may have been missed.
      resync();
    }
    feed->root = root;
    feed->bins = std::move(bins);
  }
  StopRootWatch(feed->f);
  feed->f = nullptr;
  flux_close(feed->h);
  feed->h = nullptr;
}

}  // namespace dyad
