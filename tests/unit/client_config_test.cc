// Tests of ClientConfig::FromEnv and Client::Create normalization: the
// defaults equal the configuration table, booleans follow upstream (set
// means true) except 0/false/no/off, and malformed values are errors that
// name the variable.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>

#include "client/client.h"
#include "client_test_util.h"
#include "common/config.h"

namespace dyad {
namespace {

using testing_util::EnvScrub;

class ClientConfigTest : public ::testing::Test {
 protected:
  EnvScrub scrub_;
};

TEST_F(ClientConfigTest, DefaultsMatchTheConfigurationTable) {
  Result<ClientConfig> c = ClientConfig::FromEnv();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(std::to_string(c->key_depth), FindConfigEntry("DYAD_KEY_DEPTH")->default_value);
  EXPECT_EQ(std::to_string(c->key_bins), FindConfigEntry("DYAD_KEY_BINS")->default_value);
  EXPECT_EQ(std::to_string(c->service_mux), FindConfigEntry("DYAD_SERVICE_MUX")->default_value);
  EXPECT_EQ(c->dtl_mode, FindConfigEntry("DYAD_DTL_MODE")->default_value);
  EXPECT_EQ(c->rpc_timeout_ms, 60000);
  EXPECT_EQ(c->consume_timeout_ms, -1);  // "0" = no limit
  EXPECT_FALSE(c->debug || c->check || c->shared_storage || c->reinit || c->async_publish ||
               c->fsync_write || c->relative_to_managed_path);
  EXPECT_EQ(c->kvs_namespace, "");
  EXPECT_EQ(c->prod_managed_path, "");
  EXPECT_EQ(c->cons_managed_path, "");
  EXPECT_EQ(c->service_socket, "/tmp/dyad-" + std::to_string(getuid()) + "/service.sock");

  // The struct's own defaults are the same (dyad_init and C++ users).
  ClientConfig d;
  EXPECT_EQ(d.key_depth, c->key_depth);
  EXPECT_EQ(d.key_bins, c->key_bins);
  EXPECT_EQ(d.service_mux, c->service_mux);
  EXPECT_EQ(d.dtl_mode, c->dtl_mode);
  EXPECT_EQ(d.rpc_timeout_ms, c->rpc_timeout_ms);
  EXPECT_EQ(d.consume_timeout_ms, c->consume_timeout_ms);
}

TEST_F(ClientConfigTest, BooleansFalseOnlyFor0FalseNoOff) {
  for (const char* v : {"0", "false", "FALSE", "no", "No", "off", "OFF"}) {
    setenv("DYAD_SHARED_STORAGE", v, 1);
    Result<ClientConfig> c = ClientConfig::FromEnv();
    ASSERT_TRUE(c.ok());
    EXPECT_FALSE(c->shared_storage) << "value '" << v << "'";
  }
  for (const char* v : {"", "1", "yes", "true", "on", "anything"}) {
    setenv("DYAD_SHARED_STORAGE", v, 1);
    Result<ClientConfig> c = ClientConfig::FromEnv();
    ASSERT_TRUE(c.ok());
    EXPECT_TRUE(c->shared_storage) << "value '" << v << "'";
  }
}

TEST_F(ClientConfigTest, EveryBooleanVariableIsRead) {
  for (const char* name :
       {"DYAD_SYNC_DEBUG", "DYAD_SYNC_CHECK", "DYAD_SHARED_STORAGE", "DYAD_REINIT",
        "DYAD_ASYNC_PUBLISH", "DYAD_FSYNC_WRITE", "DYAD_PATH_RELATIVE"})
    setenv(name, "", 1);
  Result<ClientConfig> c = ClientConfig::FromEnv();
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->debug && c->check && c->shared_storage && c->reinit && c->async_publish &&
              c->fsync_write && c->relative_to_managed_path);
}

TEST_F(ClientConfigTest, BadIntegersNameTheVariable) {
  for (const char* v : {"abc", "-1", "3x", "1.5"}) {
    setenv("DYAD_KEY_DEPTH", v, 1);
    Result<ClientConfig> c = ClientConfig::FromEnv();
    ASSERT_FALSE(c.ok()) << v;
    EXPECT_EQ(c.status().code(), DYAD_RC_BADREQUEST);
    EXPECT_NE(c.status().message().find("DYAD_KEY_DEPTH"), std::string::npos)
        << c.status().message();
  }
  unsetenv("DYAD_KEY_DEPTH");
  setenv("DYAD_KEY_BINS", "99999999999", 1);  // > UINT32_MAX
  Result<ClientConfig> c = ClientConfig::FromEnv();
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("DYAD_KEY_BINS"), std::string::npos);
  EXPECT_NE(c.status().message().find("out of range"), std::string::npos);
}

TEST_F(ClientConfigTest, IntegersAreRead) {
  setenv("DYAD_KEY_DEPTH", "2", 1);
  setenv("DYAD_KEY_BINS", "256", 1);
  setenv("DYAD_SERVICE_MUX", "4", 1);
  Result<ClientConfig> c = ClientConfig::FromEnv();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->key_depth, 2u);
  EXPECT_EQ(c->key_bins, 256u);
  EXPECT_EQ(c->service_mux, 4u);
}

TEST_F(ClientConfigTest, DtlModeIsCaseInsensitiveAndChecked) {
  setenv("DYAD_DTL_MODE", "ucx", 1);
  Result<ClientConfig> c = ClientConfig::FromEnv();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->dtl_mode, "UCX");
  for (const char* ok : {"flux_rpc", "TCP", "Ofi", "local"}) {
    setenv("DYAD_DTL_MODE", ok, 1);
    EXPECT_TRUE(ClientConfig::FromEnv().ok()) << ok;
  }
  // Upstream's MARGO is the OFI transport here.
  setenv("DYAD_DTL_MODE", "Margo", 1);
  c = ClientConfig::FromEnv();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->dtl_mode, "OFI");
  setenv("DYAD_DTL_MODE", "BOGUS", 1);
  c = ClientConfig::FromEnv();
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), DYAD_RC_BADDTLMODE);
  EXPECT_NE(c.status().message().find("DYAD_DTL_MODE"), std::string::npos);
}

TEST_F(ClientConfigTest, Timeouts) {
  setenv("DYAD_CONSUME_TIMEOUT", "2.5", 1);
  setenv("DYAD_RPC_TIMEOUT", "0", 1);
  Result<ClientConfig> c = ClientConfig::FromEnv();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->consume_timeout_ms, 2500);
  EXPECT_EQ(c->rpc_timeout_ms, -1);
  setenv("DYAD_CONSUME_TIMEOUT", "0", 1);
  c = ClientConfig::FromEnv();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->consume_timeout_ms, -1);
  setenv("DYAD_CONSUME_TIMEOUT", "soon", 1);
  c = ClientConfig::FromEnv();
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("DYAD_CONSUME_TIMEOUT"), std::string::npos);
}

TEST_F(ClientConfigTest, PathsNamespaceAndSocket) {
  setenv("DYAD_PATH_PRODUCER", "/p", 1);
  setenv("DYAD_PATH_CONSUMER", "", 1);  // empty counts as unset
  setenv("DYAD_KVS_NAMESPACE", "wf1", 1);
  setenv("DYAD_SERVICE_SOCKET", "/tmp/x.sock", 1);
  Result<ClientConfig> c = ClientConfig::FromEnv();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->prod_managed_path, "/p");
  EXPECT_EQ(c->cons_managed_path, "");
  EXPECT_EQ(c->kvs_namespace, "wf1");
  EXPECT_EQ(c->service_socket, "/tmp/x.sock");
}

TEST_F(ClientConfigTest, CreateNormalizes) {
  ClientConfig c;
  c.key_bins = 0;
  c.service_mux = 0;
  c.dtl_mode = "tcp";
  c.prod_managed_path = "/a//b/./c/";
  c.service_socket = "/tmp/nonexistent-dyad.sock";
  Result<std::shared_ptr<Client>> client = Client::Create(c);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_EQ((*client)->config().key_bins, 1u);
  EXPECT_EQ((*client)->config().service_mux, 1u);
  EXPECT_EQ((*client)->config().dtl_mode, "TCP");
  EXPECT_EQ((*client)->config().prod_managed_path, "/a/b/c");
  EXPECT_TRUE((*client)->has_producer_path());
  EXPECT_FALSE((*client)->has_consumer_path());

  c.dtl_mode = "bogus";
  client = Client::Create(c);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), DYAD_RC_BADDTLMODE);
}

TEST_F(ClientConfigTest, ReconfiguredClientSharesThePool) {
  ClientConfig c;
  c.service_socket = "/tmp/nonexistent-dyad.sock";
  Result<std::shared_ptr<Client>> a = Client::Create(c);
  ASSERT_TRUE(a.ok());
  c.cons_managed_path = "/tmp";
  Result<std::shared_ptr<Client>> b = Client::Create(c, (*a)->pool());
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*a)->pool(), (*b)->pool());
  c.service_socket = "/tmp/other-dyad.sock";
  Result<std::shared_ptr<Client>> d = Client::Create(c, (*a)->pool());
  ASSERT_TRUE(d.ok());
  EXPECT_NE((*a)->pool(), (*d)->pool());  // another socket needs another pool
}

}  // namespace
}  // namespace dyad
