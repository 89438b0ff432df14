// client_flux.cc: dyad::Client on a Flux node whose broker runs no dyad.so
// module (docs/flux.md, "Consumers on nodes without the module").
//
// The consume does what upstream DYAD's consumers do, with our guarantees:
// the record is looked up in the instance's KVS with FLUX_KVS_WAITCREATE
// (bounded by DYAD_CONSUME_TIMEOUT, interruptible), the bytes come from a
// streaming `dyad.fetch` RPC to the owner's module (each response within
// DYAD_RPC_TIMEOUT), land in a hidden temporary beside the final path, and
// are renamed into place only when complete and of the record's size (no
// torn reads). The copy carries the producer's mtime and the version stamp
// a service placement writes, so later consumes (with or without a
// service) recognize it as current.
#include <sys/stat.h>
#include <sys/xattr.h>

#include <cctype>
#include <cstdlib>

#include "client/client.h"
#include "common/fsutil.h"
#include "kvs/flux/flux_keys.h"

namespace dyad {
namespace {

// A record whose size is not known (an upstream module's: the rank only).
constexpr uint64_t kUnknownSize = UINT64_MAX;

// Upstream's modules publish the owner's rank alone, as a JSON integer.
bool ParseRank(const std::string& text, uint32_t* rank) {
  size_t i = 0;
  while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
  size_t j = text.size();
  // (a value written by flux's string functions ends in its NUL)
  while (j > i && (text[j - 1] == '\0' || std::isspace(static_cast<unsigned char>(text[j - 1]))))
    --j;
  if (i == j || j - i > 10) return false;
  uint64_t v = 0;
  for (size_t k = i; k < j; ++k) {
    if (!std::isdigit(static_cast<unsigned char>(text[k]))) return false;
    v = v * 10 + static_cast<uint64_t>(text[k] - '0');
  }
  if (v > UINT32_MAX) return false;
  *rank = static_cast<uint32_t>(v);
  return true;
}

}  // namespace

Status Client::NoModule(const Status& st, const char* op) const {
  if (flux_ == nullptr) return st;
  return Status(DYAD_RC_NOSERVICE,
                std::string(op) + " needs the dyad module on this node's Flux broker, and none " +
                    "answers at '" + pool_->socket_path() + "': load it with `flux module load " +
                    "dyad.so " + (has_producer_path() ? prod_.given() : "PRODUCER_DIR") +
                    "` (or `dyad start -p DIR` for every broker); without it this node can " +
                    "only consume");
}

Result<FileRecord> Client::LocateViaFlux(const std::string& upath, bool wait, int64_t wait_ms) {
  const std::string what = (wait ? "consume '" : "locate '") + upath + "'";
  // As the module's flux:// store lays its records out (flux_keys.h).
  const std::string key = FluxKeyPath(kFluxDefaultTopDir, KeyOf(upath));
  // A wait of 0 takes only what is published already (a plain lookup).
  const bool waitcreate = wait && wait_ms != 0;
  const Deadline deadline =
      waitcreate ? Deadline::AfterMs(wait_ms < 0 ? -1 : wait_ms) : RpcDeadline();
  Result<std::string> value =
      flux_->Lookup(FluxNamespace(config_.kvs_namespace), key, waitcreate, deadline, what);
  if (!value.ok()) {
    if (wait && !waitcreate && value.status().code() == DYAD_RC_NOTFOUND)
      return Status(DYAD_RC_TIMEOUT, what + ": not published yet (a wait of 0)");
    if (value.status().code() == DYAD_RC_TIMEOUT)
      return Status(DYAD_RC_TIMEOUT, what + ": not published within DYAD_CONSUME_TIMEOUT (" +
                                         std::to_string(wait_ms) + " ms; looked up '" + key +
                                         "' in the Flux KVS)");
    return value.status();
  }
  FileRecord rec;
  if (FluxDecodeFileRecord(*value, &rec)) {
    if (rec.upath.empty()) rec.upath = upath;
    return rec;
  }
  uint32_t rank = 0;
  if (ParseRank(*value, &rank)) {
    // An upstream module's record: the owner, nothing more (size and
    // version unknown, so neither is checked).
    rec.owner_rank = rank;
    rec.upath = upath;
    rec.size = kUnknownSize;
    return rec;
  }
  return Status(DYAD_RC_BADMETADATA,
                what + ": the Flux KVS value of '" + key + "' is not a DYAD record");
}

Status Client::ConsumeViaFlux(const std::string& upath, const FileRecord* record, int64_t wait_ms,
                              ConsumeInfo* info) {
  const std::string what = "consume '" + upath + "'";
  FileRecord rec;
  if (record != nullptr) {
    rec = *record;
    if (rec.upath.empty()) rec.upath = upath;
  } else {
    Result<FileRecord> found = LocateViaFlux(upath, true, wait_ms);
    if (!found.ok()) return found.status();
    rec = std::move(*found);
  }
  if (config_.shared_storage) {
    // DYAD_SHARED_STORAGE: the producer's file is visible here already;
    // only the publication was awaited, as the service does.
    if (info != nullptr) info->reply.record = rec;
    if (config_.check) MarkChecked();
    return Status::OK();
  }
  const bool size_known = rec.size != kUnknownSize;
  const std::string cons = EnsureConsumerDir(/*recheck=*/true);  // the slow path: each time
  const std::string path = cons + "/" + upath;
  if (info != nullptr) {
    info->reply = ConsumeReply{};
    info->reply.record = rec;
    info->reply.transport = "flux";
  }
  // A copy of this very version is here already (placed by an earlier
  // consume): nothing to move.
  struct stat st;
  if (size_known && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
      static_cast<uint64_t>(st.st_size) == rec.size && MtimeNs(st) == rec.version) {
    if (rec.seq == 0 || HasStamp(path, rec)) {
      if (info != nullptr) info->reply.local = true;
      if (config_.check) MarkChecked();
      return Status::OK();
    }
  }
  AtomicFile out;
  DYAD_RETURN_IF_ERROR(out.Create(cons, upath).Annotate(what));
  const uint64_t t0 = MonoNs();
  // The whole transfer has no limit (files of any size); each response
  // must come within DYAD_RPC_TIMEOUT.
  Result<uint64_t> got = flux_->Fetch(rec.owner_rank, rec.upath, out.fd(), Deadline::Never(),
                                      config_.rpc_timeout_ms, what);
  if (!got.ok()) return got.status();  // the temporary goes with `out`
  if (size_known && *got != rec.size)
    return Status(DYAD_RC_STALE, what + ": " + std::to_string(*got) + " bytes arrived from rank " +
                                     std::to_string(rec.owner_rank) + ", its record says " +
                                     std::to_string(rec.size) + "; nothing was placed");
  FileRecord placed = rec;
  placed.size = *got;
  if (size_known) {
    // Best effort, as a service placement: without user attributes a
    // later consume compares size and mtime only.
    const std::string stamp = VersionStamp(placed);
    (void)::fsetxattr(out.fd(), kVersionXattr, stamp.data(), stamp.size(), 0);
  }
  DYAD_RETURN_IF_ERROR(out.Commit(placed.version, config_.fsync_write, 0644).Annotate(what));
  if (info != nullptr) {
    info->reply.record = placed;
    info->reply.transferred = true;
    info->reply.bytes = *got;
    info->reply.transfer_ns = MonoNs() - t0;
  }
  if (config_.check) MarkChecked();
  return Status::OK();
}

}  // namespace dyad
