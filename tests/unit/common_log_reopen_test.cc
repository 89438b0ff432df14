// common_log_reopen_test.cc: LogReopen (SIGHUP in dyad-service) sends
// later messages to a new file at the configured path after the old one
// was moved away, as logrotate does.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "common/log.h"
#include "util.h"

namespace dyad {
namespace {

using testutil::ReadAll;

TEST(LogReopenTest, MessagesFollowTheConfiguredPathAfterRotation) {
  const testutil::TempDir dir("dyad-log-test-");
  ASSERT_TRUE(dir.ok());
  const std::string info = dir.Sub("info.log");
  const std::string error = dir.Sub("error.log");
  ASSERT_TRUE(LogSetInfoFile(info));
  ASSERT_TRUE(LogSetErrorFile(error));
  DYAD_LOG_INFO("before rotation");
  DYAD_LOG_ERROR("error before rotation");
  ASSERT_EQ(::rename(info.c_str(), (info + ".1").c_str()), 0);
  ASSERT_EQ(::rename(error.c_str(), (error + ".1").c_str()), 0);
  ASSERT_TRUE(LogReopen());
  DYAD_LOG_INFO("after rotation");
  DYAD_LOG_WARN("warning after rotation");
  EXPECT_NE(ReadAll(info + ".1").find("before rotation"), std::string::npos);
  EXPECT_EQ(ReadAll(info + ".1").find("after rotation"), std::string::npos);
  EXPECT_NE(ReadAll(info).find("after rotation"), std::string::npos);
  EXPECT_NE(ReadAll(error).find("warning after rotation"), std::string::npos);
  EXPECT_EQ(ReadAll(error + ".1").find("warning after"), std::string::npos);
  ASSERT_TRUE(LogSetInfoFile(""));
  ASSERT_TRUE(LogSetErrorFile(""));
  EXPECT_TRUE(LogReopen());  // back on stderr: nothing to reopen
}

}  // namespace
}  // namespace dyad
