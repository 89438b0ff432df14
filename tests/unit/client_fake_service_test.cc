// Tests of what the client sends, against a fake service on a temporary
// Unix socket: exact request fields, level-1 shortcuts that send nothing,
// connection pooling and retry, deadlines, interruption, fork.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "client/client.h"
#include "client_test_util.h"
#include "common/fsutil.h"
#include "common/key.h"
#include "dyad/client/dyad_client.h"
#include "dyad/core/dyad_ctx.h"

namespace dyad {
namespace {

using testing_util::EnvScrub;
using testing_util::FakeService;
using testing_util::TempDir;
using testing_util::WriteFile;

class FakeServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    prod_real_ = tmp_.Sub("prod-real");
    prod_link_ = tmp_.Sub("prod");
    cons_ = tmp_.Sub("cons");
    std::filesystem::create_directories(prod_real_);
    std::filesystem::create_directory_symlink(prod_real_, prod_link_);
    fake_ = std::make_unique<FakeService>(tmp_.Sub("svc.sock"));
    ASSERT_TRUE(fake_->listening());
    fake_->set_producer_path(std::filesystem::canonical(prod_real_).string());
  }
  void TearDown() override {
    SetInterruptCheck(nullptr);
    dyad_finalize();
  }

  ClientConfig Config() {
    ClientConfig c;
    c.prod_managed_path = prod_link_;
    c.cons_managed_path = cons_;
    c.service_socket = fake_->path();
    c.rpc_timeout_ms = 5000;
    return c;
  }
  std::shared_ptr<Client> Make(const ClientConfig& c) {
    Result<std::shared_ptr<Client>> r = Client::Create(c);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return *r;
  }
  template <typename T>
  static T Decode(const std::string& payload) {
    T out;
    Decoder d(payload);
    EXPECT_TRUE(out.DecodeFrom(d));
    EXPECT_TRUE(d.done());
    return out;
  }

  EnvScrub scrub_;
  TempDir tmp_;
  std::string prod_real_, prod_link_, cons_;
  std::unique_ptr<FakeService> fake_;
};

TEST_F(FakeServiceTest, PublishCarriesExactFields) {
  ClientConfig cfg = Config();
  cfg.kvs_namespace = "wf";
  cfg.async_publish = true;
  auto c = Make(cfg);
  WriteFile(prod_real_ + "/1/data0.txt", "0123456789");
  struct stat st;
  ASSERT_EQ(stat((prod_real_ + "/1/data0.txt").c_str(), &st), 0);

  Status s = c->Produce(prod_link_ + "/1/data0.txt");
  ASSERT_TRUE(s.ok()) << s.ToString();
  // Asynchronous: the request is sent, its reply collected by the flush.
  s = c->FlushPublications();
  ASSERT_TRUE(s.ok()) << s.ToString();
  auto r = fake_->last(MsgType::kPublish);
  ASSERT_TRUE(r.has_value());
  PublishRequest req = Decode<PublishRequest>(r->payload);
  EXPECT_EQ(req.ns, "wf");
  EXPECT_EQ(req.key, "263.2ce.2e1.1/data0.txt");
  EXPECT_EQ(req.upath, "1/data0.txt");
  EXPECT_EQ(req.prod_path, std::filesystem::canonical(prod_real_).string());
  EXPECT_EQ(req.size, 10u);
  EXPECT_EQ(req.version, MtimeNs(st));
  EXPECT_TRUE(req.async);

  // The canonical spelling of the producer directory works too.
  ASSERT_TRUE(c->Produce(prod_real_ + "/1/data0.txt").ok());
  ASSERT_TRUE(c->FlushPublications().ok());
  EXPECT_EQ(fake_->count(MsgType::kPublish), 2u);
}

TEST_F(FakeServiceTest, PublishErrorFromServicePassesThrough) {
  auto c = Make(Config());
  WriteFile(prod_real_ + "/x", "x");
  fake_->set_handler([](uint16_t, const std::string&) -> FakeService::Answer {
    return std::make_pair(Status(DYAD_RC_BADMANAGEDPATH, "not the directory this service serves"),
                          std::string());
  });
  Status s = c->Produce(prod_link_ + "/x");
  EXPECT_EQ(s.code(), DYAD_RC_BADMANAGEDPATH);
  EXPECT_NE(s.message().find("not the directory"), std::string::npos);
}

TEST_F(FakeServiceTest, FsyncWritePublishes) {
  ClientConfig cfg = Config();
  cfg.fsync_write = true;
  auto c = Make(cfg);
  WriteFile(prod_real_ + "/sub/f", "abc");
  ASSERT_TRUE(c->Produce(prod_link_ + "/sub/f").ok());
  EXPECT_EQ(fake_->count(MsgType::kPublish), 1u);
}

TEST_F(FakeServiceTest, ConsumeCarriesExactFields) {
  ClientConfig cfg = Config();
  cfg.consume_timeout_ms = 1500;
  cfg.dtl_mode = "tcp";
  cfg.key_depth = 2;
  cfg.key_bins = 256;
  auto c = Make(cfg);
  ConsumeInfo info;
  Status s = c->Consume(cons_ + "/d/f.bin", &info);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_FALSE(info.level1);
  EXPECT_TRUE(info.reply.transferred);
  EXPECT_EQ(info.upath, "d/f.bin");
  auto r = fake_->last(MsgType::kConsume);
  ASSERT_TRUE(r.has_value());
  ConsumeRequest req = Decode<ConsumeRequest>(r->payload);
  EXPECT_EQ(req.key, GenPathKey("d/f.bin", 2, 256));
  EXPECT_EQ(req.upath, "d/f.bin");
  // The consumer directory did not exist: the client created it so the
  // service can place files there, and sends its canonical form.
  EXPECT_TRUE(std::filesystem::is_directory(cons_));
  EXPECT_EQ(req.cons_path, std::filesystem::canonical(cons_).string());
  EXPECT_EQ(req.timeout_ms, 1500);
  EXPECT_FALSE(req.shared_storage);
  EXPECT_FALSE(req.have_record);
  EXPECT_EQ(req.dtl_mode, "TCP");

  cfg.consume_timeout_ms = -1;
  cfg.shared_storage = true;
  c = Make(cfg);
  ASSERT_TRUE(c->Consume(cons_ + "/d/g.bin").ok());
  req = Decode<ConsumeRequest>(fake_->last(MsgType::kConsume)->payload);
  EXPECT_EQ(req.timeout_ms, -1);
  EXPECT_TRUE(req.shared_storage);
}

TEST_F(FakeServiceTest, LevelOneSkipsTheRequestInAPrivateConsumerDirectory) {
  auto c = Make(Config());
  WriteFile(cons_ + "/here.dat", "complete");
  WriteFile(cons_ + "/also.dat", "complete");
  ConsumeInfo info;
  ASSERT_TRUE(c->Consume(cons_ + "/here.dat", &info).ok());
  EXPECT_TRUE(info.level1);
  ASSERT_TRUE(c->Consume(cons_ + "/also.dat", &info).ok());
  EXPECT_TRUE(info.level1);
  EXPECT_EQ(fake_->count(MsgType::kConsume), 0u);
  // The service was asked once which directory it serves, then remembered.
  EXPECT_EQ(fake_->count(MsgType::kStatus), 1u);
  // A missing file still goes to the service.
  ASSERT_TRUE(c->Consume(cons_ + "/absent.dat").ok());
  EXPECT_EQ(fake_->count(MsgType::kConsume), 1u);
}

TEST_F(FakeServiceTest, NoLevelOneWhereAProducerWrites) {
  // The consumer directory is the one the local service serves: a file
  // there may still be open for writing by a producer on this node.
  fake_->set_producer_path(std::filesystem::canonical(prod_real_).string());
  ClientConfig cfg = Config();
  cfg.prod_managed_path = "";
  cfg.cons_managed_path = prod_link_;
  auto c = Make(cfg);
  WriteFile(prod_real_ + "/w.dat", "partial?");
  ConsumeInfo info;
  ASSERT_TRUE(c->Consume(prod_link_ + "/w.dat", &info).ok());
  EXPECT_FALSE(info.level1);
  EXPECT_EQ(fake_->count(MsgType::kConsume), 1u);

  // Same when it is this process's own producer directory (no status asked).
  cfg.prod_managed_path = prod_real_;
  c = Make(cfg);
  const size_t status_before = fake_->count(MsgType::kStatus);
  ASSERT_TRUE(c->Consume(prod_link_ + "/w.dat", &info).ok());
  EXPECT_FALSE(info.level1);
  EXPECT_EQ(fake_->count(MsgType::kStatus), status_before);

  // And with shared storage.
  cfg = Config();
  cfg.shared_storage = true;
  c = Make(cfg);
  WriteFile(cons_ + "/s.dat", "x");
  ASSERT_TRUE(c->Consume(cons_ + "/s.dat", &info).ok());
  EXPECT_FALSE(info.level1);
}

// Stamps `path` as a service's placement does: the version stamp of a
// record with the file's size and content time (revocable: the service
// follows the namespace). False when the file system has no user
// attributes.
bool StampAsPlaced(const std::string& path, bool revocable = true, uint64_t seq = 3) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  FileRecord rec;
  rec.owner_rank = 1;
  rec.owner_incarnation = 42;
  rec.seq = seq;
  rec.size = static_cast<uint64_t>(st.st_size);
  rec.version = MtimeNs(st);
  const std::string stamp = VersionStamp(rec, revocable);
  return ::setxattr(path.c_str(), kVersionXattr, stamp.data(), stamp.size(), 0) == 0;
}

TEST_F(FakeServiceTest, LevelOneTrustsAPlacedCopyWhereAProducerWrites) {
  // One managed directory for producers and consumers: a copy a service
  // placed there, unchanged since, is complete without a message.
  ClientConfig cfg = Config();
  cfg.cons_managed_path = prod_link_;
  auto c = Make(cfg);
  WriteFile(prod_real_ + "/placed.dat", "a copy placed by the service");
  if (!StampAsPlaced(prod_real_ + "/placed.dat")) GTEST_SKIP() << "no user xattrs here";
  ConsumeInfo info;
  ASSERT_TRUE(c->Consume(prod_link_ + "/placed.dat", &info).ok());
  EXPECT_TRUE(info.level1);
  EXPECT_EQ(fake_->count(MsgType::kConsume), 0u);
  EXPECT_EQ(fake_->count(MsgType::kStatus), 0u);  // the stamp alone decided

  // A local program wrote to it since: its mtime (and maybe size) moved
  // away from the stamp, so the service decides.
  struct stat st;
  ASSERT_EQ(::stat((prod_real_ + "/placed.dat").c_str(), &st), 0);
  const struct timespec later[2] = {{0, UTIME_OMIT}, {st.st_mtim.tv_sec + 5, st.st_mtim.tv_nsec}};
  ASSERT_EQ(::utimensat(AT_FDCWD, (prod_real_ + "/placed.dat").c_str(), later, 0), 0);
  ASSERT_TRUE(c->Consume(prod_link_ + "/placed.dat", &info).ok());
  EXPECT_FALSE(info.level1);
  EXPECT_EQ(fake_->count(MsgType::kConsume), 1u);

  // Same size and time but a stamp of another length or kind: not trusted.
  WriteFile(prod_real_ + "/odd.dat", "x");
  ASSERT_EQ(::setxattr((prod_real_ + "/odd.dat").c_str(), kVersionXattr, "\x01junk", 5, 0), 0);
  ASSERT_TRUE(c->Consume(prod_link_ + "/odd.dat", &info).ok());
  EXPECT_FALSE(info.level1);
  // A file being written (no stamp yet) goes to the service too.
  WriteFile(prod_real_ + "/fresh.dat", "partial?");
  ASSERT_TRUE(c->Consume(prod_link_ + "/fresh.dat", &info).ok());
  EXPECT_FALSE(info.level1);
  // So does a copy whose stamp its service would not withdraw in time (it
  // does not follow the namespace): only dyad_consume_w_metadata's exact
  // comparison with a record accepts that one.
  WriteFile(prod_real_ + "/plain.dat", "placed, not followed");
  ASSERT_TRUE(StampAsPlaced(prod_real_ + "/plain.dat", /*revocable=*/false));
  ASSERT_TRUE(c->Consume(prod_link_ + "/plain.dat", &info).ok());
  EXPECT_FALSE(info.level1);
  EXPECT_EQ(fake_->count(MsgType::kConsume), 4u);

  // The batch consume takes the same shortcut.
  WriteFile(prod_real_ + "/b1.dat", "placed too");
  ASSERT_TRUE(StampAsPlaced(prod_real_ + "/b1.dat"));
  std::vector<Status> results;
  ASSERT_TRUE(c->ConsumeBatch({prod_link_ + "/b1.dat"}, &results).ok());
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(results[0].ok());
  EXPECT_EQ(fake_->count(MsgType::kConsumeBatch), 0u);

  // With shared storage there are no placed copies: never level 1.
  cfg.shared_storage = true;
  c = Make(cfg);
  ASSERT_TRUE(c->Consume(prod_link_ + "/b1.dat", &info).ok());
  EXPECT_FALSE(info.level1);
}

TEST_F(FakeServiceTest, ConsumeErrorsPassThrough) {
  auto c = Make(Config());
  fake_->set_handler([](uint16_t, const std::string&) -> FakeService::Answer {
    return std::make_pair(Status(DYAD_RC_TIMEOUT, "'x.dat' was not published within 100 ms"),
                          std::string());
  });
  Status s = c->Consume(cons_ + "/x.dat");
  EXPECT_EQ(s.code(), DYAD_RC_TIMEOUT);
  EXPECT_NE(s.message().find("not published"), std::string::npos);
}

TEST_F(FakeServiceTest, ClientDeadlineBoundsASilentService) {
  ClientConfig cfg = Config();
  cfg.consume_timeout_ms = 200;
  cfg.rpc_timeout_ms = 300;
  auto c = Make(cfg);
  fake_->set_handler([](uint16_t, const std::string&) -> FakeService::Answer { return {}; });
  const auto t0 = std::chrono::steady_clock::now();
  Status s = c->Consume(cons_ + "/never.dat");
  const auto dt = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(s.code(), DYAD_RC_TIMEOUT) << s.ToString();
  EXPECT_GE(dt, std::chrono::milliseconds(450));
  EXPECT_LT(dt, std::chrono::seconds(3));
  // The client closed the connection, so the service can stop waiting.
  for (int i = 0; i < 200 && fake_->disconnects() == 0; ++i) usleep(10000);
  EXPECT_EQ(fake_->disconnects(), 1);
  EXPECT_EQ(c->pool()->idle_count(), 0u);
}

TEST_F(FakeServiceTest, InterruptCheckCancelsAWait) {
  auto c = Make(Config());  // no consume timeout
  fake_->set_handler([](uint16_t, const std::string&) -> FakeService::Answer { return {}; });
  std::atomic<bool> stop{false};
  SetInterruptCheck([&] { return stop.load(); });
  std::thread t([&] {
    usleep(300000);
    stop = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  Status s = c->Consume(cons_ + "/never.dat");
  t.join();
  EXPECT_EQ(s.code(), DYAD_RC_CANCELLED) << s.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
}

TEST_F(FakeServiceTest, ConnectionsArePooledAndReused) {
  auto c = Make(Config());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(c->Ping().ok());
  EXPECT_EQ(fake_->connections(), 1);
  EXPECT_EQ(c->pool()->idle_count(), 1u);

  // Concurrent calls each get a connection; at most kMaxIdle stay.
  fake_->set_handler([this](uint16_t type, const std::string& p) -> FakeService::Answer {
    usleep(50000);
    return fake_->DefaultAnswer(type, p);
  });
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 12; ++i) threads.emplace_back([&] { ok += c->Ping().ok(); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 12);
  EXPECT_GT(fake_->connections(), 1);
  EXPECT_LE(c->pool()->idle_count(), ServicePool::kMaxIdle);
}

TEST_F(FakeServiceTest, ReconnectsWhenTheServiceClosedAConnection) {
  auto c = Make(Config());
  fake_->set_close_after_reply(true);
  for (int i = 0; i < 4; ++i) {
    Status s = c->Ping();
    ASSERT_TRUE(s.ok()) << i << ": " << s.ToString();
  }
  EXPECT_EQ(fake_->connections(), 4);
}

TEST_F(FakeServiceTest, ConnectionLostMidRequestIsReported) {
  auto c = Make(Config());
  ASSERT_TRUE(c->Ping().ok());  // leaves a pooled connection
  fake_->set_drop_requests(true);
  Status s = c->Ping();
  EXPECT_EQ(s.code(), DYAD_RC_CONNLOST) << s.ToString();
  EXPECT_NE(s.message().find("lost"), std::string::npos);
  // The pooled connection failed, the retry on a fresh one failed too.
  EXPECT_EQ(fake_->count(MsgType::kPing), 3u);
  EXPECT_EQ(fake_->connections(), 2);
}

TEST_F(FakeServiceTest, RpcTimeoutBoundsOrdinaryRequests) {
  ClientConfig cfg = Config();
  cfg.rpc_timeout_ms = 300;
  auto c = Make(cfg);
  fake_->set_handler([](uint16_t, const std::string&) -> FakeService::Answer { return {}; });
  const auto t0 = std::chrono::steady_clock::now();
  Status s = c->Ping();
  EXPECT_EQ(s.code(), DYAD_RC_TIMEOUT) << s.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
}

TEST_F(FakeServiceTest, GetMetadataListAndStatus) {
  auto c = Make(Config());
  FileRecord rec;
  rec.owner_rank = 3;
  rec.size = 42;
  rec.version = 123456789;
  rec.upath = "m/f.dat";
  fake_->set_handler([&](uint16_t type, const std::string& p) -> FakeService::Answer {
    Encoder e;
    switch (static_cast<MsgType>(type)) {
      case MsgType::kLocate: {
        LocateRequest req = Decode<LocateRequest>(p);
        if (!req.wait) return std::make_pair(Status(DYAD_RC_NOTFOUND, "not yet"), std::string());
        EXPECT_EQ(req.key, GenPathKey("m/f.dat", 3, 1024));
        e.Str(rec.Encode());
        return std::make_pair(Status::OK(), e.Take());
      }
      case MsgType::kList: {
        ListRequest req = Decode<ListRequest>(p);
        EXPECT_EQ(req.path_prefix, "m/");
        EXPECT_EQ(req.limit, 10u);
        EXPECT_EQ(req.ns, "other");
        e.U32(1).Str(GenPathKey(rec.upath, 3, 1024)).Str(rec.Encode());
        return std::make_pair(Status::OK(), e.Take());
      }
      default:
        return fake_->DefaultAnswer(type, p);
    }
  });
  Result<FileRecord> got = c->GetMetadata(cons_ + "/m/f.dat", false);
  EXPECT_EQ(got.status().code(), DYAD_RC_NOTFOUND);
  got = c->GetMetadata(cons_ + "/m/f.dat", true);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(got->owner_rank, 3u);
  EXPECT_EQ(got->size, 42u);

  auto list = c->List("m/", 10, std::string("other"));
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].second.upath, "m/f.dat");

  Result<StatusReply> st = c->ServiceStatus();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->info["rank"], "0");
}

TEST_F(FakeServiceTest, CApiMetadataRoundTrip) {
  setenv("DYAD_SERVICE_SOCKET", fake_->path().c_str(), 1);
  ASSERT_EQ(dyad_init(false, false, false, true, false, false, 3, 1024, 1, nullptr, nullptr,
                      cons_.c_str(), false, "FLUX_RPC", DYAD_COMM_RECV, nullptr),
            DYAD_RC_OK);
  WriteFile(cons_ + "/m/f.dat", "0123456789");
  struct stat st;
  ASSERT_EQ(stat((cons_ + "/m/f.dat").c_str(), &st), 0);
  FileRecord rec;
  rec.owner_rank = 5;
  rec.size = 10;
  rec.version = MtimeNs(st);
  rec.upath = "m/f.dat";
  fake_->set_handler([&](uint16_t type, const std::string& p) -> FakeService::Answer {
    if (type != static_cast<uint16_t>(MsgType::kLocate)) return fake_->DefaultAnswer(type, p);
    Encoder e;
    e.Str(rec.Encode());
    return std::make_pair(Status::OK(), e.Take());
  });
  dyad_metadata_t* md = nullptr;
  ASSERT_EQ(dyad_get_metadata(dyad_ctx_get(), (cons_ + "/m/f.dat").c_str(), true, &md), DYAD_RC_OK);
  ASSERT_NE(md, nullptr);
  EXPECT_STREQ(md->fpath, "m/f.dat");
  EXPECT_EQ(md->owner_rank, 5u);
  EXPECT_EQ(md->size, 10u);
  EXPECT_EQ(md->version, rec.version);
  // The local copy matches the record: no consume request at all.
  EXPECT_EQ(dyad_consume_w_metadata(dyad_ctx_get(), (cons_ + "/m/f.dat").c_str(), md), DYAD_RC_OK);
  EXPECT_EQ(fake_->count(MsgType::kConsume), 0u);
  // A stale local copy (other version) is fetched with the record attached.
  md->version += 1;
  EXPECT_EQ(dyad_consume_w_metadata(dyad_ctx_get(), (cons_ + "/m/f.dat").c_str(), md), DYAD_RC_OK);
  ASSERT_EQ(fake_->count(MsgType::kConsume), 1u);
  ConsumeRequest req = Decode<ConsumeRequest>(fake_->last(MsgType::kConsume)->payload);
  EXPECT_TRUE(req.have_record);
  EXPECT_EQ(req.record.owner_rank, 5u);
  EXPECT_EQ(req.record.version, rec.version + 1);
  EXPECT_EQ(dyad_free_metadata(&md), DYAD_RC_OK);
  EXPECT_EQ(md, nullptr);
}

TEST_F(FakeServiceTest, ForkedChildNeverUsesTheParentsConnection) {
  auto c = Make(Config());
  ASSERT_TRUE(c->Ping().ok());
  ASSERT_EQ(fake_->connections(), 1);
  ASSERT_EQ(c->pool()->idle_count(), 1u);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 0;
    if (c->pool()->idle_count() != 0) code |= 1;  // inherited connection discarded
    if (!c->Ping().ok()) code |= 2;
    _exit(code);
  }
  int status = 0;
  for (int i = 0; i < 1000 && waitpid(pid, &status, WNOHANG) == 0; ++i) usleep(10000);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // The child's request came on a second connection; the parent's own
  // connection is intact and still pooled.
  auto reqs = fake_->requests();
  ASSERT_EQ(reqs.size(), 2u);
  EXPECT_EQ(reqs[0].conn, 1);
  EXPECT_EQ(reqs[1].conn, 2);
  ASSERT_TRUE(c->Ping().ok());
  reqs = fake_->requests();
  ASSERT_EQ(reqs.size(), 3u);
  EXPECT_EQ(reqs[2].conn, 1);
}

// Item 2 of the client's cost per consume: a copy found current by its
// stamp is remembered (StampMemo), so its next open costs an fstat and no
// stamp read; a change of the stamp is still seen at once: withdrawn (the
// service learnt of a newer version) or written again (a later placement).
TEST_F(FakeServiceTest, RememberedCopyIsAskedForAgainOnceItsStampChanges) {
  ClientConfig cfg = Config();
  cfg.cons_managed_path = prod_link_;
  auto c = Make(cfg);
  const std::string path = prod_real_ + "/memo.dat";
  WriteFile(path, "a copy placed by the service");
  if (!StampAsPlaced(path)) GTEST_SKIP() << "no user xattrs here";
  // Remembered only once its ctime is settled (StampMemo::kSettledNs).
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  auto open_consume = [&c, &path]() {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    struct stat st;
    return fd.valid() && ::fstat(fd.get(), &st) == 0 && c->ConsumeOpened(fd.get(), st);
  };
  ASSERT_TRUE(open_consume());
  ASSERT_TRUE(open_consume());  // remembered (and right)
  // Withdrawn: not current any more, although size and mtime still match.
  ASSERT_EQ(::removexattr(path.c_str(), kVersionXattr), 0);
  EXPECT_FALSE(open_consume());
  ConsumeInfo info;
  ASSERT_TRUE(c->Consume(prod_link_ + "/memo.dat", &info).ok());
  EXPECT_FALSE(info.level1);
  // Stamped again (a later placement): current again, and remembered.
  ASSERT_TRUE(StampAsPlaced(path, true, 4));
  std::this_thread::sleep_for(std::chrono::milliseconds(150));
  ASSERT_TRUE(open_consume());
  ASSERT_TRUE(open_consume());
  // Withdrawn again, right after: the memo's entry does not outlive it.
  ASSERT_EQ(::removexattr(path.c_str(), kVersionXattr), 0);
  EXPECT_FALSE(open_consume());
  ASSERT_TRUE(c->Consume(prod_link_ + "/memo.dat", &info).ok());
  EXPECT_FALSE(info.level1);
  EXPECT_EQ(fake_->count(MsgType::kConsume), 2u);
}

// Item 2: in a consumer directory private to consumers the preload
// library's probe needs no look at what it opened (ConsumeOpenedInPrivate
// Directory); where a producer writes, or with shared storage, it must look.
TEST_F(FakeServiceTest, PrivateConsumerDirectoryNeedsNoLookAtAnOpenedFile) {
  std::filesystem::create_directories(cons_);
  auto c = Make(Config());
  EXPECT_TRUE(c->ConsumeOpenedInPrivateDirectory());
  EXPECT_TRUE(c->ConsumeOpenedInPrivateDirectory());
  EXPECT_EQ(fake_->count(MsgType::kStatus), 1u);  // asked once which directory it serves
  EXPECT_EQ(fake_->count(MsgType::kConsume), 0u);
  ClientConfig one = Config();
  one.cons_managed_path = prod_link_;
  EXPECT_FALSE(Make(one)->ConsumeOpenedInPrivateDirectory());
  ClientConfig shared = Config();
  shared.shared_storage = true;
  EXPECT_FALSE(Make(shared)->ConsumeOpenedInPrivateDirectory());
  // The service produces into our consumer directory: not private either.
  fake_->set_producer_path(std::filesystem::canonical(cons_).string());
  EXPECT_FALSE(Make(Config())->ConsumeOpenedInPrivateDirectory());
}

// Waits (bounded) for a child; kills it when it does not end in time.
int WaitChild(pid_t pid) {
  int status = 0;
  for (int i = 0; i < 1000; ++i) {
    if (waitpid(pid, &status, WNOHANG) == pid) return status;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return status;
}

// Item 1 of the client's cost per consume: fork detection costs no system
// call now; a consume in a child (of fork(), and of a raw clone that runs no
// atfork handler) after the parent consumed still goes on a connection of
// the child's own.
TEST_F(FakeServiceTest, ForkedChildConsumesOnItsOwnConnectionAfterTheParentConsumed) {
  auto c = Make(Config());
  ASSERT_TRUE(c->Consume(cons_ + "/a.dat").ok());
  ASSERT_EQ(fake_->connections(), 1);
  ASSERT_EQ(c->pool()->idle_count(), 1u);
  auto child_consumes = [&c, this](pid_t pid) {
    if (pid == 0) {
      int code = 0;
      if (!c->Consume(cons_ + "/b.dat").ok()) code |= 1;
      if (!c->Consume(cons_ + "/c.dat").ok()) code |= 2;
      _exit(code);
    }
  };
  for (const bool raw : {false, true}) {
    SCOPED_TRACE(raw ? "raw clone" : "fork");
    const int before = fake_->connections();
    const size_t consumes = fake_->count(MsgType::kConsume);
    const pid_t pid =
        raw ? static_cast<pid_t>(::syscall(SYS_clone, SIGCHLD, nullptr, nullptr, nullptr, nullptr))
            : fork();
    ASSERT_GE(pid, 0);
    child_consumes(pid);
    const int status = WaitChild(pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
    // Both of the child's consumes came on one new connection, none on the
    // parent's (connection 1).
    auto reqs = fake_->requests();
    ASSERT_EQ(fake_->count(MsgType::kConsume), consumes + 2);
    EXPECT_EQ(fake_->connections(), before + 1);
    EXPECT_EQ(reqs[reqs.size() - 2].conn, before + 1);
    EXPECT_EQ(reqs[reqs.size() - 1].conn, before + 1);
    // The parent's connection is intact and still pooled.
    ASSERT_TRUE(c->Consume(cons_ + "/d.dat").ok());
    EXPECT_EQ(fake_->requests().back().conn, 1);
  }
}

// Item 1: no liveness check before reusing a pooled connection. A service
// restarted between two consumes of one client (the pooled connection is
// dead) still answers the second consume at once, exactly once.
TEST_F(FakeServiceTest, ConsumeAfterAServiceRestartIsAnsweredAtOnce) {
  auto c = Make(Config());
  ASSERT_TRUE(c->Consume(cons_ + "/a.dat").ok());
  ASSERT_EQ(c->pool()->idle_count(), 1u);
  fake_.reset();  // closes every connection
  fake_ = std::make_unique<FakeService>(tmp_.Sub("svc.sock"));
  ASSERT_TRUE(fake_->listening());
  const auto t0 = std::chrono::steady_clock::now();
  Status s = c->Consume(cons_ + "/b.dat");
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(1));
  EXPECT_EQ(fake_->count(MsgType::kConsume), 1u);
  EXPECT_EQ(fake_->connections(), 1);
  // The same for a publish (checked before its send instead).
  WriteFile(prod_real_ + "/p.dat", "x");
  ASSERT_TRUE(c->Produce(prod_link_ + "/p.dat").ok());
  fake_.reset();
  fake_ = std::make_unique<FakeService>(tmp_.Sub("svc.sock"));
  ASSERT_TRUE(fake_->listening());
  fake_->set_producer_path(std::filesystem::canonical(prod_real_).string());
  s = c->Produce(prod_link_ + "/p.dat");
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(fake_->count(MsgType::kPublish), 1u);
}

// Item 1: a publish is not a no-op when repeated (a new publication
// counter), so one whose connection is lost after its send is reported, not
// sent again; a consume in the same case is sent again once.
TEST_F(FakeServiceTest, PublishLostAfterItsSendIsNotRepeated) {
  auto c = Make(Config());
  ASSERT_TRUE(c->Ping().ok());  // leaves a pooled connection
  WriteFile(prod_real_ + "/p.dat", "x");
  fake_->set_drop_requests(true);
  Status s = c->Produce(prod_link_ + "/p.dat");
  EXPECT_EQ(s.code(), DYAD_RC_CONNLOST) << s.ToString();
  EXPECT_EQ(fake_->count(MsgType::kPublish), 1u);
  fake_->set_drop_requests(false);
  ASSERT_TRUE(c->Ping().ok());
  fake_->set_drop_requests(true);
  s = c->Consume(cons_ + "/a.dat");
  EXPECT_EQ(s.code(), DYAD_RC_CONNLOST) << s.ToString();
  EXPECT_EQ(fake_->count(MsgType::kConsume), 2u);  // the pooled connection, then a fresh one
}

// Item 1: the consumer directory is looked at once per client; one removed
// between two consumes is made again when the service's consume fails for
// want of it, and the consume is asked again.
TEST_F(FakeServiceTest, ConsumerDirectoryRemovedBetweenConsumesIsMadeAgain) {
  fake_->set_handler([this](uint16_t type, const std::string& p) -> FakeService::Answer {
    if (type == static_cast<uint16_t>(MsgType::kConsume)) {
      ConsumeRequest req;
      Decoder d(p);
      if (req.DecodeFrom(d) && !std::filesystem::is_directory(req.cons_path))
        return std::make_pair(Status(DYAD_RC_BADFIO, "prepare: no consumer directory"),
                              std::string());
    }
    return fake_->DefaultAnswer(type, p);
  });
  auto c = Make(Config());
  ASSERT_TRUE(c->Consume(cons_ + "/a.dat").ok());
  ASSERT_TRUE(std::filesystem::is_directory(cons_));
  std::filesystem::remove_all(cons_);
  Status s = c->Consume(cons_ + "/b.dat");
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(std::filesystem::is_directory(cons_));
  EXPECT_EQ(fake_->count(MsgType::kConsume), 3u);
  // A directory that cannot be made: the service's error, as before.
  std::filesystem::remove_all(cons_);
  WriteFile(cons_, "a file where the directory should be");
  s = c->Consume(cons_ + "/c.dat");
  EXPECT_EQ(s.code(), DYAD_RC_BADFIO) << s.ToString();
  EXPECT_NE(s.message().find("no consumer directory"), std::string::npos) << s.ToString();
  std::filesystem::remove(cons_);
}

}  // namespace
}  // namespace dyad
