// Unpacking .tar.gz archives (data/tar_gz.h): what GNU tar writes, and
// archives that try to leave the folder or are damaged.
#include "data/tar_gz.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "tests/test_util.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

int Shell(const std::string& cmd) { return std::system(cmd.c_str()); }

// One ustar header block for `name` (< 100 chars) of `size` bytes and `type`.
std::string TarHeader(const std::string& name, size_t size, char type) {
  std::string h(512, '\0');
  std::memcpy(&h[0], name.data(), name.size());
  std::snprintf(&h[100], 8, "%07o", 0644);
  std::snprintf(&h[108], 8, "%07o", 0);
  std::snprintf(&h[116], 8, "%07o", 0);
  std::snprintf(&h[124], 12, "%011zo", size);
  std::snprintf(&h[136], 12, "%011o", 0);
  h[156] = type;
  std::memcpy(&h[257],
              "ustar\0"
              "00",
              8);
  std::memset(&h[148], ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(&h[148], 8, "%06o", sum);
  h[155] = ' ';
  return h;
}

// Writes the checksum of header block `h` again (after a field changed).
void Rechecksum(std::string* h) {
  std::memset(&(*h)[148], ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : *h) sum += c;
  std::snprintf(&(*h)[148], 8, "%06o", sum);
  (*h)[155] = ' ';
}

void GzipTo(const std::string& path, const std::string& tar) {
  gzFile gz = gzopen(path.c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(gzwrite(gz, tar.data(), static_cast<unsigned>(tar.size())),
            static_cast<int>(tar.size()));
  gzclose(gz);
}

// A gzipped tar of (name, bytes, type) members, written by hand.
void WriteTarGz(const std::string& path,
                const std::vector<std::tuple<std::string, std::string, char>>& members) {
  std::string tar;
  for (const auto& [name, bytes, type] : members) {
    tar += TarHeader(name, bytes.size(), type);
    tar += bytes;
    tar.append((512 - bytes.size() % 512) % 512, '\0');
  }
  tar.append(1024, '\0');
  gzFile gz = gzopen(path.c_str(), "wb");
  ASSERT_NE(gz, nullptr);
  ASSERT_EQ(gzwrite(gz, tar.data(), static_cast<unsigned>(tar.size())),
            static_cast<int>(tar.size()));
  gzclose(gz);
}

class TarGzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("targz");
    ASSERT_FALSE(dir_.empty());
    fs::create_directories(dir_ + "/out");
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(TarGzTest, UnpacksWhatGnuTarWritesStrippingThePrefix) {
  const std::string src = dir_ + "/src/set-bin";
  fs::create_directories(src + "/sub");
  std::string big(1 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7 + i / 4096);
  WriteFile(src + "/batch_1.bin", big);
  WriteFile(src + "/empty.txt", "");
  WriteFile(src + "/sub/note.txt", "hello\n");
  // Longer than the 100 bytes of a ustar name: GNU tar writes a long-name record.
  const std::string long_name = std::string(120, 'n') + ".txt";
  WriteFile(src + "/" + long_name, "long");
  ASSERT_EQ(Shell("tar -czf " + dir_ + "/a.tar.gz -C " + dir_ + "/src set-bin"), 0);

  std::vector<UnpackedFile> files;
  UnpackOptions options;
  options.strip_prefix = "set-bin/";
  ASSERT_OK(UnpackTarGz(dir_ + "/a.tar.gz", dir_ + "/out", options, &files));
  EXPECT_EQ(files.size(), 4u);
  EXPECT_EQ(ReadAll(dir_ + "/out/batch_1.bin"), big);
  EXPECT_TRUE(fs::exists(dir_ + "/out/empty.txt"));
  EXPECT_EQ(fs::file_size(dir_ + "/out/empty.txt"), 0u);
  EXPECT_EQ(ReadAll(dir_ + "/out/sub/note.txt"), "hello\n");
  EXPECT_EQ(ReadAll(dir_ + "/out/" + long_name), "long");
  EXPECT_FALSE(fs::exists(dir_ + "/out/set-bin"));
  for (const auto& e : fs::recursive_directory_iterator(dir_ + "/out")) {
    EXPECT_NE(e.path().extension(), ".part") << e.path();
  }
}

TEST_F(TarGzTest, PathsThatLeaveTheFolderAreRefused) {
  for (const std::string& evil : {std::string("../evil.txt"), std::string("a/../../evil.txt"),
                                  std::string("/tmp/pstrain-evil.txt")}) {
    WriteTarGz(dir_ + "/evil.tar.gz", {{"ok.txt", "fine", '0'}, {evil, "gotcha", '0'}});
    Status s = UnpackTarGz(dir_ + "/evil.tar.gz", dir_ + "/out", UnpackOptions(), nullptr);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << evil << ": " << s;
    EXPECT_NE(s.message().find(evil), std::string::npos) << s;
    EXPECT_NE(s.message().find("refused"), std::string::npos) << s;
    EXPECT_FALSE(fs::exists(dir_ + "/evil.txt"));
    EXPECT_FALSE(fs::exists("/tmp/pstrain-evil.txt"));
  }
}

TEST_F(TarGzTest, LinksAreRefused) {
  fs::create_directories(dir_ + "/src");
  fs::create_symlink("/etc/passwd", dir_ + "/src/link");
  ASSERT_EQ(Shell("tar -czf " + dir_ + "/l.tar.gz -C " + dir_ + "/src link"), 0);
  Status s = UnpackTarGz(dir_ + "/l.tar.gz", dir_ + "/out", UnpackOptions(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("'link' is a symbolic link"), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(dir_ + "/out/link"));
}

TEST_F(TarGzTest, ATruncatedArchiveIsCorruptionAndLeavesNoShortFile) {
  std::string big(300000, 'z');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>((i * 2654435761u) >> 13);
  WriteTarGz(dir_ + "/full.tar.gz", {{"data.bin", big, '0'}});
  const std::string gz = ReadAll(dir_ + "/full.tar.gz");
  WriteFile(dir_ + "/cut.tar.gz", gz.substr(0, gz.size() / 2));
  Status s = UnpackTarGz(dir_ + "/cut.tar.gz", dir_ + "/out", UnpackOptions(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s;
  EXPECT_NE(s.message().find(dir_ + "/cut.tar.gz"), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(dir_ + "/out/data.bin"));
  EXPECT_FALSE(fs::exists(dir_ + "/out/data.bin.part"));
}

TEST_F(TarGzTest, ABadHeaderChecksumIsCorruption) {
  WriteTarGz(dir_ + "/ok.tar.gz", {{"x.txt", "abc", '0'}});
  // Not a tar inside the gzip: 1024 bytes of text.
  gzFile f = gzopen((dir_ + "/text.tar.gz").c_str(), "wb");
  ASSERT_NE(f, nullptr);
  const std::string text(1024, 'q');
  gzwrite(f, text.data(), static_cast<unsigned>(text.size()));
  gzclose(f);
  Status s = UnpackTarGz(dir_ + "/text.tar.gz", dir_ + "/out", UnpackOptions(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s;
  EXPECT_NE(s.message().find("header at byte offset 0): bad tar header checksum"),
            std::string::npos)
      << s;
  EXPECT_OK(UnpackTarGz(dir_ + "/ok.tar.gz", dir_ + "/out", UnpackOptions(), nullptr));
  EXPECT_EQ(ReadAll(dir_ + "/out/x.txt"), "abc");
}

TEST_F(TarGzTest, ABrokenGzipStreamIsCorruption) {
  WriteTarGz(dir_ + "/ok.tar.gz", {{"x.bin", std::string(100000, 'a'), '0'}});
  std::string gz = ReadAll(dir_ + "/ok.tar.gz");
  for (size_t i = 20; i < 60 && i < gz.size(); ++i) gz[i] = static_cast<char>(gz[i] ^ 0xff);
  WriteFile(dir_ + "/bad.tar.gz", gz);
  Status s = UnpackTarGz(dir_ + "/bad.tar.gz", dir_ + "/out", UnpackOptions(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s;
  EXPECT_FALSE(fs::exists(dir_ + "/out/x.bin"));
}

// Found by a review: a size near 2^63 (GNU base-256, or a pax record)
// overflowed when rounded up to whole blocks (undefined behaviour), and a
// 0-byte file was left under the member's name.
TEST_F(TarGzTest, AnAbsurdMemberSizeIsCorruptionAndLeavesNoFile) {
  std::string h = TarHeader("victim.bin", 0, '0');
  // 0x80, then 2^63 - 1 in the last 8 bytes.
  h[124] = static_cast<char>(0x80);
  for (int i = 125; i < 128; ++i) h[i] = 0;
  h[128] = 0x7f;
  for (int i = 129; i < 136; ++i) h[i] = static_cast<char>(0xff);
  Rechecksum(&h);
  GzipTo(dir_ + "/b256.tar.gz", h + std::string(2048, '\0'));
  Status s = UnpackTarGz(dir_ + "/b256.tar.gz", dir_ + "/out", UnpackOptions(), nullptr);
  EXPECT_EQ(s.code(), StatusCode::kCorruption) << s;
  EXPECT_NE(s.message().find("header at byte offset 0): bad size field"), std::string::npos) << s;
  EXPECT_FALSE(fs::exists(dir_ + "/out/victim.bin"));

  for (const std::string size : {"9223372036854775807", "-5", "12abc", " 7"}) {
    const std::string record = "size=" + size + "\n";
    const std::string line = std::to_string(record.size() + 3) + " " + record;
    ASSERT_EQ(line.size(), record.size() + 3) << "a two-digit length";
    std::string tar = TarHeader("pax", line.size(), 'x') + line;
    tar.append((512 - line.size() % 512) % 512, '\0');
    tar += TarHeader("victim.bin", 3, '0') + "abc" + std::string(509, '\0');
    tar.append(1024, '\0');
    GzipTo(dir_ + "/pax.tar.gz", tar);
    s = UnpackTarGz(dir_ + "/pax.tar.gz", dir_ + "/out", UnpackOptions(), nullptr);
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << size << ": " << s;
    EXPECT_NE(s.message().find("pax size '" + size + "' is not a size"), std::string::npos) << s;
    EXPECT_FALSE(fs::exists(dir_ + "/out/victim.bin")) << size;
  }
}

// POSIX: an empty pax value deletes the keyword, so the ustar header's size
// holds.
TEST_F(TarGzTest, AnEmptyPaxSizeKeepsTheHeadersSize) {
  const std::string record = "size=\n";
  const std::string line = std::to_string(record.size() + 2) + " " + record;  // "8 size=\n"
  ASSERT_EQ(line.size(), record.size() + 2);
  std::string tar = TarHeader("pax", line.size(), 'x') + line;
  tar.append((512 - line.size() % 512) % 512, '\0');
  tar += TarHeader("kept.bin", 3, '0') + "abc" + std::string(509, '\0');
  tar.append(1024, '\0');
  GzipTo(dir_ + "/empty.tar.gz", tar);
  ASSERT_OK(UnpackTarGz(dir_ + "/empty.tar.gz", dir_ + "/out", UnpackOptions(), nullptr));
  EXPECT_EQ(ReadAll(dir_ + "/out/kept.bin"), "abc");
}

// Found by review: a pax record whose LEN does not cover its own "LEN " and
// '\n' ("2 path=x\n") made a path of the rest of the header block. It is
// Corruption naming where.
TEST_F(TarGzTest, APaxRecordShorterThanItsOwnPrefixIsCorruption) {
  for (const std::string& line : {std::string("2 path=evil.bin\n"), std::string("5 path=x\n")}) {
    std::string tar = TarHeader("pax", line.size(), 'x') + line;
    tar.append((512 - line.size() % 512) % 512, '\0');
    tar += TarHeader("kept.bin", 3, '0') + "abc" + std::string(509, '\0');
    tar.append(1024, '\0');
    GzipTo(dir_ + "/pax.tar.gz", tar);
    Status s = UnpackTarGz(dir_ + "/pax.tar.gz", dir_ + "/out", UnpackOptions(), nullptr);
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << line << ": " << s;
    EXPECT_NE(s.message().find("malformed pax header record at byte 0"), std::string::npos) << s;
  }
}

}  // namespace
}  // namespace pstrain
