// Regression tests of issue 25 ("Hardening, round two") that need an
// in-process dyad-service: the start-up policy without a credential (item
// 8), weak secrets given to the service directly (item 7) and the modes of
// the files it writes for its operator (item 13). The common-layer items
// are in common_hardening2_test.cc.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <memory>
#include <string>

#include "service/service.h"
#include "unit/service_pair.h"
#include "util.h"

namespace dyad {
namespace {

using testing_services::FirstServiceOptions;

class Hardening2 : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = testutil::MakeTempDir("dyad-hardening2-svc-");
    ASSERT_FALSE(base_.empty());
  }
  void TearDown() override {
    if (svc_) svc_->Stop();
    svc_.reset();
    std::unique_ptr<Service> none;
    testing_services::StopAndRemove(&none, &none, &base_);
  }
  Status Start(const ServiceOptions& o) {
    svc_ = std::make_unique<Service>(o);
    return svc_->Start();
  }
  std::string base_;
  std::unique_ptr<Service> svc_;
};

// Item 8: without a credential a service refuses to listen, on loopback
// too (every local uid could fetch any file of its producer directory),
// and says why; --insecure lets it start.
TEST_F(Hardening2, NoCredentialRefusedOnLoopback) {
  ServiceOptions o = FirstServiceOptions(base_);
  o.secret.clear();
  Status st = Start(o);
  EXPECT_EQ(st.code(), DYAD_RC_PERM) << st.ToString();
  EXPECT_NE(st.message().find("refusing to listen on 127.0.0.1"), std::string::npos)
      << st.ToString();
  EXPECT_NE(st.message().find("any process of any user on this host"), std::string::npos)
      << st.ToString();
  EXPECT_NE(st.message().find("published or not"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("--insecure"), std::string::npos) << st.ToString();
  svc_.reset();
  o.insecure = true;
  st = Start(o);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

// Item 7: a weak secret given to the service directly is refused too.
TEST_F(Hardening2, ShortSecretRefused) {
  ServiceOptions o = FirstServiceOptions(base_);
  o.secret = "password";
  Status st = Start(o);
  EXPECT_EQ(st.code(), DYAD_RC_AUTH) << st.ToString();
  EXPECT_NE(st.message().find("too weak"), std::string::npos) << st.ToString();
  EXPECT_EQ(st.message().find("password"), std::string::npos) << st.ToString();
}

// Item 13: the ready file is 0600 even under umask 000 (and the operator's
// DYAD_SERVICE_FILE_MODE when given); a stricter umask wins.
TEST_F(Hardening2, ReadyFileAndLogPrivate) {
  ServiceOptions o = FirstServiceOptions(base_);
  o.ready_file = base_ + "/ready";
  const mode_t old = ::umask(0);
  Status st = Start(o);
  ::umask(old);
  ASSERT_TRUE(st.ok()) << st.ToString();
  struct stat sb;
  ASSERT_EQ(::stat(o.ready_file.c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0600u) << std::oct << (sb.st_mode & 0777);
  svc_->Stop();
  svc_.reset();

  o.file_mode = 0640;
  ::umask(077);  // stricter than the mode asked: the umask wins
  st = Start(o);
  ::umask(old);
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(::stat(o.ready_file.c_str(), &sb), 0);
  EXPECT_EQ(sb.st_mode & 0777, 0600u);
}

}  // namespace
}  // namespace dyad
