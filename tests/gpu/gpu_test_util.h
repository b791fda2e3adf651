// Shared by the `gpu` suites: they skip, saying why, where no GPU can be used.
#ifndef PSTRAIN_TESTS_GPU_GPU_TEST_UTIL_H_
#define PSTRAIN_TESTS_GPU_GPU_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <string>

#include "nn/backend.h"

// Skips the test (GTEST_SKIP, with the reason GpuCount gives: no CUDA module
// in the build, no driver, no device) unless a GPU can be used.
#define SKIP_WITHOUT_GPU()                                     \
  do {                                                         \
    std::string why_;                                          \
    if (::pstrain::GpuCount(&why_) == 0) GTEST_SKIP() << why_; \
  } while (0)

#endif  // PSTRAIN_TESTS_GPU_GPU_TEST_UTIL_H_
