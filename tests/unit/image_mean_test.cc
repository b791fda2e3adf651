// MXNet mean image files (NDArray list format).
#include "data/image_mean.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "tests/test_util.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

class ImageMeanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() /
             ("pstrain_mean_test_" + std::to_string(::getpid()) + ".bin"))
                .string();
  }
  void TearDown() override { std::filesystem::remove(path_); }
  void Write(const std::string& bytes) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::string Read() {
    std::ifstream in(path_, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  template <typename T>
  static void Put(std::string* s, T v) {
    s->append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  std::string path_;
};

TEST_F(ImageMeanTest, SaveWritesTheV2LayoutAndLoadsBack) {
  MeanImage mean;
  mean.shape = {3, 2, 2};
  for (int i = 0; i < 12; ++i) mean.data.push_back(i * 1.5f);
  ASSERT_OK(SaveMeanImage(path_, mean));
  std::string expected;
  Put<uint64_t>(&expected, 0x112);
  Put<uint64_t>(&expected, 0);
  Put<uint64_t>(&expected, 1);
  Put<uint32_t>(&expected, 0xF993FAC9);
  Put<int32_t>(&expected, 0);
  Put<uint32_t>(&expected, 3);
  for (int64_t d : mean.shape) Put<int64_t>(&expected, d);
  Put<int32_t>(&expected, 1);  // cpu
  Put<int32_t>(&expected, 0);  // device 0
  Put<int32_t>(&expected, 0);  // float32
  for (float v : mean.data) Put<float>(&expected, v);
  Put<uint64_t>(&expected, 1);
  Put<uint64_t>(&expected, 8);
  expected += "mean_img";
  EXPECT_EQ(Read(), expected);
  auto loaded = LoadMeanImage(path_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->shape, mean.shape);
  EXPECT_EQ(loaded->data, mean.data);
}

TEST_F(ImageMeanTest, LoadsTheLegacyFormatByName) {
  // Two arrays in the 2015 layout (uint32 dims); the second is mean_img.
  std::string s;
  Put<uint64_t>(&s, 0x112);
  Put<uint64_t>(&s, 0);
  Put<uint64_t>(&s, 2);
  for (int a = 0; a < 2; ++a) {
    Put<uint32_t>(&s, 3);
    Put<uint32_t>(&s, 1);
    Put<uint32_t>(&s, 1);
    Put<uint32_t>(&s, 2);
    Put<int32_t>(&s, 1);
    Put<int32_t>(&s, 0);
    Put<int32_t>(&s, 0);
    Put<float>(&s, a + 0.25f);
    Put<float>(&s, a + 0.75f);
  }
  Put<uint64_t>(&s, 2);
  for (std::string name : {"other", "mean_img"}) {
    Put<uint64_t>(&s, name.size());
    s += name;
  }
  Write(s);
  auto loaded = LoadMeanImage(path_);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->shape, (std::vector<int64_t>{1, 1, 2}));
  EXPECT_EQ(loaded->data, (std::vector<float>{1.25f, 1.75f}));
}

TEST_F(ImageMeanTest, CorruptFilesNameFileAndOffset) {
  Write("not an ndarray file at all");
  auto bad = LoadMeanImage(path_);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr(path_ + ":0"));
  MeanImage mean;
  mean.shape = {1, 4, 4};
  mean.data.assign(16, 1.0f);
  ASSERT_OK(SaveMeanImage(path_, mean));
  std::string bytes = Read();
  Write(bytes.substr(0, 80));
  auto truncated = LoadMeanImage(path_);
  ASSERT_FALSE(truncated.ok());
  EXPECT_EQ(truncated.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(truncated.status().message(),
              HasSubstr("the array claims 16 floats but the file holds"));
}

// Found by review: a 56-byte file claiming 2^31 floats made the reader
// allocate (and zero) 8 GiB before it found the data missing.
TEST_F(ImageMeanTest, AHeaderClaimingMoreThanTheFileHoldsAllocatesNothing) {
  std::string s;
  Put<uint64_t>(&s, 0x112);
  Put<uint64_t>(&s, 0);
  Put<uint64_t>(&s, 1);
  Put<uint32_t>(&s, 0xF993FAC9);
  Put<int32_t>(&s, 0);
  Put<uint32_t>(&s, 1);
  Put<int64_t>(&s, int64_t{1} << 31);
  Put<int32_t>(&s, 1);
  Put<int32_t>(&s, 0);
  Put<int32_t>(&s, 0);  // float32, and no data
  Write(s);
  auto bad = LoadMeanImage(path_);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(bad.status().message(),
              HasSubstr(path_ + ":56: the array claims 2147483648 floats but the file holds 0"));
}

}  // namespace
}  // namespace pstrain
