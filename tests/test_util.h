// Helpers shared by the test suites.
#ifndef PSTRAIN_TESTS_TEST_UTIL_H_
#define PSTRAIN_TESTS_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "common/status.h"

#define ASSERT_OK(expr)                          \
  do {                                           \
    const ::pstrain::Status pstrain_s_ = (expr); \
    ASSERT_TRUE(pstrain_s_.ok()) << pstrain_s_;  \
  } while (0)
#define EXPECT_OK(expr)                          \
  do {                                           \
    const ::pstrain::Status pstrain_s_ = (expr); \
    EXPECT_TRUE(pstrain_s_.ok()) << pstrain_s_;  \
  } while (0)

namespace pstrain::testing {

// ../shared/data beside the checkout (PSTRAIN_SHARED_DATA_DIR overrides it at run time).
inline std::string SharedDataDir() {
  const char* env = std::getenv("PSTRAIN_SHARED_DATA_DIR");
  return env != nullptr && *env != '\0' ? env : PSTRAIN_SHARED_DATA_DIR;
}
// The built `pstrain` binary.
inline std::string PstrainBinary() { return PSTRAIN_BINARY; }
inline std::string SourceDir() { return PSTRAIN_SOURCE_DIR; }
// A new empty folder under $TMPDIR (or /tmp) named after `what`; "" if none
// could be made. The caller removes it.
inline std::string MakeTempDir(const std::string& what) {
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/pstrain-" + what + "-XXXXXX";
  return mkdtemp(pattern.data()) != nullptr ? pattern : std::string();
}

}  // namespace pstrain::testing

#endif  // PSTRAIN_TESTS_TEST_UTIL_H_
