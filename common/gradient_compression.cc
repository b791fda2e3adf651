#include "common/gradient_compression.h"

#include <cmath>
#include <cstring>

namespace pstrain {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the 2-bit layout is written as little-endian words");

// Element j of a block: byte j / 4 of the word, bit pair from the byte's top.
constexpr uint32_t PosMask(int j) { return (0xC0u >> (2 * (j % 4))) << (8 * (j / 4)); }
constexpr uint32_t NegMask(int j) { return (0x80u >> (2 * (j % 4))) << (8 * (j / 4)); }

// As arrays, so that the per-block loops below vectorize (one lane per element).
struct Masks {
  alignas(64) uint32_t pos[16];
  alignas(64) uint32_t neg[16];
  constexpr Masks() : pos(), neg() {
    for (int j = 0; j < 16; ++j) {
      pos[j] = PosMask(j);
      neg[j] = NegMask(j);
    }
  }
};
constexpr Masks kMasks;

// One block of 16 elements, one vector lane per element: selects, no branches,
// and the codes OR-ed together only after the lanes are done.
inline uint32_t QuantizeBlock(const float* g, float* r, float t) {
  uint32_t bits[16];
  for (int j = 0; j < 16; ++j) {
    const float v = r[j] + g[j];
    const bool pos = v >= t;
    const bool neg = v <= -t;
    // v - 0 is v and v - (-t) is v + t: the reference's results, bit for bit.
    r[j] = v - (pos ? t : (neg ? -t : 0.0f));
    bits[j] = (pos ? kMasks.pos[j] : 0u) | (neg ? kMasks.neg[j] : 0u);
  }
  uint32_t word = 0;
  for (int j = 0; j < 16; ++j) word |= bits[j];
  return word;
}

inline void DequantizeBlock(uint32_t word, float t, float* out) {
  for (int j = 0; j < 16; ++j) {
    const uint32_t m = word & kMasks.pos[j];
    out[j] = m == kMasks.pos[j] ? t : (m == kMasks.neg[j] ? -t : 0.0f);
  }
}

inline void RoundTripBlock(float* g, float* r, float t) {
  for (int j = 0; j < 16; ++j) {
    const float v = r[j] + g[j];
    const bool pos = v >= t;
    const bool neg = v <= -t;
    const float sent = pos ? t : (neg ? -t : 0.0f);
    r[j] = v - sent;
    g[j] = sent;
  }
}

}  // namespace

StatusOr<GradientCompression> ParseGradientCompression(const std::string& type, float threshold) {
  GradientCompression gc;
  if (type == "none") return gc;
  if (type != "2bit") {
    return Status::InvalidArgument(
        StrCat("--gc-type='", type, "' is not a gradient compression (known: none, 2bit)"));
  }
  if (!(threshold > 0) || !std::isfinite(threshold)) {
    return Status::InvalidArgument(
        StrCat("--gc-threshold=", threshold, " must be a finite number > 0 for --gc-type 2bit"));
  }
  gc.type = GradientCompressionType::kTwoBit;
  gc.threshold = threshold;
  return gc;
}

void QuantizeTwoBit(const float* grad, float* residual, size_t n, float threshold, uint32_t* out) {
  const size_t full = n / 16;
  for (size_t b = 0; b < full; ++b) {
    out[b] = QuantizeBlock(grad + 16 * b, residual + 16 * b, threshold);
  }
  const size_t rest = n - 16 * full;
  if (rest == 0) return;
  // The last, partial block through a padded copy: zeros quantize to code 00.
  float g[16] = {}, r[16] = {};
  std::memcpy(g, grad + 16 * full, rest * sizeof(float));
  std::memcpy(r, residual + 16 * full, rest * sizeof(float));
  out[full] = QuantizeBlock(g, r, threshold);
  std::memcpy(residual + 16 * full, r, rest * sizeof(float));
}

void DequantizeTwoBit(const uint32_t* codes, size_t n, float threshold, float* out) {
  const size_t full = n / 16;
  for (size_t b = 0; b < full; ++b) DequantizeBlock(codes[b], threshold, out + 16 * b);
  const size_t rest = n - 16 * full;
  if (rest == 0) return;
  float v[16];
  DequantizeBlock(codes[full], threshold, v);
  std::memcpy(out + 16 * full, v, rest * sizeof(float));
}

void QuantizeTwoBitInPlace(float* grad, float* residual, size_t n, float threshold) {
  const size_t full = n / 16;
  for (size_t b = 0; b < full; ++b) RoundTripBlock(grad + 16 * b, residual + 16 * b, threshold);
  const size_t rest = n - 16 * full;
  if (rest == 0) return;
  float g[16] = {}, r[16] = {};
  std::memcpy(g, grad + 16 * full, rest * sizeof(float));
  std::memcpy(r, residual + 16 * full, rest * sizeof(float));
  RoundTripBlock(g, r, threshold);
  std::memcpy(grad + 16 * full, g, rest * sizeof(float));
  std::memcpy(residual + 16 * full, r, rest * sizeof(float));
}

}  // namespace pstrain
