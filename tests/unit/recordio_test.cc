// RecordIO container, .idx files, part splitting and the image record header.
#include "data/recordio.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "data/image_recordio.h"
#include "tests/test_util.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

class RecordIOTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("pstrain_recordio_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  static std::string ReadAll(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  static void WriteAll(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  static std::string Word(uint32_t v) { return std::string(reinterpret_cast<char*>(&v), 4); }

  // Writes `records`, returns their start offsets.
  std::vector<uint64_t> WriteRecords(const std::string& path,
                                     const std::vector<std::string>& records) {
    auto writer = RecordIOWriter::Create(path);
    EXPECT_TRUE(writer.ok()) << writer.status();
    std::vector<uint64_t> offsets;
    for (const std::string& r : records) {
      offsets.push_back((*writer)->Tell());
      EXPECT_OK((*writer)->Write(r));
    }
    EXPECT_OK((*writer)->Close());
    return offsets;
  }

  // Random payloads; about one in four holds the magic word at aligned and
  // unaligned offsets.
  static std::vector<std::string> RandomRecords(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<std::string> out;
    for (int i = 0; i < n; ++i) {
      std::string r(rng() % 300, '\0');
      for (char& c : r) c = static_cast<char>(rng());
      if (rng() % 4 == 0 && r.size() >= 8) {
        const uint32_t magic = kRecordIOMagic;
        size_t at = (rng() % (r.size() - 4));
        std::memcpy(&r[at], &magic, 4);
        std::memcpy(&r[(at / 4) * 4], &magic, 4);
      }
      out.push_back(std::move(r));
    }
    return out;
  }

  std::filesystem::path dir_;
};

TEST_F(RecordIOTest, WholeRecordLayoutIsDmlcs) {
  const std::string path = Path("a.rec");
  WriteRecords(path, {"hello", "", "abcd"});
  std::string expected = Word(kRecordIOMagic) + Word(5) + "hello" + std::string(3, '\0') +
                         Word(kRecordIOMagic) + Word(0) + Word(kRecordIOMagic) + Word(4) + "abcd";
  EXPECT_EQ(ReadAll(path), expected);
}

TEST_F(RecordIOTest, AlignedMagicIsSplitIntoContinuationPieces) {
  const std::string path = Path("c.rec");
  const std::string m = Word(kRecordIOMagic);
  // Magic at 0, at 8 and an unaligned one at 13 (kept as data).
  const std::string payload = m + "abcd" + m + "x" + m + "yz";
  auto writer = RecordIOWriter::Create(path);
  ASSERT_TRUE(writer.ok());
  ASSERT_OK((*writer)->Write(payload));
  EXPECT_EQ((*writer)->num_escaped(), 2);
  ASSERT_OK((*writer)->Close());
  std::string expected = m + Word(1u << 29 | 0)             // first piece: empty
                         + m + Word(2u << 29 | 4) + "abcd"  // middle piece
                         + m + Word(3u << 29 | 7) + "x" + m + "yz" + std::string(1, '\0');
  EXPECT_EQ(ReadAll(path), expected);

  auto file = RecordIOFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  std::string_view rec;
  std::string scratch;
  uint64_t next = 0;
  ASSERT_OK((*file)->ReadAt(0, &rec, &scratch, &next));
  EXPECT_EQ(rec, payload);
  EXPECT_EQ(next, expected.size());
}

TEST_F(RecordIOTest, RandomRoundTripAndScan) {
  const std::string path = Path("r.rec");
  std::vector<std::string> records = RandomRecords(500, 7);
  std::vector<uint64_t> offsets = WriteRecords(path, records);
  auto file = RecordIOFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto starts = (*file)->ScanRecordStarts(0, (*file)->size());
  ASSERT_TRUE(starts.ok()) << starts.status();
  EXPECT_EQ(*starts, offsets);
  std::string scratch;
  for (size_t i = 0; i < records.size(); ++i) {
    std::string_view rec;
    ASSERT_OK((*file)->ReadAt(offsets[i], &rec, &scratch, nullptr));
    ASSERT_EQ(rec, records[i]) << "record " << i;
  }
}

TEST_F(RecordIOTest, PartsCoverEveryRecordExactlyOnce) {
  const std::string path = Path("p.rec");
  std::vector<uint64_t> offsets = WriteRecords(path, RandomRecords(1000, 11));
  auto file = RecordIOFile::Open(path);
  ASSERT_TRUE(file.ok());
  for (int parts : {1, 2, 3, 4, 7, 16, 64}) {
    std::vector<uint64_t> all;
    uint64_t prev_end = 0;
    for (int p = 0; p < parts; ++p) {
      auto [begin, end] = (*file)->PartitionRange(p, parts);
      EXPECT_EQ(begin, prev_end) << "part " << p << "/" << parts;
      prev_end = end;
      auto starts = (*file)->ScanRecordStarts(begin, end);
      ASSERT_TRUE(starts.ok()) << starts.status();
      all.insert(all.end(), starts->begin(), starts->end());
    }
    EXPECT_EQ(prev_end, (*file)->size());
    EXPECT_EQ(all, offsets) << parts << " parts";
  }
}

TEST_F(RecordIOTest, PartBoundariesSkipContinuationPieces) {
  // One large record made of many pieces, then small ones: a boundary falling
  // inside the large record moves to the next record start.
  const std::string path = Path("big.rec");
  std::string big(4000, 'x');
  const uint32_t magic = kRecordIOMagic;
  for (size_t at = 0; at + 4 <= big.size(); at += 64) std::memcpy(&big[at], &magic, 4);
  std::vector<uint64_t> offsets = WriteRecords(path, {big, "a", "b", "c"});
  auto file = RecordIOFile::Open(path);
  ASSERT_TRUE(file.ok());
  auto [begin, end] = (*file)->PartitionRange(0, 2);
  EXPECT_EQ(begin, 0u);
  EXPECT_EQ(end, offsets[1]);
  auto second = (*file)->PartitionRange(1, 2);
  EXPECT_EQ(second.first, offsets[1]);
  EXPECT_EQ(second.second, (*file)->size());
}

TEST_F(RecordIOTest, IndexRoundTripAndErrors) {
  const std::string path = Path("x.idx");
  std::vector<RecordIndexEntry> entries = {{0, 0}, {7, 1024}, {3, 4096}};
  ASSERT_OK(WriteRecordIndex(path, entries));
  EXPECT_EQ(ReadAll(path), "0\t0\n7\t1024\n3\t4096\n");
  auto read = ReadRecordIndex(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 3u);
  EXPECT_EQ((*read)[1].key, 7u);
  EXPECT_EQ((*read)[2].offset, 4096u);

  WriteAll(path, "0\t0\n1\tabc\n");
  auto bad = ReadRecordIndex(path);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("x.idx:2"));
  // Found by a review: ">> uint64_t" took "-1" as 2^64 - 1.
  for (const char* line : {"-1\t0", "1\t-64", "1\t+64", "1\t18446744073709551616", "1\t64x"}) {
    WriteAll(path, StrCat("0\t0\n", line, "\n"));
    bad = ReadRecordIndex(path);
    ASSERT_FALSE(bad.ok()) << line;
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(bad.status().message(), HasSubstr(StrCat("x.idx:2: expected 'key<TAB>offset' "
                                                         "(two unsigned integers), got '",
                                                         line, "'")));
  }
  WriteAll(path, "18446744073709551615 7\n");  // the largest key, space-separated
  read = ReadRecordIndex(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ((*read)[0].key, ~uint64_t{0});
}

TEST_F(RecordIOTest, BadMagicNamesFileAndOffset) {
  const std::string path = Path("bad.rec");
  std::vector<uint64_t> offsets = WriteRecords(path, {"first", "second!", "third"});
  std::string bytes = ReadAll(path);
  bytes[offsets[1]] ^= 0x55;
  WriteAll(path, bytes);
  auto file = RecordIOFile::Open(path);
  ASSERT_TRUE(file.ok());
  auto starts = (*file)->ScanRecordStarts(0, (*file)->size());
  ASSERT_FALSE(starts.ok());
  EXPECT_EQ(starts.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(starts.status().message(), HasSubstr("bad.rec:" + std::to_string(offsets[1])));
  EXPECT_THAT(starts.status().message(), HasSubstr("magic"));
}

TEST_F(RecordIOTest, TruncatedRecordNamesFileAndOffset) {
  const std::string path = Path("trunc.rec");
  std::vector<uint64_t> offsets = WriteRecords(path, {"first", std::string(100, 'z')});
  std::string bytes = ReadAll(path);
  WriteAll(path, bytes.substr(0, offsets[1] + 8 + 50));
  auto file = RecordIOFile::Open(path);
  ASSERT_TRUE(file.ok());
  auto starts = (*file)->ScanRecordStarts(0, (*file)->size());
  ASSERT_FALSE(starts.ok());
  EXPECT_THAT(starts.status().message(), HasSubstr("trunc.rec:" + std::to_string(offsets[1])));
  EXPECT_THAT(starts.status().message(), HasSubstr("truncated"));

  WriteAll(path, bytes.substr(0, offsets[1] + 6));  // cut inside the header
  auto file2 = RecordIOFile::Open(path);
  ASSERT_TRUE(file2.ok());
  std::string_view rec;
  Status s = (*file2)->ReadAt(offsets[1], &rec, nullptr, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_THAT(s.message(), HasSubstr("truncated record header"));
}

TEST_F(RecordIOTest, ContinuationPieceAtRecordStartIsCorruption) {
  const std::string path = Path("flag.rec");
  WriteAll(path, Word(kRecordIOMagic) + Word(2u << 29 | 4) + "abcd");
  auto file = RecordIOFile::Open(path);
  ASSERT_TRUE(file.ok());
  std::string_view rec;
  std::string scratch;
  Status s = (*file)->ReadAt(0, &rec, &scratch, nullptr);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_THAT(s.message(), HasSubstr("flag.rec:0"));
  EXPECT_THAT(s.message(), HasSubstr("continuation flag 2"));
}

TEST_F(RecordIOTest, MissingFileIsNotFound) {
  auto file = RecordIOFile::Open(Path("none.rec"));
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().code(), StatusCode::kNotFound);
}

TEST_F(RecordIOTest, EmptyFileHasNoRecords) {
  const std::string path = Path("empty.rec");
  WriteAll(path, "");
  auto file = RecordIOFile::Open(path);
  ASSERT_TRUE(file.ok());
  auto starts = (*file)->ScanRecordStarts(0, (*file)->size());
  ASSERT_TRUE(starts.ok());
  EXPECT_TRUE(starts->empty());
  EXPECT_EQ((*file)->PartitionRange(1, 3), std::make_pair(uint64_t{0}, uint64_t{0}));
}

TEST(ImageRecordHeaderTest, SingleLabelLayout) {
  std::string payload = PackImageRecord(42, {3.0f}, "JPEGDATA");
  ASSERT_EQ(payload.size(), 24u + 8u);
  uint32_t flag;
  float label;
  uint64_t id, id2;
  std::memcpy(&flag, payload.data(), 4);
  std::memcpy(&label, payload.data() + 4, 4);
  std::memcpy(&id, payload.data() + 8, 8);
  std::memcpy(&id2, payload.data() + 16, 8);
  EXPECT_EQ(flag, 0u);
  EXPECT_EQ(label, 3.0f);
  EXPECT_EQ(id, 42u);
  EXPECT_EQ(id2, 0u);
  ImageRecordView view;
  ASSERT_OK(ParseImageRecord(payload, "t.rec:0", &view));
  EXPECT_EQ(view.labels, std::vector<float>{3.0f});
  EXPECT_EQ(view.header.id, 42u);
  EXPECT_EQ(view.image, "JPEGDATA");
}

TEST(ImageRecordHeaderTest, MultiLabelRoundTrip) {
  std::vector<float> labels = {1.0f, 0.5f, -2.0f, 7.0f};
  std::string payload = PackImageRecord(9, labels, "img");
  uint32_t flag;
  float label;
  std::memcpy(&flag, payload.data(), 4);
  std::memcpy(&label, payload.data() + 4, 4);
  EXPECT_EQ(flag, 4u);
  EXPECT_EQ(label, 0.0f);
  ImageRecordView view;
  ASSERT_OK(ParseImageRecord(payload, "t.rec:0", &view));
  EXPECT_EQ(view.labels, labels);
  EXPECT_EQ(view.image, "img");
}

TEST(ImageRecordHeaderTest, ShortPayloadsAreCorruption) {
  ImageRecordView view;
  Status s = ParseImageRecord(std::string(10, 'a'), "t.rec:64", &view);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_THAT(s.message(), HasSubstr("t.rec:64"));
  std::string payload = PackImageRecord(1, {1, 2, 3}, "");
  s = ParseImageRecord(std::string_view(payload).substr(0, 30), "t.rec:128", &view);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_THAT(s.message(), HasSubstr("3 labels"));
}

TEST_F(RecordIOTest, ImageRecordsThroughContinuationPieces) {
  // A label whose float bits equal the magic word forces a split in the header.
  float magic_label;
  const uint32_t magic = kRecordIOMagic;
  std::memcpy(&magic_label, &magic, 4);
  std::vector<float> labels = {1.0f, magic_label, 2.0f};
  std::string payload = PackImageRecord(5, labels, "abcdefgh");
  const std::string path = Path("img.rec");
  WriteRecords(path, {payload});
  auto file = RecordIOFile::Open(path);
  ASSERT_TRUE(file.ok());
  std::string_view rec;
  std::string scratch;
  ASSERT_OK((*file)->ReadAt(0, &rec, &scratch, nullptr));
  ImageRecordView view;
  ASSERT_OK(ParseImageRecord(rec, "img.rec:0", &view));
  ASSERT_EQ(view.labels.size(), 3u);
  EXPECT_EQ(std::memcmp(&view.labels[1], &magic, 4), 0);
  EXPECT_EQ(view.image, "abcdefgh");
}

}  // namespace
}  // namespace pstrain
