// Batched fetches (kFetchBatch, Placement::PlaceBatch) between two
// in-process dyad-services: the prefetcher asks the owner for many small
// files in one request, a file too large to travel inline still arrives by
// its own fetch, and a file changed on the owner since its publication is
// refused (DYAD_RC_STALE) without failing the rest of its batch; a batch
// consume reads its records in one store request and fetches an owner's
// small files in one request too.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <string>
#include <thread>

#include "common/fsutil.h"
#include "common/key.h"
#include "service/placement.h"
#include "unit/service_pair.h"

namespace dyad {
namespace {

using testing_services::CallLocal;
using testing_services::Eventually;
using testing_services::ReadAll;

class FetchBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Status st = pair_.Start("embedded");
    ASSERT_TRUE(st.ok()) << st.ToString();
    cons_ = pair_.base + "/c";
    ASSERT_EQ(::mkdir(cons_.c_str(), 0755), 0);
    cons_ = CanonicalPath(cons_);
  }
  void TearDown() override { pair_.Stop(); }

  Status Declare(const std::string& pattern) {
    PrefetchRequest req;
    req.ns = "t";
    req.pattern = pattern;
    req.cons_path = cons_;
    Encoder e;
    req.EncodeTo(e);
    return CallLocal(pair_.base + "/b.sock", MsgType::kPrefetch, e.data()).status();
  }
  uint64_t OwnerCounter(const std::string& name) {
    auto all = pair_.a->stats().Snapshot();
    auto it = all.find(name);
    return it == all.end() ? 0 : it->second;
  }
  uint64_t ConsumerCounter(const std::string& name) {
    Result<std::string> body = CallLocal(pair_.base + "/b.sock", MsgType::kStatus, "");
    if (!body.ok()) return ~0ull;
    StatusReply r;
    Decoder d(*body);
    if (!r.DecodeFrom(d)) return ~0ull;
    auto it = r.counters.find(name);
    return it == r.counters.end() ? 0 : it->second;
  }
  static std::string Content(int i) { return "file " + std::to_string(i) + std::string(i, 'x'); }

  testing_services::ServicePair pair_;
  std::string cons_;
};

TEST_F(FetchBatchTest, SmallFilesTravelTogetherAndALargeOneAlone) {
  constexpr int kFiles = 40;
  for (int i = 0; i < kFiles; ++i)
    ASSERT_TRUE(pair_.Publish("d/f" + std::to_string(i), Content(i)).ok());
  const std::string large(Placement::kBatchInline + 1, 'L');
  ASSERT_TRUE(pair_.Publish("d/large", large).ok());
  ASSERT_TRUE(pair_.Publish("d/empty", "").ok());  // empty files are data
  ASSERT_TRUE(Declare("d/").ok());

  EXPECT_TRUE(Eventually([&] {
    for (int i = 0; i < kFiles; ++i)
      if (ReadAll(cons_ + "/d/f" + std::to_string(i)) != Content(i)) return false;
    struct stat st;
    return ReadAll(cons_ + "/d/large") == large && ::stat((cons_ + "/d/empty").c_str(), &st) == 0;
  })) << "prefetched files did not all arrive";
  EXPECT_EQ(pair_.b->stats().Get(ServiceStats::kTransfersIn), kFiles + 2u);
  // Every small file rode in a batch; only the large one was fetched alone.
  EXPECT_GE(OwnerCounter("requests.fetch_batch"), 1u);
  EXPECT_LT(OwnerCounter("requests.fetch_batch"), kFiles / 2u);
  EXPECT_EQ(pair_.a->stats().Get(ServiceStats::kReqFetch), 1u);
  EXPECT_EQ(OwnerCounter("transfers.out.tcp"), kFiles + 2u);
}

TEST_F(FetchBatchTest, AFileChangedSincePublicationIsRefusedAndTheRestArrive) {
  ASSERT_TRUE(pair_.Publish("d/a", "first").ok());
  ASSERT_TRUE(pair_.Publish("d/changed", "published bytes").ok());
  ASSERT_TRUE(pair_.Publish("d/b", "second").ok());
  // Rewritten in place, never published again: a different size and mtime.
  {
    const std::string path = pair_.dir_a + "/d/changed";
    ASSERT_TRUE(WriteFully(UniqueFd(::open(path.c_str(), O_WRONLY | O_TRUNC)).get(),
                           "rewritten, not published", 24)
                    .ok());
    struct timespec times[2] = {{0, UTIME_OMIT}, {12345, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  }
  ASSERT_TRUE(Declare("d/").ok());
  EXPECT_TRUE(Eventually(
      [&] { return ReadAll(cons_ + "/d/a") == "first" && ReadAll(cons_ + "/d/b") == "second"; }));
  // The stale file is counted as failed once its batch is answered.
  EXPECT_TRUE(Eventually([&] { return ConsumerCounter("prefetch.failed") == 1; }));
  struct stat st;
  EXPECT_NE(::stat((cons_ + "/d/changed").c_str(), &st), 0) << "a changed file was placed";
  EXPECT_EQ(pair_.a->stats().Get(ServiceStats::kReqFetch), 0u);
}

// A batch consume (kConsumeBatch, e.g. a DataLoader's look-ahead) rides the
// same batched fetch: one request to the owner for its small files, the
// large one alone, a path named twice placed once, a copy already current
// not fetched again, and an unpublished path its own timeout.
TEST_F(FetchBatchTest, ABatchConsumeFetchesAnOwnersSmallFilesInOneRequest) {
  constexpr int kFiles = 24;
  for (int i = 0; i < kFiles; ++i)
    ASSERT_TRUE(pair_.Publish("d/f" + std::to_string(i), Content(i)).ok());
  const std::string large(Placement::kBatchInline + 1, 'L');
  ASSERT_TRUE(pair_.Publish("d/large", large).ok());
  auto item = [&](const std::string& upath, int64_t timeout_ms) {
    return testing_services::ConsumeRequestOf(upath, cons_, timeout_ms);
  };
  auto consume = [&](const ConsumeBatchRequest& batch) {
    Encoder e;
    batch.EncodeTo(e);
    Result<std::string> body =
        CallLocal(pair_.base + "/b.sock", MsgType::kConsumeBatch, e.data(), 30000);
    EXPECT_TRUE(body.ok()) << body.status().ToString();
    const std::string payload = body.ok() ? *body : std::string();
    ConsumeBatchReply reply;
    Decoder d(payload);
    EXPECT_TRUE(reply.DecodeFrom(d) && d.done());
    return reply;
  };
  ConsumeBatchRequest batch;
  for (int i = 0; i < kFiles; ++i) batch.items.push_back(item("d/f" + std::to_string(i), 0));
  batch.items.push_back(item("d/large", 0));
  batch.items.push_back(item("d/f3", 0));  // named twice
  batch.items.push_back(item("d/never", 200));
  const uint64_t kvs_requests = OwnerCounter("requests.kvs");  // a hosts the store
  ConsumeBatchReply reply = consume(batch);
  ASSERT_EQ(reply.results.size(), batch.items.size());
  for (size_t i = 0; i + 1 < reply.results.size(); ++i)
    EXPECT_EQ(reply.results[i].code, DYAD_RC_OK) << i << ": " << reply.results[i].message;
  EXPECT_EQ(reply.results.back().code, DYAD_RC_TIMEOUT);
  EXPECT_NE(reply.results.back().message.find("d/never"), std::string::npos);
  for (int i = 0; i < kFiles; ++i)
    EXPECT_EQ(ReadAll(cons_ + "/d/f" + std::to_string(i)), Content(i));
  EXPECT_EQ(ReadAll(cons_ + "/d/large"), large);
  EXPECT_EQ(OwnerCounter("requests.fetch_batch"), 1u);
  EXPECT_EQ(pair_.a->stats().Get(ServiceStats::kReqFetch), 1u);  // the large file
  EXPECT_EQ(pair_.b->stats().Get(ServiceStats::kTransfersIn), kFiles + 1u);
  // The records came in one batched store read, not one read per file (the
  // few other store requests: d/never's wait, b's background traffic).
  EXPECT_EQ(OwnerCounter("requests.kvs.multi_get"), 1u);
  EXPECT_LT(OwnerCounter("requests.kvs") - kvs_requests, kFiles / 2u);

  // Again, with one file republished: only that one moves.
  ASSERT_TRUE(pair_.Publish("d/f5", "new bytes").ok());
  batch.items.pop_back();
  reply = consume(batch);
  for (const ConsumeBatchResult& r : reply.results) EXPECT_EQ(r.code, DYAD_RC_OK) << r.message;
  EXPECT_EQ(ReadAll(cons_ + "/d/f5"), "new bytes");
  EXPECT_EQ(pair_.b->stats().Get(ServiceStats::kTransfersIn), kFiles + 2u);
}

// An owner from before batched fetches answers kFetchBatch with
// BADREQUEST (it serves no such request): the prefetcher must then fetch
// each file on its own, and every file still arrives.
TEST(FetchBatchOlderOwnerTest, EveryFileArrivesOneFetchEach) {
  testing_services::ServicePair pair;
  pair.a_serves_batches = false;
  Status st = pair.Start("embedded");
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::string cons = pair.base + "/c";
  ASSERT_EQ(::mkdir(cons.c_str(), 0755), 0);
  cons = CanonicalPath(cons);
  constexpr int kFiles = 12;
  for (int i = 0; i < kFiles; ++i)
    ASSERT_TRUE(pair.Publish("old/f" + std::to_string(i), "older owner " + std::to_string(i)).ok());
  PrefetchRequest req;
  req.ns = "t";
  req.pattern = "old/";
  req.cons_path = cons;
  Encoder e;
  req.EncodeTo(e);
  ASSERT_TRUE(CallLocal(pair.base + "/b.sock", MsgType::kPrefetch, e.data()).ok());
  EXPECT_TRUE(Eventually([&] {
    for (int i = 0; i < kFiles; ++i)
      if (ReadAll(cons + "/old/f" + std::to_string(i)) != "older owner " + std::to_string(i))
        return false;
    return true;
  })) << "prefetched files did not all arrive from an owner without batches";
  EXPECT_EQ(pair.a->stats().Get(ServiceStats::kReqFetch), static_cast<uint64_t>(kFiles));
  // The batch was asked for, and refused (an error reply is counted).
  EXPECT_GE(pair.a->stats().Get(ServiceStats::kErrors), 1u);
  EXPECT_EQ(pair.b->stats().Get(ServiceStats::kTransfersIn), static_cast<uint64_t>(kFiles));
  pair.Stop();
}

}  // namespace
}  // namespace dyad
