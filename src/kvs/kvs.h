// kvs.h: the metadata store interface (the global level of the file locator).
//
// A Kvs maps (namespace, key) to an opaque value. DYAD stores FileRecords
// under gen_path_key keys and ServiceRecords under kMembersNamespace.
// Implementations: "memory" (in-process, tests and single-node use),
// "embedded" (client of the store hosted by the root dyad-service), and
// later "redis". They are selected by URL through OpenKvs(), from an
// explicit registry (kvs/registry.cc), never by static initialization.
//
// Contract shared by all backends (tests/unit/kvs_conformance_test.cc):
//  * Put overwrites and wakes every waiter on that key;
//  * Wait returns at once if the key exists, else blocks until it is put,
//    the deadline passes (DYAD_RC_TIMEOUT) or `cancel` reports true
//    (DYAD_RC_CANCELLED); there is no lost wake-up between check and wait;
//  * namespaces are disjoint; List returns keys starting with a prefix, in
//    lexicographic order, at most `limit` (0 = all).
// All methods are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/time.h"

namespace dyad {
class Authenticator;
}

namespace dyad {

// Polled by long waits every so often (at most every 250 ms); returning true
// abandons the wait. Used to stop waiting for a client that went away.
using CancelFn = std::function<bool()>;

struct KvsCaps {
  bool persistent = false;   // survives restarts of the store
  bool shared = false;       // visible to every node (false: this process only)
  bool native_wait = false;  // waits are pushed by the store, not sliced requests
};

using KvsEntry = std::pair<std::string, std::string>;  // key, value

class Kvs {
 public:
  virtual ~Kvs() = default;
  virtual std::string name() const = 0;
  virtual KvsCaps caps() const = 0;

  virtual Status Put(const std::string& ns, const std::string& key, const std::string& value) = 0;
  virtual Result<std::optional<std::string>> Get(const std::string& ns, const std::string& key) = 0;
  virtual Result<std::string> Wait(const std::string& ns, const std::string& key,
                                   Deadline deadline, const CancelFn& cancel = nullptr) = 0;
  virtual Status Remove(const std::string& ns, const std::string& key) = 0;
  virtual Result<std::vector<KvsEntry>> List(const std::string& ns, const std::string& prefix,
                                             uint32_t limit = 0) = 0;
};

struct KvsOptions {
  std::string secret;                 // cluster secret for authenticated backends
  // How to authenticate to a remote store (credentials and link protection);
  // when null, `secret` alone with the default protection.
  std::shared_ptr<const Authenticator> auth;
  uint32_t self_rank = 0;             // identity presented to a remote store
  uint64_t self_incarnation = 0;
  int64_t rpc_timeout_ms = 60000;     // bound on one non-wait request
};

// Opens a store from a URL: "memory", "embedded://HOST:PORT", and the
// backends compiled in (see KvsBackendNames()). An unknown or not compiled-in
// scheme gives DYAD_RC_NOTSUP with a message listing what is available.
Result<std::unique_ptr<Kvs>> OpenKvs(const std::string& url, const KvsOptions& options);
std::vector<std::string> KvsBackendNames();

}  // namespace dyad
