// scripts/quickstart.sh on a checkout with no ../shared beside it and no
// datasets/: MNIST is fetched from a local HTTP server (PSTRAIN_DATA_MIRRORS)
// and the main job (1 scheduler, 1 server, 2 workers, dist_sync) trains on it.
// Installing and building are skipped (PSTRAIN_QUICKSTART_SETUP=0): the test
// uses the binary of this build.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "tests/http_test_server.h"
#include "tests/test_util.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;

TEST(QuickstartTest, WorksWithoutSharedDataByFetchingMnist) {
  const std::string dir = testing::MakeTempDir("quickstart");
  ASSERT_FALSE(dir.empty());
  const std::string repo = dir + "/checkout";
  fs::create_directories(repo + "/scripts");
  fs::copy_file(testing::SourceDir() + "/scripts/quickstart.sh", repo + "/scripts/quickstart.sh");
  ASSERT_FALSE(fs::exists(dir + "/shared"));

  testing::TestHttpServer server;
  const std::string mnist = testing::SharedDataDir() + "/mnist/";
  for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
    ASSERT_TRUE(server.AddFileFrom(f, mnist + f)) << mnist + f;
  }
  ASSERT_TRUE(server.Start());

  const std::string build_dir = fs::path(testing::PstrainBinary()).parent_path().string();
  const std::string cmd =
      "cd '" + repo +
      "' && env -u PSTRAIN_DATA -u PSTRAIN_MNIST_DIR PSTRAIN_QUICKSTART_SETUP=0 "
      "PSTRAIN_BUILD_DIR='" +
      build_dir + "' EPOCHS=1 NUM_EXAMPLES=3200 PSTRAIN_DATA_MIRRORS=" + server.Url("mnist") +
      " bash scripts/quickstart.sh 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  server.Stop();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << out;
  EXPECT_NE(out.find("quickstart: MNIST in datasets/mnist"), std::string::npos) << out;
  int fetched = 0;
  for (size_t at = out.find("sha256 ok"); at != std::string::npos;
       at = out.find("sha256 ok", at + 1)) {
    ++fetched;
  }
  EXPECT_EQ(fetched, 4) << out;
  EXPECT_EQ(server.requests().size(), 4u);
  // The job's table: one epoch, accuracy above chance.
  EXPECT_NE(out.find("| epoch | train-accuracy | valid-accuracy | time |"), std::string::npos)
      << out;
  EXPECT_NE(out.find("\n|  1 | 0."), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(repo + "/datasets/mnist/train-images-idx3-ubyte.gz"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pstrain
