// service_versions.cc: read-write ownership on the service side. A
// publication made from a consumer copy adopts that copy (it becomes a copy
// of the new version), and the services holding older versions are told
// (service/versions.h, docs/consistency.md).
#include <sys/stat.h>

#include "common/fsutil.h"
#include "common/log.h"
#include "service/dispatch.h"
#include "service/file_server.h"
#include "service/node_cache.h"
#include "service/peer_waits.h"
#include "service/service.h"
#include "service/versions.h"

namespace dyad {

std::set<uint32_t> Service::PreviousOwners(const std::string& ns, const std::string& key,
                                           const std::string& upath) {
  std::set<uint32_t> owners = node_cache_->OwnersOf(ns, upath);
  if (std::optional<FileRecord> known = cache_.Get(ns, key); known && known->upath == upath)
    owners.insert(known->owner_rank);
  owners.erase(opt_.rank);
  return owners;
}

// The copy must be `upath` below a consumer directory that is not (and is
// not inside or around) the producer directory: a produced file is never
// indexed as a copy, so it can never be evicted.
Status Service::AdoptCopy(const PublishRequest& req, const FileRecord& rec) {
  const std::string& copy = req.adopted_copy;
  const std::string suffix = "/" + rec.upath;
  if (copy.empty() || copy[0] != '/' || NormalizeAbsolute(copy) != copy ||
      copy.size() <= suffix.size() ||
      copy.compare(copy.size() - suffix.size(), suffix.size(), suffix) != 0)
    return Status(DYAD_RC_BADREQUEST,
                  "adopted copy '" + copy + "' is not '" + rec.upath + "' below a directory");
  const std::string root = copy.substr(0, copy.size() - suffix.size());
  if (RelativeTo(prod_real_, root) || RelativeTo(root, prod_real_)) return Status::OK();
  struct stat st;
  if (::lstat(copy.c_str(), &st) != 0 || !S_ISREG(st.st_mode))
    return Status(DYAD_RC_BADFIO, "adopted copy '" + copy + "' is not a regular file");
  node_cache_->NoteFetched(req.ns, copy, rec);
  return Status::OK();
}

// The previous owners pass the notice on to their readers; ours (when we
// owned the previous version: a producer rewriting its file) hear it now.
VersionNotices::Addressed Service::AddressNotices(const std::set<uint32_t>& owners,
                                                  const PublishRequest& req,
                                                  const FileRecord& rec) {
  const std::vector<uint32_t> readers = notices_->TakeReaders(rec.upath);
  VersionNotices::Addressed to;
  if (owners.empty() && readers.empty()) return to;
  SupersedeNotice n;
  n.ns = req.ns;
  n.key = req.key;
  n.record = rec;
  n.forward = true;
  notices_->Address(owners, n, &to);
  std::set<uint32_t> others(readers.begin(), readers.end());
  for (uint32_t o : owners) others.erase(o);
  n.forward = false;
  notices_->Address(others, n, &to);
  return to;
}

Task<void> Service::NotifyPreviousOwners(RequestContext& ctx, const std::set<uint32_t>& owners,
                                         const PublishRequest& req, const FileRecord& rec) {
  VersionNotices::Addressed to = AddressNotices(owners, req, rec);
  if (to.empty()) co_return;
  PeerWaits waits(*runtime_, ctx.stop, &stats_, "notices.parked_for_peer");
  co_await notices_->Send(std::move(to), rec.upath, waits);
}

// A notice is a claim by whoever holds the cluster credential; the store
// is where publications are decided. The notice is acted on only when the
// store's record for its key is the very version it names, and then with
// the store's record: a forged notice (a version that was never published,
// a publication clock of 2^64-1) or a replayed older one (the store holds
// a later version) changes nothing here.
Task<Result<FileRecord>> Service::ConfirmNotice(const SupersedeNotice& n) {
  Result<std::optional<std::string>> stored = co_await kvs_->GetTask(*runtime_, n.ns, n.key);
  if (!stored.ok())
    co_return Status(stored.status().code(), "cannot confirm the notice for '" + n.record.upath +
                                                 "' with the store: " + stored.status().message());
  FileRecord rec;
  if (!stored->has_value())
    co_return Status(DYAD_RC_STALE, "notice for '" + n.record.upath +
                                        "' not confirmed: the store has no record for its key; "
                                        "nothing changed");
  if (!FileRecord::Decode(**stored, &rec) || rec.upath != n.record.upath)
    co_return Status(DYAD_RC_STALE, "notice for '" + n.record.upath +
                                        "' not confirmed: the store's record under its key is "
                                        "another file's; nothing changed");
  if (IdOf(rec) != IdOf(n.record))
    co_return Status(DYAD_RC_STALE,
                     "notice for '" + n.record.upath + "' (rank " +
                         std::to_string(n.record.owner_rank) + ", publication " +
                         std::to_string(n.record.seq) +
                         ") not confirmed: the store's record is another version (rank " +
                         std::to_string(rec.owner_rank) + ", publication " +
                         std::to_string(rec.seq) + "); nothing changed");
  co_return rec;
}

Task<void> Service::HandleSupersede(RequestContext& ctx, SupersedeNotice n) {
  Channel& ch = ctx.ch;
  Result<std::string> upath = ValidateUpath(n.record.upath);
  if (!upath.ok() || *upath != n.record.upath || n.ns == kMembersNamespace || n.key.empty()) {
    Reply(ch, Status(DYAD_RC_BADREQUEST, "invalid supersede notice"));
    co_return;
  }
  Result<FileRecord> confirmed = co_await ConfirmNotice(n);
  if (!confirmed.ok()) {
    stats_.AddNamed("notices.unconfirmed");
    DYAD_LOG_WARN("ignored a supersede notice from rank %u: %s",
                  ctx.peer != nullptr ? ctx.peer->rank : 0u, confirmed.status().ToString().c_str());
    Reply(ch, confirmed.status());
    co_return;
  }
  stats_.AddNamed("notices.confirmed");
  n.record = *confirmed;
  cache_.Put(n.ns, n.key, n.record);
  node_cache_->Supersede(n.ns, n.record);
  if (n.forward) {
    const std::vector<uint32_t> readers = notices_->TakeReaders(n.record.upath);
    std::set<uint32_t> ranks(readers.begin(), readers.end());
    if (ctx.peer != nullptr) ranks.erase(ctx.peer->rank);
    ranks.erase(n.record.owner_rank);
    n.forward = false;
    VersionNotices::Addressed to;
    notices_->Address(ranks, n, &to);
    if (!to.empty()) {
      PeerWaits waits(*runtime_, ctx.stop, &stats_, "notices.parked_for_peer");
      co_await notices_->Send(std::move(to), n.record.upath, waits);
    }
  }
  Reply(ch, Status::OK());
}

}  // namespace dyad
