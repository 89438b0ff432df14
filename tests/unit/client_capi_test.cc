// Tests of the C API without a service: argument checks, context life
// cycle, the process-wide context seen from other threads, bounded failure
// when no dyad-service runs, and fork.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "client_test_util.h"
#include "dyad/client/dyad_client.h"
#include "dyad/core/dyad_ctx.h"

namespace {

using dyad::testing_util::EnvScrub;
using dyad::testing_util::TempDir;
using dyad::testing_util::WriteFile;

dyad_rc_t InitPaths(const char* prod, const char* cons, bool reinit = true,
                    const char* mode = "FLUX_RPC", void* flux = nullptr) {
  return dyad_init(false, false, false, reinit, false, false, 3, 1024, 1, nullptr, prod, cons,
                   false, mode, DYAD_COMM_RECV, flux);
}

// Waits for a child at most `seconds`; kills it on expiry. Returns its
// exit status, or -1 on timeout / abnormal end.
int WaitChild(pid_t pid, int seconds) {
  for (int i = 0; i < seconds * 100; ++i) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    usleep(10000);
  }
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  return -1;
}

class CApiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dyad_finalize();
    ASSERT_FALSE(tmp_.path().empty());
    prod_ = tmp_.Sub("prod");
    cons_ = tmp_.Sub("cons");
    sock_ = tmp_.Sub("no-service.sock");
    setenv("DYAD_SERVICE_SOCKET", sock_.c_str(), 1);
    setenv("DYAD_RPC_TIMEOUT", "5", 1);
  }
  void TearDown() override { dyad_finalize(); }

  EnvScrub scrub_;
  TempDir tmp_;
  std::string prod_, cons_, sock_;
};

TEST_F(CApiTest, NoContextBeforeInit) {
  EXPECT_EQ(dyad_ctx_get(), nullptr);
  EXPECT_EQ(dyad_produce(dyad_ctx_get(), "/x"), DYAD_RC_NOCTX);
  EXPECT_EQ(dyad_consume(nullptr, "/x"), DYAD_RC_NOCTX);
  EXPECT_NE(std::strstr(dyad_last_error(), "not initialized"), nullptr) << dyad_last_error();
  dyad_metadata_t* md = nullptr;
  EXPECT_EQ(dyad_get_metadata(nullptr, "/x", false, &md), DYAD_RC_NOCTX);
  EXPECT_EQ(dyad_consume_w_metadata(nullptr, "/x", nullptr), DYAD_RC_NOCTX);
  EXPECT_EQ(dyad_set_prod_path("/x"), DYAD_RC_NOCTX);
  EXPECT_EQ(dyad_set_and_init_dtl_mode("TCP", DYAD_COMM_RECV), DYAD_RC_NOCTX);
}

TEST_F(CApiTest, ReturnCodesAreErrorsExceptOk) {
  EXPECT_FALSE(DYAD_IS_ERROR(DYAD_RC_OK));
  for (int rc : {DYAD_RC_SYSFAIL, DYAD_RC_NOCTX, DYAD_RC_BADBUF, DYAD_RC_FLUXFAIL,
                 DYAD_RC_UCXINIT_FAIL, DYAD_RC_TIMEOUT, DYAD_RC_NOSERVICE, DYAD_RC_STALE})
    EXPECT_TRUE(DYAD_IS_ERROR(rc)) << rc;
  EXPECT_STREQ(dyad_rc_name(DYAD_RC_NOSERVICE), "DYAD_RC_NOSERVICE");
}

TEST_F(CApiTest, InitWithoutPathsIsInertAndOk) {
  EXPECT_EQ(InitPaths(nullptr, nullptr), DYAD_RC_OK);
  ASSERT_NE(dyad_ctx_get(), nullptr);
  EXPECT_EQ(dyad_produce(dyad_ctx_get(), "/anything"), DYAD_RC_OK);
  EXPECT_EQ(dyad_consume(dyad_ctx_get(), "/anything"), DYAD_RC_OK);
  EXPECT_EQ(dyad_init_env(DYAD_COMM_RECV, nullptr), DYAD_RC_OK);  // already initialized
}

TEST_F(CApiTest, ArgumentErrors) {
  ASSERT_EQ(InitPaths(prod_.c_str(), cons_.c_str()), DYAD_RC_OK);
  dyad_ctx_t* ctx = dyad_ctx_get();
  ASSERT_NE(ctx, nullptr);
  EXPECT_EQ(dyad_produce(ctx, nullptr), DYAD_RC_BADBUF);
  EXPECT_EQ(dyad_consume(ctx, nullptr), DYAD_RC_BADBUF);
  EXPECT_EQ(dyad_get_metadata(ctx, "/x", false, nullptr), DYAD_RC_BADBUF);
  EXPECT_EQ(dyad_get_metadata(ctx, nullptr, false, nullptr), DYAD_RC_BADBUF);
  EXPECT_EQ(dyad_consume_w_metadata(ctx, nullptr, nullptr), DYAD_RC_BADBUF);
  EXPECT_EQ(dyad_consume_w_metadata(ctx, (cons_ + "/f").c_str(), nullptr), DYAD_RC_OK);
  dyad_metadata_t* md = nullptr;
  EXPECT_EQ(dyad_free_metadata(&md), DYAD_RC_OK);
  EXPECT_EQ(dyad_free_metadata(nullptr), DYAD_RC_OK);
  // A pointer that is not this process's context.
  EXPECT_EQ(dyad_produce(reinterpret_cast<dyad_ctx_t*>(&md), "/x"), DYAD_RC_NOCTX);
}

TEST_F(CApiTest, BadSettings) {
  EXPECT_EQ(InitPaths(prod_.c_str(), nullptr, true, "NOPE"), DYAD_RC_BADDTLMODE);
  EXPECT_EQ(dyad_ctx_get(), nullptr);
  EXPECT_EQ(InitPaths("", nullptr), DYAD_RC_BADMANAGEDPATH);
  EXPECT_EQ(dyad_init(false, false, false, true, false, false, 3, 1024, 1, nullptr, prod_.c_str(),
                      nullptr, false, "TCP", static_cast<dyad_dtl_comm_mode_t>(7), nullptr),
            DYAD_RC_BAD_COMM_MODE);
  setenv("DYAD_KEY_BINS", "many", 1);
  EXPECT_EQ(dyad_init_env(DYAD_COMM_RECV, nullptr), DYAD_RC_BADREQUEST);
  EXPECT_NE(std::strstr(dyad_last_error(), "DYAD_KEY_BINS"), nullptr);
  EXPECT_EQ(dyad_ctx_get(), nullptr);
}

TEST_F(CApiTest, DtlModeNamesAreCaseInsensitive) {
  EXPECT_EQ(InitPaths(prod_.c_str(), nullptr, true, "tcp"), DYAD_RC_OK);
  EXPECT_EQ(InitPaths(prod_.c_str(), nullptr, true, "Ucx"), DYAD_RC_OK);
  EXPECT_EQ(InitPaths(prod_.c_str(), nullptr, true, nullptr), DYAD_RC_OK);
  EXPECT_EQ(dyad_set_and_init_dtl_mode("ofi", DYAD_COMM_SEND), DYAD_RC_OK);
  // Upstream's MARGO is the OFI transport here.
  EXPECT_EQ(dyad_set_and_init_dtl_mode("margo", DYAD_COMM_SEND), DYAD_RC_OK);
  EXPECT_EQ(dyad_set_and_init_dtl_mode("bogus", DYAD_COMM_SEND), DYAD_RC_BADDTLMODE);
  EXPECT_NE(dyad_ctx_get(), nullptr);  // a failed setter keeps the context
}

TEST_F(CApiTest, ReinitSemantics) {
  ASSERT_EQ(InitPaths(prod_.c_str(), nullptr), DYAD_RC_OK);
  const std::string other = tmp_.Sub("other");
  WriteFile(other + "/f", "x");
  // Without reinit the call is a no-op: `other` stays untracked.
  ASSERT_EQ(InitPaths(other.c_str(), nullptr, /*reinit=*/false), DYAD_RC_OK);
  EXPECT_EQ(dyad_produce(dyad_ctx_get(), (other + "/f").c_str()), DYAD_RC_OK);
  // With reinit the new producer path is used: the file is now tracked and
  // publishing it needs the (absent) service.
  ASSERT_EQ(InitPaths(other.c_str(), nullptr, /*reinit=*/true), DYAD_RC_OK);
  EXPECT_EQ(dyad_produce(dyad_ctx_get(), (other + "/f").c_str()), DYAD_RC_NOSERVICE);
}

TEST_F(CApiTest, SetPaths) {
  ASSERT_EQ(InitPaths(prod_.c_str(), nullptr), DYAD_RC_OK);
  EXPECT_EQ(dyad_set_cons_path(""), DYAD_RC_BADMANAGEDPATH);
  EXPECT_EQ(dyad_set_cons_path(cons_.c_str()), DYAD_RC_OK);
  WriteFile(cons_ + "/in.dat", "x");
  EXPECT_EQ(dyad_consume(dyad_ctx_get(), (cons_ + "/elsewhere/../../x").c_str()), DYAD_RC_OK);
  EXPECT_EQ(dyad_set_prod_path(nullptr), DYAD_RC_OK);  // clears it
  EXPECT_EQ(dyad_produce(dyad_ctx_get(), (prod_ + "/a").c_str()), DYAD_RC_BADMANAGEDPATH);
}

TEST_F(CApiTest, FinalizeIsSafeTwiceAndClearUninitializes) {
  ASSERT_EQ(InitPaths(prod_.c_str(), nullptr), DYAD_RC_OK);
  EXPECT_EQ(dyad_finalize(), DYAD_RC_OK);
  EXPECT_EQ(dyad_finalize(), DYAD_RC_OK);
  EXPECT_EQ(dyad_ctx_get(), nullptr);
  ASSERT_EQ(InitPaths(prod_.c_str(), nullptr), DYAD_RC_OK);
  EXPECT_EQ(dyad_clear(), DYAD_RC_OK);
  EXPECT_EQ(dyad_ctx_get(), nullptr);
  dyad_ctx_fini();
  dyad_ctx_fini();
}

TEST_F(CApiTest, CtxInitFromEnvironment) {
  setenv("DYAD_PATH_PRODUCER", prod_.c_str(), 1);
  dyad_ctx_init(DYAD_COMM_SEND, nullptr);
  EXPECT_NE(dyad_ctx_get(), nullptr);
  dyad_ctx_fini();
  setenv("DYAD_DTL_MODE", "carrier-pigeon", 1);
  dyad_ctx_init(DYAD_COMM_SEND, nullptr);  // reports on stderr, leaves DYAD off
  EXPECT_EQ(dyad_ctx_get(), nullptr);
}

TEST_F(CApiTest, ContextIsVisibleFromOtherThreads) {
  ASSERT_EQ(InitPaths(prod_.c_str(), cons_.c_str()), DYAD_RC_OK);
  dyad_ctx_t* mine = dyad_ctx_get();
  dyad_ctx_t* theirs = nullptr;
  dyad_rc_t rc = DYAD_RC_SYSFAIL;
  std::thread t([&] {
    theirs = dyad_ctx_get();
    rc = dyad_produce(theirs, "/not/managed");
  });
  t.join();
  EXPECT_EQ(theirs, mine);
  EXPECT_EQ(rc, DYAD_RC_OK);
}

TEST_F(CApiTest, UntrackedAndMissingFiles) {
  ASSERT_EQ(InitPaths(prod_.c_str(), cons_.c_str()), DYAD_RC_OK);
  EXPECT_EQ(dyad_produce(dyad_ctx_get(), "/etc/hostname"), DYAD_RC_OK);
  EXPECT_EQ(dyad_consume(dyad_ctx_get(), "/etc/hostname"), DYAD_RC_OK);
  // Producing a file that does not exist fails before any request.
  EXPECT_EQ(dyad_produce(dyad_ctx_get(), (prod_ + "/missing").c_str()), DYAD_RC_BADFIO);
  EXPECT_NE(std::strstr(dyad_last_error(), "missing"), nullptr) << dyad_last_error();
  std::filesystem::create_directories(prod_ + "/adir");
  EXPECT_EQ(dyad_produce(dyad_ctx_get(), (prod_ + "/adir").c_str()), DYAD_RC_BADFIO);
  EXPECT_NE(std::strstr(dyad_last_error(), "not a regular file"), nullptr) << dyad_last_error();
}

TEST_F(CApiTest, NoServiceIsReportedQuickly) {
  ASSERT_EQ(InitPaths(prod_.c_str(), cons_.c_str()), DYAD_RC_OK);
  WriteFile(prod_ + "/a.dat", "hello");
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(dyad_produce(dyad_ctx_get(), (prod_ + "/a.dat").c_str()), DYAD_RC_NOSERVICE);
  EXPECT_NE(std::strstr(dyad_last_error(), sock_.c_str()), nullptr) << dyad_last_error();
  EXPECT_NE(std::strstr(dyad_last_error(), "dyad-service"), nullptr);
  EXPECT_EQ(dyad_consume(dyad_ctx_get(), (cons_ + "/b.dat").c_str()), DYAD_RC_NOSERVICE);
  EXPECT_NE(std::strstr(dyad_last_error(), sock_.c_str()), nullptr) << dyad_last_error();
  dyad_metadata_t* md = nullptr;
  EXPECT_EQ(dyad_get_metadata(dyad_ctx_get(), (cons_ + "/b.dat").c_str(), false, &md),
            DYAD_RC_NOSERVICE);
  EXPECT_EQ(md, nullptr);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
}

TEST_F(CApiTest, LastErrorIsPerThread) {
  ASSERT_EQ(InitPaths(prod_.c_str(), cons_.c_str()), DYAD_RC_OK);
  EXPECT_EQ(dyad_produce(dyad_ctx_get(), nullptr), DYAD_RC_BADBUF);
  std::string other;
  std::thread t([&] { other = dyad_last_error(); });
  t.join();
  EXPECT_EQ(other, "");
  EXPECT_NE(std::string(dyad_last_error()), "");
}

TEST_F(CApiTest, CheckSetsEnvironmentOnLevelOneConsume) {
  // A file already present in a private consumer directory is complete;
  // no service is needed. With `check`, DYAD_SYNC_HEALTH=ok records the success.
  WriteFile(cons_ + "/ready.dat", "done");
  ASSERT_EQ(dyad_init(false, /*check=*/true, false, true, false, false, 3, 1024, 1, nullptr,
                      prod_.c_str(), cons_.c_str(), false, "FLUX_RPC", DYAD_COMM_RECV, nullptr),
            DYAD_RC_OK);
  unsetenv(DYAD_CHECK_ENV);
  EXPECT_EQ(dyad_consume(dyad_ctx_get(), (cons_ + "/ready.dat").c_str()), DYAD_RC_OK);
  ASSERT_NE(getenv(DYAD_CHECK_ENV), nullptr);
  EXPECT_STREQ(getenv(DYAD_CHECK_ENV), "ok");
}

TEST_F(CApiTest, ForkedChildCanUseAndReinitialize) {
  ASSERT_EQ(InitPaths(prod_.c_str(), cons_.c_str()), DYAD_RC_OK);
  WriteFile(prod_ + "/a.dat", "hello");
  const std::string file = prod_ + "/a.dat";
  // Busy threads in the parent while forking must not wedge the child.
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    while (!stop) dyad_produce(dyad_ctx_get(), file.c_str());
  });
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = 0;
    if (dyad_ctx_get() == nullptr) code |= 1;
    if (dyad_produce(dyad_ctx_get(), file.c_str()) != DYAD_RC_NOSERVICE) code |= 2;
    if (dyad_finalize() != DYAD_RC_OK) code |= 4;
    if (InitPaths(prod_.c_str(), cons_.c_str()) != DYAD_RC_OK) code |= 8;
    if (dyad_produce(dyad_ctx_get(), file.c_str()) != DYAD_RC_NOSERVICE) code |= 16;
    _exit(code);
  }
  const int code = WaitChild(pid, 20);
  stop = true;
  busy.join();
  EXPECT_EQ(code, 0);
  EXPECT_EQ(dyad_produce(dyad_ctx_get(), file.c_str()), DYAD_RC_NOSERVICE);
}

}  // namespace
