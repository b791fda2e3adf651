// SHA-256 against the FIPS 180-4 examples, NIST's long-message vector, the
// system's sha256sum at every padding boundary, and a real MNIST file.
#include "common/sha256.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>

#include "tests/test_util.h"

namespace pstrain {
namespace {

TEST(Sha256Test, FipsExamples) {
  // FIPS 180-4 appendix examples (csrc.nist.gov, "SHA256.pdf").
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnop"
                      "jklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

TEST(Sha256Test, OneMillionAsInPiecesOfEverySize) {
  const std::string expected = "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0";
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')), expected);
  // Streamed in uneven pieces, so the buffer is entered and left at every offset.
  Sha256 h;
  const std::string piece(997, 'a');
  size_t done = 0;
  for (size_t step = 1; done < 1000000; step = step % 131 + 1) {
    const size_t n = std::min<size_t>({step, piece.size(), 1000000 - done});
    h.Update(piece.data(), n);
    done += n;
  }
  EXPECT_EQ(h.FinalHex(), expected);
  h.Reset();
  h.Update("abc");
  EXPECT_EQ(h.FinalHex(), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// Every length around the padding boundaries (55, 56, 63, 64, 119, 120 ...)
// against coreutils' sha256sum.
TEST(Sha256Test, AgreesWithSha256sumAtEveryLengthUpTo200) {
  const std::string dir = testing::MakeTempDir("sha256");
  ASSERT_FALSE(dir.empty());
  std::mt19937 rng(1701);
  std::string all;
  for (int i = 0; i < 200; ++i) all.push_back(static_cast<char>(rng() & 0xff));
  const std::string path = dir + "/bytes";
  for (size_t len : {0, 1, 55, 56, 57, 63, 64, 65, 119, 120, 127, 128, 129, 200}) {
    std::ofstream(path, std::ios::binary) << all.substr(0, len);
    FILE* p = popen(("sha256sum " + path).c_str(), "r");
    ASSERT_NE(p, nullptr);
    char buf[65] = {0};
    ASSERT_EQ(std::fread(buf, 1, 64, p), 64u);
    pclose(p);
    EXPECT_EQ(Sha256Hex(all.substr(0, len)), std::string(buf, 64)) << "length " << len;
    auto file = Sha256FileHex(path);
    ASSERT_OK(file.status());
    EXPECT_EQ(*file, std::string(buf, 64)) << "length " << len;
  }
  std::remove(path.c_str());
  rmdir(dir.c_str());
}

TEST(Sha256Test, FileDigestOfTheOfficialMnistLabels) {
  auto got = Sha256FileHex(testing::SharedDataDir() + "/mnist/train-labels-idx1-ubyte.gz");
  ASSERT_OK(got.status());
  EXPECT_EQ(*got, "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c");
  auto missing = Sha256FileHex("/no/such/file");
  EXPECT_EQ(missing.status().code(), StatusCode::kIOError);
  EXPECT_NE(missing.status().message().find("/no/such/file"), std::string::npos);
}

}  // namespace
}  // namespace pstrain
