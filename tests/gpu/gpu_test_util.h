// Shared by the `gpu` suites: they skip, saying why, where no GPU can be used.
#ifndef PSTRAIN_TESTS_GPU_GPU_TEST_UTIL_H_
#define PSTRAIN_TESTS_GPU_GPU_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "nn/backend.h"

// Skips the test (GTEST_SKIP, with the reason GpuCount gives: no CUDA module
// in the build, no driver, no device) unless a GPU can be used. With
// PSTRAIN_REQUIRE_GPU=1 (set on a GPU machine: bench/gpu_session.sh) it fails
// instead, so that a CUDA module that cannot load there (a library missing
// from the path, an ABI mismatch, a driver error) is not a green run of skips.
#define SKIP_WITHOUT_GPU()                                                         \
  do {                                                                             \
    std::string why_;                                                              \
    if (::pstrain::GpuCount(&why_) == 0) {                                         \
      if (::pstrain::testing::GpuRequired()) {                                     \
        GTEST_FAIL() << "PSTRAIN_REQUIRE_GPU=1, but no GPU can be used: " << why_; \
      }                                                                            \
      GTEST_SKIP() << why_;                                                        \
    }                                                                              \
  } while (0)

namespace pstrain::testing {

// PSTRAIN_REQUIRE_GPU=1: a GPU test that cannot use a GPU fails.
inline bool GpuRequired() {
  const char* v = std::getenv("PSTRAIN_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

}  // namespace pstrain::testing

#endif  // PSTRAIN_TESTS_GPU_GPU_TEST_UTIL_H_
