// The client on a Flux node whose broker runs no dyad.so module (issue 27,
// "consumers on nodes without the module"; docs/flux.md). Runs inside
// `flux start --test-size=2` (tests/flux/CMakeLists.txt): the client uses
// rank 0 (FLUX_URI) and has no local service; a stand-in for the owner's
// module on rank 1 serves `dyad.fetch` in upstream's format (request
// {"upath": P}, raw responses with the bytes, ENODATA at the end) from its
// own producer directory, and records are committed to the KVS as the
// flux:// store lays them out. The real module meets the same client in
// tests/flux/upstream_ci_test.sh.
#include <dlfcn.h>
#include <flux/core.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "client/client.h"
#include "client/service_pool.h"
#include "common/fsutil.h"
#include "dyad/client/dyad_client.h"
#include "dyad/core/dyad_ctx.h"
#include "kvs/flux/flux_keys.h"
#include "proto/protocol.h"
#include "util.h"

namespace dyad {
namespace {

std::string RunCommand(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  ::pclose(p);
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  return out;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

// Files below `dir` whose name starts with the temporary prefix.
int CountTemporaries(const std::string& dir) {
  const std::string out = RunCommand("find '" + dir + "' -name '" + kPartPrefix + "*' | wc -l");
  return std::atoi(out.c_str());
}

// The stand-in for the owner's module: a reactor thread on its own handle
// to `uri` that registers service "dyad" and answers dyad.fetch from
// `prod_dir`. `short_by` bytes are left out of every answer (a lying or
// broken owner).
class FakeOwner {
 public:
  FakeOwner(const std::string& uri, std::string prod_dir) : prod_(std::move(prod_dir)) {
    h_ = flux_open(uri.c_str(), 0);
    if (h_ == nullptr) return;
    flux_future_t* f = flux_service_register(h_, "dyad");
    if (f == nullptr || flux_future_get(f, nullptr) < 0) {
      flux_future_destroy(f);
      flux_close(h_);
      h_ = nullptr;
      return;
    }
    flux_future_destroy(f);
    struct flux_match match = FLUX_MATCH_REQUEST;
    match.topic_glob = const_cast<char*>("dyad.fetch");
    mh_ = flux_msg_handler_create(h_, match, &FakeOwner::OnFetch, this);
    flux_msg_handler_start(mh_);
    timer_ = flux_timer_watcher_create(flux_get_reactor(h_), 0.05, 0.05, &FakeOwner::OnTick, this);
    flux_watcher_start(timer_);
    thread_ = std::thread([this] { flux_reactor_run(flux_get_reactor(h_), 0); });
  }
  ~FakeOwner() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
    if (timer_ != nullptr) flux_watcher_destroy(timer_);
    if (mh_ != nullptr) flux_msg_handler_destroy(mh_);
    if (h_ != nullptr) flux_close(h_);
  }
  bool ok() const { return h_ != nullptr; }
  int requests() const { return requests_.load(); }
  void set_short_by(size_t n) { short_by_ = n; }

 private:
  static void OnTick(flux_reactor_t* r, flux_watcher_t*, int, void* arg) {
    if (static_cast<FakeOwner*>(arg)->stop_.load()) flux_reactor_stop(r);
  }
  static void OnFetch(flux_t* h, flux_msg_handler_t*, const flux_msg_t* msg, void* arg) {
    auto* self = static_cast<FakeOwner*>(arg);
    self->requests_++;
    const char* upath = nullptr;
    if (flux_request_unpack(msg, nullptr, "{s:s}", "upath", &upath) < 0) {
      flux_respond_error(h, msg, EPROTO, "malformed dyad.fetch");
      return;
    }
    std::ifstream in(self->prod_ + "/" + upath, std::ios::binary);
    if (!in) {
      flux_respond_error(h, msg, ENOENT, "no such file");
      return;
    }
    std::stringstream ss;
    ss << in.rdbuf();
    std::string data = ss.str();
    data.resize(data.size() > self->short_by_ ? data.size() - self->short_by_ : 0);
    constexpr size_t kChunk = 4096;  // several responses for the larger files
    for (size_t off = 0; off < data.size(); off += kChunk) {
      const size_t n = std::min(kChunk, data.size() - off);
      flux_respond_raw(h, msg, data.data() + off, static_cast<int>(n));
    }
    flux_respond_error(h, msg, ENODATA, nullptr);
  }

  std::string prod_;
  flux_t* h_ = nullptr;
  flux_msg_handler_t* mh_ = nullptr;
  flux_watcher_t* timer_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> requests_{0};
  size_t short_by_ = 0;
};

class FluxClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* uri = std::getenv("FLUX_URI");
    ASSERT_NE(uri, nullptr) << "run inside flux start --test-size=2";
    uri_ = uri;
    owner_uri_ = RunCommand("flux exec -r 1 flux getattr local-uri");
    ASSERT_EQ(owner_uri_.rfind("local://", 0), 0u) << "need a second broker: " << owner_uri_;
    root_ = testutil::MakeTempDir("dyad-flux-client.");
    ASSERT_FALSE(root_.empty()) << std::strerror(errno);
    prod_ = root_ + "/prod";
    cons_ = root_ + "/cons";
    ASSERT_EQ(::mkdir(prod_.c_str(), 0755), 0);
    h_ = flux_open(uri_.c_str(), 0);
    ASSERT_NE(h_, nullptr);
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    ns_ = std::string("t") + std::to_string(::getpid()) + "-" + info->name();
    flux_future_t* f = flux_kvs_namespace_create(h_, ns_.c_str(), ::getuid(), 0);
    ASSERT_TRUE(f != nullptr && flux_future_get(f, nullptr) == 0);
    flux_future_destroy(f);
  }
  void TearDown() override {
    SetInterruptCheck(nullptr);
    if (h_ != nullptr) {
      flux_future_t* f = flux_kvs_namespace_remove(h_, ns_.c_str());
      if (f != nullptr) (void)flux_future_get(f, nullptr);
      flux_future_destroy(f);
      flux_close(h_);
    }
    if (!root_.empty()) (void)std::system(("rm -rf '" + root_ + "'").c_str());
  }

  ClientConfig Config() const {
    ClientConfig c;
    c.prod_managed_path = prod_;
    c.cons_managed_path = cons_;
    c.kvs_namespace = ns_;
    c.service_socket = root_ + "/no-module.sock";  // no dyad.so on this broker
    c.flux_uri = uri_;
    c.consume_timeout_ms = 20000;
    c.rpc_timeout_ms = 10000;
    return c;
  }

  // Publishes `upath` (already in the owner's producer directory) as the
  // flux:// store of rank 1's module would: value = the record.
  void Publish(const Client& client, const std::string& upath, uint32_t owner_rank = 1,
               const std::string* raw_value = nullptr) {
    struct stat st;
    ASSERT_EQ(::stat((prod_ + "/" + upath).c_str(), &st), 0);
    FileRecord rec;
    rec.owner_rank = owner_rank;
    rec.owner_incarnation = 7;
    rec.size = static_cast<uint64_t>(st.st_size);
    rec.version = MtimeNs(st);
    rec.upath = upath;
    rec.seq = 3;
    const std::string value = raw_value != nullptr ? *raw_value : FluxEncodeValue(rec.Encode());
    const std::string key = FluxKeyPath(kFluxDefaultTopDir, client.KeyOf(upath));
    flux_kvs_txn_t* txn = flux_kvs_txn_create();
    ASSERT_EQ(flux_kvs_txn_put_raw(txn, 0, key.c_str(), value.data(), value.size()), 0);
    flux_future_t* f = flux_kvs_commit(h_, ns_.c_str(), 0, txn);
    ASSERT_TRUE(f != nullptr && flux_future_get(f, nullptr) == 0) << std::strerror(errno);
    flux_future_destroy(f);
    flux_kvs_txn_destroy(txn);
  }

  std::string uri_, owner_uri_, root_, prod_, cons_, ns_;
  flux_t* h_ = nullptr;
};

TEST_F(FluxClientTest, ConsumeWithoutModuleFetchesFromOwnersModule) {
  FakeOwner owner(owner_uri_, prod_);
  ASSERT_TRUE(owner.ok());
  std::string data(100000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>('a' + i % 23);
  ASSERT_EQ(::mkdir((prod_ + "/sub").c_str(), 0755), 0);
  WriteFile(prod_ + "/sub/f.dat", data);
  Result<std::shared_ptr<Client>> client = Client::Create(Config());
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  ASSERT_NE((*client)->flux(), nullptr);
  Publish(**client, "sub/f.dat");

  ConsumeInfo info;
  Status st = (*client)->Consume(cons_ + "/sub/f.dat", &info);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(info.reply.transferred);
  EXPECT_EQ(info.reply.transport, "flux");
  EXPECT_EQ(info.reply.bytes, data.size());
  EXPECT_EQ(ReadFile(cons_ + "/sub/f.dat"), data);
  // Stamped as a service placement stamps its copies.
  struct stat ps, cs;
  ASSERT_EQ(::stat((prod_ + "/sub/f.dat").c_str(), &ps), 0);
  ASSERT_EQ(::stat((cons_ + "/sub/f.dat").c_str(), &cs), 0);
  EXPECT_EQ(MtimeNs(cs), MtimeNs(ps));
  char buf[64];
  const ssize_t n = ::getxattr((cons_ + "/sub/f.dat").c_str(), kVersionXattr, buf, sizeof buf);
  if (n >= 0 || errno != ENOTSUP) EXPECT_GT(n, 0);
  EXPECT_EQ(CountTemporaries(cons_), 0);
  // A second consume finds the copy current: no second transfer.
  const int before = owner.requests();
  ASSERT_TRUE((*client)->Consume(cons_ + "/sub/f.dat").ok());
  EXPECT_EQ(owner.requests(), before);
}

TEST_F(FluxClientTest, ConsumerStartedFirstWaitsForPublication) {
  FakeOwner owner(owner_uri_, prod_);
  ASSERT_TRUE(owner.ok());
  Result<std::shared_ptr<Client>> client = Client::Create(Config());
  ASSERT_TRUE(client.ok());
  Status st = Status(DYAD_RC_SYSFAIL, "not run");
  std::atomic<bool> done{false};
  std::thread consumer([&] {
    st = (*client)->Consume(cons_ + "/late.txt");
    done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_FALSE(done.load()) << "returned before the file was published: " << st.ToString();
  WriteFile(prod_ + "/late.txt", "written late\n");
  Publish(**client, "late.txt");
  consumer.join();
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(ReadFile(cons_ + "/late.txt"), "written late\n");
}

TEST_F(FluxClientTest, WaitIsBoundedByConsumeTimeout) {
  ClientConfig c = Config();
  c.consume_timeout_ms = 500;
  Result<std::shared_ptr<Client>> client = Client::Create(c);
  ASSERT_TRUE(client.ok());
  const auto t0 = std::chrono::steady_clock::now();
  Status st = (*client)->Consume(cons_ + "/never.txt");
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  EXPECT_EQ(st.code(), DYAD_RC_TIMEOUT) << st.ToString();
  EXPECT_NE(st.message().find("DYAD_CONSUME_TIMEOUT"), std::string::npos) << st.message();
  EXPECT_GE(ms, 450);
  EXPECT_LT(ms, 5000);
  EXPECT_NE(::access((cons_ + "/never.txt").c_str(), F_OK), 0);
  // The cancelled lookup left the pooled handle usable.
  FakeOwner owner(owner_uri_, prod_);
  WriteFile(prod_ + "/after.txt", "x");
  Publish(**client, "after.txt");
  EXPECT_TRUE((*client)->Consume(cons_ + "/after.txt").ok());
}

TEST_F(FluxClientTest, WaitIsInterruptible) {
  ClientConfig c = Config();
  c.consume_timeout_ms = -1;  // no limit: only the interrupt ends it
  Result<std::shared_ptr<Client>> client = Client::Create(c);
  ASSERT_TRUE(client.ok());
  const auto t0 = std::chrono::steady_clock::now();
  SetInterruptCheck(
      [t0] { return std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(400); });
  Status st = (*client)->Consume(cons_ + "/never.txt");
  SetInterruptCheck(nullptr);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  EXPECT_EQ(st.code(), DYAD_RC_CANCELLED) << st.ToString();
  EXPECT_LT(ms, 5000);
}

TEST_F(FluxClientTest, ShortTransferPlacesNothing) {
  FakeOwner owner(owner_uri_, prod_);
  ASSERT_TRUE(owner.ok());
  owner.set_short_by(10);
  WriteFile(prod_ + "/short.dat", std::string(9000, 'z'));
  Result<std::shared_ptr<Client>> client = Client::Create(Config());
  ASSERT_TRUE(client.ok());
  Publish(**client, "short.dat");
  Status st = (*client)->Consume(cons_ + "/short.dat");
  EXPECT_EQ(st.code(), DYAD_RC_STALE) << st.ToString();
  EXPECT_NE(st.message().find("nothing was placed"), std::string::npos) << st.message();
  EXPECT_NE(::access((cons_ + "/short.dat").c_str(), F_OK), 0);
  EXPECT_EQ(CountTemporaries(cons_), 0);
}

TEST_F(FluxClientTest, EmptyFileIsData) {
  FakeOwner owner(owner_uri_, prod_);
  ASSERT_TRUE(owner.ok());
  WriteFile(prod_ + "/empty", "");
  Result<std::shared_ptr<Client>> client = Client::Create(Config());
  ASSERT_TRUE(client.ok());
  Publish(**client, "empty");
  Status st = (*client)->Consume(cons_ + "/empty");
  ASSERT_TRUE(st.ok()) << st.ToString();
  struct stat cs;
  ASSERT_EQ(::stat((cons_ + "/empty").c_str(), &cs), 0);
  EXPECT_EQ(cs.st_size, 0);
}

TEST_F(FluxClientTest, OwnerWithoutModuleIsNoService) {
  // The record names rank 0, which serves no dyad.fetch (ENOSYS).
  WriteFile(prod_ + "/orphan", "o");
  Result<std::shared_ptr<Client>> client = Client::Create(Config());
  ASSERT_TRUE(client.ok());
  Publish(**client, "orphan", /*owner_rank=*/0);
  Status st = (*client)->Consume(cons_ + "/orphan");
  EXPECT_EQ(st.code(), DYAD_RC_NOSERVICE) << st.ToString();
  EXPECT_NE(st.message().find("flux module load dyad.so"), std::string::npos) << st.message();
  EXPECT_NE(::access((cons_ + "/orphan").c_str(), F_OK), 0);
}

TEST_F(FluxClientTest, ProduceWithoutModuleSaysLoadIt) {
  WriteFile(prod_ + "/mine", "m");
  Result<std::shared_ptr<Client>> client = Client::Create(Config());
  ASSERT_TRUE(client.ok());
  Status st = (*client)->Produce(prod_ + "/mine");
  EXPECT_EQ(st.code(), DYAD_RC_NOSERVICE) << st.ToString();
  EXPECT_NE(st.message().find("flux module load dyad.so"), std::string::npos) << st.message();
}

TEST_F(FluxClientTest, UpstreamRankOnlyRecordIsFetched) {
  // Upstream's modules store the owner's rank alone (a JSON integer).
  FakeOwner owner(owner_uri_, prod_);
  ASSERT_TRUE(owner.ok());
  WriteFile(prod_ + "/up.txt", "from an upstream module\n");
  Result<std::shared_ptr<Client>> client = Client::Create(Config());
  ASSERT_TRUE(client.ok());
  const std::string value = "1";
  Publish(**client, "up.txt", 1, &value);
  Status st = (*client)->Consume(cons_ + "/up.txt");
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(ReadFile(cons_ + "/up.txt"), "from an upstream module\n");
}

TEST_F(FluxClientTest, BatchWithoutModuleConsumesEach) {
  FakeOwner owner(owner_uri_, prod_);
  ASSERT_TRUE(owner.ok());
  ClientConfig c = Config();
  Result<std::shared_ptr<Client>> client = Client::Create(c);
  ASSERT_TRUE(client.ok());
  WriteFile(prod_ + "/b1", "one");
  WriteFile(prod_ + "/b2", "two");
  Publish(**client, "b1");
  Publish(**client, "b2");
  std::vector<Status> results;
  Status st = (*client)->ConsumeBatch({cons_ + "/b1", cons_ + "/b2", cons_ + "/b3"}, &results, 0);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0].ok()) << results[0].ToString();
  EXPECT_TRUE(results[1].ok()) << results[1].ToString();
  EXPECT_EQ(results[2].code(), DYAD_RC_TIMEOUT) << results[2].ToString();  // a wait of 0
  EXPECT_EQ(ReadFile(cons_ + "/b2"), "two");
}

// Two consumers waiting on a namespace nobody made yet: flux-core's
// kvs-watch aborts the broker for two WAITCREATE lookups on a missing
// namespace, so the client makes the namespace first.
TEST_F(FluxClientTest, WaitsOnANamespaceNotYetMadeKeepTheBrokerUp) {
  FakeOwner owner(owner_uri_, prod_);
  ASSERT_TRUE(owner.ok());
  ClientConfig c = Config();
  c.kvs_namespace = ns_ + "-new";
  Result<std::shared_ptr<Client>> client = Client::Create(c);
  ASSERT_TRUE(client.ok());
  Status st[2] = {Status(DYAD_RC_SYSFAIL, "not run"), Status(DYAD_RC_SYSFAIL, "not run")};
  std::thread a([&] { st[0] = (*client)->Consume(cons_ + "/n1"); });
  std::thread b([&] { st[1] = (*client)->Consume(cons_ + "/n2"); });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  WriteFile(prod_ + "/n1", "first");
  WriteFile(prod_ + "/n2", "second");
  const std::string saved = ns_;
  ns_ = c.kvs_namespace;
  Publish(**client, "n1");
  Publish(**client, "n2");
  ns_ = saved;
  a.join();
  b.join();
  EXPECT_TRUE(st[0].ok()) << st[0].ToString();
  EXPECT_TRUE(st[1].ok()) << st[1].ToString();
  EXPECT_EQ(ReadFile(cons_ + "/n2"), "second");
  // The broker is still there.
  EXPECT_EQ(RunCommand("flux getattr rank"), "0");
  flux_future_t* f = flux_kvs_namespace_remove(h_, c.kvs_namespace.c_str());
  if (f != nullptr) (void)flux_future_get(f, nullptr);
  flux_future_destroy(f);
}

TEST_F(FluxClientTest, SharedStorageOnlyWaitsForPublication) {
  FakeOwner owner(owner_uri_, prod_);
  ASSERT_TRUE(owner.ok());
  ClientConfig c = Config();
  c.shared_storage = true;
  Result<std::shared_ptr<Client>> client = Client::Create(c);
  ASSERT_TRUE(client.ok());
  WriteFile(prod_ + "/shared.txt", "s");
  Publish(**client, "shared.txt");
  Status st = (*client)->Consume(cons_ + "/shared.txt");
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(owner.requests(), 0);  // nothing moved
  EXPECT_NE(::access((cons_ + "/shared.txt").c_str(), F_OK), 0);
}

// dyad_init's flux_handle (was: must be NULL): with FLUX_URI unset the
// consume can only reach Flux through the caller's handle.
TEST_F(FluxClientTest, CallerFluxHandleIsUsed) {
  FakeOwner owner(owner_uri_, prod_);
  ASSERT_TRUE(owner.ok());
  WriteFile(prod_ + "/h.txt", "through the caller's handle\n");
  Result<std::shared_ptr<Client>> keyer = Client::Create(Config());
  ASSERT_TRUE(keyer.ok());
  Publish(**keyer, "h.txt");
  flux_t* mine = flux_open(uri_.c_str(), 0);
  ASSERT_NE(mine, nullptr);
  const std::string saved_uri = uri_;
  ::unsetenv("FLUX_URI");
  ::setenv("DYAD_SERVICE_SOCKET", (root_ + "/no-module.sock").c_str(), 1);
  const dyad_rc_t rc = dyad_init(false, false, false, true, false, false, 3, 1024, 1, ns_.c_str(),
                                 nullptr, cons_.c_str(), false, nullptr, DYAD_COMM_RECV, mine);
  ::setenv("FLUX_URI", saved_uri.c_str(), 1);
  ::unsetenv("DYAD_SERVICE_SOCKET");
  ASSERT_EQ(rc, DYAD_RC_OK) << dyad_last_error();
  const dyad_rc_t crc = dyad_consume(dyad_ctx_get(), (cons_ + "/h.txt").c_str());
  EXPECT_EQ(crc, DYAD_RC_OK) << dyad_last_error();
  EXPECT_EQ(ReadFile(cons_ + "/h.txt"), "through the caller's handle\n");
  EXPECT_EQ(dyad_finalize(), DYAD_RC_OK);
  flux_close(mine);  // still open until here: DYAD never closed it
}

}  // namespace
}  // namespace dyad
