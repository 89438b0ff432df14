#include "transport/ucx/ucx_config.h"

#include <cstring>
#include <initializer_list>

#include "common/config.h"
#include "common/log.h"

namespace dyad::ucx {
namespace {

// Segment size asked of UCX's tcp transport (see TuneTcp).
constexpr const char* kTcpSegment = "512k";

bool StartsWithAny(const std::string& s, std::initializer_list<const char*> prefixes) {
  for (const char* p : prefixes) {
    if (s.compare(0, std::strlen(p), p) == 0) return true;
  }
  return false;
}

}  // namespace

// Over TCP, UCX sends a message as fragments of one segment each, and the
// default 8 KiB segment cuts file throughput to a fraction of plain TCP;
// 512 KiB segments recover most of it (docs/ucx.md has the figures). The
// buffers are per connection and held only while data is in flight.
// ucp_config_modify passes names it does not know to the transports'
// tables without their prefix, hence "TX_SEG_SIZE" (in UCX 1.13 only the
// tcp transport has these two fields).
bool TuneTcp(ucp_config_t* config) {
  for (const char* name : {"TX_SEG_SIZE", "RX_SEG_SIZE"}) {
    const std::string env = std::string("UCX_TCP_") + name;
    if (std::getenv(env.c_str()) != nullptr) continue;
    const ucs_status_t s = ucp_config_modify(config, name, kTcpSegment);
    if (s != UCS_OK) DYAD_LOG_DEBUG("ucx: cannot set %s: %s", name, ucs_status_string(s));
  }
  // Without native RMA, UCX 1.13's rendezvous protocol falls back to
  // emulated puts, whose acknowledgements abort the receiving process when
  // the sender died meanwhile. Eager messages of any size need nothing
  // back from the receiver.
  if (std::getenv("UCX_RNDV_THRESH") == nullptr && !HasNativeRma(std::getenv("UCX_TLS"))) {
    const ucs_status_t s = ucp_config_modify(config, "RNDV_THRESH", "inf");
    if (s == UCS_OK) return true;
    DYAD_LOG_DEBUG("ucx: cannot set RNDV_THRESH: %s", ucs_status_string(s));
  }
  return false;
}

bool HasNativeRma(const char* tls) {
  if (tls == nullptr || *tls == '\0') return true;
  const std::string list(tls);
  if (list[0] == '^') return true;  // an exclusion list
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    if (end == std::string::npos) end = list.size();
    if (StartsWithAny(list.substr(start, end - start),
                      {"all", "rc", "dc", "ud", "ib", "mlx", "sm", "shm", "cma", "knem", "xpmem",
                       "gdr", "cuda", "rocm"}))
      return true;
    start = end + 1;
  }
  return false;
}

// Messages between hosts use only such transports or tcp (the same-host
// ones cannot serve endpoints with peer error handling).
bool HasRmaNetwork(ucp_context_h context) {
  for (const std::string& tl : ResourceTransports(context)) {
    const bool local = tl.empty() || StartsWithAny(tl, {"self", "tcp", "sysv", "posix", "xpmem",
                                                        "cma", "knem", "cuda", "rocm", "gdr"});
    if (!local) return true;
  }
  return false;
}

bool HasMappableMemory(ucp_context_h context) {
  for (const std::string& tl : ResourceTransports(context)) {
    if (tl == "sysv" || tl == "posix" || tl == "xpmem") return true;
  }
  return false;
}

// From the "resource N : md M dev D flags -- tcp/eth0" lines of the
// context's info.
std::vector<std::string> ResourceTransports(ucp_context_h context) {
  const std::string info = CaptureUcxInfo([&](FILE* f) { ucp_context_print_info(context, f); });
  std::vector<std::string> out;
  for (size_t pos = 0; (pos = info.find("resource", pos)) != std::string::npos;) {
    size_t eol = info.find('\n', pos);
    if (eol == std::string::npos) eol = info.size();
    const std::string line = info.substr(pos, eol - pos);
    pos = eol;
    const size_t sp = line.find_last_of(' ');
    const std::string dev = sp == std::string::npos ? line : line.substr(sp + 1);
    out.push_back(dev.substr(0, dev.find('/')));
  }
  return out;
}

bool ShmDirectAllowed() {
  std::optional<std::string> v = GetEnv("DYAD_UCX_SHM");
  return !v || ParseBool(*v);  // "auto" (the default) and any true value allow it
}

int PoolBuffersFromEnv() {
  Result<uint64_t> v = EnvUint("DYAD_UCX_POOL_BUFFERS", kDefaultPoolBuffers);
  if (!v.ok() || *v < 1 || *v > 1024) {
    DYAD_LOG_WARN("ignoring DYAD_UCX_POOL_BUFFERS='%s' (want 1..1024)",
                  GetEnv("DYAD_UCX_POOL_BUFFERS").value_or("").c_str());
    return kDefaultPoolBuffers;
  }
  return static_cast<int>(*v);
}

}  // namespace dyad::ucx
