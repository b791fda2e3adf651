// MXNet's 2-bit gradient compression (PR #8662; ../shared/reference/
// mxnet_facts.md 1.8): the codec the workers, the servers and the device
// merge share.
//
// A worker keeps a residual per key (fp32, the key's full length). Per
// element: r += g; if r >= t it sends +t and r -= t; else if r <= -t it sends
// -t and r += t; else it sends 0. Codes: 11 = +t, 10 = -t, 00 = 0 (01 reads as
// 0, as in MXNet). Sixteen codes fill one 32-bit word, so n elements take
// ceil(n / 16) words: element j of a block of 16 lives in byte j / 4 of its
// word (bytes in memory order), in the bit pair counted from the byte's most
// significant end (+ masks 0xC0, 0x30, 0x0C, 0x03; - masks 0x80, 0x20, 0x08,
// 0x02). Codes past n in the last word are 0.
//
// The loops are plain per-block loops that the compiler vectorizes (SSE4 with
// the default -march=x86-64-v2); bench/RESULTS.md has their speed
// (`gc_bench`). Every function is pure apart from its output and residual
// arguments: thread-safe on disjoint arrays.
#ifndef PSTRAIN_COMMON_GRADIENT_COMPRESSION_H_
#define PSTRAIN_COMMON_GRADIENT_COMPRESSION_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace pstrain {

enum class GradientCompressionType { kNone, kTwoBit };

// What kv.set_gradient_compression sets: a type and its threshold t.
struct GradientCompression {
  GradientCompressionType type = GradientCompressionType::kNone;
  float threshold = 0.5f;
  bool enabled() const { return type != GradientCompressionType::kNone; }
};

// fit.py's --gc-type ("none" | "2bit") and --gc-threshold (> 0, finite; only
// read for 2bit). InvalidArgument naming the flag and the known types.
StatusOr<GradientCompression> ParseGradientCompression(const std::string& type, float threshold);

// 32-bit words (and bytes) of n elements' codes: ceil(n / 16).
constexpr size_t TwoBitWords(size_t n) { return (n + 15) / 16; }
constexpr size_t TwoBitBytes(size_t n) { return TwoBitWords(n) * sizeof(uint32_t); }

// Quantizes grad[0, n) with the residual residual[0, n) (updated in place)
// into out[0, TwoBitWords(n)). Returns false when some r + g was NaN or Inf:
// such an element sends 0 and its residual stays non-finite (MXNet's rule), so
// only the caller can tell anyone. REQUIRES: threshold > 0; out does not
// overlap grad or residual.
[[nodiscard]] bool QuantizeTwoBit(const float* grad, float* residual, size_t n, float threshold,
                                  uint32_t* out);

// out[i] = +threshold, -threshold or 0 from the codes of n elements
// (TwoBitWords(n) words at `codes`).
void DequantizeTwoBit(const uint32_t* codes, size_t n, float threshold, float* out);

// The round trip of both on one array, without the packing: grad[i] becomes
// what DequantizeTwoBit(QuantizeTwoBit(grad)) gives and the residual moves as
// QuantizeTwoBit moves it (MXNet's device kvstore compresses each device's
// gradient before the merge; here the values never leave the device). Where
// r + g is NaN or Inf, grad[i] becomes NaN (not 0), so that the update's
// NaN/Inf check still sees it. REQUIRES: grad and residual do not overlap.
void QuantizeTwoBitInPlace(float* grad, float* residual, size_t n, float threshold);

}  // namespace pstrain

#endif  // PSTRAIN_COMMON_GRADIENT_COMPRESSION_H_
