// The node cache with real services on loopback: the byte budget evicts
// least recently consumed copies but never one a reader holds open, an
// evicted file is fetched again, produced files stay, `status` counts it
// all; and versions: a rewrite that keeps size and mtime (or moves mtime
// backwards) still reaches the consumer, while a current copy costs no
// transfer.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include "common/fsutil.h"
#include "common/key.h"
#include "proto/protocol.h"
#include "service/node_cache.h"
#include "service/service.h"
#include "unit/service_pair.h"

namespace dyad {
namespace {

using testing_services::CallLocal;
using testing_services::ReadAll;
using testing_services::WriteFile;

class NodeCacheServices : public ::testing::Test {
 protected:
  void Start(uint64_t budget) {
    pair_.b_cache_bytes = budget;
    Status st = pair_.Start("embedded");
    ASSERT_TRUE(st.ok()) << st.ToString();
    cons_ = pair_.base + "/cons_b";
    ASSERT_EQ(::mkdir(cons_.c_str(), 0755), 0);
    cons_ = CanonicalPath(cons_);
  }
  void TearDown() override { pair_.Stop(); }

  // Writes `data` under `node`'s producer directory ("a" or "b") and
  // publishes it there; `mtime_ns` (when set) is stamped on the file first.
  void Publish(const std::string& upath, const std::string& data, uint64_t mtime_ns = 0,
               const std::string& node = "a") {
    const std::string dir = node == "a" ? pair_.dir_a : pair_.dir_b;
    const std::string path = dir + "/" + upath;
    WriteFile(path, data);
    if (mtime_ns != 0) {
      struct timespec ts[2];
      ts[0].tv_sec = ts[1].tv_sec = static_cast<time_t>(mtime_ns / 1000000000ull);
      ts[0].tv_nsec = ts[1].tv_nsec = static_cast<long>(mtime_ns % 1000000000ull);
      ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), ts, 0), 0);
    }
    struct stat sb;
    ASSERT_EQ(::stat(path.c_str(), &sb), 0);
    PublishRequest req;
    req.ns = "t";
    req.key = GenPathKey(upath, 3, 1024);
    req.upath = upath;
    req.prod_path = CanonicalPath(dir);
    req.size = data.size();
    req.version = MtimeNs(sb);
    Encoder e;
    req.EncodeTo(e);
    Result<std::string> r =
        CallLocal(pair_.base + "/" + node + ".sock", MsgType::kPublish, e.data());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }

  // Consumes into B's consumer directory (not its producer directory).
  ConsumeReply Consume(const std::string& upath) {
    ConsumeRequest req;
    req.ns = "t";
    req.key = GenPathKey(upath, 3, 1024);
    req.upath = upath;
    req.cons_path = cons_;
    req.timeout_ms = 10000;
    Encoder e;
    req.EncodeTo(e);
    Result<std::string> body = CallLocal(pair_.base + "/b.sock", MsgType::kConsume, e.data());
    EXPECT_TRUE(body.ok()) << body.status().ToString();
    ConsumeReply r;
    if (!body.ok()) return r;
    Decoder d(*body);
    EXPECT_TRUE(r.DecodeFrom(d));
    return r;
  }

  std::map<std::string, uint64_t> Counters() {
    Result<std::string> body = CallLocal(pair_.base + "/b.sock", MsgType::kStatus, "");
    EXPECT_TRUE(body.ok());
    StatusReply r;
    if (body.ok()) {
      Decoder d(*body);
      EXPECT_TRUE(r.DecodeFrom(d));
    }
    return r.counters;
  }
  bool InCons(const std::string& upath) {
    return ::access((cons_ + "/" + upath).c_str(), F_OK) == 0;
  }

  testing_services::ServicePair pair_;
  std::string cons_;
};

const std::string kBlobA(100000, 'a'), kBlobB(100000, 'b'), kBlobC(100000, 'c');

TEST_F(NodeCacheServices, TinyBudgetEvictsButNeverAFileHeldOpen) {
  Start(250000);
  Publish("a", kBlobA);
  Publish("b", kBlobB);
  Publish("c", kBlobC);
  ASSERT_TRUE(Consume("a").transferred);
  ASSERT_TRUE(Consume("b").transferred);
  // A reader holds a open the way DYAD's readers do (shared flock).
  UniqueFd reader(::open((cons_ + "/a").c_str(), O_RDONLY));
  ASSERT_TRUE(reader.valid());
  ASSERT_EQ(::flock(reader.get(), LOCK_SH), 0);
  // Past the grace period, c pushes the cache over budget: a is the least
  // recently consumed but held open, so b goes.
  std::this_thread::sleep_for(std::chrono::milliseconds(NodeCache::kGraceMs + 100));
  ASSERT_TRUE(Consume("c").transferred);
  EXPECT_TRUE(InCons("a"));
  EXPECT_FALSE(InCons("b"));
  EXPECT_TRUE(InCons("c"));
  std::string held(kBlobA.size(), '\0');
  ASSERT_EQ(::pread(reader.get(), held.data(), held.size(), 0), static_cast<ssize_t>(held.size()));
  EXPECT_EQ(held, kBlobA);
  auto c = Counters();
  EXPECT_EQ(c["node_cache.evictions"], 1u);
  EXPECT_EQ(c["node_cache.bytes"], 200000u);
  EXPECT_EQ(c["node_cache.files"], 2u);
  EXPECT_EQ(c["node_cache.budget"], 250000u);

  // The evicted file comes back on its next consume, intact.
  reader.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(NodeCache::kGraceMs + 100));
  ConsumeReply again = Consume("b");
  EXPECT_TRUE(again.transferred);
  EXPECT_EQ(ReadAll(cons_ + "/b"), kBlobB);
  EXPECT_FALSE(InCons("a"));  // now free to go: least recently consumed
  // A current copy is a hit: no transfer.
  ConsumeReply hit = Consume("b");
  EXPECT_FALSE(hit.transferred);
  EXPECT_TRUE(hit.local);
  EXPECT_GE(Counters()["node_cache.hits"], 1u);
}

TEST_F(NodeCacheServices, ProducedFilesAreNeverEvicted) {
  Start(100000);  // one file's size: a file larger than the budget is refused
  // B's own files, published from B's producer directory.
  Publish("p1", kBlobA, 0, "b");
  Publish("p2", kBlobA, 0, "b");
  Publish("a", kBlobA);
  Publish("b", kBlobB);
  ASSERT_TRUE(Consume("a").transferred);
  ASSERT_TRUE(Consume("p1").transferred);  // B's own file copied into the consumer dir
  std::this_thread::sleep_for(std::chrono::milliseconds(NodeCache::kGraceMs + 100));
  ASSERT_TRUE(Consume("b").transferred);
  EXPECT_FALSE(InCons("a"));
  EXPECT_FALSE(InCons("p1"));                       // the copy may go...
  EXPECT_EQ(ReadAll(pair_.dir_b + "/p1"), kBlobA);  // ...the produced file never
  EXPECT_EQ(ReadAll(pair_.dir_b + "/p2"), kBlobA);
  EXPECT_TRUE(InCons("b"));  // just consumed
  EXPECT_EQ(Counters()["node_cache.evictions"], 2u);
}

TEST_F(NodeCacheServices, RewriteWithTheSameMtimeStillTransfers) {
  Start(0);
  const uint64_t t = 1700000000ull * 1000000000ull;  // a coarse clock: whole seconds
  Publish("f", std::string(1000, '1'), t);
  ASSERT_TRUE(Consume("f").transferred);
  EXPECT_FALSE(Consume("f").transferred);   // current copy: no transfer
  Publish("f", std::string(1000, '2'), t);  // same size, same mtime (touch -d)
  EXPECT_TRUE(Consume("f").transferred);
  EXPECT_EQ(ReadAll(cons_ + "/f"), std::string(1000, '2'));
  EXPECT_FALSE(Consume("f").transferred);
}

TEST_F(NodeCacheServices, MtimeGoingBackwardsStillTransfers) {
  Start(0);
  const uint64_t t = 1700000000ull * 1000000000ull;
  Publish("f", std::string(1000, '1'), t);
  ASSERT_TRUE(Consume("f").transferred);
  Publish("f", std::string(1000, '2'), t - 5000000000ull);  // clock stepped back
  EXPECT_TRUE(Consume("f").transferred);
  EXPECT_EQ(ReadAll(cons_ + "/f"), std::string(1000, '2'));
}

}  // namespace
}  // namespace dyad
