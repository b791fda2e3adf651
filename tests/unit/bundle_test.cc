// scripts/bundle.sh: pstrain packed with its shared libraries for a GPU host
// that has none of our Debian packages. The archive holds the binary, the
// CUDA module where this build made one, env.sh, and every library `ldd`
// names except glibc's and CUDA's; from the unpacked bundle, in an empty
// environment with env.sh sourced, pstrain runs on the bundle's libraries.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "tests/test_util.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;
using testing::PstrainBinary;
using testing::RunShell;
using testing::SourceDir;
using testing::TempDir;

TEST(BundleTest, TheBundleRunsPstrainOnItsOwnLibraries) {
  TempDir dir("bundle");
  ASSERT_FALSE(dir.path().empty());
  const std::string build = fs::path(PstrainBinary()).parent_path().string();
  const std::string archive = dir.Sub("pstrain.tar.gz");
  std::string out;
  ASSERT_EQ(
      RunShell("bash " + SourceDir() + "/scripts/bundle.sh " + archive + " " + build + " 2>&1",
               &out),
      0)
      << out;
  ASSERT_EQ(RunShell("tar -xzf " + archive + " -C " + dir.path() + " 2>&1", &out), 0) << out;
  const std::string root = dir.Sub("pstrain-bundle");
  EXPECT_TRUE(fs::exists(root + "/bin/pstrain"));
  EXPECT_TRUE(fs::exists(root + "/env.sh"));
  EXPECT_TRUE(fs::exists(root + "/lib/libzmq.so.5"));
  EXPECT_EQ(fs::exists(build + "/libpstrain_cuda.so"),
            fs::exists(root + "/bin/libpstrain_cuda.so"));

  const std::string in_bundle = "env -i PATH=/usr/bin:/bin bash -c '. " + root + "/env.sh && ";
  ASSERT_EQ(RunShell(in_bundle + "ldd " + root + "/bin/pstrain' 2>&1", &out), 0) << out;
  std::istringstream lines(out);
  std::string line;
  int from_bundle = 0;
  while (std::getline(lines, line)) {
    const size_t arrow = line.find("=> /");
    if (arrow == std::string::npos) continue;
    const std::string path = line.substr(arrow + 3);
    if (path.rfind(root + "/lib/", 0) == 0) {
      ++from_bundle;
      continue;
    }
    const std::string name = line.substr(line.find_first_not_of(" \t"));
    const bool host_lib = name.rfind("libc.", 0) == 0 || name.rfind("libm.", 0) == 0 ||
                          name.rfind("libpthread.", 0) == 0 || name.rfind("libdl.", 0) == 0 ||
                          name.rfind("librt.", 0) == 0 || name.rfind("libresolv.", 0) == 0;
    EXPECT_TRUE(host_lib) << "resolved outside the bundle: " << line;
  }
  EXPECT_GE(from_bundle, 5) << out;

  ASSERT_EQ(RunShell(in_bundle + "pstrain version' 2>&1", &out), 0) << out;
  EXPECT_NE(out.find("backends: cpu"), std::string::npos) << out;
}

}  // namespace
}  // namespace pstrain
