// registry.cc: maps transport and DTL mode names to Transport instances.
//
// The list of transports is written out here rather than built by static
// initializers, so linking the static library can never silently drop a
// backend and the set is visible in one place. Everything here is a pure
// function of its arguments and safe from any thread.
#include <algorithm>
#include <cctype>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "transport/local/local_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/transport.h"
#ifdef DYAD_HAVE_UCX
#include "transport/ucx/ucx_transport.h"
#endif
#ifdef DYAD_HAVE_OFI
#include "transport/ofi/ofi_transport.h"
#endif

namespace dyad {
namespace {

std::string Lower(const std::string& s) {
  std::string out = s;
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

std::string AvailableList() {
  std::string out;
  for (const std::string& n : TransportNames()) {
    if (!out.empty()) out += ", ";
    out += n;
  }
  return out;
}

}  // namespace

std::vector<std::string> TransportNames() {
  std::vector<std::string> names = {"tcp", "local"};
#ifdef DYAD_HAVE_UCX
  names.push_back("ucx");
#endif
#ifdef DYAD_HAVE_OFI
  names.push_back("ofi");
#endif
  return names;
}

Result<std::string> TransportNameForMode(const std::string& dtl_mode) {
  const std::string mode = Lower(dtl_mode);
  // FLUX_RPC is upstream's default mode; here the fetch session is the RPC,
  // so it means the same as TCP.
  if (mode.empty() || mode == "flux_rpc" || mode == "tcp") return std::string("tcp");
  if (mode == "local") return std::string("local");
  if (mode == "ucx") {
#ifdef DYAD_HAVE_UCX
    return std::string("ucx");
#else
    return Status(DYAD_RC_BADDTLMODE,
                  "UCX transport not compiled in (build with DYAD_ENABLE_UCX=ON and libucx-dev)");
#endif
  }
  // MARGO: upstream's Margo backend pulled with RMA over libfabric; the
  // ofi transport does the same without Mercury/Margo (not packaged here).
  if (mode == "ofi" || mode == "margo") {
#ifdef DYAD_HAVE_OFI
    return std::string("ofi");
#else
    return Status(DYAD_RC_BADDTLMODE,
                  std::string(mode == "margo" ? "MARGO maps to the OFI (libfabric) transport, "
                                              : "the OFI (libfabric) transport ") +
                      "which is not compiled in (build with DYAD_ENABLE_OFI=ON and libfabric-dev)");
#endif
  }
  return Status(DYAD_RC_BADDTLMODE,
                "unknown transport '" + dtl_mode + "' (available: " + AvailableList() +
                    "; DTL modes FLUX_RPC and TCP mean tcp, MARGO means ofi)");
}

Result<std::unique_ptr<Transport>> CreateTransport(const std::string& name,
                                                   const TransportOptions& options) {
  Result<std::string> canonical = TransportNameForMode(name);
  if (!canonical.ok()) return canonical.status();
  std::unique_ptr<Transport> t;
  if (*canonical == "tcp") {
    t = std::make_unique<TcpTransport>(options);
  } else if (*canonical == "local") {
    t = std::make_unique<LocalTransport>(options);
#ifdef DYAD_HAVE_UCX
  } else if (*canonical == "ucx") {
    t = std::make_unique<UcxTransport>(options);
#endif
#ifdef DYAD_HAVE_OFI
  } else if (*canonical == "ofi") {
    Result<std::unique_ptr<Transport>> ofi = CreateOfiTransport(options);
    if (!ofi.ok()) return ofi.status();
    t = std::move(ofi).value();
#endif
  } else {
    // TransportNameForMode and this switch disagree: a programming error,
    // reported rather than crashed on.
    return Status(DYAD_RC_BADDTLMODE, "transport '" + *canonical + "' has no constructor");
  }
  return Result<std::unique_ptr<Transport>>(std::move(t));
}

}  // namespace dyad
