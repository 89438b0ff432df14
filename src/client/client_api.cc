// client_api.cc: dyad::client::Client (dyad/client/dyad_client.hpp), the
// public face of dyad::Client, in libdyad_ctx.
//
// A public Client is a handle on one internal dyad::Client; this file only
// converts between the public plain types and the internal ones
// (ClientConfig, FileRecord, the protocol replies) and keeps exceptions
// (std::bad_alloc) from crossing the public API.
#include "dyad/client/dyad_client.hpp"

#include <exception>
#include <new>
#include <utility>

#include "client/client.h"
#include "client/ctx_internal.h"
#include "client/service_pool.h"

namespace dyad {
namespace client {

class Client::Impl {
 public:
  explicit Impl(std::shared_ptr<::dyad::Client> c) : core(std::move(c)) {}
  const std::shared_ptr<::dyad::Client> core;
};

namespace {

Status Public(const ::dyad::Status& st) { return Status(st.code(), st.message()); }

// Runs `body`, turning an exception (out of memory) into a Status.
template <typename F>
Status Guarded(const char* what, F&& body) noexcept {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return Status(DYAD_RC_SYSFAIL, std::string(what) + ": out of memory");
  } catch (const std::exception& e) {
    return Status(DYAD_RC_SYSFAIL, std::string(what) + ": " + e.what());
  } catch (...) {
    return Status(DYAD_RC_SYSFAIL, what);
  }
}

Status NoClient() {
  return Status(DYAD_RC_NOCTX, "empty dyad::client::Client (use Client::Create or FromEnv)");
}

ClientConfig ToConfig(const Options& o) {
  ClientConfig c;
  c.debug = o.debug;
  c.check = o.check;
  c.shared_storage = o.shared_storage;
  c.async_publish = o.async_publish;
  c.fsync_write = o.fsync_write;
  c.key_depth = o.key_depth;
  c.key_bins = o.key_bins;
  c.service_mux = o.service_mux;
  c.kvs_namespace = o.kvs_namespace;
  c.prod_managed_path = o.producer_path;
  c.cons_managed_path = o.consumer_path;
  c.relative_to_managed_path = o.relative_to_managed_path;
  c.dtl_mode = o.dtl_mode;  // "" becomes the default, not chosen (Client::Create)
  c.dtl_mode_chosen = !o.dtl_mode.empty();
  c.service_socket = o.service_socket;
  c.consume_timeout_ms = o.consume_timeout_ms;
  c.rpc_timeout_ms = o.rpc_timeout_ms;
  return c;
}

Options FromConfig(const ClientConfig& c) {
  Options o;
  o.debug = c.debug;
  o.check = c.check;
  o.shared_storage = c.shared_storage;
  o.async_publish = c.async_publish;
  o.fsync_write = c.fsync_write;
  o.key_depth = c.key_depth;
  o.key_bins = c.key_bins;
  o.service_mux = c.service_mux;
  o.kvs_namespace = c.kvs_namespace;
  o.producer_path = c.prod_managed_path;
  o.consumer_path = c.cons_managed_path;
  o.relative_to_managed_path = c.relative_to_managed_path;
  o.dtl_mode = c.dtl_mode_chosen ? c.dtl_mode : std::string();
  o.service_socket = c.service_socket;
  o.consume_timeout_ms = c.consume_timeout_ms;
  o.rpc_timeout_ms = c.rpc_timeout_ms;
  return o;
}

Metadata ToMetadata(const FileRecord& r) {
  Metadata m;
  m.path = r.upath;
  m.owner_rank = r.owner_rank;
  m.owner_incarnation = r.owner_incarnation;
  m.size = r.size;
  m.version = r.version;
  m.published_ns = r.published_ns;
  return m;
}

FileRecord ToRecord(const Metadata& m) {
  FileRecord r;
  r.upath = m.path;
  r.owner_rank = m.owner_rank;
  r.owner_incarnation = m.owner_incarnation;
  r.size = m.size;
  r.version = m.version;
  r.published_ns = m.published_ns;
  return r;
}

void ToInfo(const ::dyad::ConsumeInfo& in, ConsumeInfo* out) {
  out->path = in.upath;
  out->level1 = in.level1;
  out->transferred = in.reply.transferred;
  out->joined = in.reply.joined;
  out->local = in.reply.local;
  out->bytes = in.reply.bytes;
  out->metadata = ToMetadata(in.reply.record);
  out->elapsed_ns = in.elapsed_ns;
  out->transport = in.reply.transport;
  out->owner_address = in.reply.owner_address;
}

static_assert(static_cast<int>(PeerState::kRefused) ==
                      static_cast<int>(::dyad::PeerState::kRefused) &&
                  static_cast<int>(PeerState::kStopped) ==
                      static_cast<int>(::dyad::PeerState::kStopped),
              "the public PeerState mirrors the protocol's");

Transfer ToTransfer(const TransferInfo& t) {
  Transfer x;
  x.outgoing = t.outgoing;
  x.path = t.upath;
  x.peer_rank = t.peer_rank;
  x.transport = t.transport;
  x.bytes_done =
      t.bytes_done == TransferInfo::kUnknownBytes ? Transfer::kUnknownBytes : t.bytes_done;
  x.bytes_total = t.bytes_total;
  x.elapsed_ns = t.elapsed_ns;
  return x;
}

Peer ToPeer(const PeerInfo& p) {
  Peer x;
  x.rank = p.record.rank;
  x.node = p.record.node_idx;
  x.address = p.record.address;
  x.host = p.record.hostname;
  x.pid = p.record.pid;
  x.incarnation = p.record.incarnation;
  x.started_ns = p.record.started_ns;
  x.state = static_cast<PeerState>(p.state);
  x.last_contact_ns = p.last_contact_ns;
  x.rtt_ns = p.rtt_ns;
  x.detail = p.detail;
  return x;
}

::dyad::Side ToSide(Side s) {
  return s == Side::kProducer ? ::dyad::Side::kProducer : ::dyad::Side::kConsumer;
}

Status ToEntries(Result<std::vector<std::pair<std::string, FileRecord>>> listed,
                 std::vector<ListEntry>* out) {
  if (!listed.ok()) return Public(listed.status());
  std::vector<ListEntry> entries;
  entries.reserve(listed->size());
  for (auto& [key, rec] : *listed) entries.push_back(ListEntry{std::move(key), ToMetadata(rec)});
  if (out != nullptr) *out = std::move(entries);
  return Status();
}

}  // namespace

Status Options::FromEnv(Options* out) {
  return Guarded("read the DYAD_* environment", [&] {
    Result<ClientConfig> c = ClientConfig::FromEnv();
    if (!c.ok()) return Public(c.status());
    if (out != nullptr) *out = FromConfig(*c);
    return Status();
  });
}

Client::Client() = default;
Client::~Client() = default;
Client::Client(const Client& other) = default;
Client& Client::operator=(const Client& other) = default;
Client::Client(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Status Client::Create(const Options& options, Client* out) {
  return Guarded("create a DYAD client", [&] {
    Result<std::shared_ptr<::dyad::Client>> c = ::dyad::Client::Create(ToConfig(options));
    if (!c.ok()) return Public(c.status());
    if (out != nullptr) *out = Client(std::make_shared<Impl>(std::move(*c)));
    return Status();
  });
}

Status Client::FromEnv(Client* out) {
  return Guarded("create a DYAD client", [&] {
    Result<ClientConfig> cfg = ClientConfig::FromEnv();
    if (!cfg.ok()) return Public(cfg.status());
    Result<std::shared_ptr<::dyad::Client>> c = ::dyad::Client::Create(std::move(*cfg));
    if (!c.ok()) return Public(c.status());
    if (out != nullptr) *out = Client(std::make_shared<Impl>(std::move(*c)));
    return Status();
  });
}

Status Client::FromContext(dyad_ctx_t* ctx, Client* out) {
  return Guarded("the client of a DYAD context", [&] {
    Result<std::shared_ptr<::dyad::Client>> c = capi::ClientOf(ctx);
    if (!c.ok()) return Public(c.status());
    if (out != nullptr) *out = Client(std::make_shared<Impl>(std::move(*c)));
    return Status();
  });
}

Options Client::options() const { return impl_ ? FromConfig(impl_->core->config()) : Options(); }

bool Client::has_producer_path() const { return impl_ && impl_->core->has_producer_path(); }

bool Client::has_consumer_path() const { return impl_ && impl_->core->has_consumer_path(); }

Status Client::Resolve(const std::string& path, Side side, std::string* relative) const {
  if (!impl_) return NoClient();
  return Guarded("resolve", [&] {
    Result<std::string> r = impl_->core->Resolve(path, ToSide(side));
    if (!r.ok()) return Public(r.status());
    if (relative != nullptr) *relative = std::move(*r);
    return Status();
  });
}

bool Client::IsManaged(const char* path, Side side) const {
  if (!impl_ || path == nullptr) return false;
  try {
    return impl_->core->IsManaged(path, ToSide(side));
  } catch (...) {
    return false;  // out of memory on the slow path: treat as not DYAD's
  }
}

Status Client::Produce(const std::string& path) {
  if (!impl_) return NoClient();
  return Guarded("produce", [&] { return Public(impl_->core->Produce(path)); });
}

Status Client::Consume(const std::string& path, ConsumeInfo* info) {
  if (!impl_) return NoClient();
  return Guarded("consume", [&] {
    ::dyad::ConsumeInfo in;
    ::dyad::Status st = impl_->core->Consume(path, info != nullptr ? &in : nullptr);
    if (st.ok() && info != nullptr) ToInfo(in, info);
    return Public(st);
  });
}

Status Client::ConsumeBatch(const std::vector<std::string>& paths, std::vector<Status>* results) {
  return ConsumeBatch(paths, ::dyad::Client::kConfiguredTimeout, results);
}

Status Client::ConsumeBatch(const std::vector<std::string>& paths, int64_t timeout_ms,
                            std::vector<Status>* results) {
  if (!impl_) return NoClient();
  if (timeout_ms < 0) timeout_ms = ::dyad::Client::kConfiguredTimeout;
  return Guarded("consume batch", [&] {
    std::vector<::dyad::Status> in(paths.size(), ::dyad::Status::OK());
    ::dyad::Status st = impl_->core->ConsumeBatch(paths, &in, timeout_ms);
    if (results != nullptr) {
      results->clear();
      for (const ::dyad::Status& r : in) results->push_back(Public(r));
    }
    return Public(st);
  });
}

Status Client::Prefetch(const std::string& pattern, bool cancel, uint32_t* already_published) {
  if (!impl_) return NoClient();
  return Guarded("prefetch", [&] {
    Result<uint32_t> n = impl_->core->Prefetch(pattern, cancel);
    if (n.ok() && already_published != nullptr) *already_published = *n;
    return Public(n.status());
  });
}

Status Client::GetMetadata(const std::string& path, bool wait, Metadata* out) {
  if (!impl_) return NoClient();
  return Guarded("get metadata", [&] {
    Result<FileRecord> r = impl_->core->GetMetadata(path, wait);
    if (!r.ok()) return Public(r.status());
    if (out != nullptr) *out = ToMetadata(*r);
    return Status();
  });
}

Status Client::ConsumeWithMetadata(const std::string& path, const Metadata& metadata,
                                   ConsumeInfo* info) {
  if (!impl_) return NoClient();
  return Guarded("consume", [&] {
    ::dyad::ConsumeInfo in;
    ::dyad::Status st =
        impl_->core->ConsumeWithRecord(path, ToRecord(metadata), info != nullptr ? &in : nullptr);
    if (st.ok() && info != nullptr) ToInfo(in, info);
    return Public(st);
  });
}

Status Client::List(const std::string& prefix, uint32_t limit, std::vector<ListEntry>* out) {
  if (!impl_) return NoClient();
  return Guarded("list", [&] { return ToEntries(impl_->core->List(prefix, limit), out); });
}

Status Client::ListNamespace(const std::string& kvs_namespace, const std::string& prefix,
                             uint32_t limit, std::vector<ListEntry>* out) {
  if (!impl_) return NoClient();
  return Guarded("list",
                 [&] { return ToEntries(impl_->core->List(prefix, limit, kvs_namespace), out); });
}

Status Client::GetServiceStatus(ServiceStatus* out) { return GetServiceStatus(out, nullptr); }

Status Client::GetServiceStatus(ServiceStatus* out, std::vector<WaitingRequest>* waits) {
  if (!impl_) return NoClient();
  return Guarded("status", [&] {
    Result<StatusReply> r = impl_->core->ServiceStatus();
    if (!r.ok()) return Public(r.status());
    if (out != nullptr) {
      out->socket = impl_->core->pool()->socket_path();
      out->info = std::move(r->info);
      out->counters = std::move(r->counters);
      out->transfers.clear();
      for (const TransferInfo& t : r->transfers) out->transfers.push_back(ToTransfer(t));
    }
    if (waits != nullptr) {
      waits->clear();
      for (const WaitInfo& w : r->waits) {
        WaitingRequest q;
        q.kind = w.kind;
        q.path = w.upath;
        q.kvs_namespace = w.ns;
        q.pid = w.pid;
        q.age_ns = w.age_ns;
        q.unpublished_local_file = w.local;
        waits->push_back(std::move(q));
      }
    }
    return Status();
  });
}

Status Client::Peers(const std::vector<uint32_t>& ranks, int64_t probe_timeout_ms,
                     std::vector<Peer>* out) {
  if (!impl_) return NoClient();
  return Guarded("peers", [&] {
    PeersRequest req;
    req.probe = probe_timeout_ms > 0;
    req.probe_timeout_ms = req.probe ? probe_timeout_ms : 0;
    req.ranks = ranks;
    Result<PeersReply> r = impl_->core->Peers(req);
    if (!r.ok()) return Public(r.status());
    if (out != nullptr) {
      out->clear();
      for (const PeerInfo& p : r->peers) out->push_back(ToPeer(p));
    }
    return Status();
  });
}

// Defined here so that programs may bind it to a reference (C++11 needs it).
const uint64_t Transfer::kUnknownBytes;

const char* PeerStateName(PeerState state) {
  return ::dyad::PeerStateName(static_cast<::dyad::PeerState>(state));
}

Status Client::Ping() {
  if (!impl_) return NoClient();
  return Guarded("ping", [&] { return Public(impl_->core->Ping()); });
}

std::string Client::KeyOf(const std::string& relative_path) const {
  return impl_ ? impl_->core->KeyOf(relative_path) : std::string();
}

void SetInterruptCheck(std::function<bool()> check) { ::dyad::SetInterruptCheck(std::move(check)); }

dyad_rc_t SetLastError(const Status& status) {
  if (status.ok()) return DYAD_RC_OK;
  return capi::Fail(::dyad::Status(status.code(), status.message()));
}

}  // namespace client
}  // namespace dyad
