// The parts of the Flux module dyad.so that need no Flux instance (issue 27
// items 1 and 2): its command line (upstream's options, argv without a
// program name) and the file rules of dyad.fetch (beneath the producer
// directory, regular files only, the producer's lock, a chunk at a time).
// The module itself is tested in a real instance by tests/flux/module_test.sh.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "flux/fetch_file.h"
#include "flux/module_options.h"
#include "util.h"

namespace dyad {
namespace {

namespace fs = std::filesystem;

TEST(FluxModuleOptions, UpstreamCommandLine) {
  // flux module load dyad.so --mode=UCX $DYAD_PATH_PRODUCER (no program name)
  Result<ModuleOptions> o = ParseModuleOptions({"--mode=UCX", "/tmp/prod"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->mode, "UCX");
  EXPECT_EQ(o->producer_path, "/tmp/prod");
  EXPECT_EQ(o->kvs, "flux://");  // the default store under the module
  EXPECT_FALSE(o->debug || o->help);

  o = ParseModuleOptions({"-m", "flux_rpc", "-d", "-i", "/tmp/info", "-e/tmp/err", "/p"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->mode, "FLUX_RPC");
  EXPECT_TRUE(o->debug);
  EXPECT_EQ(o->info_log, "/tmp/info");
  EXPECT_EQ(o->error_log, "/tmp/err");
  EXPECT_EQ(o->producer_path, "/p");

  for (const char* m : {"UCX", "FLUX_RPC", "MARGO", "TCP", "OFI", "ucx"})
    EXPECT_TRUE(ParseModuleOptions({"-m", m}).ok()) << m;
  o = ParseModuleOptions({"--info_log=/a", "--error_log", "/b", "-h"});
  ASSERT_TRUE(o.ok());
  EXPECT_TRUE(o->help);
  EXPECT_EQ(o->producer_path, "");  // DYAD_PATH_PRODUCER then
}

TEST(FluxModuleOptions, OurOptions) {
  Result<ModuleOptions> o = ParseModuleOptions(
      {"-k", "embedded", "--service", "/opt/bin/dyad-service", "--ready-timeout", "5", "/p"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->kvs, "embedded");
  EXPECT_EQ(o->service, "/opt/bin/dyad-service");
  EXPECT_EQ(o->ready_timeout_s, 5);
  EXPECT_EQ(o->fetch_chunk, 16u << 20);
  o = ParseModuleOptions({"--fetch-chunk", "1048576"});
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->fetch_chunk, 1u << 20);
  o = ParseModuleOptions({"--kvs=redis://h:6379", "--", "-odd-name"});
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->kvs, "redis://h:6379");
  EXPECT_EQ(o->producer_path, "-odd-name");
}

TEST(FluxModuleOptions, BadInputIsRefusedWithItsName) {
  struct Case {
    std::vector<std::string> args;
    const char* names;
  } cases[] = {
      {{"--bogus"}, "--bogus"},
      {{"-m", "RDMA"}, "RDMA"},
      {{"-m"}, "-m needs"},
      {{"/a", "/b"}, "more than one producer path"},
      {{"-d=1"}, "takes no value"},
      {{"--service", "relative/dyad-service"}, "absolute"},
      {{"--ready-timeout", "0"}, "--ready-timeout"},
      {{"--ready-timeout", "x"}, "--ready-timeout"},
      {{"-k", ""}, "store URL"},
      {{"--fetch-chunk", "12"}, "--fetch-chunk"},
      {{"--fetch-chunk", "-5"}, "--fetch-chunk"},
  };
  for (const Case& c : cases) {
    Result<ModuleOptions> o = ParseModuleOptions(c.args);
    ASSERT_FALSE(o.ok()) << c.names;
    EXPECT_EQ(o.status().code(), DYAD_RC_BADREQUEST);
    EXPECT_NE(o.status().message().find(c.names), std::string::npos) << o.status().message();
    EXPECT_NE(o.status().message().find("--help"), std::string::npos);
  }
  EXPECT_NE(ModuleHelp().find("--mode"), std::string::npos);
}

class FluxFetchFile : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testutil::MakeTempDir("dyad-fetchfile.");
    ASSERT_FALSE(dir_.empty()) << std::strerror(errno);
    prod_ = dir_ + "/prod";
    fs::create_directories(prod_ + "/sub");
    std::ofstream(dir_ + "/outside") << "secret";
    std::ofstream(prod_ + "/sub/a.txt") << "0123456789";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_, prod_;
};

TEST_F(FluxFetchFile, ServesAFileBeneathTheProducerDirectoryAChunkAtATime) {
  int err = -1;
  Result<FetchFile> f = FetchFile::Open(prod_, "sub/a.txt", &err);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(err, 0);
  EXPECT_EQ(f->size(), 10u);
  EXPECT_TRUE(f->TryLockShared());
  std::string chunk, all;
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(f->Next(&chunk, 4).ok());
    if (chunk.empty()) break;
    EXPECT_LE(chunk.size(), 4u);
    all += chunk;
  }
  EXPECT_EQ(all, "0123456789");
}

TEST_F(FluxFetchFile, RefusesEscapesAndWhatIsNotARegularFile) {
  fs::create_symlink(dir_ + "/outside", prod_ + "/link");
  fs::create_symlink("../outside", prod_ + "/rel-link");
  ASSERT_EQ(::mkfifo((prod_ + "/fifo").c_str(), 0600), 0);
  struct Case {
    const char* upath;
    int errnum;
  } cases[] = {
      {"link", EPERM}, {"rel-link", EPERM}, {"../outside", EPERM}, {"/etc/hostname", EPERM},
      {"sub", EISDIR}, {"fifo", EPERM},     {"missing", ENOENT},   {"", EPERM},
  };
  for (const Case& c : cases) {
    int err = 0;
    Result<FetchFile> f = FetchFile::Open(prod_, c.upath, &err);
    EXPECT_FALSE(f.ok()) << c.upath;
    if (std::string(c.upath).empty())
      EXPECT_NE(err, 0);
    else
      EXPECT_EQ(err, c.errnum) << c.upath << ": " << f.status().ToString();
  }
}

TEST_F(FluxFetchFile, TheProducersExclusiveLockIsHonoured) {
  const std::string path = prod_ + "/sub/a.txt";
  const int producer = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(producer, 0);
  ASSERT_EQ(::flock(producer, LOCK_EX), 0);
  int err = 0;
  Result<FetchFile> f = FetchFile::Open(prod_, "sub/a.txt", &err);
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->TryLockShared());  // the module waits on a timer
  ASSERT_EQ(::flock(producer, LOCK_UN), 0);
  EXPECT_TRUE(f->TryLockShared());
  ::close(producer);
}

}  // namespace
}  // namespace dyad
