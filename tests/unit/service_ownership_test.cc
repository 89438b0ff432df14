// Read-write ownership with three real services on loopback and the client
// library: a file moves A -> B -> A (each writer adopts its consumed copy),
// and a reader on C, whose copies are found by the level-1 shortcut (no
// message), sees every version in order, the same size each time.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "client/client.h"
#include "common/fsutil.h"
#include "service/service.h"
#include "unit/service_pair.h"
#include "util.h"

namespace dyad {
namespace {

using testing_services::CallLocal;
using testing_services::ReadAll;
using testing_services::WriteFile;

struct Node {
  std::unique_ptr<Service> service;
  std::shared_ptr<Client> client;
  std::string prod, cons, sock;
};

class Ownership : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = testutil::MakeTempDir("dyad-ownership.");
    ASSERT_FALSE(base_.empty());
    for (uint32_t rank = 0; rank < 3; ++rank) {
      Node n;
      const std::string name = std::string(1, static_cast<char>('a' + rank));
      n.prod = base_ + "/prod_" + name;
      n.cons = base_ + "/cons_" + name;
      n.sock = base_ + "/" + name + ".sock";
      ASSERT_EQ(::mkdir(n.prod.c_str(), 0755), 0);
      ASSERT_EQ(::mkdir(n.cons.c_str(), 0755), 0);
      ServiceOptions o;
      o.rank = rank;
      o.prod_path = n.prod;
      o.listen = "127.0.0.1:0";
      o.socket_path = n.sock;
      o.kvs_url = rank == 0 ? "embedded" : "embedded://" + nodes_[0].service->tcp_address();
      o.secret = "test-secret-0123456789abcdef0123";
      o.rpc_timeout_ms = 5000;
      n.service = std::make_unique<Service>(o);
      Status st = n.service->Start();
      ASSERT_TRUE(st.ok()) << st.ToString();
      ClientConfig c;
      c.prod_managed_path = n.prod;
      c.cons_managed_path = n.cons;
      c.service_socket = n.sock;
      c.rpc_timeout_ms = 5000;
      c.consume_timeout_ms = 10000;
      Result<std::shared_ptr<Client>> client = Client::Create(c);
      ASSERT_TRUE(client.ok()) << client.status().ToString();
      n.client = *client;
      nodes_.push_back(std::move(n));
    }
  }
  void TearDown() override {
    for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it) {
      it->client.reset();
      if (it->service) it->service->Stop();
    }
    nodes_.clear();
    EXPECT_TRUE(testutil::RemoveTree(base_));
  }

  // Consumes f on node `i` and returns what its consumer directory holds.
  std::string Read(size_t i) {
    Status st = nodes_[i].client->Consume(nodes_[i].cons + "/f");
    EXPECT_TRUE(st.ok()) << st.ToString();
    return ReadAll(nodes_[i].cons + "/f");
  }
  // Node `i` rewrites its consumed copy and closes it: it becomes the owner.
  void Rewrite(size_t i, const std::string& data) {
    WriteFile(nodes_[i].cons + "/f", data);
    Status st = nodes_[i].client->Adopt(nodes_[i].cons + "/f");
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  uint64_t Counter(size_t i, const std::string& name) {
    Result<StatusReply> r = nodes_[i].client->ServiceStatus();
    EXPECT_TRUE(r.ok());
    return r.ok() ? r->counters[name] : 0;
  }

  std::string base_;
  std::vector<Node> nodes_;
};

TEST_F(Ownership, MovesAToBToAAndCSeesEachVersionInOrder) {
  WriteFile(nodes_[0].prod + "/f", "version-1");
  ASSERT_TRUE(nodes_[0].client->Produce(nodes_[0].prod + "/f").ok());
  EXPECT_EQ(Read(2), "version-1");
  EXPECT_EQ(Read(1), "version-1");

  Rewrite(1, "version-2");  // B owns it now
  EXPECT_EQ(ReadAll(nodes_[1].prod + "/f"), "version-2");
  Result<FileRecord> rec = nodes_[2].client->GetMetadata(nodes_[2].cons + "/f", false);
  ASSERT_TRUE(rec.ok());
  EXPECT_EQ(rec->owner_rank, 1u);
  EXPECT_EQ(Read(2), "version-2");  // C's old copy did not survive the notice
  EXPECT_EQ(Read(1), "version-2");  // the writer's own copy is current: kept
  EXPECT_EQ(Counter(1, "transfers.in"), 1u);

  EXPECT_EQ(Read(0), "version-2");
  Rewrite(0, "version-3");  // back to A
  EXPECT_EQ(Read(2), "version-3");
  EXPECT_EQ(Read(1), "version-3");
  EXPECT_EQ(Read(0), "version-3");
  EXPECT_GE(Counter(2, "node_cache.superseded"), 2u);
  // Unchanged since: every node answers from its copy.
  const uint64_t before = Counter(2, "transfers.in");
  EXPECT_EQ(Read(2), "version-3");
  EXPECT_EQ(Counter(2, "transfers.in"), before);
}

TEST_F(Ownership, AProducerRewritingItsFileReachesLevelOneReaders) {
  WriteFile(nodes_[0].prod + "/f", "version-1");
  ASSERT_TRUE(nodes_[0].client->Produce(nodes_[0].prod + "/f").ok());
  EXPECT_EQ(Read(1), "version-1");
  EXPECT_EQ(Read(2), "version-1");
  WriteFile(nodes_[0].prod + "/f", "version-2");
  ASSERT_TRUE(nodes_[0].client->Produce(nodes_[0].prod + "/f").ok());
  EXPECT_EQ(Read(1), "version-2");
  EXPECT_EQ(Read(2), "version-2");
}

// consume_w_metadata: a copy stamped with the record's version needs no
// message at all; a record of another version with the same size and mtime
// is not mistaken for it.
TEST_F(Ownership, KnownMetadataTellsVersionsApartWithoutAMessage) {
  WriteFile(nodes_[0].prod + "/f", "version-1");
  ASSERT_TRUE(nodes_[0].client->Produce(nodes_[0].prod + "/f").ok());
  Client& c = *nodes_[2].client;
  const std::string f = nodes_[2].cons + "/f";
  Result<FileRecord> rec = c.GetMetadata(f, true);
  ASSERT_TRUE(rec.ok()) << rec.status().ToString();
  ConsumeInfo info;
  ASSERT_TRUE(c.ConsumeWithRecord(f, *rec, &info).ok());
  EXPECT_TRUE(info.reply.transferred);
  ASSERT_TRUE(c.ConsumeWithRecord(f, *rec, &info).ok());
  EXPECT_TRUE(info.level1);  // stamped copy, no request
  FileRecord other = *rec;
  other.seq += 1;  // same size and mtime, another publication
  ASSERT_TRUE(c.ConsumeWithRecord(f, other, &info).ok());
  EXPECT_FALSE(info.level1);
}

TEST_F(Ownership, WithoutAProducerDirectoryTheWriterIsTold) {
  ClientConfig c;
  c.cons_managed_path = nodes_[1].cons;
  c.service_socket = nodes_[1].sock;
  Result<std::shared_ptr<Client>> reader = Client::Create(c);
  ASSERT_TRUE(reader.ok());
  WriteFile(nodes_[1].cons + "/g", "x");
  Status st = (*reader)->Adopt(nodes_[1].cons + "/g");
  EXPECT_EQ(st.code(), DYAD_RC_BADMANAGEDPATH);
  EXPECT_NE(st.message().find("DYAD_PATH_PRODUCER"), std::string::npos);
}

}  // namespace
}  // namespace dyad
