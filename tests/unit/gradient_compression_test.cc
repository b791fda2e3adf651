// The 2-bit codec (common/gradient_compression.h) against a straightforward
// reference written here from MXNet's rule (mxnet_facts.md 1.8), bit for bit:
// the codes byte by byte and the residuals.
#include "common/gradient_compression.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tests/test_util.h"

namespace pstrain {
namespace {

const uint8_t kPosBits[4] = {0xC0, 0x30, 0x0C, 0x03};
const uint8_t kNegBits[4] = {0x80, 0x20, 0x08, 0x02};

// Element i: block i / 16, byte (i % 16) / 4 of that block's word, bit pair
// i % 4 from the byte's top. Returns the codes as bytes.
std::vector<uint8_t> ReferenceQuantize(const std::vector<float>& grad, std::vector<float>* residual,
                                       float t) {
  std::vector<uint8_t> bytes(TwoBitBytes(grad.size()), 0);
  for (size_t i = 0; i < grad.size(); ++i) {
    float& r = (*residual)[i];
    r += grad[i];
    uint8_t& byte = bytes[4 * (i / 16) + (i % 16) / 4];
    if (r >= t) {
      byte |= kPosBits[i % 4];
      r -= t;
    } else if (r <= -t) {
      byte |= kNegBits[i % 4];
      r += t;
    }
  }
  return bytes;
}

std::vector<float> ReferenceDequantize(const std::vector<uint8_t>& bytes, size_t n, float t) {
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    const uint8_t m = bytes[4 * (i / 16) + (i % 16) / 4] & kPosBits[i % 4];
    out[i] = m == kPosBits[i % 4] ? t : (m == kNegBits[i % 4] ? -t : 0.0f);
  }
  return out;
}

std::vector<uint8_t> AsBytes(const std::vector<uint32_t>& words) {
  std::vector<uint8_t> b(words.size() * 4);
  std::memcpy(b.data(), words.data(), b.size());
  return b;
}

::testing::AssertionResult SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// A worked example: t = 0.5, 17 elements (two words, the second holding one code).
TEST(GradientCompressionTest, HandWorkedLayout) {
  const float t = 0.5f;
  std::vector<float> g(17, 0.0f);
  g[0] = 1.0f;     // r 1.0   -> +t (11), r 0.5
  g[1] = -1.0f;    // r -1.0  -> -t (10), r -0.5
  g[2] = 0.25f;    // r 0.25  -> 0 (00)
  g[3] = 0.5f;     // r 0.5   -> +t: >= t counts (11), r 0
  g[4] = -0.5f;    // r -0.5  -> -t: <= -t counts (10), r 0
  g[6] = 0.49f;    // below t -> 0
  g[7] = -2.0f;    // -> -t once (10), r -1.5
  g[12] = 3.0f;    // -> +t once (11), r 2.5
  g[16] = -0.75f;  // word 1, byte 0, top pair: 10, r -0.25
  std::vector<float> r(17, 0.0f);
  std::vector<uint32_t> words(TwoBitWords(17), 0xFFFFFFFFu);
  ASSERT_EQ(words.size(), 2u);
  ASSERT_TRUE(QuantizeTwoBit(g.data(), r.data(), g.size(), t, words.data()));
  // byte 0: e0..e3 = 11 10 00 11; byte 1: e4..e7 = 10 00 00 10; byte 2: 0;
  // byte 3: e12 = 11; word 1: e16 = 10, the padding 00.
  const std::vector<uint8_t> want = {0xE3, 0x82, 0x00, 0xC0, 0x80, 0x00, 0x00, 0x00};
  EXPECT_EQ(AsBytes(words), want);
  EXPECT_EQ(words[0], 0xC00082E3u);
  EXPECT_EQ(words[1], 0x00000080u);
  const std::vector<float> want_r = {0.5f, -0.5f, 0.25f, 0,    0, 0, 0.49f, -1.5f, 0,
                                     0,    0,     0,     2.5f, 0, 0, 0,     -0.25f};
  EXPECT_TRUE(SameBits(r, want_r));
  std::vector<float> out(17, 9.0f);
  DequantizeTwoBit(words.data(), out.size(), t, out.data());
  const std::vector<float> sent = {0.5f, -0.5f, 0, 0.5f, -0.5f, 0, 0, -0.5f, 0,
                                   0,    0,     0, 0.5f, 0,     0, 0, -0.5f};
  EXPECT_TRUE(SameBits(out, sent));
  // The residual carries over: the same gradient again.
  ASSERT_TRUE(QuantizeTwoBit(g.data(), r.data(), g.size(), t, words.data()));
  EXPECT_EQ(r[0], 1.0f);                     // 0.5 + 1.0 = 1.5 -> +t
  EXPECT_EQ(r[2], 0.0f);                     // 0.25 + 0.25 reaches t -> +t
  EXPECT_EQ(r[6], 2 * 0.49f - 0.5f);         // 0.98 -> +t
  EXPECT_EQ(r[7], -3.0f);                    // -1.5 - 2.0 = -3.5 -> -t
  EXPECT_EQ(words[0] & 0xFF, 0xEFu);         // 11 10 11 11
  EXPECT_EQ((words[0] >> 8) & 0xFF, 0x8Eu);  // 10 00 11 10
}

// Random gradients, lengths around and off multiples of 16, several
// thresholds, the residual carried across pushes: codes and residuals equal
// the reference's bit for bit, and dequantizing gives what the codes say.
TEST(GradientCompressionTest, MatchesTheReferenceBitForBit) {
  std::mt19937 rng(1701);
  for (float t : {0.5f, 0.1f, 1.0f, 2.5f, 1e-3f}) {
    for (size_t n : {1, 2, 15, 16, 17, 31, 32, 33, 100, 1000, 4097, 100003}) {
      SCOPED_TRACE(::testing::Message() << "t=" << t << " n=" << n);
      std::normal_distribution<float> normal(0.0f, 2.0f * t);
      std::vector<float> r(n, 0.0f), ref_r(n, 0.0f), g(n);
      std::vector<uint32_t> words(TwoBitWords(n));
      for (int push = 0; push < 5; ++push) {
        for (float& x : g) x = normal(rng);
        if (n > 3) g[n / 2] = t;  // exactly at the threshold
        const std::vector<uint8_t> want = ReferenceQuantize(g, &ref_r, t);
        ASSERT_TRUE(QuantizeTwoBit(g.data(), r.data(), n, t, words.data()));
        ASSERT_EQ(AsBytes(words), want) << "push " << push;
        ASSERT_TRUE(SameBits(r, ref_r)) << "push " << push;
        std::vector<float> out(n);
        DequantizeTwoBit(words.data(), n, t, out.data());
        ASSERT_TRUE(SameBits(out, ReferenceDequantize(want, n, t))) << "push " << push;
      }
    }
  }
}

// Every 2-bit pattern, 01 included (it reads as 0, as in MXNet).
TEST(GradientCompressionTest, DequantizesEveryCodeOfRandomWords) {
  std::mt19937 rng(7);
  const size_t n = 16 * 1000 + 9;
  std::vector<uint32_t> words(TwoBitWords(n));
  for (uint32_t& w : words) w = static_cast<uint32_t>(rng());
  std::vector<float> out(n);
  DequantizeTwoBit(words.data(), n, 0.75f, out.data());
  EXPECT_TRUE(SameBits(out, ReferenceDequantize(AsBytes(words), n, 0.75f)));
}

// The device merge's in-place round trip equals quantize then dequantize.
TEST(GradientCompressionTest, InPlaceRoundTripEqualsQuantizeThenDequantize) {
  std::mt19937 rng(3);
  for (size_t n : {5, 16, 47, 10000}) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> r1(n, 0.0f), r2(n, 0.0f);
    for (int push = 0; push < 4; ++push) {
      std::vector<float> g(n);
      for (float& x : g) x = normal(rng);
      std::vector<uint32_t> words(TwoBitWords(n));
      ASSERT_TRUE(QuantizeTwoBit(g.data(), r1.data(), n, 0.5f, words.data()));
      std::vector<float> want(n);
      DequantizeTwoBit(words.data(), n, 0.5f, want.data());
      QuantizeTwoBitInPlace(g.data(), r2.data(), n, 0.5f);
      ASSERT_TRUE(SameBits(g, want)) << "n=" << n << " push " << push;
      ASSERT_TRUE(SameBits(r2, r1)) << "n=" << n << " push " << push;
    }
  }
}

// MXNet's rule sends 0 for NaN and keeps it in the residual: QuantizeTwoBit
// says so, and the in-place round trip leaves NaN where the update's check
// finds it. Finite elements around it are quantized as usual.
TEST(GradientCompressionTest, NanAndInfAreReported) {
  for (float bad : {std::nanf(""), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    for (size_t at : {0, 7, 16, 20}) {  // in a full block and in the partial last one
      SCOPED_TRACE(::testing::Message() << bad << " at " << at);
      std::vector<float> g(21, 0.75f), r(21, 0.0f), r2(21, 0.0f);
      g[at] = bad;
      std::vector<uint32_t> words(TwoBitWords(21));
      EXPECT_FALSE(QuantizeTwoBit(g.data(), r.data(), g.size(), 0.5f, words.data()));
      std::vector<float> out(21);
      DequantizeTwoBit(words.data(), out.size(), 0.5f, out.data());
      for (size_t i = 0; i < 21; ++i) {
        if (i != at) {
          EXPECT_EQ(out[i], 0.5f) << i;
        }
      }
      QuantizeTwoBitInPlace(g.data(), r2.data(), g.size(), 0.5f);
      EXPECT_TRUE(std::isnan(g[at]));
      EXPECT_EQ(g[(at + 1) % 21], 0.5f);
      // A residual that went non-finite keeps being reported.
      std::vector<float> zero(21, 0.0f);
      EXPECT_FALSE(QuantizeTwoBit(zero.data(), r.data(), zero.size(), 0.5f, words.data()));
    }
  }
  std::vector<float> big(100, 3e38f), r(100, 3e38f);  // r + g overflows to Inf
  std::vector<uint32_t> words(TwoBitWords(100));
  EXPECT_FALSE(QuantizeTwoBit(big.data(), r.data(), big.size(), 0.5f, words.data()));
}

TEST(GradientCompressionTest, SizesAndFlags) {
  EXPECT_EQ(TwoBitWords(0), 0u);
  EXPECT_EQ(TwoBitWords(1), 1u);
  EXPECT_EQ(TwoBitWords(16), 1u);
  EXPECT_EQ(TwoBitWords(17), 2u);
  EXPECT_EQ(TwoBitBytes(1200 * 1200), 1200u * 1200 / 4);
  auto none = ParseGradientCompression("none", -1.0f);  // the threshold is not read
  ASSERT_OK(none.status());
  EXPECT_FALSE(none->enabled());
  auto two = ParseGradientCompression("2bit", 0.25f);
  ASSERT_OK(two.status());
  EXPECT_TRUE(two->enabled());
  EXPECT_EQ(two->threshold, 0.25f);
  auto bad = ParseGradientCompression("1bit", 0.5f);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("known: none, 2bit"), std::string::npos) << bad.status();
  for (float t : {0.0f, -0.5f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
    auto s = ParseGradientCompression("2bit", t);
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << t;
    EXPECT_NE(s.status().message().find("--gc-threshold"), std::string::npos) << s.status();
  }
}

}  // namespace
}  // namespace pstrain
