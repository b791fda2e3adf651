// The start-up check of the instruction set a binary was built for.
#include "tools/cpu_check.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace pstrain {
namespace {

bool HasUpToV2(const char* level) {
  return std::strcmp(level, "x86-64") == 0 || std::strcmp(level, "x86-64-v2") == 0;
}

TEST(CpuCheckTest, LevelTheCpuHasRuns) {
  char msg[256] = "";
  EXPECT_TRUE(CpuCanRun("x86-64-v2", HasUpToV2, msg, sizeof(msg)));
  EXPECT_TRUE(CpuCanRun("x86-64", HasUpToV2, msg, sizeof(msg)));
  EXPECT_STREQ(msg, "");
}

TEST(CpuCheckTest, LevelTheCpuLacksNamesItAndTheFix) {
  char msg[512] = "";
  EXPECT_FALSE(CpuCanRun("x86-64-v3", HasUpToV2, msg, sizeof(msg)));
  const std::string m = msg;
  EXPECT_NE(m.find("built for x86-64-v3"), std::string::npos) << m;
  EXPECT_NE(m.find("-DPSTRAIN_ARCH=x86-64-v2"), std::string::npos) << m;
}

TEST(CpuCheckTest, MessageIsTruncatedToTheBuffer) {
  char msg[16];
  std::memset(msg, 'x', sizeof(msg));
  EXPECT_FALSE(CpuCanRun("x86-64-v4", HasUpToV2, msg, sizeof(msg)));
  EXPECT_EQ(std::strlen(msg), sizeof(msg) - 1);
}

TEST(CpuCheckTest, NonLevelArchesAreNotAskedAbout) {
  char msg[64] = "";
  auto never = [](const char*) { return false; };
  EXPECT_TRUE(CpuCanRun("native", never, msg, sizeof(msg)));
  EXPECT_TRUE(CpuCanRun("", never, msg, sizeof(msg)));
  EXPECT_TRUE(CpuCanRun("znver4", never, msg, sizeof(msg)));
}

}  // namespace
}  // namespace pstrain
