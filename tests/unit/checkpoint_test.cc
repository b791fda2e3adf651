// Checkpoint files: round trip, truncation, damage.
#include "worker/checkpoint.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <vector>

#include "tests/test_util.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pstrain_ckpt_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    NamedArray w;
    w.name = "fc1_weight";
    w.shape = {2, 3};
    w.data = {1, 2, 3, 4, 5, 6};
    NamedArray mean;
    mean.kind = NamedArray::Kind::kAux;
    mean.name = "bn1_moving_mean";
    mean.shape = {2};
    mean.data = {0.5f, -0.25f};
    arrays_ = {w, mean};
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  std::vector<NamedArray> arrays_;
};

TEST_F(CheckpointTest, PathsAreMxnets) {
  EXPECT_EQ(CheckpointParamsPath("out/lenet", 3), "out/lenet-0003.params");
  EXPECT_EQ(CheckpointStatesPath("m", 12), "m-0012.states");
}

TEST_F(CheckpointTest, RoundTrip) {
  const std::string path = (dir_ / "m-0001.params").string();
  ASSERT_OK(SaveArrays(path, arrays_));
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  auto loaded = LoadArrays(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_EQ(loaded->size(), 2u);
  EXPECT_EQ((*loaded)[0].name, "fc1_weight");
  EXPECT_EQ((*loaded)[0].kind, NamedArray::Kind::kParam);
  EXPECT_EQ((*loaded)[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ((*loaded)[0].data, arrays_[0].data);
  EXPECT_EQ((*loaded)[1].kind, NamedArray::Kind::kAux);
  EXPECT_EQ((*loaded)[1].data, arrays_[1].data);
}

TEST_F(CheckpointTest, TruncatedAndDamagedFilesAreCorruption) {
  const std::string path = (dir_ / "m-0001.params").string();
  ASSERT_OK(SaveArrays(path, arrays_));
  const auto size = fs::file_size(path);
  for (uintmax_t cut : {uintmax_t{5}, uintmax_t{30}, size - 9, size - 1}) {
    ASSERT_OK(SaveArrays(path, arrays_));
    fs::resize_file(path, cut);
    auto r = LoadArrays(path);
    ASSERT_FALSE(r.ok()) << "cut at " << cut;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status();
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status();
    EXPECT_NE(r.status().message().find("byte offset"), std::string::npos) << r.status();
  }
  ASSERT_OK(SaveArrays(path, arrays_));
  {
    FILE* f = std::fopen(path.c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, static_cast<long>(size) - 8, SEEK_SET);
    std::fputc(0x7f, f);
    std::fclose(f);
  }
  auto r = LoadArrays(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("CRC mismatch"), std::string::npos) << r.status();
  EXPECT_EQ(LoadArrays((dir_ / "none.params").string()).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace pstrain
