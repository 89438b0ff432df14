// insecure_test.cc: emulated nodes whose services have no credential at
// all (no cluster secret, no MUNGE) and listen on their node's network
// address (issue 12, defect 14, in a whole cluster).
//
// Told --insecure they start, exchange files, and say what that means: the
// service's log warns that anyone reaching the port can fetch files and
// write the metadata store, and `dyad status` reports no credential. Not
// told, the first service refuses to start and says why and how to fix it.
// Since issue 25 (item 8) the same holds on loopback, where every local
// user reaches the port. (StartupTest.Defect14_* and
// StartupTest.Hardening2_NoCredentialRefusedOnLoopback check the refusal for a
// lone service; this checks it where the emulator's users meet it.)
#include "integration/integration_util.h"

namespace dyad::it {
namespace {

emu::ClusterOptions NoCredential() {
  emu::ClusterOptions o;
  o.use_secret = false;
  return o;
}

class InsecureClusterTest : public TwoNodeTest {
 protected:
  emu::ClusterOptions Options() override {
    emu::ClusterOptions o = NoCredential();
    o.extra_service_args = {"--insecure"};
    return o;
  }
};

TEST_F(InsecureClusterTest, ServicesWithoutCredentialExchangeAndSaySo) {
  const std::vector<ManifestEntry> files = {{"insecure/a.dat", 200003}, {"insecure/b.dat", 7}};
  Produce(files);
  ConsumeOk(files);
  for (int node : {kA, kB}) {
    SCOPED_TRACE("node " + std::to_string(node));
    const std::string log = cluster().ServiceLogTail(node, 1 << 20);
    EXPECT_NE(log.find("running --insecure"), std::string::npos) << log;
    EXPECT_NE(log.find("any file of the producer directory"), std::string::npos) << log;
    EXPECT_NE(log.find("metadata store"), std::string::npos) << log;
    Result<emu::RunResult> status = cluster().RunOnNode(node, {dyad_, "status", "--json"}, 10000);
    ASSERT_TRUE(status.ok()) << Str(status.status());
    EXPECT_NE(status->output.find("\"credentials\": \"none\""), std::string::npos)
        << status->output;
  }
}

TEST(InsecureCluster, WithoutInsecureTheServiceRefusesToStartAndSaysWhy) {
  emu::ClusterOptions o = NoCredential();
  o.bin_dir = DYAD_BUILD_BIN_DIR;
  o.ready_timeout_ms = 5000;
  Result<std::unique_ptr<EmuCluster>> c = EmuCluster::Start(2, o);
  if (c.ok()) {
    (*c)->Teardown();
    FAIL() << "services without a credential started";
  }
  const std::string why = c.status().message();
  EXPECT_NE(why.find("refusing to listen on"), std::string::npos) << why;
  EXPECT_NE(why.find("without a credential"), std::string::npos) << why;
  EXPECT_NE(why.find("--secret-file"), std::string::npos) << why;
  EXPECT_NE(why.find("published or not"), std::string::npos) << why;
  EXPECT_NE(why.find("--insecure"), std::string::npos) << why;
}

}  // namespace
}  // namespace dyad::it
