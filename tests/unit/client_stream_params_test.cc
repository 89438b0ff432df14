// client_stream_params_test.cc: dyad::dyad_params (the settings of the C++
// streams) against the C API's settings, without a service.
//
// One set of defaults for every language: a C++ program that builds a
// dyad_params and a C program that relies on the environment must compute
// the same metadata keys and talk the same transport. The stream classes
// themselves are tested in tests/integration/stream_test.cc (they need
// libdyad_fstream and, for most behaviour, running services).
#include <gtest/gtest.h>
#include <dyad/stream/dyad_params.hpp>

#include "client/client.h"
#include "client_test_util.h"

namespace dyad {
namespace {

TEST(StreamParamsTest, DefaultsEqualTheEnvironmentDefaults) {
  testing_util::EnvScrub scrub;  // no DYAD_* variable: the C API's defaults
  auto env = ClientConfig::FromEnv();
  ASSERT_TRUE(env.ok()) << env.status().ToString();
  const dyad_params p;
  EXPECT_EQ(p.m_debug, env->debug);
  EXPECT_EQ(p.m_check, env->check);
  EXPECT_EQ(p.m_shared_storage, env->shared_storage);
  EXPECT_EQ(p.m_reinit, env->reinit);
  EXPECT_EQ(p.m_async_publish, env->async_publish);
  EXPECT_EQ(p.m_fsync_write, env->fsync_write);
  EXPECT_EQ(p.m_key_depth, env->key_depth);
  EXPECT_EQ(p.m_key_bins, env->key_bins);
  EXPECT_EQ(p.m_service_mux, env->service_mux);
  EXPECT_EQ(p.m_kvs_namespace, env->kvs_namespace);
  EXPECT_EQ(p.m_prod_managed_path, env->prod_managed_path);
  EXPECT_EQ(p.m_cons_managed_path, env->cons_managed_path);
  EXPECT_EQ(p.m_relative_to_managed_path, env->relative_to_managed_path);
  ASSERT_GE(p.m_dtl_mode, 0);
  ASSERT_LT(p.m_dtl_mode, DYAD_DTL_END);
  EXPECT_EQ(std::string(dyad_dtl_mode_name[p.m_dtl_mode]), env->dtl_mode);
  EXPECT_TRUE(p.m_dtl_mode_name.empty());
}

// Upstream's C++ defaults were depth 2, 256 bins, UCX: keys then differed
// from C and Python programs of the same workflow.
TEST(StreamParamsTest, NotUpstreamsDivergentCppDefaults) {
  const dyad_params p;
  EXPECT_EQ(p.m_key_depth, 3u);
  EXPECT_EQ(p.m_key_bins, 1024u);
  EXPECT_EQ(p.m_service_mux, 1u);
  EXPECT_EQ(p.m_dtl_mode, DYAD_DTL_FLUX_RPC);
  EXPECT_NE(p.m_dtl_mode, DYAD_DTL_UCX);
}

}  // namespace
}  // namespace dyad
