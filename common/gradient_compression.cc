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

inline float FromBits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof(f));
  return f;
}
inline uint32_t ToBits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof(b));
  return b;
}

// One block of 16 elements, one vector lane per element. The comparisons
// become all-ones/zero masks that select the bits of +t, -t or +0 and of the
// codes, so there is no branch nor float select for GCC to keep as control
// flow, and the codes are OR-ed together after the lanes are done. __restrict:
// else GCC guards the vector code with an overlap test per block. v - (+0) is
// v and v - (-t) is v + t: the reference's results, bit for bit. `bad` gets 1
// where v is NaN or Inf (v - v is 0 exactly for finite v).
inline uint32_t QuantizeBlock(const float* __restrict g, float* __restrict r, float t,
                              uint32_t* nonfinite) {
  const uint32_t plus = ToBits(t), minus = ToBits(-t);
  uint32_t bits[16];
  uint32_t bad[16];
  for (int j = 0; j < 16; ++j) {
    const float v = r[j] + g[j];
    const uint32_t pos = 0u - static_cast<uint32_t>(v >= t);
    const uint32_t neg = 0u - static_cast<uint32_t>(v <= -t);
    r[j] = v - FromBits((pos & plus) | (neg & minus));
    bits[j] = (pos & kMasks.pos[j]) | (neg & kMasks.neg[j]);
    bad[j] = static_cast<uint32_t>(!(v - v == 0.0f));
  }
  uint32_t word = 0;
  uint32_t any_bad = 0;
  for (int j = 0; j < 16; ++j) {
    word |= bits[j];
    any_bad |= bad[j];
  }
  *nonfinite |= any_bad;
  return word;
}

inline void DequantizeBlock(uint32_t word, float t, float* __restrict out) {
  const uint32_t plus = ToBits(t), minus = ToBits(-t);
  for (int j = 0; j < 16; ++j) {
    const uint32_t m = word & kMasks.pos[j];
    const uint32_t pos = 0u - static_cast<uint32_t>(m == kMasks.pos[j]);
    const uint32_t neg = 0u - static_cast<uint32_t>(m == kMasks.neg[j]);
    out[j] = FromBits((pos & plus) | (neg & minus));
  }
}

// As QuantizeBlock, writing what the codes stand for; adding v - v (0, or NaN
// for a NaN or Inf v) keeps a non-finite value visible to the update's NaN/Inf
// check instead of sending 0.
inline void RoundTripBlock(float* __restrict g, float* __restrict r, float t) {
  const uint32_t plus = ToBits(t), minus = ToBits(-t);
  for (int j = 0; j < 16; ++j) {
    const float v = r[j] + g[j];
    const uint32_t pos = 0u - static_cast<uint32_t>(v >= t);
    const uint32_t neg = 0u - static_cast<uint32_t>(v <= -t);
    const float sent = FromBits((pos & plus) | (neg & minus));
    r[j] = v - sent;
    g[j] = sent + (v - v);
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

bool QuantizeTwoBit(const float* grad, float* residual, size_t n, float threshold, uint32_t* out) {
  uint32_t nonfinite = 0;
  const size_t full = n / 16;
  for (size_t b = 0; b < full; ++b) {
    out[b] = QuantizeBlock(grad + 16 * b, residual + 16 * b, threshold, &nonfinite);
  }
  const size_t rest = n - 16 * full;
  if (rest == 0) return nonfinite == 0;
  // The last, partial block through a padded copy: zeros quantize to code 00.
  float g[16] = {}, r[16] = {};
  std::memcpy(g, grad + 16 * full, rest * sizeof(float));
  std::memcpy(r, residual + 16 * full, rest * sizeof(float));
  out[full] = QuantizeBlock(g, r, threshold, &nonfinite);
  std::memcpy(residual + 16 * full, r, rest * sizeof(float));
  return nonfinite == 0;
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
