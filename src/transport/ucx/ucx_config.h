// ucx_config.h: how the UCX transport configures a UCX context and reads
// what the context found, and its own DYAD_UCX_* settings. Stateless
// functions; safe from any thread.
#pragma once

#include <ucp/api/ucp.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace dyad::ucx {

// Adjusts `config` before ucp_init: larger tcp segments, and every message
// eager when UCX_TLS can select no transport with native RMA (docs/ucx.md,
// "Why tagged messages and not puts"). A value the user set in the
// environment always wins. Returns whether it made every message eager.
bool TuneTcp(ucp_config_t* config);

// Whether the UCX_TLS value may select a transport with native RMA (an
// InfiniBand or RoCE transport, or shared memory with a cross-memory copy
// mechanism). Unset, "all" or an exclusion list: yes.
bool HasNativeRma(const char* tls);

// Whether the context found a network device with native RMA (any
// transport other than tcp and the same-host ones).
bool HasRmaNetwork(ucp_context_h context);

// Whether the context has a shared-memory transport whose remote keys can
// be mapped into another process (System V, POSIX or XPMEM).
bool HasMappableMemory(ucp_context_h context);

// The transport name of every resource (device) the context found.
std::vector<std::string> ResourceTransports(ucp_context_h context);

// $DYAD_UCX_SHM: false for "off" (or 0/no/false), true otherwise.
bool ShmDirectAllowed();

// $DYAD_UCX_POOL_BUFFERS (1..1024), or kDefaultPoolBuffers.
int PoolBuffersFromEnv();
constexpr int kDefaultPoolBuffers = 4;

// What a UCX print routine writes, as a string ("" when it cannot be had).
template <typename Fn>
std::string CaptureUcxInfo(Fn&& print) {
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = ::open_memstream(&buf, &len);
  if (f == nullptr) return "";
  print(f);
  std::fclose(f);
  std::string out(buf != nullptr ? buf : "", len);
  std::free(buf);
  return out;
}

}  // namespace dyad::ucx
