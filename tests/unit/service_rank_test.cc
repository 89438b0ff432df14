// Where a dyad-service's rank comes from (src/service/rank.h): -r wins,
// then DYAD_SERVICE_RANK, then the launcher's task rank; anything present
// but malformed is refused, and no source at all is refused too.
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>

#include "service/peers.h"
#include "service/rank.h"
#include "service/service.h"
#include "unit/service_pair.h"
#include "util.h"

namespace dyad {
namespace {

class FakeEnv {
 public:
  FakeEnv(std::map<std::string, std::string> vars) : vars_(std::move(vars)) {}
  GetEnvFn fn() const {
    return [this](const char* name) -> const char* {
      auto it = vars_.find(name);
      return it == vars_.end() ? nullptr : it->second.c_str();
    };
  }

 private:
  std::map<std::string, std::string> vars_;
};

Result<uint32_t> Resolve(std::optional<std::string> cli, std::map<std::string, std::string> env) {
  FakeEnv e(std::move(env));
  return ResolveServiceRank(cli, e.fn());
}

TEST(ServiceRank, ParsesPlainDecimal) {
  for (auto [text, want] : {std::pair<const char*, uint32_t>{"0", 0},
                            {"17", 17},
                            {"007", 7},
                            {"4294967295", 4294967295u}}) {
    Result<uint32_t> r = ParseRank(text, "test");
    ASSERT_TRUE(r.ok()) << text << ": " << r.status().ToString();
    EXPECT_EQ(*r, want);
  }
}

TEST(ServiceRank, RefusesWhatIsNotARank) {
  for (const char* text : {"", "x", "-1", "+1", " 1", "1 ", "3a", "0x10", "1.0", "4294967296",
                           "99999999999999999999999"}) {
    Result<uint32_t> r = ParseRank(text, "-r/--rank");
    ASSERT_FALSE(r.ok()) << "'" << text << "' accepted";
    EXPECT_EQ(r.status().code(), DYAD_RC_BAD_CLI_PARSE);
    EXPECT_NE(r.status().message().find("-r/--rank"), std::string::npos);
    EXPECT_NE(r.status().message().find(std::string("'") + text + "'"), std::string::npos)
        << r.status().message();
  }
}

TEST(ServiceRank, CommandLineWinsOverEnvironment) {
  auto r = Resolve("3", {{"DYAD_SERVICE_RANK", "5"}, {"SLURM_PROCID", "7"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 3u);
  // Even a garbage variable does not matter once -r is given.
  r = Resolve("4", {{"DYAD_SERVICE_RANK", "abc"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 4u);
}

TEST(ServiceRank, EmptyCommandLineRankIsRefused) {
  auto r = Resolve("", {{"SLURM_PROCID", "2"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("invalid rank ''"), std::string::npos);
}

TEST(ServiceRank, DyadServiceRankBeforeLaunchers) {
  auto r = Resolve(std::nullopt, {{"DYAD_SERVICE_RANK", "5"}, {"SLURM_PROCID", "7"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 5u);
}

TEST(ServiceRank, LaunchersInOrder) {
  auto r = Resolve(std::nullopt, {{"PMIX_RANK", "9"}, {"OMPI_COMM_WORLD_RANK", "8"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 8u);
  r = Resolve(std::nullopt, {{"FLUX_TASK_RANK", "1"}, {"SLURM_PROCID", "2"}});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, 1u);
  for (const char* const* v = kLauncherRankVariables; *v != nullptr; ++v) {
    r = Resolve(std::nullopt, {{*v, "12"}});
    ASSERT_TRUE(r.ok()) << *v;
    EXPECT_EQ(*r, 12u) << *v;
  }
}

TEST(ServiceRank, MalformedVariableIsRefusedNotSkipped) {
  // DYAD_SERVICE_RANK=$UNSET must not fall through to the launcher's rank.
  auto r = Resolve(std::nullopt, {{"DYAD_SERVICE_RANK", ""}, {"SLURM_PROCID", "2"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("DYAD_SERVICE_RANK"), std::string::npos);
  r = Resolve(std::nullopt, {{"DYAD_SERVICE_RANK", "abc"}});
  ASSERT_FALSE(r.ok());
  r = Resolve(std::nullopt, {{"SLURM_PROCID", "zz"}, {"PMI_RANK", "1"}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("SLURM_PROCID"), std::string::npos);
  EXPECT_NE(r.status().message().find("-r/--rank"), std::string::npos);
}

TEST(ServiceRank, NoSourceNamesEveryOption) {
  auto r = Resolve(std::nullopt, {{"HOME", "/root"}});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), DYAD_RC_BAD_CLI_PARSE);
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("-r/--rank"), std::string::npos) << m;
  EXPECT_NE(m.find("DYAD_SERVICE_RANK"), std::string::npos) << m;
  for (const char* const* v = kLauncherRankVariables; *v != nullptr; ++v)
    EXPECT_NE(m.find(*v), std::string::npos) << *v << " missing from: " << m;
}

// Issue 26 item 19: a MUNGE (or secret) mismatch led with the generic
// "check --secret-file" hint before the real cause. The cause comes first,
// and the hint fits it.
TEST(Issue26Item19, CredentialFailureLeadsWithTheCauseAndFitsTheHint) {
  const Status munge(DYAD_RC_AUTH, "MUNGE credential refused: Invalid credential");
  const Status m = CredentialFailure(munge, "authenticate with rank 1 at 10.0.0.2:7590");
  EXPECT_EQ(m.code(), DYAD_RC_AUTH);
  EXPECT_EQ(m.message().find("authenticate with rank 1 at 10.0.0.2:7590: MUNGE credential refused"),
            0u)
      << m.message();
  EXPECT_NE(m.message().find("munge key"), std::string::npos) << m.message();
  EXPECT_EQ(m.message().find("--secret-file"), std::string::npos) << m.message();
  const Status secret(DYAD_RC_AUTH, "handshake: proof of the cluster secret does not match");
  const Status s = CredentialFailure(secret, "register rank 2");
  EXPECT_EQ(s.message().find("register rank 2: handshake: proof"), 0u) << s.message();
  EXPECT_NE(s.message().find("check --secret-file"), std::string::npos) << s.message();
  EXPECT_LT(s.message().find("proof"), s.message().find("--secret-file")) << s.message();
}

// Issue 26 item 20: with libfabric's shm provider (same host only) a
// service joined a cluster of several hosts and failed only at the first
// fetch. It is now refused at start when a service of another host is
// registered.
TEST(Issue26Item20, SameHostOnlyTransportIsRefusedAtStartInAClusterOfHosts) {
  using namespace testing_services;  // NOLINT(build/namespaces)
  std::string base = testutil::MakeTempDir("dyad-shm-start.");
  ASSERT_FALSE(base.empty());
  std::unique_ptr<Service> a, b;
  ServiceOptions oa = FirstServiceOptions(base);
  a = std::make_unique<Service>(oa);
  Status st = a->Start();
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_TRUE(RegisterRank(a->tcp_address(), 7, 0x77, "127.0.0.1:9", "another-host").ok());
  ::setenv("DYAD_OFI_PROVIDER", "shm", 1);
  ServiceOptions ob = SecondServiceOptions(oa, base, "embedded://" + a->tcp_address());
  ob.dtl_mode = "OFI";
  b = std::make_unique<Service>(ob);
  st = b->Start();
  ::unsetenv("DYAD_OFI_PROVIDER");
  const std::string msg = st.ToString();
  const bool no_ofi = !st.ok() && (msg.find("not compiled") != std::string::npos ||
                                   msg.find("unknown") != std::string::npos ||
                                   msg.find("no libfabric provider") != std::string::npos);
  if (no_ofi) {
    StopAndRemove(&b, &a, &base);
    GTEST_SKIP() << "no OFI transport with the shm provider here: " << msg;
  }
  EXPECT_EQ(st.code(), DYAD_RC_MARGO_BAD_PROTO) << msg;
  EXPECT_NE(msg.find("reaches only services on this host"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 7 is registered from host another-host"), std::string::npos) << msg;
  StopAndRemove(&b, &a, &base);
}

}  // namespace
}  // namespace dyad
