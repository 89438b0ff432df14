// Prefetch on publication and batch consumes between two in-process
// dyad-services (service/prefetch.h): files published before and after a
// declaration reach the consumer directory without a consume, a later
// consume is local, a prefetch racing an explicit consume costs one
// transfer, a re-publication during a prefetch ends with the newer bytes,
// and a batch reports each path's own result. Run on the embedded store
// and, when redis-server is installed, on one Redis server and on a real
// three-master Redis Cluster (tools/emu/redis_cluster.h), where the
// namespace's files spread over every master and the watch messages cross
// the cluster bus; there, a declaration made while a master is down gets
// its earlier files once the master is back (the failed listing stays
// owed). The C API's prefetch and start/wait forms run against the same
// services.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/fsutil.h"
#include "common/key.h"
#include "dyad/client/dyad_client.h"
#include "dyad/core/dyad_ctx.h"
#include "emu/redis_server.h"
#ifdef DYAD_HAVE_REDIS
#include "emu/redis_cluster.h"
#include "kvs/redis/redis_kvs.h"
#endif
#include "service/prefetch.h"
#include "unit/service_pair.h"

namespace dyad {
namespace {

using testing_services::CallLocal;
using testing_services::Eventually;
using testing_services::ReadAll;

bool IsEmptyFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0;
}

class PrefetchTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "redis") {
#ifdef DYAD_HAVE_REDIS
      redis_ = std::make_unique<emu::RedisServer>();
      if (!redis_->available()) GTEST_SKIP() << "redis-server is not installed";
      ASSERT_EQ(redis_->Start(), "");
      ASSERT_TRUE(pair_.Start(redis_->url(), redis_->url()).ok());
#else
      GTEST_SKIP() << "built without Redis";
#endif
    } else if (GetParam() == "redis_cluster") {
#ifdef DYAD_HAVE_REDIS
      cluster_ = std::make_unique<emu::RedisCluster>();
      if (!cluster_->available()) GTEST_SKIP() << "redis-server or redis-cli is not installed";
      ASSERT_EQ(cluster_->Start(), "");
      const std::string url = cluster_->url(ClusterUrlOptions());
      ASSERT_TRUE(pair_.Start(url, url).ok());
#else
      GTEST_SKIP() << "built without Redis";
#endif
    } else {
      Status st = pair_.Start("embedded");
      ASSERT_TRUE(st.ok()) << st.ToString();
    }
    cons_ = pair_.base + "/c";
    ASSERT_EQ(::mkdir(cons_.c_str(), 0755), 0);
    cons_ = CanonicalPath(cons_);
  }
  virtual std::string ClusterUrlOptions() const { return ""; }
  void TearDown() override {
    pair_.Stop();
    redis_.reset();
#ifdef DYAD_HAVE_REDIS
    cluster_.reset();
#endif
  }

  Result<uint32_t> Declare(const std::string& pattern, bool cancel = false) {
    PrefetchRequest req;
    req.ns = "t";
    req.pattern = pattern;
    req.cons_path = cons_;
    req.cancel = cancel;
    Encoder e;
    req.EncodeTo(e);
    Result<std::string> body = CallLocal(pair_.base + "/b.sock", MsgType::kPrefetch, e.data());
    if (!body.ok()) return body.status();
    Decoder d(*body);
    return d.U32();
  }

  ConsumeRequest ConsumeOf(const std::string& upath, int64_t timeout_ms = 10000) {
    return testing_services::ConsumeRequestOf(upath, cons_, timeout_ms);
  }
  Result<ConsumeReply> Consume(const std::string& upath) {
    Encoder e;
    ConsumeOf(upath).EncodeTo(e);
    Result<std::string> body = CallLocal(pair_.base + "/b.sock", MsgType::kConsume, e.data());
    if (!body.ok()) return body.status();
    ConsumeReply r;
    Decoder d(*body);
    if (!r.DecodeFrom(d)) return Status(DYAD_RC_BADUNPACK, "bad reply");
    return r;
  }
  bool Holds(const std::string& upath, const std::string& data) {
    return ReadAll(cons_ + "/" + upath) == data;
  }
  uint64_t TransfersIn() { return pair_.b->stats().Get(ServiceStats::kTransfersIn); }

  testing_services::ServicePair pair_;
  std::unique_ptr<emu::RedisServer> redis_;
#ifdef DYAD_HAVE_REDIS
  std::unique_ptr<emu::RedisCluster> cluster_;
#endif
  std::string cons_;
};

TEST(PrefetchPattern, PrefixesAndGlobs) {
  EXPECT_TRUE(PrefetchPatternMatches("", "a/b"));
  EXPECT_TRUE(PrefetchPatternMatches("run1/", "run1/f0"));
  EXPECT_FALSE(PrefetchPatternMatches("run1/", "run10/f0"));
  EXPECT_TRUE(PrefetchPatternMatches("run*/f?.bin", "run7/f3.bin"));
  EXPECT_TRUE(PrefetchPatternMatches("*.bin", "deep/dir/x.bin"));  // '*' crosses '/'
  EXPECT_FALSE(PrefetchPatternMatches("*.bin", "x.txt"));
  EXPECT_TRUE(PrefetchPatternMatches("f[0-3]", "f2"));
}

TEST_P(PrefetchTest, FilesPublishedBeforeAndAfterTheDeclarationArriveUnasked) {
  ASSERT_TRUE(pair_.Publish("d/early0", "e0").ok());
  ASSERT_TRUE(pair_.Publish("d/early1", std::string(100000, '1')).ok());
  ASSERT_TRUE(pair_.Publish("other/x", "not asked for").ok());
  Result<uint32_t> n = Declare("d/");
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 2u);
  ASSERT_TRUE(pair_.Publish("d/late0", "").ok());  // empty files are data
  ASSERT_TRUE(pair_.Publish("d/sub/late1", std::string(70000, 'L')).ok());
  ASSERT_TRUE(pair_.Publish("other/y", "not asked for either").ok());

  EXPECT_TRUE(Eventually([&] {
    return Holds("d/early0", "e0") && Holds("d/early1", std::string(100000, '1')) &&
           IsEmptyFile(cons_ + "/d/late0") && Holds("d/sub/late1", std::string(70000, 'L'));
  })) << "prefetched files did not all arrive";
  EXPECT_EQ(TransfersIn(), 4u);
  // A later consume is local: no transfer, no waiting for one.
  Result<ConsumeReply> r = Consume("d/sub/late1");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->transferred);
  EXPECT_FALSE(r->joined);
  EXPECT_EQ(TransfersIn(), 4u);
  struct stat st;
  EXPECT_NE(::stat((cons_ + "/other/x").c_str(), &st), 0);
  EXPECT_NE(::stat((cons_ + "/other/y").c_str(), &st), 0);

  // Withdrawn: later publications stay where they are.
  ASSERT_TRUE(Declare("d/", true).ok());
  EXPECT_EQ(Declare("d/", true).status().code(), DYAD_RC_NOTFOUND);
  ASSERT_TRUE(pair_.Publish("d/after_cancel", "z").ok());
  ASSERT_TRUE(Consume("other/x").ok());  // a round trip through B after the publication
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_NE(::stat((cons_ + "/d/after_cancel").c_str(), &st), 0);
}

TEST_P(PrefetchTest, PrefetchRacingExplicitConsumesTransfersEachFileOnce) {
  constexpr int kFiles = 16;
  const std::string data(1 << 20, 'r');
  for (int i = 0; i < kFiles; ++i)
    ASSERT_TRUE(pair_.Publish("race/f" + std::to_string(i), data).ok());
  std::vector<std::thread> consumers;
  std::vector<Status> results(kFiles);
  ASSERT_TRUE(Declare("race/").ok());
  // Eight consumers (two files each) plus the prefetch workers stay under
  // the owner's cap on concurrent handshakes from one address.
  for (int c = 0; c < kFiles / 2; ++c)
    consumers.emplace_back([&, c] {
      for (int i : {c, kFiles - 1 - c}) results[i] = Consume("race/f" + std::to_string(i)).status();
    });
  for (auto& t : consumers) t.join();
  for (int i = 0; i < kFiles; ++i) {
    EXPECT_TRUE(results[i].ok()) << results[i].ToString();
    EXPECT_TRUE(Holds("race/f" + std::to_string(i), data));
  }
  // Let any prefetch still queued run: it must find the copies complete.
  EXPECT_TRUE(Eventually([&] {
    Result<std::string> body = CallLocal(pair_.base + "/b.sock", MsgType::kStatus, "");
    StatusReply s;
    Decoder d(*body);
    return body.ok() && s.DecodeFrom(d) && s.counters["prefetch.pending"] == 0;
  }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(TransfersIn(), static_cast<uint64_t>(kFiles));
  EXPECT_EQ(pair_.a->stats().Get(ServiceStats::kTransfersOut), static_cast<uint64_t>(kFiles));
}

TEST_P(PrefetchTest, RepublicationDuringAPrefetchEndsWithTheNewerVersion) {
  const std::string v1(32 << 20, '1');
  const std::string v2(3 << 20, '2');
  ASSERT_TRUE(pair_.Publish("big", v1).ok());
  ASSERT_TRUE(Declare("big").ok());
  // The prefetch of v1 starts at the declaration; publish v2 at once (the
  // file is rewritten under the owner, then published again).
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  ASSERT_TRUE(pair_.Publish("big", v2).ok());
  EXPECT_TRUE(Eventually([&] { return Holds("big", v2); }, 20000))
      << "the copy never became the newer version";
  // And stays so once the queue is idle.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(Holds("big", v2));
}

TEST_P(PrefetchTest, BatchConsumeReportsEachPathIncludingAMissingOne) {
  ConsumeBatchRequest batch;
  for (int i = 0; i < 12; ++i) {
    const std::string p = "batch/f" + std::to_string(i);
    ASSERT_TRUE(pair_.Publish(p, std::string(5000 + i, 'b')).ok());
    batch.items.push_back(ConsumeOf(p));
  }
  batch.items.insert(batch.items.begin() + 5, ConsumeOf("batch/never", 300));
  Encoder e;
  batch.EncodeTo(e);
  Result<std::string> body =
      CallLocal(pair_.base + "/b.sock", MsgType::kConsumeBatch, e.data(), 30000);
  ASSERT_TRUE(body.ok()) << body.status().ToString();
  ConsumeBatchReply reply;
  Decoder d(*body);
  ASSERT_TRUE(reply.DecodeFrom(d));
  ASSERT_EQ(reply.results.size(), 13u);
  for (size_t i = 0; i < reply.results.size(); ++i) {
    if (i == 5) {
      EXPECT_EQ(reply.results[i].code, DYAD_RC_TIMEOUT);
      EXPECT_NE(reply.results[i].message.find("batch/never"), std::string::npos)
          << reply.results[i].message;
      continue;
    }
    EXPECT_EQ(reply.results[i].code, DYAD_RC_OK) << reply.results[i].message;
    EXPECT_TRUE(reply.results[i].reply.transferred);
  }
  for (int i = 0; i < 12; ++i)
    EXPECT_TRUE(Holds("batch/f" + std::to_string(i), std::string(5000 + i, 'b')));
  // A malformed batch gets an error reply, not a crash.
  Result<std::string> bad = CallLocal(pair_.base + "/b.sock", MsgType::kConsumeBatch, "\x01");
  EXPECT_EQ(bad.status().code(), DYAD_RC_BADUNPACK);
}

// The C API over the same services: dyad_prefetch, dyad_consume_start/wait.
TEST_P(PrefetchTest, CApiPrefetchAndAsynchronousBatch) {
  ::setenv("DYAD_SERVICE_SOCKET", (pair_.base + "/b.sock").c_str(), 1);
  ::setenv("DYAD_PATH_CONSUMER", cons_.c_str(), 1);
  ::setenv("DYAD_KVS_NAMESPACE", "t", 1);
  ::unsetenv("DYAD_PATH_PRODUCER");
  ::setenv("DYAD_REINIT", "1", 1);
  ASSERT_EQ(dyad_init_env(DYAD_COMM_RECV, nullptr), DYAD_RC_OK) << dyad_last_error();
  dyad_ctx_t* ctx = dyad_ctx_get();

  ASSERT_TRUE(pair_.Publish("api/p0", "zero").ok());
  ASSERT_EQ(dyad_prefetch(ctx, (cons_ + "/api/p").c_str()), DYAD_RC_OK) << dyad_last_error();
  ASSERT_TRUE(pair_.Publish("api/p1", "one").ok());
  EXPECT_TRUE(Eventually([&] { return Holds("api/p0", "zero") && Holds("api/p1", "one"); }));
  EXPECT_EQ(dyad_prefetch(ctx, "/elsewhere/x"), DYAD_RC_UNTRACKED);
  EXPECT_EQ(dyad_prefetch(ctx, "../up"), DYAD_RC_PERM);
  EXPECT_EQ(dyad_prefetch(ctx, nullptr), DYAD_RC_BADBUF);

  // Started before the files exist; waited for after they are published.
  const std::vector<std::string> names = {cons_ + "/async/a", cons_ + "/async/b",
                                          cons_ + "/async/c"};
  std::vector<const char*> argv;
  for (const auto& n : names) argv.push_back(n.c_str());
  dyad_consume_handle_t* h = nullptr;
  ASSERT_EQ(dyad_consume_start(ctx, argv.data(), argv.size(), &h), DYAD_RC_OK);
  ASSERT_NE(h, nullptr);
  ASSERT_TRUE(pair_.Publish("async/a", "A").ok());
  ASSERT_TRUE(pair_.Publish("async/b", "B").ok());
  ASSERT_TRUE(pair_.Publish("async/c", "C").ok());
  dyad_rc_t rcs[3] = {DYAD_RC_SYSFAIL, DYAD_RC_SYSFAIL, DYAD_RC_SYSFAIL};
  EXPECT_EQ(dyad_consume_wait(h, rcs), DYAD_RC_OK) << dyad_last_error();
  for (dyad_rc_t rc : rcs) EXPECT_EQ(rc, DYAD_RC_OK);
  EXPECT_TRUE(Holds("async/a", "A") && Holds("async/b", "B") && Holds("async/c", "C"));

  // A synchronous batch with one missing file: its own code, the rest OK.
  ::setenv("DYAD_CONSUME_TIMEOUT", "0.3", 1);
  ASSERT_EQ(dyad_init_env(DYAD_COMM_RECV, nullptr), DYAD_RC_OK);
  ctx = dyad_ctx_get();
  const std::string missing = cons_ + "/async/missing";
  const char* mixed[] = {argv[0], missing.c_str(), argv[2]};
  EXPECT_EQ(dyad_consume_batch(ctx, mixed, 3, rcs), DYAD_RC_TIMEOUT);
  EXPECT_EQ(rcs[0], DYAD_RC_OK);
  EXPECT_EQ(rcs[1], DYAD_RC_TIMEOUT);
  EXPECT_EQ(rcs[2], DYAD_RC_OK);
  EXPECT_NE(std::string(dyad_last_error()).find("async/missing"), std::string::npos)
      << dyad_last_error();
  dyad_finalize();
  for (const char* v : {"DYAD_SERVICE_SOCKET", "DYAD_PATH_CONSUMER", "DYAD_KVS_NAMESPACE",
                        "DYAD_REINIT", "DYAD_CONSUME_TIMEOUT"})
    ::unsetenv(v);
}

INSTANTIATE_TEST_SUITE_P(Stores, PrefetchTest,
                         ::testing::Values("embedded", "redis", "redis_cluster"),
                         [](const auto& info) { return info.param; });

#ifdef DYAD_HAVE_REDIS
// A cluster master down when the consumer declares: the declaration's
// listing fails (a listing needs every master), stays owed, and is retried
// until the master is back; then the earlier files arrive. Commands give
// up after 1 s here (retry_ms) so the declaration answers quickly.
class PrefetchClusterOutageTest : public PrefetchTest {
 protected:
  std::string ClusterUrlOptions() const override { return "?retry_ms=1000"; }
};

TEST_P(PrefetchClusterOutageTest, ListingFailedWhileAMasterWasDownIsRetriedUntilItIsBack) {
  Result<std::unique_ptr<RedisKvs>> keys = RedisKvs::Open(cluster_->url(), {});
  ASSERT_TRUE(keys.ok()) << keys.status().ToString();
  auto owner = [&](const std::string& upath) {
    return cluster_->OwnerOf((*keys)->RedisKey("t", GenPathKey(upath, 3, 1024)));
  };
  // Early files kept by masters that stay up (these nodes keep no data
  // across a kill), and a victim that holds none of them.
  const std::vector<std::string> early = {"d/e0", "d/e1"};
  size_t victim = 0;
  while (victim < cluster_->size() &&
         (cluster_->port(victim) == owner(early[0]) || cluster_->port(victim) == owner(early[1])))
    ++victim;
  ASSERT_LT(victim, cluster_->size());
  for (const std::string& f : early) ASSERT_TRUE(pair_.Publish(f, "x" + f).ok());
  // Their watch messages are delivered (to nobody) before the watch starts:
  // only the listing can bring these files.
  std::vector<int> all;
  for (size_t i = 0; i < cluster_->size(); ++i) all.push_back(cluster_->port(i));
  ASSERT_TRUE(
      emu::BusDrained(all, {owner(early[0]), owner(early[1])}, (*keys)->WatchChannel("t"), 3000));

  cluster_->node(victim).Kill();
  Result<uint32_t> n = Declare("d/");
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, 0u);  // not listed: a master is unreachable
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_FALSE(Holds("d/e0", "xd/e0"));

  ASSERT_EQ(cluster_->node(victim).Start(), "");
  ASSERT_TRUE(cluster_->WaitHealthy(15000));
  EXPECT_TRUE(Eventually([&] { return Holds("d/e0", "xd/e0") && Holds("d/e1", "xd/e1"); }))
      << "the owed listing did not bring the earlier files";
  ASSERT_TRUE(pair_.Publish("d/late", "after").ok());
  EXPECT_TRUE(Eventually([&] { return Holds("d/late", "after"); }));
}

INSTANTIATE_TEST_SUITE_P(Cluster, PrefetchClusterOutageTest, ::testing::Values("redis_cluster"),
                         [](const auto& info) { return info.param; });
#endif  // DYAD_HAVE_REDIS

}  // namespace
}  // namespace dyad
