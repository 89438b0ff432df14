#include "transport/ofi/ofi_transport.h"

#include <rdma/fi_domain.h>

#include <algorithm>
#include <utility>

#include "common/config.h"
#include "common/fsutil.h"
#include "common/log.h"
#include "transport/host_id.h"
#include "transport/ofi/ofi_engine.h"
#include "transport/ofi/ofi_fabric.h"
#include "transport/ofi/ofi_pool.h"
#include "transport/ofi/ofi_wire.h"

namespace dyad {
namespace {

// Used when options.chunk_size is 0 (a misconfiguration, not a reason to fail).
constexpr size_t kDefaultChunk = 4u << 20;

int PoolBuffersFromEnv() {
  Result<uint64_t> v = EnvUint("DYAD_OFI_POOL_BUFFERS", OfiTransport::kDefaultPoolBuffers);
  if (!v.ok() || *v < 1 || *v > 1024) {
    DYAD_LOG_WARN("ignoring DYAD_OFI_POOL_BUFFERS (want 1..1024)");
    return OfiTransport::kDefaultPoolBuffers;
  }
  return static_cast<int>(*v);
}

// A buffer is 2 x chunk_size bytes cut into kSlots slots, each at most one
// message of the provider.
size_t SlotBytes(size_t chunk_size, size_t max_msg) {
  const size_t chunk = chunk_size > 0 ? chunk_size : kDefaultChunk;
  size_t slot = std::max<size_t>(4096, 2 * chunk / OfiTransport::kSlots);
  if (max_msg > 0) slot = std::min(slot, max_msg);
  return std::min<size_t>(slot, kOfiMaxSlotBytes);
}

}  // namespace

OfiTransport::OfiTransport(const TransportOptions& options)
    : Transport(options), config_(OfiConfig::FromEnv()), pool_buffers_(PoolBuffersFromEnv()) {}

OfiTransport::~OfiTransport() {
  if (!engine_) return;
  // No completion may reach pool memory once it is unmapped.
  engine_->fabric->Stop();
  engine_->send.reset();
  engine_->receive.reset();
}

// Opens the fabric and pools once; a failed start is retried by the next
// call (nothing is left half-built).
Result<OfiTransport::Engine*> OfiTransport::Start() const {
  MutexLock lk(start_mu_);
  if (engine_) return engine_.get();
  Result<OfiProvider> provider = ChooseOfiProvider(config_);
  if (!provider.ok()) return provider.status();
  const size_t slot = SlotBytes(options_.chunk_size, provider->choice.max_msg_size);
  Result<std::shared_ptr<OfiFabric>> fabric = OfiFabric::Open(std::move(provider).value());
  if (!fabric.ok()) return fabric.status();
  auto e = std::make_unique<Engine>();
  e->fabric = *fabric;
  e->send = std::make_unique<OfiPool>(e->fabric, OfiPool::Kind::kSend, slot, kSlots, pool_buffers_);
  e->receive =
      std::make_unique<OfiPool>(e->fabric, OfiPool::Kind::kReceive, slot, kSlots, pool_buffers_);
  engine_ = std::move(e);
  return engine_.get();
}

Status OfiTransport::Warm() {
  Result<Engine*> e = Start();
  if (!e.ok()) return e.status();
  DYAD_RETURN_IF_ERROR((*e)->receive->Preallocate());
  return (*e)->send->Preallocate();
}

std::string OfiTransport::Details() const {
  MutexLock lk(start_mu_);
  if (!engine_) return "not started";
  return engine_->fabric->Details() + "; buffers mapped: " + engine_->receive->Describe() + ", " +
         engine_->send->Describe();
}

std::string OfiTransport::SameHostOnly() const {
  MutexLock lk(start_mu_);
  if (!engine_ || !engine_->fabric->choice().same_host_only()) return "";
  return "transport ofi uses libfabric provider " + engine_->fabric->choice().provider + " (" +
         engine_->fabric->choice().reason + "), which reaches only services on this host";
}

std::string OfiTransport::Probe() const {
  Result<OfiProvider> p = ChooseOfiProvider(config_);
  if (!p.ok()) return "unavailable: " + p.status().message();
  return p->choice.Describe();
}

Result<std::string> OfiTransport::PrepareRequest() {
  Result<Engine*> e = Start();
  if (!e.ok()) return e.status();
  OfiRequestArgs args;
  args.provider = (*e)->fabric->choice().provider;
  args.host = SameHostId();
  args.slot_bytes = (*e)->receive->slot_bytes();
  args.slots = static_cast<uint32_t>((*e)->receive->slots());
  return args.Encode();
}

Result<std::string> OfiTransport::ReplyArgs(const FileSource& src) {
  OfiReplyArgs args;
  if (src.size <= kOfiInlineMaxBytes) {
    args.inline_data = true;
    args.data.resize(static_cast<size_t>(src.size));
    Status st = PreadFully(src.fd, args.data.data(), args.data.size(), 0);
    if (!st.ok()) return st.Annotate("ofi reply for '" + src.path + "'");
    return args.Encode();
  }
  Result<Engine*> e = Start();
  if (!e.ok()) return e.status();
  const OfiFabric& fabric = *(*e)->fabric;
  args.provider = fabric.choice().provider;
  args.host = SameHostId();
  args.address = fabric.address();
  args.instance = fabric.instance();
  args.slot_bytes = (*e)->send->slot_bytes();
  args.slots = static_cast<uint32_t>((*e)->send->slots());
  return args.Encode();
}

Status OfiTransport::CheckPeer(const Engine& e, const std::string& provider,
                               const std::string& host, const char* who) const {
  const OfiChoice& mine = e.fabric->choice();
  if (provider != mine.provider)
    return Status(DYAD_RC_MARGO_BAD_PROTO,
                  std::string("the ") + who + "'s service uses libfabric provider '" + provider +
                      "' and this one '" + mine.provider +
                      "': give every service the same DYAD_OFI_PROVIDER (or FI_PROVIDER)");
  if (mine.same_host_only() && (host.empty() || host != SameHostId()))
    return Status(DYAD_RC_MARGO_BAD_PROTO,
                  std::string("provider shm reaches only services on this host (same boot, pid "
                              "and mount namespaces), and the ") +
                      who + "'s service is elsewhere");
  return Status::OK();
}

Result<std::unique_ptr<OfiRegion>> OfiTransport::Register(void* addr, size_t len) {
  if (addr == nullptr || len == 0)
    return Status(DYAD_RC_BADBUF, "ofi register: empty memory range");
  Result<Engine*> e = Start();
  if (!e.ok()) return e.status();
  Result<OfiFabric::Registration> reg = (*e)->fabric->Register(addr, len, FI_READ | FI_REMOTE_READ);
  if (!reg.ok()) return reg.status();
  return std::make_unique<OfiRegion>((*e)->fabric, addr, len, *reg);
}

int OfiTransport::BuffersInUse() const {
  MutexLock lk(start_mu_);
  if (!engine_) return 0;
  return engine_->send->InUse() + engine_->receive->InUse();
}

DYAD_DEFINE_TRANSPORT_FACTORY(ofi, OfiTransport)

}  // namespace dyad
