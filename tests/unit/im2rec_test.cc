// im2rec: folder listing, .lst files, train/val/test splits and packing.
#include "data/im2rec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "data/image_codec.h"
#include "data/image_recordio.h"
#include "data/recordio.h"
#include "tests/test_util.h"

namespace pstrain {
namespace {

using ::testing::HasSubstr;

class Im2recTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("pstrain_im2rec_test_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_ / "root");
    // Two classes in sorted order ("b_cats" before "c_dogs"), plus a file that
    // is not an image and one that claims to be a JPEG but is not.
    WriteJpeg("root/c_dogs/2.jpg", 20, 30, 10);
    WriteJpeg("root/c_dogs/1.JPG", 20, 30, 20);
    WriteJpeg("root/b_cats/9.jpeg", 40, 16, 30);
    WriteJpeg("root/b_cats/a.jpg", 16, 16, 40);
    WriteFile("root/b_cats/notes.txt", "hello");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  void WriteFile(const std::string& name, const std::string& bytes) {
    std::filesystem::create_directories((dir_ / name).parent_path());
    std::ofstream out(Path(name), std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  void WriteJpeg(const std::string& name, int h, int w, uint8_t value) {
    Image img;
    img.Resize(h, w, 3);
    std::fill(img.pixels.begin(), img.pixels.end(), value);
    std::string jpeg;
    CHECK_OK(EncodeJpeg(img, 90, &jpeg));
    WriteFile(name, jpeg);
  }

  std::filesystem::path dir_;
};

TEST_F(Im2recTest, RecursiveListingNumbersFoldersInSortedOrder) {
  auto list = ListImageFolder(Path("root"), true, {".jpg", ".jpeg"});
  ASSERT_TRUE(list.ok()) << list.status();
  ASSERT_EQ(list->size(), 4u);
  EXPECT_EQ((*list)[0].path, "b_cats/9.jpeg");
  EXPECT_EQ((*list)[1].path, "b_cats/a.jpg");
  EXPECT_EQ((*list)[2].path, "c_dogs/1.JPG");
  EXPECT_EQ((*list)[3].path, "c_dogs/2.jpg");
  EXPECT_EQ((*list)[0].labels, std::vector<float>{0});
  EXPECT_EQ((*list)[3].labels, std::vector<float>{1});
  EXPECT_EQ((*list)[3].index, 3);
  auto flat = ListImageFolder(Path("root"), false, {".jpg"});
  ASSERT_TRUE(flat.ok());
  EXPECT_TRUE(flat->empty());
  // `im2rec --list` of class folders without --recursive says what to add.
  MakeListOptions no_recursion;
  no_recursion.recursive = false;
  const Status none = MakeImageLists(Path("flat"), Path("root"), no_recursion).status();
  EXPECT_EQ(none.code(), StatusCode::kNotFound);
  EXPECT_THAT(none.message(), HasSubstr("no images under " + Path("root") +
                                        " (its images may be in folders such as '"));
  EXPECT_THAT(none.message(), HasSubstr("--recursive lists them"));
  EXPECT_EQ(ListImageFolder(Path("nowhere"), true, {".jpg"}).status().code(),
            StatusCode::kNotFound);
}

// Found by review: a link loop or a dangling link in the image tree ended the
// whole listing ("listing ...: too many levels of symbolic links"). Such an
// entry is passed over.
TEST_F(Im2recTest, ListingPassesOverLinksItCannotFollow) {
  std::filesystem::create_symlink("loop.jpg", Path("root/c_dogs/loop.jpg"));
  std::filesystem::create_symlink("gone", Path("root/b_cats/dangling.jpg"));
  for (bool recursive : {true, false}) {
    auto list = ListImageFolder(Path(recursive ? "root" : "root/c_dogs"), recursive, {".jpg"});
    ASSERT_TRUE(list.ok()) << list.status();
    EXPECT_EQ(list->size(), recursive ? 3u : 2u);
  }
}

TEST_F(Im2recTest, ListFilesRoundTripAndRejectMalformedLines) {
  std::vector<ImageListEntry> entries = {{0, {1.0f}, "a/x.jpg"}, {5, {2.0f, 0.5f}, "b/y.jpg"}};
  ASSERT_OK(WriteImageList(Path("l.lst"), entries));
  std::ifstream in(Path("l.lst"));
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first, "0\t1.000000\ta/x.jpg");
  auto read = ReadImageList(Path("l.lst"));
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 2u);
  EXPECT_EQ((*read)[1].index, 5);
  EXPECT_EQ((*read)[1].labels, (std::vector<float>{2.0f, 0.5f}));
  EXPECT_EQ((*read)[1].path, "b/y.jpg");

  WriteFile("bad.lst", "0\t1\ta.jpg\nseven\t1\tb.jpg\n");
  auto bad = ReadImageList(Path("bad.lst"));
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("bad.lst:2"));
  WriteFile("short.lst", "0\ta.jpg\n");
  EXPECT_EQ(ReadImageList(Path("short.lst")).status().code(), StatusCode::kInvalidArgument);
  // A negative index became 2^64-5 in the record header, and one past
  // int64 was clamped, both silently (found by review).
  for (const char* index : {"-5", "99999999999999999999"}) {
    WriteFile("index.lst", std::string("0\t1\ta.jpg\n") + index + "\t1\tb.jpg\n");
    auto refused = ReadImageList(Path("index.lst"));
    ASSERT_FALSE(refused.ok()) << index;
    EXPECT_THAT(refused.status().message(), HasSubstr("index.lst:2: index '"));
  }
  // Blanks around fields are dropped, as im2rec.py's strip() does.
  WriteFile("blanks.lst", " 3 \t 1.5\tdir/a b.jpg \r\n");
  auto blanks = ReadImageList(Path("blanks.lst"));
  ASSERT_TRUE(blanks.ok()) << blanks.status();
  ASSERT_EQ(blanks->size(), 1u);
  EXPECT_EQ((*blanks)[0].index, 3);
  EXPECT_EQ((*blanks)[0].labels, (std::vector<float>{1.5f}));
  EXPECT_EQ((*blanks)[0].path, "dir/a b.jpg");
}

TEST_F(Im2recTest, SplitsAreDisjointAndCoverTheList) {
  MakeListOptions opts;
  opts.train_ratio = 0.5;
  opts.test_ratio = 0.25;
  auto written = MakeImageLists(Path("s"), Path("root"), opts);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_EQ(written->size(), 3u);
  std::set<std::string> paths;
  size_t total = 0;
  for (const char* split : {"_train", "_val", "_test"}) {
    auto lst = ReadImageList(Path(std::string("s") + split + ".lst"));
    ASSERT_TRUE(lst.ok()) << lst.status();
    EXPECT_EQ(lst->size(), split == std::string("_train") ? 2u : 1u) << split;
    for (const ImageListEntry& e : *lst) paths.insert(e.path);
    total += lst->size();
  }
  EXPECT_EQ(total, 4u);
  EXPECT_EQ(paths.size(), 4u);
  opts.train_ratio = 0.9;
  EXPECT_EQ(MakeImageLists(Path("s"), Path("root"), opts).status().code(),
            StatusCode::kInvalidArgument);
}

// Found by review: a listed FIFO blocked the pack for good (a directory or
// device would be read too). They are skipped as bad images.
TEST_F(Im2recTest, PackSkipsWhatIsNotARegularFile) {
  ASSERT_EQ(::mkfifo(Path("root/c_dogs/fifo.jpg").c_str(), 0600), 0);
  std::filesystem::create_directories(Path("root/c_dogs/dir.jpg"));
  std::vector<ImageListEntry> entries = {
      {0, {0.0f}, "c_dogs/fifo.jpg"}, {1, {0.0f}, "c_dogs/dir.jpg"}, {2, {1.0f}, "c_dogs/1.JPG"}};
  ASSERT_OK(WriteImageList(Path("f.lst"), entries));
  PackOptions opts;
  opts.num_threads = 2;
  PackStats stats;
  ASSERT_OK(PackImageList(Path("f.lst"), Path("root"), Path("f.rec"), Path("f.idx"), opts, &stats));
  EXPECT_EQ(stats.written, 1);
  EXPECT_EQ(stats.skipped, 2);
}

// Found by review: a wrong ROOT skipped every image, replaced a good pack
// with an empty one and exited 0. Now it is an error naming the first image
// and the folder, and the old pair stays.
TEST_F(Im2recTest, AListWhoseImagesAreAllSkippedIsAnErrorAndKeepsTheOldPack) {
  std::vector<ImageListEntry> entries = {{0, {0.0f}, "c_dogs/1.JPG"}, {1, {1.0f}, "b_cats/a.jpg"}};
  ASSERT_OK(WriteImageList(Path("a.lst"), entries));
  PackOptions opts;
  PackStats stats;
  ASSERT_OK(PackImageList(Path("a.lst"), Path("root"), Path("a.rec"), Path("a.idx"), opts, &stats));
  ASSERT_EQ(stats.written, 2);
  const uint64_t rec_size = std::filesystem::file_size(Path("a.rec"));
  const uint64_t idx_size = std::filesystem::file_size(Path("a.idx"));
  const Status wrong_root =
      PackImageList(Path("a.lst"), Path("nowhere"), Path("a.rec"), Path("a.idx"), opts, &stats);
  EXPECT_EQ(wrong_root.code(), StatusCode::kNotFound) << wrong_root;
  EXPECT_THAT(wrong_root.message(), HasSubstr("every one of the 2 images of " + Path("a.lst") +
                                              " was skipped (the first: c_dogs/1.JPG: "));
  EXPECT_THAT(wrong_root.message(), HasSubstr("is '" + Path("nowhere") + "' the folder"));
  EXPECT_EQ(stats.written, 0);
  EXPECT_EQ(stats.skipped, 2);
  EXPECT_EQ(std::filesystem::file_size(Path("a.rec")), rec_size);
  EXPECT_EQ(std::filesystem::file_size(Path("a.idx")), idx_size);
  EXPECT_FALSE(std::filesystem::exists(Path("a.rec.part")));
  EXPECT_FALSE(std::filesystem::exists(Path("a.idx.part")));
}

TEST_F(Im2recTest, PackResizesSkipsBadImagesAndIndexesByListIndex) {
  WriteFile("root/c_dogs/broken.jpg", "not a jpeg at all");
  std::vector<ImageListEntry> entries = {{10, {0.0f, 7.0f}, "b_cats/9.jpeg"},
                                         {11, {1.0f, 8.0f}, "c_dogs/broken.jpg"},
                                         {12, {1.0f, 9.0f}, "c_dogs/1.JPG"},
                                         {13, {1.0f, 6.0f}, "c_dogs/missing.jpg"}};
  ASSERT_OK(WriteImageList(Path("p.lst"), entries));
  PackOptions opts;
  opts.resize = 8;
  opts.pack_label = true;
  opts.num_threads = 2;
  PackStats stats;
  ASSERT_OK(PackImageList(Path("p.lst"), Path("root"), Path("p.rec"), Path("p.idx"), opts, &stats));
  EXPECT_EQ(stats.written, 2);
  EXPECT_EQ(stats.skipped, 2);
  auto idx = ReadRecordIndex(Path("p.idx"));
  ASSERT_TRUE(idx.ok());
  ASSERT_EQ(idx->size(), 2u);
  EXPECT_EQ((*idx)[0].key, 10u);
  EXPECT_EQ((*idx)[1].key, 12u);
  auto file = RecordIOFile::Open(Path("p.rec"));
  ASSERT_TRUE(file.ok());
  ImageDecoder dec;
  const int expect_h[] = {20, 8}, expect_w[] = {8, 12};  // 40x16 and 20x30, shorter side 8
  for (int r = 0; r < 2; ++r) {
    std::string_view payload;
    std::string scratch;
    ASSERT_OK((*file)->ReadAt((*idx)[r].offset, &payload, &scratch, nullptr));
    ImageRecordView view;
    ASSERT_OK(ParseImageRecord(payload, "p.rec", &view));
    EXPECT_EQ(view.header.flag, 2u);
    EXPECT_EQ(view.labels[1], r == 0 ? 7.0f : 9.0f);
    EXPECT_EQ(view.header.id, (*idx)[r].key);
    int h = 0, w = 0;
    ASSERT_OK(dec.ReadSize(view.image, "p.rec", &h, &w));
    EXPECT_EQ(h, expect_h[r]);
    EXPECT_EQ(w, expect_w[r]);
  }
  // Found by review: packing again truncated the .rec in place (a job with it
  // mapped died of SIGBUS) and wrote the .idx last, so a pack that failed
  // between left a new .rec beside the old .idx. A pack that fails now leaves
  // the old pair as it was and nothing beside it; one that succeeds replaces
  // both, and the old mapping still reads the old records.
  const uint64_t old_size = std::filesystem::file_size(Path("p.rec"));
  ASSERT_OK(WriteImageList(Path("one.lst"), {entries[2]}));
  EXPECT_FALSE(PackImageList(Path("one.lst"), Path("root"), Path("p.rec"), Path("no/dir/p.idx"),
                             opts, &stats)
                   .ok());
  EXPECT_EQ(std::filesystem::file_size(Path("p.rec")), old_size);
  EXPECT_FALSE(std::filesystem::exists(Path("p.rec.part")));
  ASSERT_OK(
      PackImageList(Path("one.lst"), Path("root"), Path("p.rec"), Path("p.idx"), opts, &stats));
  EXPECT_FALSE(std::filesystem::exists(Path("p.rec.part")));
  EXPECT_FALSE(std::filesystem::exists(Path("p.idx.part")));
  auto replaced = ReadRecordIndex(Path("p.idx"));
  ASSERT_TRUE(replaced.ok());
  ASSERT_EQ(replaced->size(), 1u);
  EXPECT_EQ((*replaced)[0].key, 12u);
  EXPECT_LT(std::filesystem::file_size(Path("p.rec")), old_size);
  std::string_view payload;
  std::string scratch;
  ASSERT_OK((*file)->ReadAt((*idx)[1].offset, &payload, &scratch, nullptr));
  ImageRecordView view;
  ASSERT_OK(ParseImageRecord(payload, "old p.rec", &view));
  EXPECT_EQ(view.header.id, 12u);
}

// Found by review: a 1,000,000 x 1 PNG (a kilobyte) resized to a shorter side
// of 256 asked for 256 million x 256 pixels and aborted the whole pack.
TEST_F(Im2recTest, AnImageWhoseResizeWouldBeHugeIsSkipped) {
  Image wide;
  wide.Resize(1, 1000000, 3);
  std::fill(wide.pixels.begin(), wide.pixels.end(), uint8_t{90});
  std::string png;
  ASSERT_OK(EncodePng(wide, &png));
  WriteFile("root/wide.png", png);
  std::vector<ImageListEntry> entries = {{0, {0.0f}, "wide.png"}, {1, {1.0f}, "b_cats/a.jpg"}};
  ASSERT_OK(WriteImageList(Path("w.lst"), entries));
  PackOptions opts;
  opts.resize = 256;
  PackStats stats;
  ASSERT_OK(PackImageList(Path("w.lst"), Path("root"), Path("w.rec"), Path("w.idx"), opts, &stats));
  EXPECT_EQ(stats.written, 1);
  EXPECT_EQ(stats.skipped, 1);

  int h = 0, w = 0;
  Status s = ShorterSideTo(1, 1000000, 256, "wide.png", &h, &w);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_THAT(s.message(), HasSubstr("wide.png: the image of 1000000x1 scaled to a shorter side "
                                     "of 256 would be 256000000x256"));
  // Sides whose product overflows int are refused too, not wrapped.
  EXPECT_EQ(ShorterSideTo(1, 1000000, 3000, "w", &h, &w).code(), StatusCode::kCorruption);
  ASSERT_OK(ShorterSideTo(40, 16, 8, "w", &h, &w));
  EXPECT_EQ(h, 20);
  EXPECT_EQ(w, 8);
}

TEST_F(Im2recTest, PassThroughStoresTheFileBytes) {
  std::vector<ImageListEntry> entries = {{0, {3.0f}, "b_cats/a.jpg"}};
  ASSERT_OK(WriteImageList(Path("t.lst"), entries));
  PackOptions opts;
  opts.pass_through = true;
  PackStats stats;
  ASSERT_OK(PackImageList(Path("t.lst"), Path("root"), Path("t.rec"), Path("t.idx"), opts, &stats));
  auto file = RecordIOFile::Open(Path("t.rec"));
  ASSERT_TRUE(file.ok());
  std::string_view payload;
  ASSERT_OK((*file)->ReadAt(0, &payload, nullptr, nullptr));
  ImageRecordView view;
  ASSERT_OK(ParseImageRecord(payload, "t.rec", &view));
  EXPECT_EQ(view.header.flag, 0u);
  EXPECT_EQ(view.header.label, 3.0f);
  std::ifstream in(Path("root/b_cats/a.jpg"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(view.image, bytes);
}

}  // namespace
}  // namespace pstrain
