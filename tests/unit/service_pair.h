// service_pair.h: two in-process dyad-services on loopback for unit tests,
// driven through the protocol the client library speaks (publish on A,
// consume on B). Used by the service tests of every metadata store.
// Not thread-safe itself; the services it starts are.
#pragma once

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "common/fsutil.h"
#include "common/key.h"
#include "common/net.h"
#include "kvs/kvs.h"
#include "proto/protocol.h"
#include "service/service.h"
#include "util.h"

namespace dyad {
namespace testing_services {

using testutil::Eventually;
using testutil::MakeTempDir;
using testutil::ReadAll;
using testutil::RemoveTree;
using testutil::WriteFile;

// One request on a fresh connection to a service's Unix socket.
inline Result<std::string> CallLocal(const std::string& sock, MsgType type, const std::string& req,
                                     int64_t timeout_ms = 10000) {
  Result<SocketAddress> addr = ParseAddress("unix:" + sock);
  if (!addr.ok()) return addr.status();
  Result<UniqueFd> fd = Connect(*addr, Deadline::AfterMs(2000));
  if (!fd.ok()) return fd.status();
  Channel ch(std::move(*fd), Trust::kUnauthenticated);
  DYAD_RETURN_IF_ERROR(TrustLocalService(ch));
  std::string body;
  Status st = CallRpc(ch, type, req, &body, Deadline::AfterMs(timeout_ms));
  if (!st.ok()) return st;
  return body;
}

// A consume request `req` through the service at Unix socket `sock`, its
// reply decoded (the RPC bounded by `timeout_ms`).
inline Result<ConsumeReply> CallConsume(const std::string& sock, const ConsumeRequest& req,
                                        int64_t timeout_ms) {
  Encoder e;
  req.EncodeTo(e);
  Result<std::string> body = CallLocal(sock, MsgType::kConsume, e.data(), timeout_ms);
  if (!body.ok()) return body.status();
  ConsumeReply r;
  Decoder d(*body);
  if (!r.DecodeFrom(d)) return Status(DYAD_RC_BADUNPACK, "bad consume reply");
  return r;
}

// Writes `data` to prod_dir/upath and publishes it (namespace "t", key depth
// 3, 1024 bins) through the service listening on `sock`.
inline Status WriteAndPublish(const std::string& sock, const std::string& prod_dir,
                              const std::string& upath, const std::string& data,
                              bool async = false) {
  const std::string path = prod_dir + "/" + upath;
  WriteFile(path, data);
  struct stat sb;
  if (::stat(path.c_str(), &sb) != 0) return StatusFromErrno(errno, "stat " + path);
  PublishRequest req;
  req.ns = "t";
  req.key = GenPathKey(upath, 3, 1024);
  req.upath = upath;
  req.prod_path = CanonicalPath(prod_dir);
  req.size = data.size();
  req.version = MtimeNs(sb);
  req.async = async;
  Encoder e;
  req.EncodeTo(e);
  return CallLocal(sock, MsgType::kPublish, e.data()).status();
}

// A consume of `upath` (namespace "t", the key WriteAndPublish gives it)
// into `cons_path`.
inline ConsumeRequest ConsumeRequestOf(const std::string& upath, const std::string& cons_path,
                                       int64_t timeout_ms = 10000) {
  ConsumeRequest req;
  req.ns = "t";
  req.key = GenPathKey(upath, 3, 1024);
  req.upath = upath;
  req.cons_path = cons_path;
  req.timeout_ms = timeout_ms;
  return req;
}

// The cluster secret of the test services (at least 128 bits: shorter ones
// are refused).
inline constexpr const char kTestSecret[] = "test-secret-0123456789abcdef0123";

// Options of a test service A (rank 0) under `base`: producer directory
// base/a, socket base/a.sock, any free TCP port, store `kvs`.
inline ServiceOptions FirstServiceOptions(const std::string& base,
                                          const std::string& kvs = "embedded") {
  ServiceOptions o;
  o.rank = 0;
  o.prod_path = base + "/a";
  o.listen = "127.0.0.1:0";
  o.socket_path = base + "/a.sock";
  o.kvs_url = kvs;
  o.secret = kTestSecret;
  o.rpc_timeout_ms = 5000;
  return o;
}

// B (rank 1) as `a` but for base/b and base/b.sock, with store `kvs`.
inline ServiceOptions SecondServiceOptions(const ServiceOptions& a, const std::string& base,
                                           const std::string& kvs) {
  ServiceOptions o = a;
  o.rank = 1;
  o.prod_path = base + "/b";
  o.socket_path = base + "/b.sock";
  o.kvs_url = kvs;
  return o;
}

// Stops B, then A (either may be null), and removes the test's directory
// `*base` (when set).
inline void StopAndRemove(std::unique_ptr<Service>* b, std::unique_ptr<Service>* a,
                          std::string* base) {
  if (*b) (*b)->Stop();
  if (*a) (*a)->Stop();
  b->reset();
  a->reset();
  if (!base->empty()) {
    if (!RemoveTree(*base)) std::fprintf(stderr, "could not remove %s\n", base->c_str());
    base->clear();
  }
}

// A listening TCP socket on a free loopback port for a test's stand-in
// for a peer service: `*listen` gets it, the result is the address bound.
inline Result<SocketAddress> ListenOnLoopback(UniqueFd* listen, int backlog = 512) {
  Result<SocketAddress> any = ParseAddress("127.0.0.1:0");
  DYAD_RETURN_IF_ERROR(any.status());
  Result<UniqueFd> fd = Listen(*any, backlog);
  DYAD_RETURN_IF_ERROR(fd.status());
  *listen = std::move(*fd);
  return BoundAddress(listen->get());
}

// Registers a test's stand-in for dyad-service `rank` (listening at
// `address`) in the cluster's store at `root`, as a real service does at
// start-up, so real services dial it as any peer.
inline Status RegisterRank(const std::string& root, uint32_t rank, uint64_t incarnation,
                           const std::string& address, const std::string& hostname) {
  KvsOptions o;
  o.secret = kTestSecret;
  o.self_rank = rank;
  Result<std::unique_ptr<Kvs>> kvs = OpenKvs("embedded://" + root, o);
  DYAD_RETURN_IF_ERROR(kvs.status());
  ServiceRecord rec;
  rec.rank = rank;
  rec.node_idx = rank;
  rec.incarnation = incarnation;
  rec.address = address;
  rec.hostname = hostname;
  return (*kvs)->Put(kMembersNamespace, MemberKey(rank), rec.Encode());
}

class ServicePair {
 public:
  ServicePair() = default;
  ServicePair(const ServicePair&) = delete;
  ServicePair& operator=(const ServicePair&) = delete;
  ~ServicePair() { Stop(); }

  // Starts A (rank 0) with store `a_kvs` and B (rank 1) with `b_kvs`, or
  // with A's embedded store when `b_kvs` is empty.
  // With `mux` 2 both services are on one node (the same-node path).
  Status Start(const std::string& a_kvs, const std::string& b_kvs = "", uint32_t mux = 1) {
    base = MakeTempDir("dyad-svc-test.");
    if (base.empty()) return StatusFromErrno(errno, "mkdtemp");
    dir_a = base + "/a";
    dir_b = base + "/b";
    ServiceOptions oa = FirstServiceOptions(base, a_kvs);
    oa.service_mux = mux;
    oa.serve_fetch_batch = a_serves_batches;
    oa.protection = protection;
    a = std::make_unique<Service>(oa);
    DYAD_RETURN_IF_ERROR(a->Start());
    ServiceOptions ob =
        SecondServiceOptions(oa, base, b_kvs.empty() ? "embedded://" + a->tcp_address() : b_kvs);
    ob.cache_bytes = b_cache_bytes;
    b = std::make_unique<Service>(ob);
    return b->Start();
  }

  void Stop() { StopAndRemove(&b, &a, &base); }

  // Writes `data` to A's directory and publishes it through A.
  Status Publish(const std::string& upath, const std::string& data, bool async = false) {
    DYAD_RETURN_IF_ERROR(MakeParentDirs(dir_a, upath));
    return WriteAndPublish(base + "/a.sock", dir_a, upath, data, async);
  }

  // Consumes `upath` into B's directory through B.
  Result<ConsumeReply> Consume(const std::string& upath, int64_t timeout_ms = 10000) {
    return CallConsume(base + "/b.sock", ConsumeRequestOf(upath, CanonicalPath(dir_b), timeout_ms),
                       60000);
  }

  std::string base, dir_a, dir_b;
  std::unique_ptr<Service> a, b;
  uint64_t b_cache_bytes = 0;    // B's --cache-bytes (set before Start)
  bool a_serves_batches = true;  // false: A answers kFetchBatch as an older owner
  LinkProtection protection = LinkProtection::kIntegrity;  // of both services' links
};

}  // namespace testing_services
}  // namespace dyad
