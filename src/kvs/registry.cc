// registry.cc: OpenKvs() and KvsBackendNames(), from the store rows.
//
// The factories are those of the stores compiled in, listed by CMake in
// dyad_built_stores.inc (one line per folder whose dyad_backend() was
// built); no store is named here.
#include <memory>
#include <string>
#include <vector>

#include "common/backend.h"
#include "kvs/kvs.h"

namespace dyad {

#define DYAD_BUILT_BACKEND(name) \
  Result<std::unique_ptr<Kvs>> OpenKvs_##name(const std::string& url, const KvsOptions& options);
#include "dyad_built_stores.inc"
#undef DYAD_BUILT_BACKEND

namespace {

struct Factory {
  const char* name;
  Result<std::unique_ptr<Kvs>> (*open)(const std::string&, const KvsOptions&);
};

const Factory kFactories[] = {
#define DYAD_BUILT_BACKEND(name) {#name, &OpenKvs_##name},
#include "dyad_built_stores.inc"
#undef DYAD_BUILT_BACKEND
};

}  // namespace

std::vector<std::string> KvsBackendNames() { return BuiltNames(BackendKind::kStore); }

Result<std::unique_ptr<Kvs>> OpenKvs(const std::string& url, const KvsOptions& options) {
  Result<const BackendRow*> row = StoreRowForUrl(url, true);
  if (!row.ok()) return row.status();
  for (const Factory& f : kFactories)
    if (std::string((*row)->name) == f.name) return f.open(url, options);
  return Status(DYAD_RC_NOTSUP,
                std::string("store '") + (*row)->name + "' is marked built but has no factory");
}

}  // namespace dyad
