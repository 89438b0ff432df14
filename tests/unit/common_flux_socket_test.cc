// FluxServiceSocket and DefaultServiceSocket on Flux (issue 27 item 5): the
// dyad.so module of a broker runs its dyad-service on the socket derived
// from the broker's local-uri, and a client with FLUX_URI set (and no
// DYAD_SERVICE_SOCKET) derives the same path, so two brokers on one host get
// two sockets and a job's processes find their own broker's service.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <optional>
#include <string>

#include "common/config.h"

namespace dyad {
namespace {

// Sets or unsets one variable for a test and restores it afterwards.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

TEST(FluxServiceSocket, LocalUriGivesSocketBesideTheBrokersSocket) {
  EXPECT_EQ(FluxServiceSocket("local:///tmp/flux-abc/local-1"), "/tmp/flux-abc/dyad-local-1.sock");
  EXPECT_EQ(FluxServiceSocket("local:///tmp/flux-abc/local-0"), "/tmp/flux-abc/dyad-local-0.sock");
  EXPECT_EQ(FluxServiceSocket("local:///run/flux/local"), "/run/flux/dyad-local.sock");
  // A trailing slash, a query or a fragment do not change the path.
  EXPECT_EQ(FluxServiceSocket("local:///tmp/flux-abc/local-1/"), "/tmp/flux-abc/dyad-local-1.sock");
  EXPECT_EQ(FluxServiceSocket("local:///tmp/flux-abc/local-1?x=1"),
            "/tmp/flux-abc/dyad-local-1.sock");
}

TEST(FluxServiceSocket, TwoBrokersOfOneHostGetTwoSockets) {
  EXPECT_NE(FluxServiceSocket("local:///tmp/flux-abc/local-0"),
            FluxServiceSocket("local:///tmp/flux-abc/local-1"));
}

TEST(FluxServiceSocket, NonLocalOrMalformedUrisGiveNothing) {
  EXPECT_EQ(FluxServiceSocket(""), "");
  EXPECT_EQ(FluxServiceSocket("ssh://host/tmp/flux-abc/local-0"), "");
  EXPECT_EQ(FluxServiceSocket("tcp://host:1234"), "");
  EXPECT_EQ(FluxServiceSocket("local://"), "");
  EXPECT_EQ(FluxServiceSocket("local://relative/local-0"), "");
  EXPECT_EQ(FluxServiceSocket("local:///local-0"), "");  // no directory
  EXPECT_EQ(FluxServiceSocket("local:///tmp/.."), "");
  EXPECT_EQ(FluxServiceSocket("/tmp/flux-abc/local-0"), "");
}

TEST(FluxServiceSocket, DefaultServiceSocketUsesFluxUriWhenNoSocketIsSet) {
  ScopedEnv sock("DYAD_SERVICE_SOCKET", nullptr);
  {
    ScopedEnv uri("FLUX_URI", "local:///tmp/flux-xyz/local-3");
    EXPECT_EQ(DefaultServiceSocket(), "/tmp/flux-xyz/dyad-local-3.sock");
  }
  {
    ScopedEnv uri("FLUX_URI", nullptr);
    EXPECT_EQ(DefaultServiceSocket(), "/tmp/dyad-" + std::to_string(getuid()) + "/service.sock");
  }
  {
    // A remote URI has no local module socket: the plain default.
    ScopedEnv uri("FLUX_URI", "ssh://host/tmp/flux-xyz/local-3");
    EXPECT_EQ(DefaultServiceSocket(), "/tmp/dyad-" + std::to_string(getuid()) + "/service.sock");
  }
}

TEST(FluxServiceSocket, DyadServiceSocketWinsOverFluxUri) {
  ScopedEnv uri("FLUX_URI", "local:///tmp/flux-xyz/local-3");
  ScopedEnv sock("DYAD_SERVICE_SOCKET", "/tmp/mine/dyad.sock");
  EXPECT_EQ(DefaultServiceSocket(), "/tmp/mine/dyad.sock");
}

}  // namespace
}  // namespace dyad
