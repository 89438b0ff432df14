#include "client/client.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdio>
#include <cstdlib>

#include "client/publish_pipeline.h"
#include "common/backend.h"
#include "common/config.h"
#include "common/fsutil.h"
#include "common/key.h"
#include "common/time.h"
#include "common/trace.h"
#include "common/wire.h"
#include "dyad/common/dyad_envs.h"

namespace dyad {
namespace {

Result<uint32_t> EnvUint32(const char* name, uint32_t def) {
  Result<uint64_t> v = EnvUint(name, def);
  if (!v.ok()) return v.status();
  if (*v > UINT32_MAX)
    return Status(DYAD_RC_BADREQUEST, std::string(name) + "=" + std::to_string(*v) +
                                          " is out of range (at most " +
                                          std::to_string(UINT32_MAX) + ")");
  return static_cast<uint32_t>(*v);
}

std::string WorkingDirectory() {
  char buf[PATH_MAX];
  if (::getcwd(buf, sizeof buf) == nullptr) return "/";
  return buf;
}

std::string MakeAbsolute(const std::string& path) {
  if (!path.empty() && path[0] == '/') return NormalizeAbsolute(path);
  return NormalizeAbsolute(WorkingDirectory() + "/" + path);
}

// Realpath, or nullopt when the path does not exist (yet).
std::optional<std::string> RealPath(const std::string& path) {
  char buf[PATH_MAX];
  if (::realpath(path.c_str(), buf) == nullptr) return std::nullopt;
  return std::string(buf);
}

// True when one directory is the other or contains it.
bool Overlap(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  return RelativeTo(a, b).has_value() || RelativeTo(b, a).has_value();
}

// mkdir -p, ignoring failures: the service reports a directory it cannot use.
void MakeDirs(const std::string& abs) {
  size_t pos = 1;
  while (pos <= abs.size()) {
    size_t slash = abs.find('/', pos);
    if (slash == std::string::npos) slash = abs.size();
    const std::string prefix = abs.substr(0, slash);
    if (::mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) return;
    pos = slash + 1;
  }
}

Status FsyncPath(const std::string& path, int flags) {
  UniqueFd fd(::open(path.c_str(), flags | O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return StatusFromErrno(errno, "open '" + path + "' for fsync", DYAD_RC_BADFIO);
  if (::fsync(fd.get()) != 0) return StatusFromErrno(errno, "fsync '" + path + "'", DYAD_RC_BADFIO);
  return Status::OK();
}

// True for an absolute path that NormalizeAbsolute would return unchanged:
// no empty, "." or ".." components and no trailing slash.
bool IsNormalAbsolute(std::string_view p) {
  if (p.empty() || p[0] != '/') return false;
  if (p.size() == 1) return true;
  if (p.back() == '/') return false;
  size_t start = 1;
  while (start <= p.size()) {
    size_t end = p.find('/', start);
    if (end == std::string_view::npos) end = p.size();
    const std::string_view comp = p.substr(start, end - start);
    if (comp.empty() || comp == "." || comp == "..") return false;
    start = end + 1;
  }
  return true;
}

// `path` is strictly below directory `dir` (both normalized absolute).
bool StrictlyUnder(std::string_view dir, std::string_view path) {
  if (dir == "/") return path.size() > 1;
  return path.size() > dir.size() + 1 && path.compare(0, dir.size(), dir) == 0 &&
         path[dir.size()] == '/';
}

}  // namespace

bool HasStamp(const std::string& path, const FileRecord& rec) {
  char buf[64];
  const ssize_t n = ::getxattr(path.c_str(), kVersionXattr, buf, sizeof(buf));
  return n > 0 && StampNames(std::string_view(buf, static_cast<size_t>(n)), rec);
}

void MarkChecked() { ::setenv(DYAD_CHECK_ENV, "ok", 1); }

Result<std::string> NormalizeDtlMode(const std::string& name) { return CanonicalDtlMode(name); }

Result<ClientConfig> ClientConfig::FromEnv() {
  ClientConfig c;
  c.debug = EnvBool("DYAD_SYNC_DEBUG", false);
  c.check = EnvBool("DYAD_SYNC_CHECK", false);
  c.shared_storage = EnvBool("DYAD_SHARED_STORAGE", false);
  c.reinit = EnvBool("DYAD_REINIT", false);
  c.async_publish = EnvBool("DYAD_ASYNC_PUBLISH", false);
  c.fsync_write = EnvBool("DYAD_FSYNC_WRITE", false);
  c.relative_to_managed_path = EnvBool("DYAD_PATH_RELATIVE", false);

  Result<uint32_t> depth = EnvUint32("DYAD_KEY_DEPTH", kDefaultKeyDepth);
  if (!depth.ok()) return depth.status();
  c.key_depth = *depth;
  Result<uint32_t> bins = EnvUint32("DYAD_KEY_BINS", kDefaultKeyBins);
  if (!bins.ok()) return bins.status();
  c.key_bins = *bins;
  Result<uint32_t> mux = EnvUint32("DYAD_SERVICE_MUX", 1);
  if (!mux.ok()) return mux.status();
  c.service_mux = *mux;

  c.kvs_namespace = GetEnv("DYAD_KVS_NAMESPACE").value_or("");
  // An empty variable counts as unset (`DYAD_PATH_PRODUCER= prog` disables it).
  c.prod_managed_path = GetEnv("DYAD_PATH_PRODUCER").value_or("");
  c.cons_managed_path = GetEnv("DYAD_PATH_CONSUMER").value_or("");

  if (std::optional<std::string> mode = GetEnv("DYAD_DTL_MODE"); mode && !mode->empty()) {
    Result<std::string> m = NormalizeDtlMode(*mode);
    if (!m.ok()) return m.status().Annotate("DYAD_DTL_MODE");
    c.dtl_mode = *m;
    c.dtl_mode_chosen = true;
  }
  c.service_socket = DefaultServiceSocket();
  c.flux_uri = GetEnv("FLUX_URI").value_or("");

  Result<int64_t> consume = EnvTimeoutMs("DYAD_CONSUME_TIMEOUT", -1);
  if (!consume.ok()) return consume.status();
  c.consume_timeout_ms = *consume;
  Result<int64_t> rpc = EnvTimeoutMs("DYAD_RPC_TIMEOUT", 60000);
  if (!rpc.ok()) return rpc.status();
  c.rpc_timeout_ms = *rpc;
  if (std::optional<std::string> pf = GetEnv("DYAD_PREFETCH"); pf && !pf->empty()) {
    size_t start = 0;
    while (start <= pf->size()) {
      const size_t colon = std::min(pf->find(':', start), pf->size());
      if (colon > start) c.prefetch.push_back(pf->substr(start, colon - start));
      start = colon + 1;
    }
  }
  return c;
}

// --- ManagedPath ------------------------------------------------------------

ManagedPath::ManagedPath(const std::string& path) {
  if (path.empty()) return;
  given_ = MakeAbsolute(path);
  std::optional<std::string> real = RealPath(given_);
  canonical_ = real.value_or(given_);
  if (real) resolved_.store(new std::string(*real));
}

ManagedPath::~ManagedPath() { delete resolved_.load(); }

std::string ManagedPath::CurrentCanonical() const {
  if (given_.empty()) return {};
  if (const std::string* r = resolved_.load(std::memory_order_acquire)) return *r;
  // Created after we started (typical for consumer directories); resolve
  // now, and remember only once it exists.
  std::optional<std::string> real = RealPath(given_);
  if (!real) return canonical_;
  auto* mine = new std::string(*real);
  const std::string* expected = nullptr;
  if (!resolved_.compare_exchange_strong(expected, mine, std::memory_order_acq_rel)) delete mine;
  return *real;
}

bool ManagedPath::Contains(std::string_view abs) const {
  if (given_.empty()) return false;
  return StrictlyUnder(given_, abs) || (canonical_ != given_ && StrictlyUnder(canonical_, abs));
}

std::optional<std::string> ManagedPath::Match(const std::string& abs) const {
  if (given_.empty()) return std::nullopt;
  if (std::optional<std::string> rel = RelativeTo(given_, abs)) return rel;
  if (canonical_ != given_) return RelativeTo(canonical_, abs);
  return std::nullopt;
}

// --- Client -----------------------------------------------------------------

Client::Client(ClientConfig config, std::shared_ptr<ServicePool> pool)
    : config_(std::move(config)),
      prod_(config_.prod_managed_path),
      cons_(config_.cons_managed_path),
      pool_(std::move(pool)) {
  config_.prod_managed_path = prod_.given();
  config_.cons_managed_path = cons_.given();
}

Client::~Client() { delete service_prod_path_.load(); }

Result<std::shared_ptr<Client>> Client::Create(ClientConfig config,
                                               std::shared_ptr<ServicePool> pool) {
  if (config.key_bins == 0) config.key_bins = 1;
  if (config.service_mux == 0) config.service_mux = 1;
  if (config.dtl_mode.empty()) {
    config.dtl_mode = DefaultDtlMode();
    config.dtl_mode_chosen = false;
  }
  Result<std::string> mode = NormalizeDtlMode(config.dtl_mode);
  if (!mode.ok()) return mode.status();
  config.dtl_mode = *mode;
  if (config.service_socket.empty()) config.service_socket = DefaultServiceSocket();
  std::shared_ptr<FluxLink> flux;
  if (!config.flux_uri.empty() || config.flux_handle != nullptr)
    flux = std::make_shared<FluxLink>(config.flux_uri, config.flux_handle);
  if (config.flux_handle != nullptr && config.flux_uri.empty() &&
      GetEnv("DYAD_SERVICE_SOCKET").value_or("").empty()) {
    // A handle without FLUX_URI in the environment: the module's socket
    // follows from the handle's broker, as DefaultServiceSocket does from
    // FLUX_URI.
    Result<std::string> local = flux->Attr("local-uri");
    if (!local.ok()) return local.status().Annotate("flux_handle");
    if (std::string sock = FluxServiceSocket(*local); !sock.empty()) config.service_socket = sock;
  }
  if (pool == nullptr || pool->socket_path() != config.service_socket)
    pool = std::make_shared<ServicePool>(config.service_socket);
  config.service_socket = pool->socket_path();
  auto client = std::shared_ptr<Client>(new Client(std::move(config), std::move(pool)));
  client->flux_ = std::move(flux);
  return client;
}

std::string Client::KeyOf(const std::string& upath) const {
  return GenPathKey(upath, config_.key_depth, config_.key_bins);
}

Result<std::string> Client::Resolve(const std::string& fname, Side side) const {
  const bool producer = side == Side::kProducer;
  const ManagedPath& dir = producer ? prod_ : cons_;
  if (dir.empty())
    return Status(DYAD_RC_BADMANAGEDPATH,
                  producer ? "no producer-managed directory is configured (DYAD_PATH_PRODUCER)"
                           : "no consumer-managed directory is configured (DYAD_PATH_CONSUMER)");
  if (fname.empty()) return Status(DYAD_RC_BADBUF, "empty file name");
  std::string abs;
  if (fname[0] == '/') {
    abs = IsNormalAbsolute(fname) ? fname : NormalizeAbsolute(fname);
  } else if (config_.relative_to_managed_path) {
    Result<std::string> up = ValidateUpath(fname);
    if (!up.ok()) return up.status();
    return up;
  } else {
    abs = NormalizeAbsolute(WorkingDirectory() + "/" + fname);
  }
  std::optional<std::string> rel = dir.Match(abs);
  if (!rel || rel->empty())
    return Status(DYAD_RC_UNTRACKED, "'" + fname + "' is not under the " +
                                         (producer ? "producer" : "consumer") +
                                         "-managed directory '" + dir.given() + "'");
  return ValidateUpath(*rel);
}

bool Client::IsManaged(std::string_view fname, Side side) const {
  const ManagedPath& dir = side == Side::kProducer ? prod_ : cons_;
  if (dir.empty() || fname.empty()) return false;
  if (IsNormalAbsolute(fname)) return dir.Contains(fname);
  return Resolve(std::string(fname), side).ok();
}

Status Client::Finish(Status st, const char* op, const std::string& fname) const {
  // The library stays silent unless asked: errors travel as return codes
  // and dyad_last_error().
  if (!st.ok() && config_.debug && st.code() != DYAD_RC_UNTRACKED)
    std::fprintf(stderr, "dyad[%d]: %s '%s': %s\n", static_cast<int>(::getpid()), op, fname.c_str(),
                 st.ToString().c_str());
  return st;
}

Deadline Client::WaitDeadline() const {
  if (config_.consume_timeout_ms < 0 || config_.rpc_timeout_ms < 0) return Deadline::Never();
  return Deadline::AfterMs(SaturatingAddMs(config_.consume_timeout_ms, config_.rpc_timeout_ms));
}

Status Client::ProduceUntraced(const std::string& fname) {
  Result<std::string> upath = Resolve(fname, Side::kProducer);
  if (!upath.ok()) return Finish(upath.status(), "produce", fname);
  const std::string path = prod_.given() + "/" + *upath;

  struct stat st;
  if (config_.fsync_write) {
    // Data first, then the directory entry, so that a published file
    // survives a node crash (https://lwn.net/Articles/457671/).
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd.valid())
      return Finish(StatusFromErrno(errno, "open '" + path + "'", DYAD_RC_BADFIO), "produce",
                    fname);
    if (::fstat(fd.get(), &st) != 0)
      return Finish(StatusFromErrno(errno, "stat '" + path + "'", DYAD_RC_BADFIO), "produce",
                    fname);
    if (S_ISREG(st.st_mode)) {
      if (::fsync(fd.get()) != 0)
        return Finish(StatusFromErrno(errno, "fsync '" + path + "'", DYAD_RC_BADFIO), "produce",
                      fname);
      Status ds = FsyncPath(path.substr(0, path.rfind('/')), O_DIRECTORY);
      if (!ds.ok()) return Finish(ds, "produce", fname);
    }
  } else if (::stat(path.c_str(), &st) != 0) {
    return Finish(StatusFromErrno(errno, "stat '" + path + "'", DYAD_RC_BADFIO), "produce", fname);
  }
  if (!S_ISREG(st.st_mode))
    return Finish(Status(DYAD_RC_BADFIO, "'" + path + "' is not a regular file"), "produce", fname);

  return Finish(Publish(*upath, st, std::string()), "produce", fname);
}

Status Client::Publish(const std::string& upath, const struct stat& st,
                       const std::string& adopted_copy) {
  PublishRequest req;
  req.ns = config_.kvs_namespace;
  req.key = KeyOf(upath);
  req.upath = upath;
  req.prod_path = prod_.CurrentCanonical();
  req.size = static_cast<uint64_t>(st.st_size);
  req.version = MtimeNs(st);
  req.async = config_.async_publish;
  req.adopted_copy = adopted_copy;
  Encoder e;
  req.EncodeTo(e);
  if (req.async && adopted_copy.empty()) {
    // Pipelined (publish_pipeline.h): returns once the request is in the
    // socket buffer; a failure is reported by the next produce or Flush.
    Status rs = pool_->Pipeline()->Send(e.data(), upath, RpcDeadline(), config_.rpc_timeout_ms);
    if (rs.code() == DYAD_RC_NOSERVICE) return NoModule(rs, "publish");
    if (rs.ok() && config_.check) MarkChecked();
    return rs;
  }
  // A synchronous publication must not overtake asynchronous ones still
  // queued (the same path published twice would end with the older record).
  DYAD_RETURN_IF_ERROR(FlushPublications());
  std::string body;
  Status rs = pool_->Call(MsgType::kPublish, e.data(), &body, RpcDeadline(), config_.rpc_timeout_ms,
                          "publish '" + upath + "'");
  if (rs.code() == DYAD_RC_NOSERVICE) return NoModule(rs, "publish");
  if (rs.ok() && config_.check) MarkChecked();
  return rs;
}

Status Client::FlushPublications() {
  std::shared_ptr<PublishPipeline> pipeline = pool_->PipelineIfAny();
  if (pipeline == nullptr) return Status::OK();
  return pipeline->Flush(RpcDeadline());
}

bool Client::ConsumerDirIsPrivate() {
  if (const int known = private_verdict_.load(std::memory_order_acquire); known >= 0)
    return known == 1;
  // Final once every name it looks at is: the directories exist (their
  // canonical names are cached) and the service's directory is known.
  const bool settled = cons_.resolved() && (!has_producer_path() || prod_.resolved());
  auto decide = [this, settled](bool verdict) {
    if (settled) private_verdict_.store(verdict ? 1 : 0, std::memory_order_release);
    return verdict;
  };
  const std::string cons = cons_.CurrentCanonical();
  if (config_.shared_storage) return decide(false);
  if (has_producer_path() && Overlap(prod_.CurrentCanonical(), cons)) return decide(false);
  if (const std::string* known = service_prod_path_.load(std::memory_order_acquire))
    return decide(!Overlap(*known, cons));
  // Another process on this node may produce into our consumer directory
  // (through the local service); a file there may then still be open for
  // writing. Ask the service once which directory it serves.
  Result<StatusReply> status = ServiceStatus();
  if (!status.ok()) return true;  // cannot tell: our own paths decided
  auto it = status->info.find("producer_path");
  auto* served = new std::string(it == status->info.end() ? std::string() : it->second);
  const std::string* expected = nullptr;
  if (!service_prod_path_.compare_exchange_strong(expected, served, std::memory_order_acq_rel)) {
    delete served;
    served = const_cast<std::string*>(expected);
  }
  return decide(!Overlap(*served, cons));
}

// --- StampMemo ---------------------------------------------------------------

namespace {
uint64_t CtimeNs(const struct stat& st) {
  return static_cast<uint64_t>(st.st_ctim.tv_sec) * 1000000000ull +
         static_cast<uint64_t>(st.st_ctim.tv_nsec);
}
}  // namespace

StampMemo::~StampMemo() { delete[] slots_.load(); }

size_t StampMemo::Index(const struct stat& st) {
  const uint64_t h =
      (static_cast<uint64_t>(st.st_ino) * 0x9E3779B97F4A7C15ull) ^ static_cast<uint64_t>(st.st_dev);
  return static_cast<size_t>(h >> 52) & (kSlots - 1);
}

bool StampMemo::Knows(const struct stat& st) const {
  const Slot* slots = slots_.load(std::memory_order_acquire);
  if (slots == nullptr) return false;
  const Slot& s = slots[Index(st)];
  const uint64_t seq = s.seq.load(std::memory_order_acquire);
  if (seq == 0 || (seq & 1) != 0) return false;
  const bool same = s.ino.load(std::memory_order_relaxed) == static_cast<uint64_t>(st.st_ino) &&
                    s.dev.load(std::memory_order_relaxed) == static_cast<uint64_t>(st.st_dev) &&
                    s.ctime.load(std::memory_order_relaxed) == CtimeNs(st) &&
                    s.size.load(std::memory_order_relaxed) == static_cast<uint64_t>(st.st_size) &&
                    s.mtime.load(std::memory_order_relaxed) == MtimeNs(st);
  std::atomic_thread_fence(std::memory_order_acquire);
  return same && s.seq.load(std::memory_order_relaxed) == seq;
}

void StampMemo::Remember(const struct stat& st) {
  const uint64_t ctime = CtimeNs(st);
  const uint64_t now = WallNs();
  if (now < kSettledNs || ctime > now - kSettledNs) return;  // not settled yet
  Slot* slots = slots_.load(std::memory_order_acquire);
  if (slots == nullptr) {
    auto* made = new Slot[kSlots];
    if (slots_.compare_exchange_strong(slots, made, std::memory_order_acq_rel)) {
      slots = made;
    } else {
      delete[] made;  // another thread's table won; `slots` holds it
    }
  }
  Slot& s = slots[Index(st)];
  uint64_t seq = s.seq.load(std::memory_order_relaxed);
  // Another thread writing this slot: leave it to that one.
  if ((seq & 1) != 0 || !s.seq.compare_exchange_strong(seq, seq + 1, std::memory_order_acquire))
    return;
  std::atomic_thread_fence(std::memory_order_release);
  s.dev.store(static_cast<uint64_t>(st.st_dev), std::memory_order_relaxed);
  s.ino.store(static_cast<uint64_t>(st.st_ino), std::memory_order_relaxed);
  s.ctime.store(ctime, std::memory_order_relaxed);
  s.size.store(static_cast<uint64_t>(st.st_size), std::memory_order_relaxed);
  s.mtime.store(MtimeNs(st), std::memory_order_relaxed);
  s.seq.store(seq + 2, std::memory_order_release);
}

bool Client::Level1(const std::string& path) {
  if (config_.shared_storage) return false;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  return Complete(st, [&path](char* buf, size_t size) {
    return ::getxattr(path.c_str(), kVersionXattr, buf, size);
  });
}

template <typename ReadStamp>
bool Client::Complete(const struct stat& st, ReadStamp read_stamp) {
  // DYAD only links complete files into a consumer directory, so any
  // regular file in a directory no producer writes to is complete.
  if (ConsumerDirIsPrivate()) return true;
  // A copy a service placed carries its version stamp; while a revocable
  // stamp still describes the file's size and content time, nobody has
  // written to it since and its service has not learnt of a newer version,
  // so it is complete and current in any directory. One found so before
  // and unchanged since (StampMemo) needs no second look.
  if (stamp_memo_.Knows(st)) return true;
  char stamp[64];
  const ssize_t n = read_stamp(stamp, sizeof stamp);
  if (n <= 0 || !StampDescribes(std::string_view(stamp, static_cast<size_t>(n)),
                                static_cast<uint64_t>(st.st_size), MtimeNs(st)))
    return false;
  stamp_memo_.Remember(st);
  return true;
}

bool Client::ConsumeOpened(int fd, const struct stat& st) {
  if (config_.shared_storage || !S_ISREG(st.st_mode)) return false;
  DeclarePrefetchOnce();
  if (!Complete(st,
                [fd](char* buf, size_t size) { return ::fgetxattr(fd, kVersionXattr, buf, size); }))
    return false;
  if (config_.check) MarkChecked();
  return true;
}

bool Client::ConsumeOpenedInPrivateDirectory() {
  if (config_.shared_storage) return false;
  DeclarePrefetchOnce();
  if (!ConsumerDirIsPrivate()) return false;
  if (config_.check) MarkChecked();
  return true;
}

Result<std::string> Client::BeginConsume(const std::string& fname, ConsumeInfo* info) {
  Result<std::string> upath = Resolve(fname, Side::kConsumer);
  if (!upath.ok()) return upath;
  if (info != nullptr) {
    *info = ConsumeInfo{};
    info->upath = *upath;
  }
  DeclarePrefetchOnce();
  return upath;
}

Status Client::ConsumeUntraced(const std::string& fname, ConsumeInfo* info) {
  const uint64_t start = MonoNs();
  Result<std::string> upath = BeginConsume(fname, info);
  if (!upath.ok()) return Finish(upath.status(), "consume", fname);
  if (Level1(cons_.given() + "/" + *upath)) {
    if (info != nullptr) {
      info->level1 = true;
      info->elapsed_ns = MonoNs() - start;
    }
    if (config_.check) MarkChecked();
    return Status::OK();
  }
  Status st = ConsumeRequestFor(*upath, nullptr, info);
  if (info != nullptr) info->elapsed_ns = MonoNs() - start;
  return Finish(st, "consume", fname);
}

Status Client::ConsumeWithRecordUntraced(const std::string& fname, const FileRecord& record,
                                         ConsumeInfo* info) {
  const uint64_t start = MonoNs();
  Result<std::string> upath = BeginConsume(fname, info);
  if (!upath.ok()) return Finish(upath.status(), "consume", fname);
  // The copy is the record's version when it has its size and content time
  // (placement sets the mtime) and, for records with a publication counter
  // (a rewrite may keep size and mtime), the version stamp placement wrote
  // on it; without one (no user attributes, or a copy this node wrote) the
  // service's index decides, still without a transfer.
  struct stat st;
  const std::string path = cons_.given() + "/" + *upath;
  if (::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
      static_cast<uint64_t>(st.st_size) == record.size && MtimeNs(st) == record.version &&
      (record.seq == 0 || HasStamp(path, record))) {
    if (info != nullptr) {
      info->level1 = true;
      info->elapsed_ns = MonoNs() - start;
    }
    if (config_.check) MarkChecked();
    return Status::OK();
  }
  Status s = ConsumeRequestFor(*upath, &record, info);
  if (info != nullptr) info->elapsed_ns = MonoNs() - start;
  return Finish(s, "consume", fname);
}

void Client::AwaitPublications() {
  if (std::shared_ptr<PublishPipeline> pipeline = pool_->PipelineIfAny())
    pipeline->Drain(RpcDeadline());
}

Status Client::ConsumeRequestFor(const std::string& upath, const FileRecord* record,
                                 ConsumeInfo* info) {
  // A consume asks the service after this process's asynchronous
  // publications (a file it just published again must not be answered with
  // the version before).
  AwaitPublications();
  ConsumeRequest req = BuildConsumeRequest(upath, EnsureConsumerDir());
  if (record != nullptr) {
    req.have_record = true;
    req.record = *record;
    if (req.record.upath.empty()) req.record.upath = upath;
  }
  Encoder e;
  req.EncodeTo(e);
  std::string body;
  Status st = pool_->Call(MsgType::kConsume, e.data(), &body, WaitDeadline(),
                          config_.rpc_timeout_ms, "consume '" + upath + "'");
  if (!st.ok() && st.code() != DYAD_RC_NOSERVICE && st.code() != DYAD_RC_CANCELLED &&
      st.code() != DYAD_RC_TIMEOUT) {
    // The consumer directory is looked at once per client, not before
    // every consume: one removed since then is made again here, and the
    // consume asked again (a directory that cannot be made leaves the
    // service's error, as when it was looked at every time). A timeout is
    // no sign of it (and asking again would wait as long again).
    bool created = false;
    const std::string cons = EnsureConsumerDir(/*recheck=*/true, &created);
    if (created) {
      req.cons_path = cons;
      Encoder again;
      req.EncodeTo(again);
      st = pool_->Call(MsgType::kConsume, again.data(), &body, WaitDeadline(),
                       config_.rpc_timeout_ms, "consume '" + upath + "'");
    }
  }
  // No dyad.so on this broker: consume as upstream's clients do.
  if (st.code() == DYAD_RC_NOSERVICE && flux_ != nullptr)
    return ConsumeViaFlux(upath, record, config_.consume_timeout_ms, info);
  DYAD_RETURN_IF_ERROR(st);
  ConsumeReply reply;
  Decoder d(body);
  if (!reply.DecodeFrom(d))
    return Status(DYAD_RC_BADUNPACK, "consume '" + upath + "': malformed reply from dyad-service");
  if (info != nullptr) info->reply = std::move(reply);
  if (config_.check) MarkChecked();
  return Status::OK();
}

std::string Client::EnsureConsumerDir(bool recheck, bool* created) {
  // The service places files beneath the consumer directory and needs it to
  // exist; consumers often start before anything created it. Looked at
  // once: a directory removed later fails a consume, which looks again
  // (ConsumeRequestFor).
  if (created != nullptr) *created = false;
  std::string cons = cons_.CurrentCanonical();
  if (!recheck && cons_dir_seen_.load(std::memory_order_acquire)) return cons;
  if (::access(cons.c_str(), F_OK) != 0) {
    MakeDirs(cons_.given());
    cons = cons_.CurrentCanonical();
    if (created != nullptr) *created = ::access(cons.c_str(), F_OK) == 0;
  }
  cons_dir_seen_.store(true, std::memory_order_release);
  return cons;
}

ConsumeRequest Client::BuildConsumeRequest(const std::string& upath,
                                           const std::string& cons) const {
  ConsumeRequest req;
  req.ns = config_.kvs_namespace;
  req.key = KeyOf(upath);
  req.upath = upath;
  req.cons_path = cons;
  req.timeout_ms = config_.consume_timeout_ms < 0 ? -1 : config_.consume_timeout_ms;
  req.shared_storage = config_.shared_storage;
  // Unset, the service's own mode (its -m) applies: one DTL choice per node.
  const bool chosen = config_.dtl_mode_chosen || config_.dtl_mode != DefaultDtlMode();
  req.dtl_mode = chosen ? config_.dtl_mode : std::string();
  return req;
}

Result<FileRecord> Client::GetMetadataUntraced(const std::string& fname, bool wait) {
  Result<std::string> upath = Resolve(fname, Side::kConsumer);
  if (!upath.ok()) return Finish(upath.status(), "get metadata", fname);
  LocateRequest req;
  req.ns = config_.kvs_namespace;
  req.key = KeyOf(*upath);
  req.wait = wait;
  req.timeout_ms = wait ? (config_.consume_timeout_ms < 0 ? -1 : config_.consume_timeout_ms)
                        : config_.rpc_timeout_ms;
  Encoder e;
  req.EncodeTo(e);
  std::string body;
  Status st = pool_->Call(MsgType::kLocate, e.data(), &body, wait ? WaitDeadline() : RpcDeadline(),
                          config_.rpc_timeout_ms, "locate '" + *upath + "'");
  if (st.code() == DYAD_RC_NOSERVICE && flux_ != nullptr) {
    Result<FileRecord> rec = LocateViaFlux(*upath, wait, config_.consume_timeout_ms);
    if (!rec.ok()) return Finish(rec.status(), "get metadata", fname);
    return rec;
  }
  if (!st.ok()) return Finish(st, "get metadata", fname);
  Decoder d(body);
  const std::string bytes = d.Str();
  FileRecord rec;
  if (d.failed() || !FileRecord::Decode(bytes, &rec))
    return Finish(Status(DYAD_RC_BADMETADATA, "locate '" + *upath + "': malformed metadata"),
                  "get metadata", fname);
  return rec;
}

// The public operations, each one span of the DYAD_TRACE trace.
Status Client::Produce(const std::string& fname) {
  TraceSpan span("publish", "client");
  Status st = ProduceUntraced(fname);
  span.Arg("path", fname).Rc(st);
  return st;
}

Status Client::Consume(const std::string& fname, ConsumeInfo* info) {
  TraceSpan span("consume", "client");
  Status st = ConsumeUntraced(fname, info);
  span.Arg("path", fname).Rc(st);
  return st;
}

Status Client::ConsumeWithRecord(const std::string& fname, const FileRecord& record,
                                 ConsumeInfo* info) {
  TraceSpan span("consume", "client");
  Status st = ConsumeWithRecordUntraced(fname, record, info);
  span.Arg("path", fname).Rc(st);
  return st;
}

Result<FileRecord> Client::GetMetadata(const std::string& fname, bool wait) {
  TraceSpan span("locate", "client");
  Result<FileRecord> r = GetMetadataUntraced(fname, wait);
  span.Arg("path", fname).Rc(r.status());
  return r;
}

Result<PeersReply> Client::Peers(const PeersRequest& req) {
  Encoder e;
  req.EncodeTo(e);
  std::string body;
  const int64_t bound =
      req.probe ? req.probe_timeout_ms + config_.rpc_timeout_ms : config_.rpc_timeout_ms;
  DYAD_RETURN_IF_ERROR(pool_->Call(MsgType::kPeers, e.data(), &body, Deadline::AfterMs(bound),
                                   config_.rpc_timeout_ms, "peers"));
  PeersReply reply;
  Decoder d(body);
  if (!reply.DecodeFrom(d)) return Status(DYAD_RC_BADUNPACK, "peers: malformed reply");
  return reply;
}

Result<StatusReply> Client::ServiceStatus() {
  std::string body;
  DYAD_RETURN_IF_ERROR(pool_->Call(MsgType::kStatus, std::string(), &body, RpcDeadline(),
                                   config_.rpc_timeout_ms, "status"));
  StatusReply reply;
  Decoder d(body);
  if (!reply.DecodeFrom(d)) return Status(DYAD_RC_BADUNPACK, "status: malformed reply");
  return reply;
}

Result<std::vector<std::pair<std::string, FileRecord>>> Client::List(
    const std::string& prefix, uint32_t limit, const std::optional<std::string>& ns) {
  ListRequest req;
  req.ns = ns.value_or(config_.kvs_namespace);
  req.path_prefix = prefix;
  req.limit = limit;
  Encoder e;
  req.EncodeTo(e);
  std::string body;
  DYAD_RETURN_IF_ERROR(
      pool_->Call(MsgType::kList, e.data(), &body, RpcDeadline(), config_.rpc_timeout_ms, "list"));
  Decoder d(body);
  const uint32_t n = d.U32();
  std::vector<std::pair<std::string, FileRecord>> out;
  for (uint32_t i = 0; i < n && !d.failed(); ++i) {
    std::string key = d.Str();
    const std::string value = d.Str();
    FileRecord rec;
    if (d.failed() || !FileRecord::Decode(value, &rec))
      return Status(DYAD_RC_BADUNPACK, "list: malformed record for key '" + key + "'");
    out.emplace_back(std::move(key), std::move(rec));
  }
  if (d.failed()) return Status(DYAD_RC_BADUNPACK, "list: malformed reply");
  return out;
}

Status Client::Ping() {
  std::string body;
  return pool_->Call(MsgType::kPing, std::string(), &body, RpcDeadline(), config_.rpc_timeout_ms,
                     "ping");
}

}  // namespace dyad
