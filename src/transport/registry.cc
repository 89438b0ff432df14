// registry.cc: creates transports from their rows (common/backend.h).
//
// The factories are those of the backends compiled in, listed by CMake in
// dyad_built_transports.inc (one line per folder whose dyad_backend() was
// built), so linking the static library can never drop one silently and no
// backend is named here. Pure functions of their arguments; thread-safe.
#include <memory>
#include <string>
#include <vector>

#include "common/backend.h"
#include "transport/transport.h"

namespace dyad {

#define DYAD_BUILT_BACKEND(name) \
  Result<std::unique_ptr<Transport>> CreateTransport_##name(const TransportOptions&);
#include "dyad_built_transports.inc"
#undef DYAD_BUILT_BACKEND

namespace {

struct Factory {
  const char* name;
  Result<std::unique_ptr<Transport>> (*create)(const TransportOptions&);
};

const Factory kFactories[] = {
#define DYAD_BUILT_BACKEND(name) {#name, &CreateTransport_##name},
#include "dyad_built_transports.inc"
#undef DYAD_BUILT_BACKEND
};

}  // namespace

TransportCaps Transport::caps() const {
  const BackendRow* row = FindRow(BackendKind::kTransport, name());
  return row != nullptr ? row->transport_caps : TransportCaps{};
}

std::vector<std::string> TransportNames() { return BuiltNames(BackendKind::kTransport); }

Result<std::string> TransportNameForMode(const std::string& dtl_mode) {
  Result<const BackendRow*> row = TransportRowForMode(dtl_mode, true);
  if (!row.ok()) return row.status();
  return std::string((*row)->name);
}

Result<std::unique_ptr<Transport>> CreateTransport(const std::string& name,
                                                   const TransportOptions& options) {
  Result<const BackendRow*> row = TransportRowForMode(name, true);
  if (!row.ok()) return row.status();
  for (const Factory& f : kFactories)
    if (std::string((*row)->name) == f.name) return f.create(options);
  return Status(DYAD_RC_BADDTLMODE,
                std::string("transport '") + (*row)->name + "' is marked built but has no factory");
}

Result<const BackendRow*> SameNodeTransportRow() {
  for (const BackendRow* row : RowsOf(BackendKind::kTransport))
    if (row->built && row->transport_caps.same_node_only) return row;
  return Status(DYAD_RC_BADDTLMODE, "no same-node transport is compiled in");
}

}  // namespace dyad
