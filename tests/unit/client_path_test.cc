// Tests of Client::Resolve: which names are under a managed directory and
// what their relative path (upath) is.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "client/client.h"
#include "client_test_util.h"
#include "common/key.h"

namespace dyad {
namespace {

using testing_util::EnvScrub;
using testing_util::TempDir;

class ClientPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(tmp_.path().empty());
    dmd_ = tmp_.Sub("dmd");
    std::filesystem::create_directories(dmd_ + "/sub");
    char buf[4096];
    ASSERT_NE(getcwd(buf, sizeof buf), nullptr);
    saved_cwd_ = buf;
  }
  void TearDown() override { ASSERT_EQ(chdir(saved_cwd_.c_str()), 0); }

  std::shared_ptr<Client> Make(const std::string& cons, const std::string& prod = "",
                               bool relative = false) {
    ClientConfig c;
    c.cons_managed_path = cons;
    c.prod_managed_path = prod;
    c.relative_to_managed_path = relative;
    c.service_socket = tmp_.Sub("none.sock");
    Result<std::shared_ptr<Client>> r = Client::Create(c);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return r.ok() ? *r : nullptr;
  }

  EnvScrub scrub_;
  TempDir tmp_;
  std::string dmd_;
  std::string saved_cwd_;
};

TEST_F(ClientPathTest, AbsoluteNamesUnderTheDirectory) {
  auto c = Make(dmd_);
  Result<std::string> r = c->Resolve(dmd_ + "/a.txt", Side::kConsumer);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "a.txt");
  r = c->Resolve(dmd_ + "//sub/./b.txt", Side::kConsumer);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "sub/b.txt");
  r = c->Resolve(dmd_ + "/sub/../c.txt", Side::kConsumer);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "c.txt");
}

TEST_F(ClientPathTest, OutsideIsUntracked) {
  auto c = Make(dmd_);
  for (const std::string& name :
       {tmp_.Sub("other/a.txt"), dmd_ + "2/a.txt", dmd_, dmd_ + "/", std::string("/etc/passwd"),
        dmd_ + "/../escape.txt", dmd_ + "/sub/../../escape.txt"}) {
    Result<std::string> r = c->Resolve(name, Side::kConsumer);
    ASSERT_FALSE(r.ok()) << name << " -> " << *r;
    EXPECT_EQ(r.status().code(), DYAD_RC_UNTRACKED) << name;
  }
}

TEST_F(ClientPathTest, RelativeToWorkingDirectory) {
  auto c = Make(dmd_);
  ASSERT_EQ(chdir((dmd_ + "/sub").c_str()), 0);
  Result<std::string> r = c->Resolve("f.dat", Side::kConsumer);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "sub/f.dat");
  r = c->Resolve("../g.dat", Side::kConsumer);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "g.dat");
  r = c->Resolve("../../outside.dat", Side::kConsumer);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), DYAD_RC_UNTRACKED);
}

TEST_F(ClientPathTest, RelativeToManagedDirectory) {
  auto c = Make(dmd_, "", /*relative=*/true);
  ASSERT_EQ(chdir("/"), 0);
  Result<std::string> r = c->Resolve("x/y.dat", Side::kConsumer);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "x/y.dat");
  r = c->Resolve(dmd_ + "/abs.dat", Side::kConsumer);  // absolute names stay absolute
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "abs.dat");
  r = c->Resolve("../etc/passwd", Side::kConsumer);  // '..' escape refused
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), DYAD_RC_PERM);
  r = c->Resolve("a/../../b", Side::kConsumer);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), DYAD_RC_PERM);
}

TEST_F(ClientPathTest, SymlinkedDirectoryMatchesBothSpellings) {
  const std::string link = tmp_.Sub("link");
  std::filesystem::create_directory_symlink(dmd_, link);
  auto c = Make(link);
  EXPECT_EQ(c->consumer_path().given(), link);
  EXPECT_EQ(c->consumer_path().canonical(), std::filesystem::canonical(dmd_).string());
  Result<std::string> r = c->Resolve(link + "/a.txt", Side::kConsumer);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "a.txt");
  r = c->Resolve(std::filesystem::canonical(dmd_).string() + "/sub/b.txt", Side::kConsumer);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, "sub/b.txt");
}

TEST_F(ClientPathTest, RelativeManagedPathIsPinnedAtCreation) {
  ASSERT_EQ(chdir(tmp_.path().c_str()), 0);
  auto c = Make("dmd");
  EXPECT_EQ(c->consumer_path().given(), dmd_);
  ASSERT_EQ(chdir("/"), 0);
  Result<std::string> r = c->Resolve(dmd_ + "/a", Side::kConsumer);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, "a");
}

TEST_F(ClientPathTest, DirectoryCreatedLaterResolvesCanonically) {
  const std::string later = tmp_.Sub("later");
  auto c = Make(later);
  EXPECT_EQ(c->consumer_path().CurrentCanonical(), later);
  std::filesystem::create_directory(later);
  EXPECT_EQ(c->consumer_path().CurrentCanonical(), std::filesystem::canonical(later).string());
}

TEST_F(ClientPathTest, SidesAreSeparate) {
  const std::string prod = tmp_.Sub("prod");
  auto c = Make(dmd_, prod);
  EXPECT_TRUE(c->Resolve(prod + "/p.dat", Side::kProducer).ok());
  EXPECT_EQ(c->Resolve(prod + "/p.dat", Side::kConsumer).status().code(), DYAD_RC_UNTRACKED);
  EXPECT_EQ(c->Resolve(dmd_ + "/c.dat", Side::kProducer).status().code(), DYAD_RC_UNTRACKED);

  auto only_cons = Make(dmd_);
  EXPECT_EQ(only_cons->Resolve("/x", Side::kProducer).status().code(), DYAD_RC_BADMANAGEDPATH);
  EXPECT_EQ(only_cons->Resolve("", Side::kConsumer).status().code(), DYAD_RC_BADBUF);
}

TEST_F(ClientPathTest, IsManagedAgreesWithResolve) {
  const std::string link = tmp_.Sub("link");
  std::filesystem::create_directory_symlink(dmd_, link);
  ASSERT_EQ(chdir((dmd_ + "/sub").c_str()), 0);
  for (bool relative : {false, true}) {
    auto c = Make(link, "", relative);
    for (const std::string& name :
         {dmd_ + "/a", link + "/a", link + "/sub/b", link, link + "/", dmd_, dmd_ + "2/a",
          link + "x/a", dmd_ + "//a", dmd_ + "/./a", dmd_ + "/sub/../a", dmd_ + "/../a",
          std::string("/"), std::string("/etc/passwd"), std::string("f.dat"),
          std::string("../g.dat"), std::string("../../x"), std::string("./h"), std::string("")}) {
      EXPECT_EQ(c->IsManaged(name, Side::kConsumer), c->Resolve(name, Side::kConsumer).ok())
          << "'" << name << "' relative=" << relative;
      EXPECT_FALSE(c->IsManaged(name, Side::kProducer)) << name;
    }
  }
  auto root = Make("/");
  EXPECT_TRUE(root->IsManaged("/etc/passwd", Side::kConsumer));
  EXPECT_TRUE(root->Resolve("/etc/passwd", Side::kConsumer).ok());
  EXPECT_FALSE(root->IsManaged("/", Side::kConsumer));
}

TEST_F(ClientPathTest, KeyFollowsGenPathKey) {
  ClientConfig cfg;
  cfg.key_depth = 3;
  cfg.key_bins = 1024;
  cfg.service_socket = tmp_.Sub("none.sock");
  Result<std::shared_ptr<Client>> c = Client::Create(cfg);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->KeyOf("1/data0.txt"), "263.2ce.2e1.1/data0.txt");
  cfg.key_depth = 2;
  cfg.key_bins = 256;
  c = Client::Create(cfg);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->KeyOf("a/b"), GenPathKey("a/b", 2, 256));
}

}  // namespace
}  // namespace dyad
