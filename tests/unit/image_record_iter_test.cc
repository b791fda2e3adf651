// ImageRecordIter on synthetic .rec files, and end to end: `pstrain im2rec`
// packs a few hundred CIFAR-10 JPEGs that the iterator reads back augmented.
#include "data/image_record_iter.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "data/im2rec.h"
#include "data/image_codec.h"
#include "data/image_recordio.h"
#include "data/recordio.h"
#include "tests/test_util.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

// Example i is a solid 12x10 image of colour (2i, 255 - i, 100) with labels
// {i, i + 0.5, i + 0.25}.
uint8_t Red(int i) { return static_cast<uint8_t>(2 * i); }
uint8_t Green(int i) { return static_cast<uint8_t>(255 - i); }

// Image i: 12 x 10, every pixel (Red(i), Green(i), 100), as a JPEG.
std::string SolidJpeg(int i) {
  Image img;
  img.Resize(12, 10, 3);
  for (int p = 0; p < 120; ++p) {
    img.pixels[p * 3] = Red(i);
    img.pixels[p * 3 + 1] = Green(i);
    img.pixels[p * 3 + 2] = 100;
  }
  std::string jpeg;
  CHECK_OK(EncodeJpeg(img, 95, &jpeg));
  return jpeg;
}

class ImageRecordIterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("pstrain_iter_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  // Writes n records; `bad` (if >= 0) holds bytes that are not an image.
  // Returns the record offsets.
  // n records of id i holding image i (bad: not an image) and label i, or
  // with `labels` 3 the list {i, i + 0.5, i + 0.25}.
  std::vector<uint64_t> WriteRec(const std::string& name, int n, int bad = -1, int labels = 1) {
    auto writer = RecordIOWriter::Create(Path(name + ".rec"));
    CHECK(writer.ok());
    std::vector<RecordIndexEntry> idx;
    std::vector<uint64_t> offsets;
    for (int i = 0; i < n; ++i) {
      std::string jpeg = SolidJpeg(i);
      if (i == bad) jpeg = "this is not an image";
      offsets.push_back((*writer)->Tell());
      idx.push_back({static_cast<uint64_t>(i), (*writer)->Tell()});
      const std::vector<float> label = labels == 3
                                           ? std::vector<float>{i + 0.0f, i + 0.5f, i + 0.25f}
                                           : std::vector<float>{i + 0.0f};
      CHECK_OK((*writer)->Write(PackImageRecord(i, label, jpeg)));
    }
    CHECK_OK((*writer)->Close());
    CHECK_OK(WriteRecordIndex(Path(name + ".idx"), idx));
    return offsets;
  }

  ImageRecordIterConfig Config(const std::string& name, int batch) {
    ImageRecordIterConfig cfg;
    cfg.path_imgrec = Path(name + ".rec");
    cfg.batch_size = batch;
    cfg.preprocess_threads = 2;
    cfg.aug.out_height = 8;
    cfg.aug.out_width = 8;
    return cfg;
  }

  // Reads one pass; returns the example ids in order (pad examples excluded).
  static std::vector<int64_t> ReadPass(ImageRecordIter* it, std::vector<Batch>* batches = nullptr) {
    std::vector<int64_t> ids;
    Batch b;
    while (true) {
      auto more = it->Next(&b);
      EXPECT_TRUE(more.ok()) << more.status();
      if (!more.ok() || !*more) break;
      for (int64_t i = 0; i < b.batch_size() - b.pad; ++i) ids.push_back(b.index[i]);
      if (batches != nullptr) batches->push_back(b);
    }
    return ids;
  }

  std::filesystem::path dir_;
};

TEST_F(ImageRecordIterTest, OnePassInOrderWithLabelsDataAndPad) {
  WriteRec("a", 100);
  auto it = ImageRecordIter::Create(Config("a", 16));
  ASSERT_TRUE(it.ok()) << it.status();
  EXPECT_EQ((*it)->num_examples(), 100);
  EXPECT_EQ((*it)->batch_shape(), (std::vector<int64_t>{16, 3, 8, 8}));
  std::vector<Batch> batches;
  std::vector<int64_t> ids = ReadPass(it->get(), &batches);
  ASSERT_EQ(batches.size(), 7u);
  EXPECT_EQ(batches.back().pad, 12);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(ids[i], i);
  for (const Batch& b : batches) {
    ASSERT_EQ(b.data.size(), 16u * 3 * 64);
    for (int64_t e = 0; e < b.batch_size(); ++e) {
      const int id = static_cast<int>(b.index[e]);
      EXPECT_EQ(b.label[e], static_cast<float>(id));
      const float* px = b.data.data() + e * 3 * 64;
      EXPECT_NEAR(px[27], Red(id), 2.0) << "example " << id;
      EXPECT_NEAR(px[64 + 27], Green(id), 2.0);
      EXPECT_NEAR(px[128 + 27], 100, 2.0);
    }
  }
  // The last batch wraps around to the first examples.
  EXPECT_EQ(batches.back().index[4], 0);
  // A second pass after Reset sees everything again.
  (*it)->Reset();
  EXPECT_EQ(ReadPass(it->get()).size(), 100u);
}

TEST_F(ImageRecordIterTest, ShuffleIsDeterministicAndIndependentOfThreads) {
  WriteRec("s", 90);
  ImageRecordIterConfig cfg = Config("s", 8);
  cfg.shuffle = true;
  cfg.seed = 5;
  cfg.aug.out_height = cfg.aug.out_width = 6;
  cfg.aug.rand_crop = true;
  cfg.aug.rand_mirror = true;
  std::vector<std::vector<Batch>> runs;
  std::vector<std::vector<int64_t>> orders;
  for (int threads : {1, 3}) {
    cfg.preprocess_threads = threads;
    auto it = ImageRecordIter::Create(cfg);
    ASSERT_TRUE(it.ok()) << it.status();
    runs.emplace_back();
    orders.push_back(ReadPass(it->get(), &runs.back()));
    (*it)->Reset();
    std::vector<int64_t> second = ReadPass(it->get());
    EXPECT_NE(second, orders.back()) << "pass 1 must draw a new order";
    EXPECT_EQ(std::set<int64_t>(second.begin(), second.end()).size(), 90u);
  }
  EXPECT_EQ(orders[0], orders[1]);
  std::vector<int64_t> sorted = orders[0];
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < 90; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_NE(orders[0], sorted) << "a shuffled pass is not in file order";
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (size_t b = 0; b < runs[0].size(); ++b) EXPECT_EQ(runs[0][b].data, runs[1][b].data);
}

TEST_F(ImageRecordIterTest, EveryResetDrawsTheNextPass) {
  // A resumed trainer Resets once per skipped epoch, then once per epoch: the
  // order of pass k must not depend on whether batches were read in between.
  WriteRec("e", 40);
  ImageRecordIterConfig cfg = Config("e", 8);
  cfg.shuffle = true;
  cfg.seed = 9;
  auto unbroken = ImageRecordIter::Create(cfg);
  auto resumed = ImageRecordIter::Create(cfg);
  ASSERT_TRUE(unbroken.ok() && resumed.ok());
  std::vector<std::vector<int64_t>> orders;
  for (int epoch = 0; epoch < 3; ++epoch) {
    (*unbroken)->Reset();
    orders.push_back(ReadPass(unbroken->get()));
  }
  (*resumed)->Reset();
  (*resumed)->Reset();
  (*resumed)->Reset();
  EXPECT_EQ(ReadPass(resumed->get()), orders[2]);
  EXPECT_NE(orders[1], orders[2]);
}

TEST_F(ImageRecordIterTest, PartsSplitTheExamplesExactlyOnce) {
  WriteRec("p", 257);
  for (bool use_idx : {false, true}) {
    std::multiset<int64_t> seen;
    for (int part = 0; part < 4; ++part) {
      ImageRecordIterConfig cfg = Config("p", 10);
      cfg.part_index = part;
      cfg.num_parts = 4;
      if (use_idx) cfg.path_imgidx = Path("p.idx");
      auto it = ImageRecordIter::Create(cfg);
      ASSERT_TRUE(it.ok()) << it.status();
      std::vector<int64_t> ids = ReadPass(it->get());
      EXPECT_EQ(static_cast<int64_t>(ids.size()), (*it)->num_examples());
      EXPECT_GT(ids.size(), 40u) << "parts are about equal in bytes";
      // Every part counts all the records alike (the workers' epoch size).
      auto all = (*it)->CountAllExamples();
      ASSERT_OK(all.status());
      EXPECT_EQ(*all, 257);
      if (use_idx) {
        // By count, as dmlc's indexed splitter: ceil(257/4) = 65 per part in
        // file order, the last 62.
        std::set<int64_t> mine(ids.begin(), ids.end());
        ASSERT_EQ(mine.size(), part < 3 ? 65u : 62u) << "part " << part;
        EXPECT_EQ(*mine.begin(), 65 * part);
        EXPECT_EQ(*mine.rbegin(), std::min(65 * part + 64, 256));
      }
      seen.insert(ids.begin(), ids.end());
    }
    ASSERT_EQ(seen.size(), 257u);
    for (int i = 0; i < 257; ++i) EXPECT_EQ(seen.count(i), 1u) << "example " << i;
  }
  // A record listed twice in the .idx is read once.
  auto idx = ReadRecordIndex(Path("p.idx"));
  ASSERT_OK(idx.status());
  idx->push_back((*idx)[3]);
  ASSERT_OK(WriteRecordIndex(Path("twice.idx"), *idx));
  ImageRecordIterConfig cfg = Config("p", 10);
  cfg.path_imgidx = Path("twice.idx");
  auto it = ImageRecordIter::Create(cfg);
  ASSERT_OK(it.status());
  EXPECT_EQ((*it)->num_examples(), 257);
  EXPECT_EQ(*(*it)->CountAllExamples(), 257);
  // 9 records in 4 parts: 3, 3, 3 and none, which is said as such.
  WriteRec("nine", 9);
  cfg = Config("nine", 2);
  cfg.path_imgidx = Path("nine.idx");
  cfg.num_parts = 4;
  cfg.part_index = 3;
  auto empty = ImageRecordIter::Create(cfg);
  EXPECT_EQ(empty.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(empty.status().message().find("part 3 of 4 holds none of the 9 records it lists"),
            std::string::npos)
      << empty.status();
}

TEST_F(ImageRecordIterTest, MultiLabelRecords) {
  WriteRec("m", 20, /*bad=*/-1, /*labels=*/3);
  ImageRecordIterConfig cfg = Config("m", 5);
  cfg.label_width = 3;
  auto it = ImageRecordIter::Create(cfg);
  ASSERT_TRUE(it.ok()) << it.status();
  Batch b;
  auto more = (*it)->Next(&b);
  ASSERT_TRUE(more.ok() && *more);
  EXPECT_EQ(b.label_width, 3);
  ASSERT_EQ(b.label.size(), 15u);
  for (int e = 0; e < 5; ++e) {
    EXPECT_EQ(b.label[e * 3], e);
    EXPECT_EQ(b.label[e * 3 + 1], e + 0.5f);
    EXPECT_EQ(b.label[e * 3 + 2], e + 0.25f);
  }
  cfg.label_width = 4;
  auto too_wide = ImageRecordIter::Create(cfg);
  ASSERT_TRUE(too_wide.ok());
  more = (*too_wide)->Next(&b);
  ASSERT_FALSE(more.ok());
  EXPECT_THAT(more.status().message(), HasSubstr("3 labels"));
  // Narrower than the records' label lists: refused as MXNet does (the extra
  // labels were dropped silently), naming the record.
  cfg.label_width = 1;
  auto too_narrow = ImageRecordIter::Create(cfg);
  ASSERT_TRUE(too_narrow.ok());
  more = (*too_narrow)->Next(&b);
  ASSERT_FALSE(more.ok());
  EXPECT_THAT(more.status().message(), HasSubstr("m.rec:"));
  EXPECT_THAT(more.status().message(), HasSubstr("has 3 labels, the label width is 1"));
}

TEST_F(ImageRecordIterTest, RecordThatIsNotAnImageFailsItsBatchWithFileAndOffset) {
  std::vector<uint64_t> offsets = WriteRec("bad", 40, /*bad=*/13);
  auto it = ImageRecordIter::Create(Config("bad", 10));
  ASSERT_TRUE(it.ok()) << it.status();
  Batch b;
  auto first = (*it)->Next(&b);
  ASSERT_TRUE(first.ok() && *first);
  auto second = (*it)->Next(&b);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(second.status().message(), HasSubstr("bad.rec:" + std::to_string(offsets[13])));
  auto third = (*it)->Next(&b);  // the pipeline goes on with the next batch
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(b.index[0], 20);
}

TEST_F(ImageRecordIterTest, CorruptContainerFailsCreateWithFileAndOffset) {
  std::vector<uint64_t> offsets = WriteRec("c", 30);
  std::string bytes;
  {
    std::ifstream in(Path("c.rec"), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  bytes[offsets[17] + 1] ^= 0x11;
  {
    std::ofstream out(Path("c.rec"), std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  auto it = ImageRecordIter::Create(Config("c", 10));
  ASSERT_FALSE(it.ok());
  EXPECT_EQ(it.status().code(), StatusCode::kCorruption);
  EXPECT_THAT(it.status().message(), HasSubstr("c.rec:" + std::to_string(offsets[17])));

  // With the .idx the bad record is found when its batch is read.
  ImageRecordIterConfig cfg = Config("c", 10);
  cfg.path_imgidx = Path("c.idx");
  auto indexed = ImageRecordIter::Create(cfg);
  ASSERT_TRUE(indexed.ok()) << indexed.status();
  Batch b;
  ASSERT_TRUE((*indexed)->Next(&b).ok());
  auto bad = (*indexed)->Next(&b);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("c.rec:" + std::to_string(offsets[17])));
}

TEST_F(ImageRecordIterTest, TruncatedFileAndBadConfigAreErrors) {
  std::vector<uint64_t> offsets = WriteRec("t", 10);
  std::filesystem::resize_file(Path("t.rec"), offsets[9] + 20);
  auto it = ImageRecordIter::Create(Config("t", 4));
  ASSERT_FALSE(it.ok());
  EXPECT_THAT(it.status().message(), HasSubstr("t.rec:" + std::to_string(offsets[9])));
  EXPECT_THAT(it.status().message(), HasSubstr("truncated"));

  ImageRecordIterConfig cfg = Config("t", 4);
  cfg.path_imgrec = Path("missing.rec");
  EXPECT_EQ(ImageRecordIter::Create(cfg).status().code(), StatusCode::kNotFound);
  cfg = Config("t", 0);
  EXPECT_EQ(ImageRecordIter::Create(cfg).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ImageRecordIterTest, RandomlyCorruptedFilesGiveErrorsNotCrashes) {
  WriteRec("f", 12);
  std::string good;
  {
    std::ifstream in(Path("f.rec"), std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  std::mt19937 rng(2024);
  int errors = 0;
  for (int trial = 0; trial < 150; ++trial) {
    std::string bad = good;
    const int flips = 1 + static_cast<int>(rng() % 8);
    for (int f = 0; f < flips; ++f) bad[rng() % bad.size()] = static_cast<char>(rng());
    if (trial % 5 == 0) bad.resize(rng() % bad.size());
    {
      std::ofstream out(Path("f.rec"), std::ios::binary | std::ios::trunc);
      out.write(bad.data(), static_cast<std::streamsize>(bad.size()));
    }
    ImageRecordIterConfig cfg = Config("f", 4);
    cfg.preprocess_threads = 1;
    auto it = ImageRecordIter::Create(cfg);
    if (!it.ok()) {
      EXPECT_THAT(it.status().message(), HasSubstr("f.rec")) << it.status();
      ++errors;
      continue;
    }
    Batch b;
    for (int i = 0; i < 10; ++i) {
      auto more = (*it)->Next(&b);
      if (!more.ok()) {
        EXPECT_THAT(more.status().message(), HasSubstr("f.rec")) << more.status();
        ++errors;
      } else if (!*more) {
        break;
      }
    }
  }
  EXPECT_GT(errors, 50);
}

TEST_F(ImageRecordIterTest, ResetMidPassStartsOver) {
  WriteRec("r", 64);
  ImageRecordIterConfig cfg = Config("r", 4);
  cfg.preprocess_threads = 3;
  cfg.prefetch_buffer = 6;
  auto it = ImageRecordIter::Create(cfg);
  ASSERT_TRUE(it.ok());
  Batch b;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE((*it)->Next(&b).ok());
  (*it)->Reset();
  std::vector<int64_t> ids = ReadPass(it->get());
  ASSERT_EQ(ids.size(), 64u);
  for (int i = 0; i < 64; ++i) EXPECT_EQ(ids[i], i);
}

TEST_F(ImageRecordIterTest, ReadsAnImageFolderThroughALstFile) {
  // 30 solid images in two class folders, listed in a .lst; 3 parts.
  std::vector<ImageListEntry> entries;
  for (int i = 0; i < 30; ++i) {
    const std::string jpeg = SolidJpeg(i);
    const std::string rel = std::string(i % 2 ? "odd/" : "even/") + std::to_string(i) + ".jpg";
    std::filesystem::create_directories(dir_ / "imgs" / (i % 2 ? "odd" : "even"));
    std::ofstream(Path("imgs/" + rel), std::ios::binary) << jpeg;
    entries.push_back({i, {static_cast<float>(i % 2)}, rel});
  }
  ASSERT_OK(WriteImageList(Path("imgs.lst"), entries));
  std::multiset<int64_t> seen;
  for (int part = 0; part < 3; ++part) {
    ImageRecordIterConfig cfg = Config("unused", 4);
    cfg.path_imgrec.clear();
    cfg.path_imglist = Path("imgs.lst");
    cfg.path_root = Path("imgs");
    cfg.part_index = part;
    cfg.num_parts = 3;
    auto it = ImageRecordIter::Create(cfg);
    ASSERT_TRUE(it.ok()) << it.status();
    EXPECT_EQ((*it)->num_examples(), 10);
    EXPECT_EQ(*(*it)->CountAllExamples(), 30);
    std::vector<Batch> batches;
    for (int64_t id : ReadPass(it->get(), &batches)) seen.insert(id);
    for (const Batch& b : batches) {
      for (int64_t e = 0; e < b.batch_size(); ++e) {
        const int id = static_cast<int>(b.index[e]);
        EXPECT_EQ(b.label[e], id % 2);
        EXPECT_NEAR(b.data[e * 3 * 64 + 27], Red(id), 2.0);
      }
    }
  }
  ASSERT_EQ(seen.size(), 30u);
  for (int i = 0; i < 30; ++i) EXPECT_EQ(seen.count(i), 1u);
  // A wrong root (the .lst's folder, with --data-root forgotten) fails at
  // once, naming the folder it read relative to (found by review: the first
  // batch failed with the bare relative path).
  {
    ImageRecordIterConfig wrong = Config("unused", 4);
    wrong.path_imgrec.clear();
    wrong.path_imglist = Path("imgs.lst");
    wrong.path_root = dir_.string();
    const Status s = ImageRecordIter::Create(wrong).status();
    EXPECT_EQ(s.code(), StatusCode::kNotFound);
    EXPECT_THAT(s.message(), HasSubstr("its image 'even/0.jpg' is not under '" + dir_.string() +
                                       "', the folder its paths are read relative to"));
  }
  // A listed file that is missing fails its batch naming the file.
  std::filesystem::remove(Path("imgs/odd/5.jpg"));
  ImageRecordIterConfig cfg = Config("unused", 8);
  cfg.path_imgrec.clear();
  cfg.path_imglist = Path("imgs.lst");
  cfg.path_root = Path("imgs");
  auto it = ImageRecordIter::Create(cfg);
  ASSERT_TRUE(it.ok());
  Batch b;
  auto next = (*it)->Next(&b);
  ASSERT_FALSE(next.ok());
  EXPECT_THAT(next.status().message(), HasSubstr("odd/5.jpg"));
  it->reset();
  // Found by review: a listed FIFO blocked its reader thread for good (Next
  // timed out; the destructor's join then waited forever). It is refused.
  ASSERT_EQ(::mkfifo(Path("imgs/odd/5.jpg").c_str(), 0600), 0);
  auto fifo = ImageRecordIter::Create(cfg);
  ASSERT_TRUE(fifo.ok());
  next = (*fifo)->Next(&b);
  ASSERT_FALSE(next.ok());
  EXPECT_THAT(next.status().message(), HasSubstr("odd/5.jpg: not a regular file"));
}

// Found by review: with --random-resized-crop, images smaller than the output
// train (their windows are resized), but the mean's centre crops refused them,
// so a run without --mean-img file never started.
TEST_F(ImageRecordIterTest, MeanImageOfImagesSmallerThanARandomResizedCrop) {
  WriteRec("small", 20);  // 12x10 images
  ImageRecordIterConfig cfg = Config("small", 8);
  cfg.aug.out_height = cfg.aug.out_width = 16;
  cfg.aug.random_resized_crop = true;
  auto it = ImageRecordIter::Create(cfg);
  ASSERT_TRUE(it.ok()) << it.status();
  EXPECT_EQ(ReadPass(it->get()).size(), 20u);
  auto mean = ComputeMeanImage(cfg);
  ASSERT_TRUE(mean.ok()) << mean.status();
  ASSERT_EQ(mean->size(), 3u * 256);
  double red = 0;
  for (int i = 0; i < 20; ++i) red += Red(i) / 20.0;
  EXPECT_NEAR((*mean)[100], red, 1.5);
  EXPECT_NEAR((*mean)[2 * 256 + 100], 100.0, 1.5);
}

TEST_F(ImageRecordIterTest, MeanImageAveragesTheCentreCrops) {
  WriteRec("mean", 50);
  ImageRecordIterConfig cfg = Config("mean", 16);
  cfg.aug.rand_mirror = true;  // ignored for the mean
  auto mean = ComputeMeanImage(cfg);
  ASSERT_TRUE(mean.ok()) << mean.status();
  ASSERT_EQ(mean->size(), 3u * 64);
  double red = 0, green = 0;
  for (int i = 0; i < 50; ++i) {
    red += Red(i) / 50.0;
    green += Green(i) / 50.0;
  }
  EXPECT_NEAR((*mean)[10], red, 1.0);
  EXPECT_NEAR((*mean)[64 + 10], green, 1.0);
  EXPECT_NEAR((*mean)[128 + 10], 100.0, 1.0);
  // Subtracting it centres the data.
  cfg.aug.mean_image = *mean;
  auto it = ImageRecordIter::Create(cfg);
  ASSERT_TRUE(it.ok()) << it.status();
  std::vector<Batch> batches;
  ReadPass(it->get(), &batches);
  double sum = 0;
  int64_t n = 0;
  for (const Batch& b : batches) {
    for (int64_t e = 0; e < b.batch_size() - b.pad; ++e) {
      for (int i = 0; i < 3 * 64; ++i) sum += b.data[e * 3 * 64 + i];
      n += 3 * 64;
    }
  }
  EXPECT_NEAR(sum / n, 0.0, 0.05);
}

// End to end: extract 300 CIFAR-10 test JPEGs, `pstrain im2rec` them, read
// them back with random crop, mirror and normalization.
TEST(ImageRecordIterEndToEnd, Im2recPacksCifarJpegsThatTheIteratorReads) {
  const std::string tarball = testing::SharedDataDir() + "/cifar10_jpeg/cifar10-jpeg.tar.gz";
  if (!std::filesystem::exists(tarball)) GTEST_SKIP() << "no " << tarball;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("pstrain_im2rec_e2e_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string d = dir.string();
  const std::string untar = "tar -xzf '" + tarball + "' -C '" + d +
                            "' --wildcards 'test/*/000[0-9].jpg' 'test/*/001[0-9].jpg' "
                            "'test/*/002[0-9].jpg'";
  ASSERT_EQ(std::system(untar.c_str()), 0) << untar;
  const std::string bin = testing::PstrainBinary();
  const std::string list = bin + " im2rec --list --recursive --train-ratio 0.8 '" + d +
                           "/cifar' '" + d + "/test' > /dev/null";
  ASSERT_EQ(std::system(list.c_str()), 0) << list;
  const std::string pack =
      bin + " im2rec --num-thread 2 --quality 90 '" + d + "/cifar' '" + d + "/test' > /dev/null";
  ASSERT_EQ(std::system(pack.c_str()), 0) << pack;
  ASSERT_TRUE(std::filesystem::exists(d + "/cifar_train.rec"));
  ASSERT_TRUE(std::filesystem::exists(d + "/cifar_val.idx"));

  // The label of every list index, from the .lst (folder = class).
  std::map<int64_t, float> label_of;
  for (const char* split : {"train", "val"}) {
    auto lst = ReadImageList(d + "/cifar_" + std::string(split) + ".lst");
    ASSERT_TRUE(lst.ok()) << lst.status();
    for (const ImageListEntry& e : *lst) {
      label_of[e.index] = e.labels[0];
      const std::string cls = e.path.substr(0, e.path.find('/'));
      static const char* kClasses[] = {"airplane", "automobile", "bird",  "cat",  "deer",
                                       "dog",      "frog",       "horse", "ship", "truck"};
      EXPECT_EQ(cls, kClasses[static_cast<int>(e.labels[0])]);
    }
  }
  ASSERT_EQ(label_of.size(), 300u);

  ImageRecordIterConfig cfg;
  cfg.path_imgrec = d + "/cifar_train.rec";
  cfg.path_imgidx = d + "/cifar_train.idx";
  cfg.batch_size = 32;
  cfg.shuffle = true;
  cfg.seed = 1;
  cfg.preprocess_threads = 2;
  cfg.aug.out_height = cfg.aug.out_width = 28;
  cfg.aug.rand_crop = true;
  cfg.aug.rand_mirror = true;
  const float mean[3] = {125.307f, 122.961f, 113.8575f}, stdv[3] = {51.5865f, 50.847f, 51.255f};
  for (int c = 0; c < 3; ++c) {
    cfg.aug.mean_rgb[c] = mean[c];
    cfg.aug.std_rgb[c] = stdv[c];
  }
  auto it = ImageRecordIter::Create(cfg);
  ASSERT_TRUE(it.ok()) << it.status();
  EXPECT_EQ((*it)->num_examples(), 240);
  for (int pass = 0; pass < 2; ++pass) {
    (*it)->Reset();
    Batch b;
    std::set<int64_t> ids;
    std::set<float> classes;
    double sum = 0, sum_sq = 0;
    int64_t n = 0;
    while (true) {
      auto more = (*it)->Next(&b);
      ASSERT_TRUE(more.ok()) << more.status();
      if (!*more) break;
      ASSERT_EQ(b.shape, (std::vector<int64_t>{32, 3, 28, 28}));
      for (int64_t e = 0; e < b.batch_size() - b.pad; ++e) {
        ids.insert(b.index[e]);
        ASSERT_EQ(b.label[e], label_of.at(b.index[e])) << "index " << b.index[e];
        classes.insert(b.label[e]);
      }
      for (float v : b.data) {
        ASSERT_TRUE(std::isfinite(v));
        sum += v;
        sum_sq += v * v;
        ++n;
      }
    }
    EXPECT_EQ(ids.size(), 240u);
    EXPECT_EQ(classes.size(), 10u);
    // Normalized CIFAR pixels: mean near 0, standard deviation near 1.
    const double m = sum / n, sd = std::sqrt(sum_sq / n - m * m);
    EXPECT_LT(std::abs(m), 0.3);
    EXPECT_GT(sd, 0.7);
    EXPECT_LT(sd, 1.4);
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pstrain
