// backend.h: one row per backend (data transports and metadata stores).
//
// A backend lives in one folder (src/transport/<name>/ or src/kvs/<name>/)
// holding its sources, a CMakeLists.txt that calls dyad_backend() (its build
// switch and dependencies, cmake/DyadBackend.cmake) and a row.cc that
// defines its BackendRow: name, the names users select it by (DTL modes or
// URL schemes), capabilities, configuration entries and build switch.
// CMake lists the folders it found in a generated file, so nothing outside
// the folder names a backend: mode parsing in the client and the service,
// the configuration table, `dyad info`, the conformance suites and the docs'
// tables all read these rows. pydyad's DTLMode enum (python/pydyad/
// bindings.py) spells upstream's names by hand; common_backend_rows_test
// checks that every value it names is a mode of these rows.
//
// Rows are compiled into every program, also where the backend itself is
// not (`built` says which): the client can then tell "unknown mode" from
// "not compiled into this build" and name the switch that adds it.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace dyad {

// What the core may rely on when it picks a transport. Read through the
// row (Transport::caps() returns its row's), never by comparing names.
struct TransportCaps {
  bool data_on_session = false;     // file bytes travel on the fetch session
  bool zero_copy_send = false;      // sender avoids user-space copies
  bool rma_put = false;             // one-sided put into the requester's memory
  bool rma_get = false;             // one-sided get from the owner's memory
  bool needs_registration = false;  // moves data through registered buffers
  bool same_node_only = false;      // only between services sharing a node
};

// Files up to this size, on a transport whose bytes travel on the fetch
// session (data_on_session), are read into memory and sent with the
// channel's ordinary sends, never sendfile(2): the owner can then gather
// its reply, the bytes and its verdict into one write, so the requester
// wakes once per small file instead of once per frame.
constexpr uint64_t kGatheredFileBytes = 64u << 10;

struct KvsCaps {
  bool persistent = false;         // survives restarts of the store
  bool shared = false;             // visible to every node (false: this process only)
  bool native_wait = false;        // waits are pushed by the store, not sliced requests
  bool hosted_by_service = false;  // the root dyad-service itself hosts it
  bool async_wait = false;         // Kvs::StartWait: waits that hold no thread
  bool watch = false;              // Kvs::Watch: pushed feed of a namespace's puts
};

// Capability sets for rows, by naming the flags that are on:
//   TransportCapsWith({&TransportCaps::same_node_only})
template <typename Caps>
Caps CapsWith(std::initializer_list<bool Caps::*> on) {
  Caps c;
  for (bool Caps::*flag : on) c.*flag = true;
  return c;
}
inline TransportCaps TransportCapsWith(std::initializer_list<bool TransportCaps::*> on) {
  return CapsWith<TransportCaps>(on);
}
inline KvsCaps KvsCapsWith(std::initializer_list<bool KvsCaps::*> on) {
  return CapsWith<KvsCaps>(on);
}

enum class BackendKind { kTransport, kStore };

struct BackendRow {
  BackendKind kind;
  const char* name;  // "tcp", "ucx", "redis", ...
  // How users select it: DTL modes (upper case, e.g. "UCX") for transports,
  // URL forms for stores ("redis://", "memory", ...). The first is canonical.
  std::vector<const char*> selectors;
  // Modes accepted for compatibility that say what they map to (MARGO -> ofi).
  std::vector<const char*> aliases;
  const char* summary;
  TransportCaps transport_caps;
  KvsCaps store_caps;
  std::vector<ConfigEntry> config;  // environment variables it reads
  const char* build_switch;         // CMake option ("" = always built)
  const char* needs;                // Debian packages it builds against ("" = none)
  bool built;                       // compiled into this build
};

// Every row, transports first, each kind in folder order.
const std::vector<const BackendRow*>& BackendRows();
std::vector<const BackendRow*> RowsOf(BackendKind kind);
// Names of the backends of `kind` compiled into this build.
std::vector<std::string> BuiltNames(BackendKind kind);
const BackendRow* FindRow(BackendKind kind, const std::string& name);

// The DTL mode used when neither the client nor the service names one
// (the default of DYAD_DTL_MODE in the configuration table).
std::string DefaultDtlMode();
// The transport row a DTL mode selects (any case; aliases accepted).
// Unknown modes give DYAD_RC_BADDTLMODE listing the known ones; with
// `require_built`, a mode whose backend is not compiled in gives
// DYAD_RC_BADDTLMODE naming the build switch and packages.
Result<const BackendRow*> TransportRowForMode(const std::string& mode, bool require_built);
// The canonical spelling of a DTL mode ("flux_rpc" -> "FLUX_RPC"); errors
// as TransportRowForMode without require_built.
Result<std::string> CanonicalDtlMode(const std::string& mode);
// Every DTL mode users may write, canonical first per row (dyad-service -m).
std::vector<std::string> AllDtlModes();

// The store row a metadata-store URL selects; errors as for modes
// (DYAD_RC_NOTSUP), naming the URL forms available.
Result<const BackendRow*> StoreRowForUrl(const std::string& url, bool require_built);

// The capabilities that are on, as words ("data_on_session, zero_copy_send").
std::string CapsText(const BackendRow& row);
// The docs' table of the backends of `kind` (docs/configuration.md), one
// row per backend, independent of what this build compiled in.
std::string BackendTableMarkdown(BackendKind kind);

}  // namespace dyad
