// ofi_provider.h: which libfabric provider and domain the "ofi" transport
// uses, and why.
//
// The choice is made once per transport from fi_getinfo(): reliable
// datagram endpoints (FI_EP_RDM, native or layered with ofi_rxm) that can
// issue and serve RMA reads, under the memory-registration modes this
// transport honours (FI_MR_LOCAL, FI_MR_VIRT_ADDR, FI_MR_ALLOCATED,
// FI_MR_PROV_KEY, FI_MR_ENDPOINT). A provider named by $DYAD_OFI_PROVIDER,
// else by $FI_PROVIDER (which libfabric itself honours too), is used as
// asked; otherwise the first provider libfabric ranks highest that reaches
// other hosts (shm does not), on a non-loopback domain when there is one.
// $DYAD_OFI_DOMAIN picks one domain (a NIC or interface: mlx5_0, cxi0,
// eth0). Everything here is a pure function of the environment and
// libfabric's answer, safe from any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

struct fi_info;

namespace dyad {

struct OfiConfig {
  std::string provider;         // requested provider; "" = choose automatically
  std::string provider_source;  // "DYAD_OFI_PROVIDER" or "FI_PROVIDER" when requested
  std::string domain;           // requested domain; "" = any
  static OfiConfig FromEnv();
};

// The provider chosen and what it offers (shown by `dyad status`/`dyad info`).
struct OfiChoice {
  std::string provider;  // e.g. "tcp;ofi_rxm", "shm", "verbs;ofi_rxm", "cxi", "efa"
  std::string fabric;    // e.g. the IP subnet for tcp
  std::string domain;    // e.g. "eth0", "mlx5_0", "shm"
  std::string reason;    // why this one
  uint64_t mr_mode = 0;
  size_t inject_size = 0;
  size_t max_msg_size = 0;
  size_t mr_key_size = 0;
  uint32_t addr_format = 0;
  bool manual_progress = false;  // data moves only while someone reads the CQ
  // A provider that only reaches processes on this host.
  bool same_host_only() const { return provider == "shm"; }
  std::string Describe() const;
};

struct OfiInfoDeleter {
  void operator()(fi_info* info) const;
};
using OfiInfoPtr = std::unique_ptr<fi_info, OfiInfoDeleter>;

struct OfiProvider {
  OfiInfoPtr info;  // the chosen entry alone (what fi_fabric/fi_domain/fi_endpoint take)
  OfiChoice choice;
};

// Opens libfabric (ofi_library.cc: on first use, not at the program's
// start). DYAD_RC_MARGOINIT_FAIL names what is missing.
Status LoadOfiLibrary();

// Chooses per `config` (opening libfabric first). No fitting provider gives
// DYAD_RC_MARGO_BAD_PROTO (upstream's "protocol not available", the role
// this transport plays).
Result<OfiProvider> ChooseOfiProvider(const OfiConfig& config);

// The libfabric API version this transport is written against.
uint32_t OfiApiVersion();

// "local,virt_addr,prov_key" (or "none") for an MR mode bit set.
std::string OfiMrModeNames(uint64_t mode);

// "fi_read: Connection reset by peer" for a negative fabric return code.
std::string OfiError(const char* what, long rc);

}  // namespace dyad
