// The 2-bit gradient codec's speed (common/gradient_compression.h) on one
// thread, in GB/s of fp32 input (the gradient's bytes; dequantize: the bytes
// it writes), best of --reps repetitions of --iters calls each.
//
//   gc_bench [--elems 4194304] [--iters 20] [--reps 5] [--threshold 0.5]
//
// The gradient is N(0, 1), so about 60% of the elements send +-t at t = 0.5:
// every lane takes both paths of the selects.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/gradient_compression.h"

namespace {

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  size_t n = size_t{1} << 22;
  int iters = 20, reps = 5;
  float t = 0.5f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--elems") {
      n = std::strtoull(argv[i + 1], nullptr, 10);
    } else if (a == "--iters") {
      iters = std::atoi(argv[i + 1]);
    } else if (a == "--reps") {
      reps = std::atoi(argv[i + 1]);
    } else if (a == "--threshold") {
      t = std::strtof(argv[i + 1], nullptr);
    } else {
      std::fprintf(stderr, "gc_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (n == 0 || iters < 1 || reps < 1 || !(t > 0)) {
    std::fprintf(stderr, "gc_bench: --elems, --iters, --reps and --threshold must be > 0\n");
    return 2;
  }
  std::vector<float> grad(n), residual(n, 0.0f), out(n);
  std::vector<uint32_t> codes(pstrain::TwoBitWords(n));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& g : grad) g = normal(rng);
  double q = 1e30, d = 1e30, rt = 1e30;
  for (int r = 0; r < reps; ++r) {
    // Each repetition starts from a zero residual, as a job does.
    std::fill(residual.begin(), residual.end(), 0.0f);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) {
      (void)pstrain::QuantizeTwoBit(grad.data(), residual.data(), n, t, codes.data());
    }
    auto t1 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) pstrain::DequantizeTwoBit(codes.data(), n, t, out.data());
    auto t2 = std::chrono::steady_clock::now();
    std::fill(residual.begin(), residual.end(), 0.0f);
    for (int i = 0; i < iters; ++i) {
      std::memcpy(out.data(), grad.data(), n * sizeof(float));
      pstrain::QuantizeTwoBitInPlace(out.data(), residual.data(), n, t);
    }
    auto t3 = std::chrono::steady_clock::now();
    auto t4 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) std::memcpy(out.data(), grad.data(), n * sizeof(float));
    auto t5 = std::chrono::steady_clock::now();
    q = std::min(q, Seconds(t0, t1));
    d = std::min(d, Seconds(t1, t2));
    // The in-place round trip without the copy that restores its input.
    rt = std::min(rt, Seconds(t2, t3) - Seconds(t4, t5));
  }
  const double gb = static_cast<double>(n) * sizeof(float) * iters / 1e9;
  std::printf("elements %zu (%.1f MB fp32), threshold %g, one thread\n", n, n * 4.0 / 1e6, t);
  std::printf("quantize     %6.2f GB/s\n", gb / q);
  std::printf("dequantize   %6.2f GB/s\n", gb / d);
  std::printf("round trip   %6.2f GB/s (in place, device kvstore)\n", gb / rt);
  return 0;
}
