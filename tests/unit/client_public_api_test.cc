// Tests of the public C++ client (dyad/client/dyad_client.hpp) as a program
// sees it through libdyad_ctx: options and their defaults, path resolution,
// every request against a fake service on a temporary Unix socket, the view
// of the C context, the interrupt check and SetLastError.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <thread>

#include "client/client.h"  // ClientConfig: the defaults the public Options must match
#include "client_test_util.h"
#include "dyad/client/dyad_client.hpp"
#include "dyad/core/dyad_ctx.h"

namespace dyad {
namespace {

using client::Client;
using client::Options;
using client::Side;
using testing_util::EnvScrub;
using testing_util::FakeService;
using testing_util::TempDir;
using testing_util::WriteFile;

class PublicClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    prod_ = tmp_.Sub("prod");
    cons_ = tmp_.Sub("cons");
    std::filesystem::create_directories(prod_);
    fake_ = std::make_unique<FakeService>(tmp_.Sub("svc.sock"));
    ASSERT_TRUE(fake_->listening());
    fake_->set_producer_path(std::filesystem::canonical(prod_).string());
  }
  void TearDown() override {
    client::SetInterruptCheck(nullptr);
    dyad_finalize();
  }

  Options Opts() const {
    Options o;
    o.producer_path = prod_;
    o.consumer_path = cons_;
    o.service_socket = fake_->path();
    o.rpc_timeout_ms = 5000;
    return o;
  }
  Client Make(const Options& o) {
    Client c;
    const client::Status st = Client::Create(o, &c);
    EXPECT_TRUE(st.ok()) << st.ToString();
    return c;
  }

  EnvScrub scrub_;
  TempDir tmp_;
  std::string prod_, cons_;
  std::unique_ptr<FakeService> fake_;
};

TEST(PublicOptionsTest, DefaultsAreTheClientDefaults) {
  const Options o;
  const ClientConfig c;
  EXPECT_EQ(o.debug, c.debug);
  EXPECT_EQ(o.check, c.check);
  EXPECT_EQ(o.shared_storage, c.shared_storage);
  EXPECT_EQ(o.async_publish, c.async_publish);
  EXPECT_EQ(o.fsync_write, c.fsync_write);
  EXPECT_EQ(o.key_depth, c.key_depth);
  EXPECT_EQ(o.key_bins, c.key_bins);
  EXPECT_EQ(o.service_mux, c.service_mux);
  EXPECT_EQ(o.relative_to_managed_path, c.relative_to_managed_path);
  EXPECT_EQ(o.consume_timeout_ms, c.consume_timeout_ms);
  EXPECT_EQ(o.rpc_timeout_ms, c.rpc_timeout_ms);
  EXPECT_TRUE(o.dtl_mode.empty());  // not chosen: the service's own mode
}

TEST(PublicOptionsTest, FromEnvReadsTheVariablesAndNamesABadOne) {
  EnvScrub scrub;
  ::setenv("DYAD_KEY_DEPTH", "2", 1);
  ::setenv("DYAD_PATH_CONSUMER", "/tmp/dyad-public-cons", 1);
  ::setenv("DYAD_DTL_MODE", "tcp", 1);
  ::setenv("DYAD_CONSUME_TIMEOUT", "1.5", 1);
  Options o;
  client::Status st = Options::FromEnv(&o);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(o.key_depth, 2u);
  EXPECT_EQ(o.consumer_path, "/tmp/dyad-public-cons");
  EXPECT_EQ(o.dtl_mode, "TCP");
  EXPECT_EQ(o.consume_timeout_ms, 1500);

  ::setenv("DYAD_DTL_MODE", "no-such-mode", 1);
  Options untouched;
  untouched.key_depth = 9;
  st = Options::FromEnv(&untouched);
  EXPECT_EQ(st.code(), DYAD_RC_BADDTLMODE) << st.ToString();
  EXPECT_NE(st.message().find("DYAD_DTL_MODE"), std::string::npos) << st.message();
  EXPECT_EQ(untouched.key_depth, 9u);  // output set only on success
}

TEST_F(PublicClientTest, CreateNormalizesTheOptions) {
  Options o = Opts();
  o.dtl_mode = "flux_rpc";
  o.key_bins = 0;
  const Client c = Make(o);
  ASSERT_TRUE(c.valid());
  const Options got = c.options();
  EXPECT_EQ(got.dtl_mode, "FLUX_RPC");
  EXPECT_EQ(got.key_bins, 1u);
  EXPECT_EQ(got.producer_path, prod_);
  EXPECT_TRUE(c.has_producer_path());
  EXPECT_TRUE(c.has_consumer_path());

  o.dtl_mode = "carrier-pigeon";
  Client bad;
  EXPECT_EQ(Client::Create(o, &bad).code(), DYAD_RC_BADDTLMODE);
  EXPECT_FALSE(bad.valid());
}

TEST_F(PublicClientTest, AnEmptyClientRefusesEveryRequest) {
  Client c;
  EXPECT_FALSE(c.valid());
  EXPECT_EQ(c.Produce(prod_ + "/a").code(), DYAD_RC_NOCTX);
  EXPECT_EQ(c.Consume(cons_ + "/a").code(), DYAD_RC_NOCTX);
  EXPECT_EQ(c.Ping().code(), DYAD_RC_NOCTX);
  EXPECT_FALSE(c.IsManaged(cons_ + "/a", Side::kConsumer));
  EXPECT_EQ(fake_->requests().size(), 0u);
}

TEST_F(PublicClientTest, ResolveAndIsManagedAgree) {
  const Client c = Make(Opts());
  std::string rel;
  ASSERT_TRUE(c.Resolve(cons_ + "/d/f.dat", Side::kConsumer, &rel).ok());
  EXPECT_EQ(rel, "d/f.dat");
  EXPECT_TRUE(c.IsManaged(cons_ + "/d/f.dat", Side::kConsumer));

  rel = "unchanged";
  EXPECT_EQ(c.Resolve("/etc/passwd", Side::kConsumer, &rel).code(), DYAD_RC_UNTRACKED);
  EXPECT_EQ(rel, "unchanged");
  EXPECT_FALSE(c.IsManaged("/etc/passwd", Side::kConsumer));
  EXPECT_FALSE(c.IsManaged(static_cast<const char*>(nullptr), Side::kConsumer));
}

TEST_F(PublicClientTest, KeyOfIsTheSeedsKey) {
  const Client c = Make(Opts());
  EXPECT_EQ(c.KeyOf("1/data0.txt"), "263.2ce.2e1.1/data0.txt");
}

TEST_F(PublicClientTest, ProduceAndConsumeReachTheService) {
  Client c = Make(Opts());
  WriteFile(prod_ + "/out.dat", "payload");
  client::Status st = c.Produce(prod_ + "/out.dat");
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(fake_->count(MsgType::kPublish), 1u);

  client::ConsumeInfo info;
  st = c.Consume(cons_ + "/in.dat", &info);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(fake_->count(MsgType::kConsume), 1u);
  EXPECT_EQ(info.path, "in.dat");
  EXPECT_FALSE(info.level1);
  EXPECT_TRUE(info.transferred);
  EXPECT_EQ(info.bytes, 7u);
  EXPECT_EQ(info.metadata.path, "in.dat");
  EXPECT_EQ(info.metadata.size, 7u);

  // Complete locally already: level 1, no request.
  WriteFile(cons_ + "/here.dat", "x");
  st = c.Consume(cons_ + "/here.dat", &info);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(info.level1);
  EXPECT_EQ(fake_->count(MsgType::kConsume), 1u);

  EXPECT_EQ(c.Produce("/etc/passwd").code(), DYAD_RC_UNTRACKED);
}

TEST_F(PublicClientTest, MetadataListStatusAndPing) {
  Client c = Make(Opts());
  client::Metadata md;
  md.size = 99;
  EXPECT_EQ(c.GetMetadata(cons_ + "/none", false, &md).code(), DYAD_RC_NOTFOUND);
  EXPECT_EQ(md.size, 99u);

  fake_->set_handler([this](uint16_t type, const std::string& p) -> FakeService::Answer {
    if (type != static_cast<uint16_t>(MsgType::kList)) return fake_->DefaultAnswer(type, p);
    FileRecord rec;
    rec.upath = "a/b.dat";
    rec.owner_rank = 3;
    rec.size = 42;
    rec.version = 1234;
    Encoder e;
    e.U32(1);
    e.Str("key-of-a/b.dat");
    e.Str(rec.Encode());
    return std::make_pair(Status::OK(), e.Take());
  });
  std::vector<client::ListEntry> entries;
  client::Status st = c.ListNamespace("other-ns", "a/", 10, &entries);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].key, "key-of-a/b.dat");
  EXPECT_EQ(entries[0].metadata.path, "a/b.dat");
  EXPECT_EQ(entries[0].metadata.owner_rank, 3u);
  EXPECT_EQ(entries[0].metadata.size, 42u);
  EXPECT_EQ(entries[0].metadata.version, 1234u);
  ListRequest sent;
  const std::string payload = fake_->last(MsgType::kList)->payload;
  Decoder d(payload);
  ASSERT_TRUE(sent.DecodeFrom(d));
  EXPECT_EQ(sent.ns, "other-ns");
  EXPECT_EQ(sent.path_prefix, "a/");
  EXPECT_EQ(sent.limit, 10u);

  client::ServiceStatus status;
  st = c.GetServiceStatus(&status);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(status.info["rank"], "0");
  EXPECT_EQ(status.counters["requests.status"], 1u);
  EXPECT_TRUE(c.Ping().ok());
}

// What `dyad peers`, `dyad status` and `dyad consume -v` show comes through
// the public client: peers with their state, transfers in flight, the
// socket that answered, and who served a consume over which transport.
TEST_F(PublicClientTest, PeersTransfersAndServedByComeThrough) {
  Client c = Make(Opts());
  fake_->set_handler([this](uint16_t type, const std::string& p) -> FakeService::Answer {
    Encoder e;
    if (type == static_cast<uint16_t>(MsgType::kPeers)) {
      PeersReply reply;
      PeerInfo peer;
      peer.record.rank = 7;
      peer.record.node_idx = 2;
      peer.record.address = "10.0.0.7:7590";
      peer.record.hostname = "node7";
      peer.record.pid = 4242;
      peer.record.incarnation = 0xabcdef;
      peer.state = PeerState::kOtherIdentity;
      peer.rtt_ns = 1500;
      peer.detail = "answers as rank 8";
      reply.peers.push_back(peer);
      reply.EncodeTo(e);
      return std::make_pair(Status::OK(), e.Take());
    }
    if (type == static_cast<uint16_t>(MsgType::kStatus)) {
      StatusReply reply;
      reply.info["rank"] = "1";
      TransferInfo t;
      t.outgoing = false;
      t.upath = "big.dat";
      t.peer_rank = 7;
      t.transport = "tcp";
      t.bytes_total = 1000;
      reply.transfers.push_back(t);  // bytes_done unknown
      reply.EncodeTo(e);
      return std::make_pair(Status::OK(), e.Take());
    }
    if (type == static_cast<uint16_t>(MsgType::kConsume)) {
      ConsumeReply reply;
      reply.record.upath = "in.dat";
      reply.record.owner_rank = 7;
      reply.transferred = true;
      reply.bytes = 3;
      reply.transport = "ucx";
      reply.owner_address = "10.0.0.7:7590";
      reply.EncodeTo(e);
      return std::make_pair(Status::OK(), e.Take());
    }
    return fake_->DefaultAnswer(type, p);
  });

  std::vector<client::Peer> peers;
  client::Status st = c.Peers({7, 9}, 250, &peers);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(peers.size(), 1u);
  EXPECT_EQ(peers[0].rank, 7u);
  EXPECT_EQ(peers[0].node, 2u);
  EXPECT_EQ(peers[0].address, "10.0.0.7:7590");
  EXPECT_EQ(peers[0].host, "node7");
  EXPECT_EQ(peers[0].pid, 4242u);
  EXPECT_EQ(peers[0].incarnation, 0xabcdefu);
  EXPECT_EQ(peers[0].state, client::PeerState::kOtherIdentity);
  EXPECT_STREQ(client::PeerStateName(peers[0].state), "stale");
  EXPECT_EQ(peers[0].rtt_ns, 1500u);
  EXPECT_EQ(peers[0].detail, "answers as rank 8");
  PeersRequest sent;
  // last() returns a copy: keep its payload alive while it is decoded.
  std::string payload = fake_->last(MsgType::kPeers)->payload;
  Decoder d(payload);
  ASSERT_TRUE(sent.DecodeFrom(d));
  EXPECT_TRUE(sent.probe);
  EXPECT_EQ(sent.probe_timeout_ms, 250);
  EXPECT_EQ(sent.ranks, (std::vector<uint32_t>{7, 9}));
  // No probe asked: the service is told not to probe.
  ASSERT_TRUE(c.Peers({}, 0, &peers).ok());
  payload = fake_->last(MsgType::kPeers)->payload;
  Decoder d2(payload);
  sent = PeersRequest();
  ASSERT_TRUE(sent.DecodeFrom(d2));
  EXPECT_FALSE(sent.probe);
  EXPECT_TRUE(sent.ranks.empty());

  client::ServiceStatus status;
  st = c.GetServiceStatus(&status);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(status.socket, fake_->path());
  ASSERT_EQ(status.transfers.size(), 1u);
  EXPECT_FALSE(status.transfers[0].outgoing);
  EXPECT_EQ(status.transfers[0].path, "big.dat");
  EXPECT_EQ(status.transfers[0].peer_rank, 7u);
  EXPECT_EQ(status.transfers[0].transport, "tcp");
  EXPECT_EQ(status.transfers[0].bytes_done, client::Transfer::kUnknownBytes);
  EXPECT_EQ(status.transfers[0].bytes_total, 1000u);

  client::ConsumeInfo info;
  st = c.Consume(cons_ + "/in.dat", &info);
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(info.transport, "ucx");
  EXPECT_EQ(info.owner_address, "10.0.0.7:7590");
  EXPECT_EQ(info.metadata.owner_rank, 7u);
}

TEST_F(PublicClientTest, FromContextSharesTheContextsClient) {
  Client c;
  EXPECT_EQ(Client::FromContext(dyad_ctx_get(), &c).code(), DYAD_RC_NOCTX);
  ::setenv("DYAD_SERVICE_SOCKET", fake_->path().c_str(), 1);
  ASSERT_EQ(dyad_init(false, false, false, false, false, false, 2, 64, 1, "ns1", nullptr,
                      cons_.c_str(), false, nullptr, DYAD_COMM_RECV, nullptr),
            DYAD_RC_OK);
  client::Status st = Client::FromContext(dyad_ctx_get(), &c);
  ASSERT_TRUE(st.ok()) << st.ToString();
  const Options o = c.options();
  EXPECT_EQ(o.key_depth, 2u);
  EXPECT_EQ(o.key_bins, 64u);
  EXPECT_EQ(o.kvs_namespace, "ns1");
  EXPECT_EQ(o.consumer_path, cons_);
  EXPECT_FALSE(c.has_producer_path());
  // A client already obtained outlives the context's finalization.
  dyad_finalize();
  EXPECT_TRUE(c.Ping().ok());
  Client after;
  EXPECT_EQ(Client::FromContext(dyad_ctx_get(), &after).code(), DYAD_RC_NOCTX);
}

TEST_F(PublicClientTest, SetLastErrorFeedsTheCApi) {
  EXPECT_EQ(client::SetLastError(client::Status(DYAD_RC_TIMEOUT, "waited too long")),
            DYAD_RC_TIMEOUT);
  EXPECT_STREQ(dyad_last_error(), "waited too long");
  EXPECT_EQ(client::SetLastError(client::Status()), DYAD_RC_OK);
  EXPECT_STREQ(dyad_last_error(), "waited too long");
}

TEST_F(PublicClientTest, InterruptCheckCancelsAWait) {
  Client c = Make(Opts());
  fake_->set_handler([](uint16_t, const std::string&) -> FakeService::Answer { return {}; });
  std::atomic<bool> stop{false};
  client::SetInterruptCheck([&] { return stop.load(); });
  std::thread t([&] {
    ::usleep(300000);
    stop = true;
  });
  const auto t0 = std::chrono::steady_clock::now();
  const client::Status st = c.Consume(cons_ + "/never.dat");
  t.join();
  EXPECT_EQ(st.code(), DYAD_RC_CANCELLED) << st.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(3));
}

}  // namespace
}  // namespace dyad
