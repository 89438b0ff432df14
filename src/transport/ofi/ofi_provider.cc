#include "transport/ofi/ofi_provider.h"

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <cstring>
#include <set>
#include <vector>

#include "common/config.h"

namespace dyad {
namespace {

// The MR modes this transport can honour: it registers whole pool buffers
// once (LOCAL: local read targets are registered too; ALLOCATED: they are
// backed before registration), announces either virtual addresses or
// offsets (VIRT_ADDR), takes whatever key the provider gives (PROV_KEY)
// and binds regions to its endpoint (ENDPOINT). RAW keys, MMU_NOTIFY,
// RMA_EVENT and HMEM are not supported, so providers needing them are not
// offered.
constexpr uint64_t kHonouredMrModes =
    FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;

struct HintsDeleter {
  void operator()(fi_info* i) const { fi_freeinfo(i); }
};

std::unique_ptr<fi_info, HintsDeleter> MakeHints(const OfiConfig& config) {
  std::unique_ptr<fi_info, HintsDeleter> h(fi_allocinfo());
  if (!h) return h;
  h->ep_attr->type = FI_EP_RDM;
  // Requesters issue reads; owners serve them. Nothing else is needed.
  h->caps = FI_RMA | FI_READ | FI_REMOTE_READ;
  // Every operation carries an fi_context2 as its context (see OfiOp).
  h->mode = FI_CONTEXT | FI_CONTEXT2;
  h->domain_attr->mr_mode = static_cast<int>(kHonouredMrModes);
  // All calls into the domain are serialized by the fabric's mutex, so
  // providers without internal locking qualify too.
  h->domain_attr->threading = FI_THREAD_DOMAIN;
  // fi_freeinfo frees these strings.
  if (!config.provider.empty()) h->fabric_attr->prov_name = ::strdup(config.provider.c_str());
  if (!config.domain.empty()) h->domain_attr->name = ::strdup(config.domain.c_str());
  return h;
}

bool IsLoopback(const fi_info* i) {
  const std::string domain = i->domain_attr->name != nullptr ? i->domain_attr->name : "";
  const std::string fabric = i->fabric_attr->name != nullptr ? i->fabric_attr->name : "";
  return domain == "lo" || fabric.rfind("127.", 0) == 0 || fabric.rfind("::1", 0) == 0;
}

// Among entries of one provider: a non-loopback domain first (the other
// services are on other hosts), then IPv4 over IPv6 (whose link-local
// addresses do not route between subnets); otherwise libfabric's order.
int Preference(const fi_info* i) {
  int score = 0;
  if (!IsLoopback(i)) score += 2;
  if (i->addr_format == FI_SOCKADDR_IN) score += 1;
  return score;
}

std::string ProviderName(const fi_info* i) {
  return i->fabric_attr->prov_name != nullptr ? i->fabric_attr->prov_name : "?";
}

std::string DomainName(const fi_info* i) {
  return i->domain_attr->name != nullptr ? i->domain_attr->name : "";
}

// True when `i` is on the domain DYAD_OFI_DOMAIN asks for (any when unset).
// Layered providers (tcp;ofi_rxm) ignore the domain in the hints, so the
// list must be filtered here.
bool OnDomain(const fi_info* i, const OfiConfig& config) {
  return config.domain.empty() || DomainName(i) == config.domain;
}

// The entry to use and why, from libfabric's ranked list; nullptr when no
// entry fits (`*reason` then says why).
const fi_info* Pick(const fi_info* list, const OfiConfig& config, std::string* reason) {
  std::string provider;
  if (!config.provider.empty()) {
    provider = ProviderName(list);
    *reason = config.provider_source + "=" + config.provider;
  } else {
    for (const fi_info* i = list; i != nullptr && provider.empty(); i = i->next) {
      if (ProviderName(i) != "shm" && OnDomain(i, config)) provider = ProviderName(i);
    }
    if (provider.empty()) {
      *reason = "";
      return nullptr;  // only shm (it cannot reach other hosts), or not on the domain
    }
    *reason = "automatic: the highest-ranked provider with RMA reads that reaches other hosts";
  }
  const fi_info* best = nullptr;
  for (const fi_info* i = list; i != nullptr; i = i->next) {
    if (ProviderName(i) != provider || !OnDomain(i, config)) continue;
    if (best == nullptr || Preference(i) > Preference(best)) best = i;
  }
  if (!config.domain.empty()) *reason += ", DYAD_OFI_DOMAIN=" + config.domain;
  return best;
}

// "eth0, lo" for the entries of `list` (of `provider` when not empty).
std::string OfferedDomains(const fi_info* list, const std::string& provider) {
  std::set<std::string> names;
  for (const fi_info* i = list; i != nullptr; i = i->next)
    if (provider.empty() || ProviderName(i) == provider) names.insert(DomainName(i));
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

std::string Offered(const fi_info* list) {
  std::set<std::string> names;
  for (const fi_info* i = list; i != nullptr; i = i->next) names.insert(ProviderName(i));
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "none" : out;
}

OfiChoice Describe(const fi_info* i, std::string reason) {
  OfiChoice c;
  c.provider = ProviderName(i);
  c.fabric = i->fabric_attr->name != nullptr ? i->fabric_attr->name : "";
  c.domain = i->domain_attr->name != nullptr ? i->domain_attr->name : "";
  c.reason = std::move(reason);
  c.mr_mode = static_cast<uint64_t>(i->domain_attr->mr_mode);
  c.inject_size = i->tx_attr->inject_size;
  c.max_msg_size = i->ep_attr->max_msg_size;
  c.mr_key_size = i->domain_attr->mr_key_size;
  c.addr_format = i->addr_format;
  c.manual_progress = i->domain_attr->data_progress == FI_PROGRESS_MANUAL;
  return c;
}

std::string HumanBytes(uint64_t n) {
  if (n >= (uint64_t{1} << 60)) return "unlimited";
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (u < 5 && n >= 1024 && n % 1024 == 0) {
    n /= 1024;
    ++u;
  }
  return std::to_string(n) + " " + kUnits[u];
}

}  // namespace

void OfiInfoDeleter::operator()(fi_info* info) const { fi_freeinfo(info); }

uint32_t OfiApiVersion() { return FI_VERSION(FI_MAJOR_VERSION, FI_MINOR_VERSION); }

OfiConfig OfiConfig::FromEnv() {
  OfiConfig c;
  if (auto v = GetEnv("DYAD_OFI_PROVIDER"); v && !v->empty()) {
    c.provider = *v;
    c.provider_source = "DYAD_OFI_PROVIDER";
  } else if (auto f = GetEnv("FI_PROVIDER"); f && !f->empty()) {
    c.provider = *f;
    c.provider_source = "FI_PROVIDER";
  }
  if (auto d = GetEnv("DYAD_OFI_DOMAIN"); d && !d->empty()) c.domain = *d;
  return c;
}

Result<OfiProvider> ChooseOfiProvider(const OfiConfig& config) {
  DYAD_RETURN_IF_ERROR(LoadOfiLibrary());
  auto hints = MakeHints(config);
  if (!hints) return Status(DYAD_RC_MARGOINIT_FAIL, "fi_allocinfo failed");
  fi_info* list = nullptr;
  const int rc = fi_getinfo(OfiApiVersion(), nullptr, nullptr, 0, hints.get(), &list);
  OfiInfoPtr owned(list);
  const std::string asked = config.provider.empty()
                                ? std::string()
                                : " '" + config.provider + "' (" + config.provider_source + ")";
  if (rc != 0 || list == nullptr)
    return Status(DYAD_RC_MARGO_BAD_PROTO,
                  "no libfabric provider" + asked +
                      " offers reliable-datagram endpoints with RMA reads" +
                      (config.domain.empty() ? "" : " on domain '" + config.domain + "'") + " (" +
                      OfiError("fi_getinfo", rc) +
                      "); `fi_info -t FI_EP_RDM -c FI_RMA` lists "
                      "what this host offers");
  std::string reason;
  const fi_info* picked = Pick(list, config, &reason);
  if (picked == nullptr && !config.domain.empty()) {
    const std::string provider = config.provider.empty() ? std::string() : ProviderName(list);
    return Status(DYAD_RC_MARGO_BAD_PROTO,
                  "DYAD_OFI_DOMAIN=" + config.domain + ": no libfabric " +
                      (provider.empty() ? std::string("provider") : "provider '" + provider + "'") +
                      " with RMA reads offers that domain; domains offered: " +
                      OfferedDomains(list, provider) +
                      " (unset DYAD_OFI_DOMAIN to choose automatically; `fi_info -t FI_EP_RDM -c "
                      "FI_RMA` lists them)");
  }
  if (picked == nullptr)
    return Status(DYAD_RC_MARGO_BAD_PROTO,
                  "only same-host libfabric providers are available (" + Offered(list) +
                      "); set DYAD_OFI_PROVIDER=shm to use one deliberately");
  OfiProvider out;
  out.info.reset(fi_dupinfo(picked));
  if (!out.info) return Status(DYAD_RC_MARGOINIT_FAIL, "fi_dupinfo failed");
  // fi_dupinfo copies one entry; it must not point into the list freed below.
  out.info->next = nullptr;
  out.choice = Describe(picked, reason);
  return out;
}

std::string OfiMrModeNames(uint64_t mode) {
  static const std::pair<uint64_t, const char*> kNames[] = {{FI_MR_LOCAL, "local"},
                                                            {FI_MR_RAW, "raw"},
                                                            {FI_MR_VIRT_ADDR, "virt_addr"},
                                                            {FI_MR_ALLOCATED, "allocated"},
                                                            {FI_MR_PROV_KEY, "prov_key"},
                                                            {FI_MR_MMU_NOTIFY, "mmu_notify"},
                                                            {FI_MR_RMA_EVENT, "rma_event"},
                                                            {FI_MR_ENDPOINT, "endpoint"},
                                                            {FI_MR_HMEM, "hmem"}};
  std::string out;
  for (const auto& [bit, name] : kNames) {
    if ((mode & bit) != 0) out += (out.empty() ? "" : ",") + std::string(name);
  }
  return out.empty() ? "none" : out;
}

std::string OfiError(const char* what, long rc) {
  const int err = static_cast<int>(rc < 0 ? -rc : rc);
  return std::string(what) + ": " + fi_strerror(err);
}

std::string OfiChoice::Describe() const {
  return "provider " + provider + " (domain " + domain + ", fabric " + fabric + "; " + reason +
         "); RMA read yes; MR mode " + OfiMrModeNames(mr_mode) + "; inject " +
         HumanBytes(inject_size) + "; max message " + HumanBytes(max_msg_size) + "; progress " +
         (manual_progress ? "manual" : "automatic");
}

}  // namespace dyad
