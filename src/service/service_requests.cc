// service_requests.cc: the requests of the node's application processes
// (the local link): publish, locate, consume, list, remove, status.
#include <unistd.h>

#include <algorithm>

#include "common/format.h"
#include "common/log.h"
#include "common/trace.h"
#include "service/dispatch.h"
#include "service/file_server.h"
#include "service/node_cache.h"
#include "service/placement.h"
#include "service/prefetch.h"
#include "service/record_feed.h"
#include "service/server.h"
#include "service/service.h"
#include "service/transfers.h"
#include "service/transports.h"
#include "service/waits.h"

namespace dyad {

namespace {

// Membership records are written only by services (each its own): no
// local client may publish into or remove from their namespace.
Status ReservedNamespace() {
  return Status(DYAD_RC_PERM, std::string("namespace '") + kMembersNamespace +
                                  "' holds the services' membership records; clients cannot "
                                  "write it (use another DYAD_KVS_NAMESPACE)");
}

}  // namespace

void Service::RouteRequests() {
  Dispatcher& d = *dispatch_;
  d.RouteTask(Link::kLocal, MsgType::kPublish, "requests.publish", this, &Service::HandlePublish);
  d.RouteTask(Link::kLocal, MsgType::kLocate, "requests.locate", this, &Service::HandleLocate);
  d.RouteTask(Link::kLocal, MsgType::kConsume, "requests.consume", this, &Service::HandleConsume);
  d.RouteTask(Link::kLocal, MsgType::kList, "requests.list", this, &Service::HandleList);
  d.RouteTask(Link::kLocal, MsgType::kRemove, nullptr, this, &Service::HandleRemove);
  d.RouteTask(Link::kLocal, MsgType::kPeers, nullptr, this, &Service::HandlePeers);
  d.Route(Link::kLocal, MsgType::kPrefetch, nullptr, this, &Service::HandlePrefetch);
  d.RouteTask(Link::kLocal, MsgType::kConsumeBatch, nullptr, this, &Service::HandleConsumeBatch);
  d.RouteTask(Link::kPeer, MsgType::kSupersede, nullptr, this, &Service::HandleSupersede);
  // From memory, on the loop: it answers while every thread is busy.
  d.RouteInline(Link::kLocal, MsgType::kStatus, "requests.status",
                [this](RequestContext& ctx, const std::string&) { HandleStatus(ctx); });
  for (Link link : {Link::kLocal, Link::kPeer})
    dispatch_->RouteInline(
        link, MsgType::kPing, nullptr,
        [this](RequestContext& ctx, const std::string&) { Reply(ctx.ch, Status::OK()); });
  file_server_->Route(*dispatch_, opt_.serve_fetch_batch);
}

Task<void> Service::HandlePublish(RequestContext& ctx, PublishRequest req) {
  // A producer pipelining asynchronous publications is not preempted by
  // each wake-up of this loop (server.h); any other request undoes it.
  if (ctx.link == Link::kLocal) Server::PreferThroughput(req.async);
  FileRecord rec;
  std::set<uint32_t> previous;
  TraceSpan span("publish", "service");
  span.Arg("path", req.upath);
  if (PreparePublication(ctx, req, &rec, &previous)) co_return;
  const Status st = co_await kvs_->PutTask(*runtime_, req.ns, req.key, rec.Encode());
  span.Rc(st);
  if (!st.ok()) {
    Reply(ctx.ch, Status(DYAD_RC_BADCOMMIT, "publish '" + rec.upath + "': " + st.ToString()));
    co_return;
  }
  co_await NotifyPreviousOwners(ctx, previous, req, rec);
  Reply(ctx.ch, Status::OK());
}

bool Service::PreparePublication(RequestContext& ctx, const PublishRequest& req, FileRecord* out,
                                 std::set<uint32_t>* previous_out) {
  Channel& ch = ctx.ch;
  auto Replied = [this](Channel& c, const Status& st) {
    Reply(c, st);
    return true;
  };
  if (req.ns == kMembersNamespace) return Replied(ch, ReservedNamespace());
  Result<std::string> upath = ValidateUpath(req.upath);
  if (!upath.ok()) return Replied(ch, upath.status());
  if (prod_real_.empty())
    return Replied(ch,
                   Status(DYAD_RC_BADMANAGEDPATH,
                          "this dyad-service serves no producer directory; start it with the "
                          "producer path (dyad-service ... " +
                              (req.prod_path.empty() ? std::string("DIR") : req.prod_path) + ")"));
  if (req.prod_path != prod_real_)
    return Replied(ch, Status(DYAD_RC_BADMANAGEDPATH,
                              "producer path '" + req.prod_path +
                                  "' is not the directory this dyad-service serves ('" +
                                  prod_real_ + "'); set DYAD_PATH_PRODUCER to it"));
  if (req.key.empty()) return Replied(ch, Status(DYAD_RC_BADREQUEST, "empty key"));
  FileRecord& rec = *out;
  rec.owner_rank = opt_.rank;
  rec.owner_incarnation = incarnation_;
  rec.size = req.size;
  rec.version = req.version;
  if (req.adopted_copy.empty()) {
    // What is published is what a fetch would serve: never a file that a
    // symlink leads to outside the producer directory, whose size and time
    // would be advertised to the cluster, nor anything but a regular file.
    Result<struct stat> st = file_server_->StatPublished(*upath);
    if (!st.ok()) return Replied(ch, st.status().Annotate("publish '" + *upath + "'"));
    rec.size = static_cast<uint64_t>(st->st_size);
    rec.version = MtimeNs(*st);
  }
  rec.published_ns = WallNs();
  rec.upath = *upath;
  rec.seq = publish_seq_.fetch_add(1, std::memory_order_relaxed) + 1;
  std::set<uint32_t>& previous = *previous_out;
  previous = PreviousOwners(req.ns, req.key, rec.upath);
  if (!req.adopted_copy.empty()) {
    Status ast = AdoptCopy(req, rec);
    if (!ast.ok()) return Replied(ch, ast);
  }
  cache_.Put(req.ns, req.key, rec);
  // The published file itself is no copy (it may have been one, placed in
  // a consumer directory that is the producer directory); copies of an
  // earlier version on this node must not be handed out again.
  node_cache_->Forget(prod_real_ + "/" + rec.upath);
  node_cache_->Supersede(req.ns, rec);
  if (req.async) {
    // Receivers confirm a notice with the store, so the notices go once
    // the record is there (DrainAsyncPublications).
    QueueAsyncPublish(
        {req.ns, req.key, rec.Encode(), AddressNotices(previous, req, rec), rec.upath});
    return Replied(ch, Status::OK());
  }
  return false;
}

namespace {

// A lookup that ended without the key published: DYAD_RC_TIMEOUT naming
// `what` and the request's budget, keeping the store's explanation when
// it says more than "not yet" (e.g. that the root was unreachable).
Status NotPublishedWithin(const std::string& what, int64_t timeout_ms, const Status& st) {
  std::string msg = "'" + what + "' was not published within " + std::to_string(timeout_ms) + " ms";
  if (st.cause() != DYAD_RC_OK) msg += " (" + st.message() + ")";
  return Status(DYAD_RC_TIMEOUT, msg).WithCause(st.cause());
}

}  // namespace

Task<Result<FileRecord>> Service::Locate(RequestContext& ctx, const LocateArgs& a,
                                         bool* from_cache) {
  if (from_cache) *from_cache = false;
  if (std::optional<FileRecord> hit = cache_.Get(a.ns, a.key)) {
    stats_.Add(ServiceStats::kCacheHits);
    if (from_cache) *from_cache = true;
    co_return *hit;
  }
  stats_.Add(ServiceStats::kCacheMisses);
  std::optional<std::string> value = a.published;
  if (!value && a.wait) {
    // Until its publication (a task: no thread held), listed meanwhile.
    Result<std::string> w =
        co_await WaitPublished(ctx, a.ns, a.key, a.deadline, a.upath, a.cons_path);
    if (!w.ok()) co_return w.status();
    value = std::move(*w);
  }
  if (!value) {
    Result<std::optional<std::string>> v = co_await kvs_->GetTask(*runtime_, a.ns, a.key);
    if (!v.ok()) co_return v.status();
    if (!v->has_value()) co_return Status(DYAD_RC_NOTFOUND, "'" + a.key + "' is not published");
    value = std::move(**v);
  }
  FileRecord rec;
  if (!FileRecord::Decode(*value, &rec))
    co_return Status(DYAD_RC_BADMETADATA, "malformed metadata under key '" + a.key + "'");
  cache_.Put(a.ns, a.key, rec);
  node_cache_->Supersede(a.ns, rec);  // the store's word: other versions are stale
  co_return rec;
}

Task<void> Service::HandleLocate(RequestContext& ctx, LocateRequest req) {
  if (record_feed_) record_feed_->Follow(req.ns);
  TraceSpan span("locate", "service");
  span.Arg("key", req.key);
  LocateArgs a{req.ns, req.key};
  a.wait = req.wait;
  a.deadline = Deadline::AfterMs(req.timeout_ms);
  Result<FileRecord> rec = co_await Locate(ctx, a);
  span.Rc(rec.status());
  if (!rec.ok()) {
    if (rec.status().code() == DYAD_RC_TIMEOUT)
      co_return Reply(ctx.ch, NotPublishedWithin(req.key, req.timeout_ms, rec.status()));
    co_return Reply(ctx.ch, rec.status());
  }
  Encoder e;
  e.Str(rec->Encode());
  Reply(ctx.ch, Status::OK(), e.data());
}

Task<Result<ConsumeReply>> Service::Consume(RequestContext& ctx, const ConsumeRequest& req,
                                            Deadline deadline) {
  Result<FileRecord> rec = co_await ConsumeRecord(ctx, req, deadline);
  if (!rec.ok()) co_return rec.status();
  Result<ConsumeReply> r = co_await placement_->Place(PlacementFor(req, *rec), deadline, ctx.stop);
  ForgetFailedRecord(req, r);
  if (r.ok() || r.status().code() != DYAD_RC_STALE || req.have_record) co_return r;
  // A version its owner refuses is read again from the store, once.
  Result<FileRecord> again = co_await RecordAfterStale(ctx, req, *rec, r);
  if (again.ok()) {
    r = co_await placement_->Place(PlacementFor(req, *again), deadline, ctx.stop);
    ForgetFailedRecord(req, r);
  }
  co_return r;
}

Task<Result<FileRecord>> Service::RecordAfterStale(RequestContext& ctx, const ConsumeRequest& req,
                                                   const FileRecord& failed,
                                                   const Result<ConsumeReply>& r) {
  const Status none(DYAD_RC_NOTFOUND, "no other record");
  // ForgetFailedRecord dropped the cached record: this reads the store.
  Result<FileRecord> fresh = co_await Locate(ctx, LocateArgs{req.ns, req.key});
  if (!fresh.ok() || fresh->upath != failed.upath || IdOf(*fresh) == IdOf(failed)) co_return none;
  stats_.AddNamed("consume.stale_record_reread");
  DYAD_LOG_INFO(
      "'%s': the owner refused the version this service had cached (%s); the store "
      "names another, consuming that",
      failed.upath.c_str(), r.status().message().c_str());
  co_return fresh;
}

Task<Result<FileRecord>> Service::ConsumeRecord(RequestContext& ctx, const ConsumeRequest& req,
                                                std::optional<Deadline> wait_until,
                                                std::optional<std::string> published) {
  Result<std::string> upath = ValidateUpath(req.upath);
  if (!upath.ok()) co_return upath.status();
  if (req.cons_path.empty() || req.cons_path[0] != '/')
    co_return Status(DYAD_RC_BADMANAGEDPATH, "consumer path must be absolute");
  if (req.have_record) {
    FileRecord rec = req.record;
    rec.upath = *upath;
    co_return rec;
  }

  LocateArgs a{req.ns, req.key};
  a.wait = wait_until.has_value();
  a.deadline = wait_until.value_or(Deadline::AfterMs(0));
  a.upath = req.upath;
  a.cons_path = req.cons_path;
  a.published = std::move(published);
  bool from_cache = false;
  Result<FileRecord> located = co_await Locate(ctx, a, &from_cache);
  if (!located.ok()) {
    if (located.status().code() == DYAD_RC_TIMEOUT)
      co_return NotPublishedWithin(*upath, req.timeout_ms, located.status());
    co_return located.status();
  }
  FileRecord rec = std::move(*located);
  // The record must be the one of the file asked for: a record stored
  // under this key for another path (by mistake or malice) would make
  // this consume overwrite that other file.
  if (rec.upath != *upath)
    co_return Status(DYAD_RC_BADMETADATA, "the record under the key of '" + *upath +
                                              "' describes '" + rec.upath +
                                              "'; refusing it (keys and paths must match)");
  // A cached record that our local copy already matches may be outdated
  // (the producer rewrote and re-published the file): confirm it with the
  // store before declaring the copy current. Other cache hits need no
  // check, since a fetch always returns the owner's current file.
  if (from_cache && !req.shared_storage &&
      placement_->IsCurrentCopy(req.cons_path + "/" + rec.upath, rec)) {
    Result<std::optional<std::string>> fresh = co_await kvs_->GetTask(*runtime_, req.ns, req.key);
    FileRecord newer;
    if (fresh.ok() && fresh->has_value() && FileRecord::Decode(**fresh, &newer) &&
        newer.upath == rec.upath && IdOf(newer) != IdOf(rec)) {
      cache_.Put(req.ns, req.key, newer);
      node_cache_->Supersede(req.ns, newer);
      rec = newer;
    }
  }
  co_return rec;
}

PlacementRequest Service::PlacementFor(const ConsumeRequest& req, const FileRecord& rec) const {
  PlacementRequest preq;
  preq.record = rec;
  preq.cons_root = req.cons_path;
  preq.shared_storage = req.shared_storage;
  preq.dtl_mode = req.dtl_mode;
  preq.ns = req.ns;
  return preq;
}

void Service::ForgetFailedRecord(const ConsumeRequest& req, const Result<ConsumeReply>& r) {
  // Do not keep pointing at a copy that failed, nor at a version its owner
  // refuses (DYAD_RC_STALE): the next consume reads the store again, so no
  // record that reached the cache can pin the key.
  if (!r.ok() && (r.status().code() == DYAD_RC_BADFETCH || r.status().code() == DYAD_RC_BADFIO ||
                  r.status().code() == DYAD_RC_NOTFOUND || r.status().code() == DYAD_RC_STALE))
    cache_.Erase(req.ns, req.key);
}

Task<void> Service::HandleConsume(RequestContext& ctx, ConsumeRequest req) {
  if (record_feed_ && !req.have_record) record_feed_->Follow(req.ns);
  TraceSpan span("consume", "service");
  span.Arg("path", req.upath);
  Result<ConsumeReply> r = co_await Consume(ctx, req, Deadline::AfterMs(req.timeout_ms));
  ReplyConsume(ctx, req, r, span);
}

void Service::ReplyConsume(RequestContext& ctx, const ConsumeRequest& req,
                           const Result<ConsumeReply>& r, TraceSpan& span) {
  Channel& ch = ctx.ch;
  span.Rc(r.status());
  if (!r.ok()) {
    // A client that hung up needs no report; every other failure is one
    // the operator may have to act on, so it reaches the error log.
    if (r.status().code() != DYAD_RC_CANCELLED)
      DYAD_LOG_WARN("consume '%s' failed: %s", req.upath.c_str(), r.status().ToString().c_str());
    return Reply(ch, r.status());
  }
  if (r->transferred) span.Arg("bytes", r->bytes).Arg("transport", r->transport);
  Encoder e;
  r->EncodeTo(e);
  Reply(ch, Status::OK(), e.data());
  if (prefetch_) prefetch_->Kick();  // a consume may have freed budget for deferred prefetches
}

Task<void> Service::HandleList(RequestContext& ctx, ListRequest req) {
  Channel& ch = ctx.ch;
  // A whole namespace: the root's own store copies it, and the records
  // are decoded and filtered, on the pool, off the loop that serves
  // everything else; a remote store is waited for on the loop.
  Result<std::vector<KvsEntry>> all = Status(DYAD_RC_NOTFOUND, "not listed");
  if (kvs_->in_process())
    all = co_await runtime_->Offload([this, &req] { return kvs_->List(req.ns, "", 0); });
  else
    all = co_await kvs_->ListTask(*runtime_, req.ns, "", 0);
  if (!all.ok()) co_return Reply(ch, all.status());
  const std::string body = co_await runtime_->Offload([&req, &all] {
    std::vector<const KvsEntry*> out;
    for (const KvsEntry& kv : *all) {
      FileRecord rec;
      if (!FileRecord::Decode(kv.second, &rec)) continue;
      if (rec.upath.compare(0, req.path_prefix.size(), req.path_prefix) != 0) continue;
      out.push_back(&kv);
      if (req.limit != 0 && out.size() >= req.limit) break;
    }
    Encoder e;
    e.U32(static_cast<uint32_t>(out.size()));
    for (const KvsEntry* kv : out) e.Str(kv->first).Str(kv->second);
    return e.data();
  });
  Reply(ch, Status::OK(), body);
}

Task<void> Service::HandleRemove(RequestContext& ctx, RemoveRequest req) {
  Channel& ch = ctx.ch;
  if (req.ns == kMembersNamespace) co_return Reply(ch, ReservedNamespace());
  cache_.Erase(req.ns, req.key);
  Reply(ch, co_await kvs_->RemoveTask(*runtime_, req.ns, req.key));
}

void Service::HandleStatus(RequestContext& ctx) {
  Channel& ch = ctx.ch;
  StatusReply r;
  r.counters = stats_.Snapshot();
  r.counters["cache.entries"] = cache_.size();
  if (server_) {
    r.counters["connections.open"] = server_->live();
    r.counters["connections.handshaking"] = server_->unauthenticated();
    r.counters["requests.parked"] = server_->parked();
  }
  if (runtime_) {
    // Parked consumes whose owner (or whose file's other consumer) has
    // not answered yet.
    r.counters["consume.waiting_on_owner"] = runtime_->long_waits.load();
  }
  if (peers_) {
    // New sessions to other services being dialled, and requests waiting
    // for one of those dials (one dial per service at a time).
    r.counters["peers.dialing"] = peers_->dials_in_flight();
    r.counters["peers.waiting_on_dial"] = peers_->waiting_on_dial();
  }
  r.counters["fetch.unsent_bytes"] = file_server_->unsent_bytes();
  r.counters["node_cache.bytes"] = node_cache_->bytes();
  r.counters["node_cache.pinned_bytes"] = node_cache_->pinned_bytes();
  r.counters["node_cache.files"] = node_cache_->files();
  r.counters["node_cache.budget"] = node_cache_->budget();
  r.counters["records.followed"] = node_cache_->followed_namespaces();
  if (prefetch_) prefetch_->AddCounters(&r.counters);
  r.info["version"] = DYAD_VERSION;
  r.info["rank"] = std::to_string(opt_.rank);
  r.info["node"] = std::to_string(node_idx_);
  r.info["incarnation"] = Hex64(incarnation_);
  r.info["host"] = hostname_;
  r.info["pid"] = std::to_string(getpid());
  r.info["address"] = advertise_;
  r.info["socket"] = opt_.socket_path;
  r.info["producer_path"] = prod_real_;
  r.info["kvs"] = StoreDescription();
  r.info["transport"] = transports_->Default().name();
  if (std::string d = transports_->Default().Details(); !d.empty()) r.info["transport.details"] = d;
  r.info["credentials"] = auth_->credential_names();
  r.info["link_protection"] = LinkProtectionDescription(auth_->protection());
  r.info["uptime_s"] = std::to_string((WallNs() - started_ns_) / 1000000000ull);
  r.transfers = transfers_in_flight_->Snapshot();
  // Every request waiting for a publication, and whether its file is here
  // unpublished (a reader hung on a file written outside DYAD).
  r.waits = waits_->Snapshot();
  uint64_t unpublished = 0, oldest_ns = 0;
  for (const WaitInfo& w : r.waits) {
    if (!w.local.empty()) ++unpublished;
    oldest_ns = std::max(oldest_ns, w.age_ns);
  }
  r.counters["waits.publication"] = r.waits.size();
  r.counters["waits.publication.unpublished_local"] = unpublished;
  r.counters["waits.publication.oldest_s"] = oldest_ns / 1000000000ull;
  Encoder e;
  r.EncodeTo(e);
  Reply(ch, Status::OK(), e.data());
}

}  // namespace dyad
