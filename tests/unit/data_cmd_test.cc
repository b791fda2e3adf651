// `pstrain data` and `pstrain train --dataset` as a user runs them, with the
// data sets served by a local HTTP server (tests/http_test_server.h) and no
// ../shared/data to fall back on: every command runs in a fresh folder.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "common/sha256.h"
#include "data/image_codec.h"
#include "data/image_recordio.h"
#include "data/recordio.h"
#include "tests/http_test_server.h"
#include "tests/test_util.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;
using testing::TestHttpServer;

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Runs `pstrain <args>` in `cwd` with the data variables cleared and `env`
// ("NAME=value ...") added; stderr folded into stdout unless `stdout_only`.
// Returns the exit code.
int RunPstrain(const std::string& cwd, const std::string& args, std::string* output,
               const std::string& env = "", bool stdout_only = false) {
  const std::string cmd =
      "cd '" + cwd + "' && env -u PSTRAIN_DATA -u PSTRAIN_MNIST_DIR -u PSTRAIN_DATA_MIRRORS " +
      env + " " + testing::PstrainBinary() + " " + args + (stdout_only ? " 2>/dev/null" : " 2>&1");
  return testing::RunShell(cmd, output);
}

int CountOf(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

class DataCmdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::MakeTempDir("datacmd");
    ASSERT_FALSE(dir_.empty());
    // The commands run two levels down: no datasets/ and no ../shared/data there.
    cwd_ = dir_ + "/home/user";
    fs::create_directories(cwd_);
    const std::string mnist = testing::SharedDataDir() + "/mnist/";
    for (const char* f : {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                          "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"}) {
      ASSERT_TRUE(server_.AddFileFrom(f, mnist + f)) << mnist + f;
    }
    server_.SetRule("dead", {TestHttpServer::Mode::kNotFound});
    ASSERT_TRUE(server_.Start());
  }
  void TearDown() override {
    server_.Stop();
    fs::remove_all(dir_);
  }
  std::string dir_, cwd_;
  TestHttpServer server_;
};

TEST_F(DataCmdTest, GetMnistFromTheSecondMirrorThenKeepsIt) {
  std::string out;
  ASSERT_EQ(RunPstrain(cwd_,
                       "data get mnist --dir mnist-here --mirror " + server_.Url("dead") +
                           " --mirror " + server_.Url("good"),
                       &out),
            0)
      << out;
  // Not a terminal: one line per file, no progress line.
  EXPECT_EQ(CountOf(out, "sha256 ok"), 4) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos) << out;
  EXPECT_NE(out.find("HTTP 404; trying the next mirror"), std::string::npos) << out;
  auto sha = Sha256FileHex(cwd_ + "/mnist-here/train-images-idx3-ubyte.gz");
  ASSERT_OK(sha.status());
  EXPECT_EQ(*sha, "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609");

  server_.ClearRequests();
  ASSERT_EQ(RunPstrain(cwd_, "data get mnist --dir mnist-here", &out,
                       "PSTRAIN_DATA_MIRRORS=" + server_.Url("good")),
            0)
      << out;
  EXPECT_NE(out.find("mnist is complete in mnist-here"), std::string::npos) << out;
  EXPECT_TRUE(server_.requests().empty());

  // locate prints the folder on stdout; PSTRAIN_DATA points at it.
  fs::create_directories(dir_ + "/root");
  fs::rename(cwd_ + "/mnist-here", dir_ + "/root/mnist");
  ASSERT_EQ(RunPstrain(cwd_, "data locate mnist --no-download", &out,
                       "PSTRAIN_DATA=" + dir_ + "/root", /*stdout_only=*/true),
            0)
      << out;
  EXPECT_EQ(out, dir_ + "/root/mnist\n");
}

TEST_F(DataCmdTest, OfflineSaysWhichFilesToPutWhere) {
  std::string out;
  const std::string refused =
      "http://127.0.0.1:" + std::to_string(testing::UnusedLocalPort()) + "/";
  EXPECT_EQ(RunPstrain(cwd_, "data get mnist --mirror " + refused, &out), 1) << out;
  EXPECT_NE(out.find("could not fetch mnist train-images-idx3-ubyte.gz"), std::string::npos) << out;
  EXPECT_NE(out.find("Without a connection: put these files in datasets/mnist"), std::string::npos)
      << out;
  EXPECT_NE(out.find("t10k-labels-idx1-ubyte.gz  4542 bytes  sha256 "
                     "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find(refused + "train-images-idx3-ubyte.gz"), std::string::npos) << out;
  EXPECT_NE(out.find("PSTRAIN_DATA_MIRRORS"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(cwd_ + "/datasets/mnist/train-images-idx3-ubyte.gz"));

  EXPECT_EQ(RunPstrain(cwd_, "data locate mnist --no-download", &out), 1) << out;
  EXPECT_NE(out.find("no folder holds mnist (looked in datasets/mnist, ../shared/data/mnist)"),
            std::string::npos)
      << out;
  // Usage errors exit 2, as every command's: a name unknown or missing, an
  // option the action does not take.
  EXPECT_EQ(RunPstrain(cwd_, "data get no-such-set", &out), 2) << out;
  EXPECT_NE(out.find("no built-in data set 'no-such-set' (known: cifar10, mnist"),
            std::string::npos)
      << out;
  EXPECT_EQ(RunPstrain(cwd_, "data get", &out), 2) << out;
  EXPECT_NE(out.find("`get` needs a data set name or --manifest"), std::string::npos) << out;
  EXPECT_EQ(RunPstrain(cwd_, "data locate mnist --dir x", &out), 2) << out;
  EXPECT_NE(out.find("locate takes no --dir"), std::string::npos) << out;
  EXPECT_EQ(RunPstrain(cwd_, "data get --manifest no-such-file", &out), 1) << out;
  EXPECT_EQ(RunPstrain(cwd_, "data get mnist --mirror ftp://x/", &out), 2) << out;
  EXPECT_NE(out.find("--mirror 'ftp://x/' is not an http://, https:// or file:// URL"),
            std::string::npos)
      << out;
}

// The built-in manifests are complete and well-formed, and `list` shows them.
TEST_F(DataCmdTest, ListAndManifest) {
  std::string out;
  ASSERT_EQ(RunPstrain(cwd_, "data list", &out), 0) << out;
  EXPECT_NE(out.find("cifar10"), std::string::npos) << out;
  EXPECT_NE(out.find("mnist"), std::string::npos) << out;
  EXPECT_NE(out.find("11.6 MB to fetch"), std::string::npos) << out;
  ASSERT_EQ(RunPstrain(cwd_, "data manifest cifar10", &out), 0) << out;
  EXPECT_NE(out.find("c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("size: 170052171"), std::string::npos) << out;
  // A switch given a value: --rec=false was read as --rec.
  EXPECT_EQ(RunPstrain(cwd_, "data locate mnist --no-download=maybe", &out), 2) << out;
  EXPECT_NE(out.find("--no-download='maybe': a switch is true or false"), std::string::npos) << out;
}

// `train --dataset mnist` in a folder without data: fetched into
// datasets/mnist from the mirror PSTRAIN_DATA_MIRRORS names, then trained on;
// the second run finds it there.
TEST_F(DataCmdTest, TrainFetchesMnistWhenNoFolderHoldsIt) {
  std::string out;
  const std::string train =
      "train --network mlp --kv-store local --dataset mnist --num-epochs 1 --num-examples 1280 "
      "--batch-size 64 --disp-batches 10";
  const std::string mirrors =
      "PSTRAIN_DATA_MIRRORS=" + server_.Url("dead") + "," + server_.Url("{name}");
  ASSERT_EQ(RunPstrain(cwd_, train, &out, mirrors), 0) << out;
  EXPECT_NE(out.find("data set mnist: datasets/mnist (fetched)"), std::string::npos) << out;
  EXPECT_NE(out.find("Epoch[0] Train-accuracy="), std::string::npos) << out;
  EXPECT_NE(out.find("Epoch[0] Validation-accuracy="), std::string::npos) << out;
  int good = 0;
  for (const auto& r : server_.requests()) good += r.path.rfind("/mnist/", 0) == 0;
  EXPECT_EQ(good, 4);  // "{name}" became the data set's name

  server_.ClearRequests();
  ASSERT_EQ(RunPstrain(cwd_, train, &out, mirrors), 0) << out;
  EXPECT_NE(out.find("data set mnist: datasets/mnist (datasets/)"), std::string::npos) << out;
  EXPECT_TRUE(server_.requests().empty());

  // --data-dir with --dataset: that folder, filled when it lacks the set.
  ASSERT_EQ(RunPstrain(cwd_, train + " --data-dir elsewhere/mnist", &out, mirrors), 0) << out;
  EXPECT_NE(out.find("data set mnist: elsewhere/mnist (fetched)"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(cwd_ + "/elsewhere/mnist/t10k-labels-idx1-ubyte.gz"));
}

// Found by review: an archive made with `tar -C dir .` (members "./a.bin")
// and strip_prefix "./" unpacked nothing; and an archive whose unpacked files
// did not complete the set was removed before the check, so every later run
// downloaded it again to fail the same way. It is kept until the set is whole.
TEST_F(DataCmdTest, AnArchiveStaysUntilTheSetItUnpacksIsComplete) {
  const std::string src = dir_ + "/dot-src";
  fs::create_directories(src);
  const std::string bytes = "0123456789abcdef";
  std::ofstream(src + "/a.bin", std::ios::binary) << bytes;
  const std::string archive = dir_ + "/dot.tar.gz";
  ASSERT_EQ(std::system(("tar -czf " + archive + " -C " + src + " .").c_str()), 0);
  const std::string tgz = ReadAll(archive);
  server_.AddFile("dot.tar.gz", tgz);
  auto write_manifest = [&](const std::string& strip) {
    const std::string path = dir_ + "/dot.manifest";
    std::ofstream(path) << "name: \"dot\"\nmirror: \"" << server_.Url("d") << "\"\n"
                        << "file { name: \"dot.tar.gz\" size: " << tgz.size() << " sha256: \""
                        << Sha256Hex(tgz) << "\" unpack: \"tar.gz\" strip_prefix: \"" << strip
                        << "\" }\nprovides { name: \"a.bin\" size: " << bytes.size()
                        << " sha256: \"" << Sha256Hex(bytes) << "\" }\n";
    return path;
  };
  std::string out;
  EXPECT_EQ(
      RunPstrain(cwd_, "data get --manifest " + write_manifest("wrong/") + " --dir dot", &out), 1)
      << out;
  EXPECT_NE(out.find("is not complete"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(cwd_ + "/dot/dot.tar.gz")) << out;
  // The mended manifest unpacks the archive already there: no new download.
  server_.ClearRequests();
  ASSERT_EQ(RunPstrain(cwd_, "data get --manifest " + write_manifest("./") + " --dir dot", &out), 0)
      << out;
  EXPECT_TRUE(server_.requests().empty()) << out;
  EXPECT_EQ(ReadAll(cwd_ + "/dot/a.bin"), bytes);
  EXPECT_FALSE(fs::exists(cwd_ + "/dot/dot.tar.gz"));
}

// A small CIFAR-10 (the first records of each batch, from
// ../shared/data/cifar10_partial) packed like the official archive, served,
// fetched, unpacked and turned into .rec files that read back exactly.
TEST_F(DataCmdTest, Cifar10ArchiveIsUnpackedAndPackedIntoRecordIO) {
  const std::string part = testing::SharedDataDir() + "/cifar10_partial/";
  const std::string src = dir_ + "/src/cifar-10-batches-bin";
  fs::create_directories(src);
  struct Batch {
    std::string from, to;
    int records;
  };
  const std::vector<Batch> batches = {{"data_batch_1.first4000.bin", "data_batch_1.bin", 60},
                                      {"data_batch_2.first1017.bin", "data_batch_2.bin", 50},
                                      {"data_batch_3.first1017.bin", "data_batch_3.bin", 40},
                                      {"data_batch_4.first1017.bin", "data_batch_4.bin", 30},
                                      {"data_batch_5.first1017.bin", "data_batch_5.bin", 20},
                                      {"test_batch.first1017.bin", "test_batch.bin", 25}};
  std::string manifest_provides;
  std::string train_bytes, test_bytes;
  for (const Batch& b : batches) {
    const std::string all = ReadAll(part + b.from);
    ASSERT_GE(all.size(), 3073u * b.records) << part + b.from;
    const std::string bytes = all.substr(0, 3073 * b.records);
    std::ofstream(src + "/" + b.to, std::ios::binary) << bytes;
    (b.to == "test_batch.bin" ? test_bytes : train_bytes) += bytes;
    manifest_provides += StrCat("provides { name: \"", b.to, "\" size: ", bytes.size(),
                                " sha256: \"", Sha256Hex(bytes), "\" }\n");
  }
  std::ofstream(src + "/batches.meta.txt") << "airplane\nautomobile\n";
  const std::string archive = dir_ + "/cifar-10-binary.tar.gz";
  ASSERT_EQ(
      std::system(("tar -czf " + archive + " -C " + dir_ + "/src cifar-10-batches-bin").c_str()),
      0);
  const std::string tgz = ReadAll(archive);
  server_.AddFile("cifar-10-binary.tar.gz", tgz);
  const std::string manifest = dir_ + "/cifar-small.manifest";
  std::ofstream(manifest) << "name: \"cifar10\"\nmirror: \"" << server_.Url("c") << "\"\n"
                          << "file { name: \"cifar-10-binary.tar.gz\" size: " << tgz.size()
                          << " sha256: \"" << Sha256Hex(tgz)
                          << "\" unpack: \"tar.gz\" strip_prefix: \"cifar-10-batches-bin/\" }\n"
                          << manifest_provides;

  std::string out;
  ASSERT_EQ(RunPstrain(cwd_, "data get --manifest " + manifest + " --dir cifar --rec", &out), 0)
      << out;
  EXPECT_NE(out.find("cifar10: unpacked 7 files from cifar-10-binary.tar.gz"), std::string::npos)
      << out;
  EXPECT_NE(out.find("cifar/train.rec (200 images), cifar/test.rec (25 images), PNG"),
            std::string::npos)
      << out;
  const std::string d = cwd_ + "/cifar";
  EXPECT_FALSE(fs::exists(d + "/cifar-10-binary.tar.gz"));  // unpacked, then removed
  EXPECT_EQ(ReadAll(d + "/data_batch_3.bin"), ReadAll(src + "/data_batch_3.bin"));

  // Read the records back: labels and pixels equal the batches' (PNG is lossless).
  for (const auto& [name, bytes] : std::vector<std::pair<std::string, std::string>>{
           {"train", train_bytes}, {"test", test_bytes}}) {
    auto file = RecordIOFile::Open(d + "/" + name + ".rec");
    ASSERT_OK(file.status());
    auto index = ReadRecordIndex(d + "/" + name + ".idx");
    ASSERT_OK(index.status());
    ASSERT_EQ(index->size() * 3073, bytes.size()) << name;
    ImageDecoder decoder;
    std::string scratch;
    for (size_t i = 0; i < index->size(); ++i) {
      EXPECT_EQ((*index)[i].key, i);
      std::string_view payload;
      ASSERT_OK((*file)->ReadAt((*index)[i].offset, &payload, &scratch, nullptr));
      ImageRecordView rec;
      ASSERT_OK(ParseImageRecord(payload, "rec", &rec));
      const uint8_t* want = reinterpret_cast<const uint8_t*>(bytes.data()) + i * 3073;
      ASSERT_EQ(rec.labels.size(), 1u);
      EXPECT_EQ(rec.labels[0], static_cast<float>(want[0])) << name << " record " << i;
      EXPECT_EQ(DetectImageFormat(rec.image), ImageFormat::kPng);
      Image img;
      ASSERT_OK(decoder.Decode(rec.image, "rec", 3, &img));
      ASSERT_EQ(img.height, 32);
      ASSERT_EQ(img.width, 32);
      int diff = 0;
      for (int p = 0; p < 1024; ++p) {
        for (int c = 0; c < 3; ++c) diff += img.pixels[3 * p + c] != want[1 + c * 1024 + p];
      }
      EXPECT_EQ(diff, 0) << name << " record " << i;
    }
  }

  // Run again: nothing fetched, the .rec files kept; train reads them.
  server_.ClearRequests();
  ASSERT_EQ(RunPstrain(cwd_, "data get --manifest " + manifest + " --dir cifar --rec", &out), 0)
      << out;
  EXPECT_NE(out.find("already there"), std::string::npos) << out;
  EXPECT_TRUE(server_.requests().empty());
  ASSERT_EQ(RunPstrain(cwd_,
                       "train --test-io 1 --data-train cifar/train.rec --image-shape 3,32,32 "
                       "--num-classes 10 --batch-size 50 --num-epochs 1 --kv-store local",
                       &out),
            0)
      << out;
  EXPECT_NE(out.find("batch 50, shuffled,"), std::string::npos) << out;
  ASSERT_EQ(RunPstrain(cwd_,
                       "train --test-io 1 --data-train cifar/train.rec --image-shape 3,32,32 "
                       "--num-classes 10 --batch-size 50 --num-epochs 1 --kv-store local "
                       "--shuffle-train 0",
                       &out),
            0)
      << out;
  EXPECT_NE(out.find("batch 50, file order,"), std::string::npos) << out;
}

}  // namespace
}  // namespace pstrain
