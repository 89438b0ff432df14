// The client's Flux path without Flux (issue 27): a process that is not
// under Flux never loads libflux-core (the client libraries link nothing of
// it) and keeps its plain "no service" error; a process told it is under
// Flux where libflux-core cannot be found gets a clear error, never a crash.
// The path itself runs against real brokers in tests/flux/flux_client_test.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>

#include <string>

#include "client/client.h"
#include "client_test_util.h"

namespace dyad {
namespace {

using testing_util::EnvScrub;

bool LibfluxLoaded() {
  void* h = ::dlopen("libflux-core.so.2", RTLD_NOW | RTLD_NOLOAD);
  if (h != nullptr) ::dlclose(h);
  return h != nullptr;
}

class ClientFluxPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = testutil::MakeTempDir("dyad-flux-path.");
    ASSERT_FALSE(root_.empty()) << std::strerror(errno);
  }
  void TearDown() override { (void)std::system(("rm -rf '" + root_ + "'").c_str()); }
  ClientConfig Config() const {
    ClientConfig c;
    c.prod_managed_path = root_ + "/prod";
    c.cons_managed_path = root_ + "/cons";
    c.service_socket = root_ + "/none.sock";
    c.consume_timeout_ms = 1000;
    return c;
  }
  EnvScrub scrub_;
  std::string root_;
};

TEST_F(ClientFluxPathTest, NotUnderFluxNothingIsLoaded) {
  ::unsetenv("FLUX_URI");
  Result<ClientConfig> env = ClientConfig::FromEnv();
  ASSERT_TRUE(env.ok());
  EXPECT_TRUE(env->flux_uri.empty());
  Result<std::shared_ptr<Client>> client = Client::Create(Config());
  ASSERT_TRUE(client.ok());
  EXPECT_EQ((*client)->flux(), nullptr);
  Status st = (*client)->Consume(root_ + "/cons/f");
  EXPECT_EQ(st.code(), DYAD_RC_NOSERVICE) << st.ToString();
  // The plain message (no Flux advice off Flux).
  EXPECT_EQ(st.message().find("flux module load"), std::string::npos) << st.message();
  st = (*client)->Produce(root_ + "/prod/f");
  EXPECT_EQ(st.message().find("flux module load"), std::string::npos) << st.message();
  EXPECT_FALSE(LibfluxLoaded());
}

TEST_F(ClientFluxPathTest, FluxUriIsReadFromTheEnvironment) {
  ::setenv("FLUX_URI", "local:///tmp/flux-x/local-3", 1);
  Result<ClientConfig> env = ClientConfig::FromEnv();
  ::unsetenv("FLUX_URI");
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->flux_uri, "local:///tmp/flux-x/local-3");
  // Creating the client loads nothing yet (libflux on first use only).
  Result<std::shared_ptr<Client>> client = Client::Create(*env);
  ASSERT_TRUE(client.ok());
  EXPECT_NE((*client)->flux(), nullptr);
  EXPECT_FALSE(LibfluxLoaded());
}

TEST_F(ClientFluxPathTest, MissingLibfluxIsAClearError) {
  ClientConfig c = Config();
  c.flux_uri = "local://" + root_ + "/no-broker/local-0";
  ::setenv("FLUX_CONNECTOR_PATH", (root_ + "/nowhere/lib/flux/connectors").c_str(), 1);
  Result<std::shared_ptr<Client>> client = Client::Create(c);
  ASSERT_TRUE(client.ok());
  Status st = (*client)->Consume(root_ + "/cons/f");
  ::unsetenv("FLUX_CONNECTOR_PATH");
  void* sys = ::dlopen("libflux-core.so.2", RTLD_NOW);
  if (sys != nullptr) {
    // flux-core on the default library path: then no broker answers.
    EXPECT_EQ(st.code(), DYAD_RC_FLUXFAIL) << st.ToString();
    EXPECT_NE(st.message().find("cannot connect to the Flux broker"), std::string::npos)
        << st.message();
    return;
  }
  EXPECT_EQ(st.code(), DYAD_RC_FLUXFAIL) << st.ToString();
  EXPECT_NE(st.message().find("libflux-core could not be loaded"), std::string::npos)
      << st.message();
  // Produce says how to get a service on Flux.
  ASSERT_EQ(::mkdir((root_ + "/prod").c_str(), 0755), 0);
  FILE* f = std::fopen((root_ + "/prod/f").c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fclose(f);
  st = (*client)->Produce(root_ + "/prod/f");
  EXPECT_EQ(st.code(), DYAD_RC_NOSERVICE) << st.ToString();
  EXPECT_NE(st.message().find("flux module load dyad.so"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace dyad
