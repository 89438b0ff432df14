// kvs_flux_test: the flux:// store inside a real Flux instance (run by
// ctest as `flux start --test-size=1 kvs_flux_test`).
#include <gtest/gtest.h>

#include <cstdlib>

#include "kvs/kvs.h"

namespace dyad {
namespace {

TEST(FluxKvs, RunsInsideAnInstance) {
  ASSERT_NE(std::getenv("FLUX_URI"), nullptr) << "run me inside `flux start`";
}

}  // namespace
}  // namespace dyad
