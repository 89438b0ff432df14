// dyad-metadata: publish and locate latency of each metadata level.
//
// One run measures, on loopback, sequentially from one thread:
//  * service/<store>: three in-process dyad-services (ranks 0, 1, 2) sharing
//    the store; rank 0 only hosts it (embedded), so neither measured service
//    has the store in its own memory. "publish" is the client publish RPC on
//    rank 1 (it writes the store); "locate miss" is the first locate of each
//    file on rank 2 (its node-local cache is cold, so it reads the store);
//    "locate hit" is the same locate again (rank 2's node-local cache);
//  * kvs/<store>: the Kvs object alone, without a service: "publish" is Put
//    and "locate" is Get of a FileRecord-sized value; "wake" is the time
//    from a Put to the return of a Wait parked on that key (ops/s: n/a).
// Stores: "embedded" (hosted by rank 0) and, when compiled in and a
// redis-server binary is found, "redis" (a private redis-server on a free
// port, in a temporary directory, no persistence; removed at the end).
//
// Usage: dyad-metadata [--n N] [--json] [--no-redis]
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/fsutil.h"
#include "common/key.h"
#include "common/net.h"
#include "common/time.h"
#include "emu/redis_server.h"
#include "kvs/kvs.h"
#include "proto/protocol.h"
#include "service/service.h"

namespace dyad {
namespace {

constexpr char kSecret[] = "bench-secret-0123456789abcdef0123";

struct Row {
  std::string level;
  std::string op;
  size_t n = 0;
  double p50_us = 0;
  double p99_us = 0;
  double ops_per_s = 0;
};

// Times `op(i)` for i in [0, n); returns false (and prints) on the first
// failure.
template <typename Op>
bool Measure(const std::string& level, const std::string& op_name, size_t n, Op op,
             std::vector<Row>* rows) {
  std::vector<double> us;
  us.reserve(n);
  const auto start = SteadyClock::now();
  for (size_t i = 0; i < n; ++i) {
    const auto t0 = SteadyClock::now();
    Status st = op(i);
    if (!st.ok()) {
      std::fprintf(stderr, "%s %s #%zu: %s\n", level.c_str(), op_name.c_str(), i,
                   st.ToString().c_str());
      return false;
    }
    us.push_back(std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count());
  }
  const double total_s = std::chrono::duration<double>(SteadyClock::now() - start).count();
  std::sort(us.begin(), us.end());
  Row r;
  r.level = level;
  r.op = op_name;
  r.n = n;
  r.p50_us = us[us.size() / 2];
  r.p99_us = us[std::min(us.size() - 1, us.size() * 99 / 100)];
  r.ops_per_s = total_s > 0 ? n / total_s : 0;
  rows->push_back(r);
  return true;
}

// A client link to a service's Unix socket, reused for every call (as the
// client library does).
class LocalLink {
 public:
  static Result<std::unique_ptr<LocalLink>> Open(const std::string& sock) {
    Result<SocketAddress> addr = ParseAddress("unix:" + sock);
    if (!addr.ok()) return addr.status();
    Result<UniqueFd> fd = Connect(*addr, Deadline::AfterMs(2000));
    if (!fd.ok()) return fd.status();
    std::unique_ptr<LocalLink> link(new LocalLink(std::move(*fd)));
    DYAD_RETURN_IF_ERROR(TrustLocalService(link->ch_));
    return link;
  }
  Status Call(MsgType type, const std::string& req, std::string* body) {
    return CallRpc(ch_, type, req, body, Deadline::AfterMs(10000));
  }

 private:
  explicit LocalLink(UniqueFd fd) : ch_(std::move(fd), Trust::kUnauthenticated) {}
  Channel ch_;
};

std::string UpathOf(size_t i) { return "bench/f" + std::to_string(i) + ".dat"; }

// Three services on `kvs_url` (embedded: rank 0 hosts it), files published
// on rank 1 and located on rank 2.
bool BenchServices(const std::string& label, const std::string& base, const std::string& kvs_url,
                   size_t n, std::vector<Row>* rows) {
  const std::string dir_a = base + "/" + label + "-a";
  const std::string dir_b = base + "/" + label + "-b";
  ServiceOptions a;
  a.rank = 0;
  a.prod_path = base + "/" + label + "-root";
  a.listen = "127.0.0.1:0";
  a.socket_path = base + "/" + label + "-a.sock";
  a.kvs_url = kvs_url;
  a.secret = kSecret;
  a.rpc_timeout_ms = 10000;
  Service svc_a(a);
  Status st = svc_a.Start();
  if (!st.ok()) {
    std::fprintf(stderr, "start service (%s): %s\n", label.c_str(), st.ToString().c_str());
    return false;
  }
  // The measured pair: b publishes (its producer directory is dir_a), c
  // locates. Neither hosts the store.
  ServiceOptions b = a;
  b.rank = 1;
  b.prod_path = dir_a;
  b.socket_path = base + "/" + label + "-b.sock";
  if (kvs_url == "embedded") b.kvs_url = "embedded://" + svc_a.tcp_address();
  ServiceOptions c = b;
  c.rank = 2;
  c.prod_path = dir_b;
  c.socket_path = base + "/" + label + "-c.sock";
  Service svc_b(b);
  Service svc_c(c);
  st = svc_b.Start();
  if (st.ok()) st = svc_c.Start();
  if (!st.ok()) {
    std::fprintf(stderr, "start service (%s): %s\n", label.c_str(), st.ToString().c_str());
    svc_c.Stop();
    svc_b.Stop();
    svc_a.Stop();
    return false;
  }
  bool ok = true;
  std::vector<std::string> publishes(n), locates(n);
  for (size_t i = 0; i < n && ok; ++i) {
    const std::string upath = UpathOf(i);
    ok = MakeParentDirs(dir_a, upath).ok();
    const std::string path = dir_a + "/" + upath;
    std::ofstream(path, std::ios::binary) << "x";
    struct stat sb;
    ok = ok && ::stat(path.c_str(), &sb) == 0;
    PublishRequest p;
    p.ns = "bench";
    p.key = GenPathKey(upath, 3, 1024);
    p.upath = upath;
    p.prod_path = CanonicalPath(dir_a);
    p.size = 1;
    p.version = ok ? MtimeNs(sb) : 0;
    Encoder ep;
    p.EncodeTo(ep);
    publishes[i] = ep.data();
    LocateRequest l;
    l.ns = "bench";
    l.key = p.key;
    l.wait = false;
    Encoder el;
    l.EncodeTo(el);
    locates[i] = el.data();
  }
  Result<std::unique_ptr<LocalLink>> la = LocalLink::Open(b.socket_path);
  Result<std::unique_ptr<LocalLink>> lb = LocalLink::Open(c.socket_path);
  ok = ok && la.ok() && lb.ok();
  std::string body;
  const std::string level = "service/" + label;
  ok = ok &&
       Measure(
           level, "publish", n,
           [&](size_t i) { return (*la)->Call(MsgType::kPublish, publishes[i], &body); }, rows);
  ok = ok && Measure(
                 level, "locate (cache miss)", n,
                 [&](size_t i) { return (*lb)->Call(MsgType::kLocate, locates[i], &body); }, rows);
  ok = ok && Measure(
                 level, "locate (cache hit)", n,
                 [&](size_t i) { return (*lb)->Call(MsgType::kLocate, locates[i], &body); }, rows);
  if (!ok) std::fprintf(stderr, "service benchmark (%s) failed\n", label.c_str());
  svc_c.Stop();
  svc_b.Stop();
  svc_a.Stop();
  return ok;
}

// The store alone. For "embedded" a root service hosts it.
bool BenchKvs(const std::string& label, const std::string& base, const std::string& url, size_t n,
              std::vector<Row>* rows) {
  std::unique_ptr<Service> root;
  std::string open_url = url;
  if (url == "embedded") {
    ServiceOptions o;
    o.rank = 0;
    o.listen = "127.0.0.1:0";
    o.socket_path = base + "/kvs-root.sock";
    o.kvs_url = "embedded";
    o.secret = kSecret;
    root = std::make_unique<Service>(o);
    Status st = root->Start();
    if (!st.ok()) {
      std::fprintf(stderr, "start root: %s\n", st.ToString().c_str());
      return false;
    }
    open_url = "embedded://" + root->tcp_address();
  }
  KvsOptions ko;
  ko.secret = kSecret;
  ko.self_rank = 5;
  ko.self_incarnation = 1;
  ko.rpc_timeout_ms = 10000;
  Result<std::unique_ptr<Kvs>> kvs = OpenKvs(open_url, ko);
  if (!kvs.ok()) {
    std::fprintf(stderr, "open %s: %s\n", open_url.c_str(), kvs.status().ToString().c_str());
    if (root) root->Stop();
    return false;
  }
  FileRecord rec;
  rec.owner_rank = 0;
  rec.owner_incarnation = 1;
  rec.size = 1;
  rec.version = 1;
  rec.published_ns = WallNs();
  std::vector<std::string> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = GenPathKey(UpathOf(i), 3, 1024);
  const std::string level = "kvs/" + label;
  bool ok = Measure(
      level, "publish (put)", n,
      [&](size_t i) {
        rec.upath = UpathOf(i);
        return (*kvs)->Put("bench", keys[i], rec.Encode());
      },
      rows);
  ok = ok && Measure(
                 level, "locate (get)", n,
                 [&](size_t i) -> Status {
                   Result<std::optional<std::string>> v = (*kvs)->Get("bench", keys[i]);
                   if (!v.ok()) return v.status();
                   if (!v->has_value()) return Status(DYAD_RC_NOTFOUND, "missing " + keys[i]);
                   return Status::OK();
                 },
                 rows);
  // Wake-up latency of a parked wait: a thread waits for a fresh key, the
  // main thread puts it 5 ms later; measured from the start of the Put to
  // the return of the Wait.
  const size_t wakes = std::min<size_t>(n, 200);
  std::vector<double> wake_us;
  for (size_t i = 0; i < wakes && ok; ++i) {
    const std::string key = "wake/" + std::to_string(i);
    SteadyClock::time_point woke{};
    Status wait_status;
    std::thread waiter([&] {
      Result<std::string> r = (*kvs)->Wait("bench", key, Deadline::AfterMs(5000));
      woke = SteadyClock::now();
      wait_status = r.status();
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const auto put_at = SteadyClock::now();
    Status st = (*kvs)->Put("bench", key, "x");
    waiter.join();
    if (!st.ok() || !wait_status.ok()) {
      std::fprintf(stderr, "%s wake #%zu: %s %s\n", level.c_str(), i, st.ToString().c_str(),
                   wait_status.ToString().c_str());
      ok = false;
      break;
    }
    wake_us.push_back(std::chrono::duration<double, std::micro>(woke - put_at).count());
  }
  if (ok && !wake_us.empty()) {
    std::sort(wake_us.begin(), wake_us.end());
    Row r;
    r.level = level;
    r.op = "wake (put -> wait)";
    r.n = wake_us.size();
    r.p50_us = wake_us[wake_us.size() / 2];
    r.p99_us = wake_us[std::min(wake_us.size() - 1, wake_us.size() * 99 / 100)];
    r.ops_per_s = 0;  // latency only: waits are spaced out on purpose
    rows->push_back(r);
  }
  kvs->reset();
  if (root) root->Stop();
  return ok;
}

void PrintTable(const std::vector<Row>& rows) {
  std::printf("%-18s %-22s %7s %10s %10s %12s\n", "level", "operation", "n", "p50 us", "p99 us",
              "ops/s");
  for (const Row& r : rows) {
    const std::string rate = r.ops_per_s > 0 ? std::to_string(static_cast<long>(r.ops_per_s)) : "-";
    std::printf("%-18s %-22s %7zu %10.1f %10.1f %12s\n", r.level.c_str(), r.op.c_str(), r.n,
                r.p50_us, r.p99_us, rate.c_str());
  }
}

void PrintJson(const std::vector<Row>& rows, const std::string& note) {
  std::printf("{\"benchmark\":\"metadata\",\"note\":\"%s\",\"results\":[", note.c_str());
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const std::string rate =
        r.ops_per_s > 0 ? std::to_string(static_cast<long>(r.ops_per_s)) : "null";
    std::printf(
        "%s{\"level\":\"%s\",\"op\":\"%s\",\"n\":%zu,\"p50_us\":%.1f,\"p99_us\":%.1f,"
        "\"ops_per_s\":%s}",
        i ? "," : "", r.level.c_str(), r.op.c_str(), r.n, r.p50_us, r.p99_us, rate.c_str());
  }
  std::printf("]}\n");
}

int Run(int argc, char** argv) {
  size_t n = 2000;
  bool json = false;
  bool want_redis = true;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--n") && i + 1 < argc) {
      n = static_cast<size_t>(std::max(1L, std::atol(argv[++i])));
    } else if (!std::strcmp(argv[i], "--json")) {
      json = true;
    } else if (!std::strcmp(argv[i], "--no-redis")) {
      want_redis = false;
    } else {
      std::fprintf(stderr, "usage: %s [--n N] [--json] [--no-redis]\n", argv[0]);
      return 2;
    }
  }
  char tmpl[] = "/tmp/dyad-bench-metadata.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string base = tmpl;
  std::vector<Row> rows;
  bool ok = BenchServices("embedded", base, "embedded", n, &rows);
  ok = BenchKvs("embedded", base, "embedded", n, &rows) && ok;
  std::string note = "loopback, one client thread, sequential";
#ifdef DYAD_HAVE_REDIS
  std::unique_ptr<emu::RedisServer> redis;
  if (want_redis) {
    redis = std::make_unique<emu::RedisServer>();
    if (!redis->available()) {
      note += "; redis skipped: redis-server not installed";
    } else {
      const std::string error = redis->Start();
      if (!error.empty()) {
        std::fprintf(stderr, "redis-server: %s\n", error.c_str());
        ok = false;
      } else {
        ok = BenchServices("redis", base, redis->url(), n, &rows) && ok;
        ok = BenchKvs("redis", base, redis->url(), n, &rows) && ok;
      }
    }
  }
  redis.reset();
#else
  (void)want_redis;
  note += "; redis not compiled in";
#endif
  const std::string rm = "rm -rf '" + base + "'";
  if (::system(rm.c_str()) != 0) std::fprintf(stderr, "could not remove %s\n", base.c_str());
  if (json) {
    PrintJson(rows, note);
  } else {
    std::printf("dyad-metadata: %s\n", note.c_str());
    PrintTable(rows);
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace dyad

int main(int argc, char** argv) { return dyad::Run(argc, argv); }
