#include "flux/secret.h"

#include <cerrno>
#include <string>

#include "proto/auth.h"

namespace dyad {

namespace {

// The first line of the key's value, "" when the key does not exist.
Result<std::string> FirstLine(flux_t* h, double timeout_s) {
  flux_future_t* f = flux_kvs_lookup(h, nullptr, 0, kFluxSecretKey);
  const void* data = nullptr;
  size_t len = 0;
  if (f == nullptr || flux_future_wait_for(f, timeout_s) < 0 ||
      flux_kvs_lookup_get_raw(f, &data, &len) < 0) {
    const int err = errno;
    flux_future_destroy(f);
    if (err == ENOENT) return std::string();
    return StatusFromErrno(err, std::string("look up ") + kFluxSecretKey + " in the Flux KVS");
  }
  std::string v(static_cast<const char*>(data), len);
  flux_future_destroy(f);
  const size_t nl = v.find('\n');
  if (nl != std::string::npos) v.resize(nl);
  return v;
}

}  // namespace

Result<std::string> AgreeClusterSecret(flux_t* h, double timeout_s) {
  Result<std::string> have = FirstLine(h, timeout_s);
  if (!have.ok()) return have.status();
  if (have->empty()) {
    Result<std::string> fresh = NewClusterSecret();
    if (!fresh.ok()) return fresh.status();
    const std::string line = *fresh + "\n";
    flux_kvs_txn_t* txn = flux_kvs_txn_create();
    flux_future_t* f = nullptr;
    Status st;
    if (txn == nullptr ||
        flux_kvs_txn_put_raw(txn, FLUX_KVS_APPEND, kFluxSecretKey, line.data(), line.size()) < 0 ||
        (f = flux_kvs_commit(h, nullptr, 0, txn)) == nullptr ||
        flux_future_wait_for(f, timeout_s) < 0 || flux_future_get(f, nullptr) < 0)
      st = StatusFromErrno(errno, std::string("commit ") + kFluxSecretKey + " to the Flux KVS");
    flux_future_destroy(f);
    flux_kvs_txn_destroy(txn);
    if (!st.ok()) return st;
    have = FirstLine(h, timeout_s);
    if (!have.ok()) return have.status();
  }
  if (Status st = CheckSecretStrength(*have, std::string("the Flux KVS key ") + kFluxSecretKey);
      !st.ok())
    return st;
  return have;
}

}  // namespace dyad
