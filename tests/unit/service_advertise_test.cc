// service_advertise_test.cc: the address a service advertises, on hosts
// played by a fake NetView: a host name resolving to loopback with the
// store elsewhere, explicit loopback addresses, no route, the root itself.
#include <gtest/gtest.h>

#include <map>

#include "service/advertise.h"

namespace dyad {
namespace {

class FakeNet : public NetView {
 public:
  std::map<std::string, std::vector<std::string>> names;
  std::map<std::string, std::string> routes;  // destination -> source
  std::vector<std::string> local = {"127.0.0.1", "10.1.0.7", "192.168.5.7"};

  std::vector<std::string> Resolve(const std::string& host) const override {
    auto it = names.find(host);
    if (it != names.end()) return it->second;
    if (host.find_first_not_of("0123456789.") == std::string::npos) return {host};
    return {};
  }
  std::string SourceFor(const std::string& ip) const override {
    auto it = routes.find(ip);
    return it == routes.end() ? "" : it->second;
  }
  std::vector<std::string> LocalAddresses() const override { return local; }
};

AdvertiseInput Wildcard(const std::string& store_host) {
  AdvertiseInput in;
  in.listen_host = "0.0.0.0";
  in.port = 7590;
  in.hostname = "node7";
  in.store_host = store_host;
  return in;
}

TEST(AdvertiseTest, HostNameOnLoopbackAdvertisesTheInterfaceThatRoutesToTheStore) {
  FakeNet net;
  net.names["node7"] = {"127.0.1.1"};
  net.names["root"] = {"10.1.0.1"};
  net.routes["10.1.0.1"] = "10.1.0.7";
  Result<AdvertiseChoice> c = ChooseAdvertiseAddress(Wildcard("root"), net);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->address, "10.1.0.7:7590");
  EXPECT_NE(c->note.find("127.0.1.1"), std::string::npos) << c->note;
  EXPECT_NE(c->note.find("--advertise"), std::string::npos) << c->note;
}

TEST(AdvertiseTest, TheRouteChoosesAmongSeveralInterfaces) {
  FakeNet net;
  net.names["node7"] = {"127.0.1.1"};
  net.routes["192.168.5.1"] = "192.168.5.7";
  Result<AdvertiseChoice> c = ChooseAdvertiseAddress(Wildcard("192.168.5.1"), net);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->address, "192.168.5.7:7590");
}

TEST(AdvertiseTest, AHostNameThatResolvesToTheRoutedAddressIsKept) {
  FakeNet net;
  net.names["node7"] = {"10.1.0.7"};
  net.routes["10.1.0.1"] = "10.1.0.7";
  Result<AdvertiseChoice> c = ChooseAdvertiseAddress(Wildcard("10.1.0.1"), net);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->address, "node7:7590");
  EXPECT_TRUE(c->note.empty());
}

TEST(AdvertiseTest, NoRouteToTheStoreIsRefusedNamingAdvertise) {
  FakeNet net;
  net.names["node7"] = {"127.0.1.1"};
  Result<AdvertiseChoice> c = ChooseAdvertiseAddress(Wildcard("10.9.9.9"), net);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), DYAD_RC_BADREQUEST);
  EXPECT_NE(c.status().message().find("--advertise"), std::string::npos);
}

TEST(AdvertiseTest, LoopbackListenOrAdvertiseWithARemoteStoreIsRefused) {
  FakeNet net;
  net.routes["10.1.0.1"] = "10.1.0.7";
  AdvertiseInput in = Wildcard("10.1.0.1");
  in.listen_host = "127.0.0.1";
  Result<AdvertiseChoice> c = ChooseAdvertiseAddress(in, net);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--advertise"), std::string::npos);

  in = Wildcard("10.1.0.1");
  net.names["localhost"] = {"127.0.0.1"};
  in.explicit_address = "localhost:7590";
  c = ChooseAdvertiseAddress(in, net);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("loopback"), std::string::npos);

  in.explicit_address = "10.1.0.7:9000";
  c = ChooseAdvertiseAddress(in, net);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->address, "10.1.0.7:9000");
}

TEST(AdvertiseTest, LoopbackIsFineWhenEverythingIsOnThisHost) {
  FakeNet net;
  net.names["node7"] = {"127.0.1.1"};
  AdvertiseInput in = Wildcard("127.0.0.1");
  in.listen_host = "127.0.0.1";
  Result<AdvertiseChoice> c = ChooseAdvertiseAddress(in, net);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->address, "127.0.0.1:7590");
  // A store on one of this host's own addresses is local too.
  in.store_host = "10.1.0.7";
  c = ChooseAdvertiseAddress(in, net);
  ASSERT_TRUE(c.ok());
}

TEST(AdvertiseTest, TheRootWithAHostNameOnLoopbackTakesAnInterfaceAddress) {
  FakeNet net;
  net.names["node7"] = {"127.0.1.1"};
  Result<AdvertiseChoice> c = ChooseAdvertiseAddress(Wildcard(""), net);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->address, "10.1.0.7:7590");
  EXPECT_FALSE(c->note.empty());
  net.names["node7"] = {"10.1.0.7"};
  c = ChooseAdvertiseAddress(Wildcard(""), net);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->address, "node7:7590");
  net.local = {"127.0.0.1"};
  net.names["node7"] = {"127.0.1.1"};
  c = ChooseAdvertiseAddress(Wildcard(""), net);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->address, "node7:7590");  // a host alone: loopback is all there is
}

TEST(AdvertiseTest, StoreEndpointsFromUrls) {
  EXPECT_EQ(StoreEndpointOf("embedded").host, "");
  EXPECT_EQ(StoreEndpointOf("memory").host, "");
  StoreEndpoint e = StoreEndpointOf("embedded://root:7590");
  EXPECT_EQ(e.host, "root");
  EXPECT_EQ(e.port, 7590);
  e = StoreEndpointOf("redis://user:p%40ss@cache.example:6380/2?timeout_ms=5");
  EXPECT_EQ(e.host, "cache.example");
  EXPECT_EQ(e.port, 6380);
  e = StoreEndpointOf("redis://[fd00::1]:6379");
  EXPECT_EQ(e.host, "fd00::1");
  EXPECT_EQ(e.port, 6379);
  e = StoreEndpointOf("redis://host");
  EXPECT_EQ(e.host, "host");
  EXPECT_EQ(e.port, 0);
  e = StoreEndpointOf("redis://host:99999");
  EXPECT_EQ(e.port, 0);
}

TEST(AdvertiseTest, TheSystemViewRoutesLoopbackToLoopback) {
  EXPECT_EQ(SystemNetView().SourceFor("127.0.0.1"), "127.0.0.1");
  const std::vector<std::string> local = SystemNetView().LocalAddresses();
  EXPECT_NE(std::find(local.begin(), local.end(), "127.0.0.1"), local.end());
  EXPECT_FALSE(SystemNetView().Resolve("127.0.0.1").empty());
}

}  // namespace
}  // namespace dyad
