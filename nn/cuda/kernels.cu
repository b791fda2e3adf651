#include <algorithm>
#include <cmath>

#include "nn/cuda/cuda_check.h"
#include "nn/cuda/kernels.h"

namespace pstrain::internal::cuda {
namespace {

constexpr int kThreads = 256;

// Enough blocks for one element per thread, capped: the kernels loop with a
// grid stride, so a large n needs no huge grid.
unsigned Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(b, 65535 * 8)));
}

#define PSTRAIN_GRID_STRIDE_LOOP(i, n)                                                   \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

__global__ void FillKernel(float* p, int64_t n, float v) {
  PSTRAIN_GRID_STRIDE_LOOP(i, n) { p[i] = v; }
}

// (No __restrict__: Backend::Add allows src == dst, doubling it.)
__global__ void AddKernel(const float* src, float* dst, int64_t n) {
  PSTRAIN_GRID_STRIDE_LOOP(i, n) { dst[i] += src[i]; }
}

__global__ void Add2Kernel(const float* a, const float* b, float* out, int64_t n) {
  PSTRAIN_GRID_STRIDE_LOOP(i, n) { out[i] = a[i] + b[i]; }
}

// 1 for NaN and +-Inf (all exponent bits set), else 0: the CPU's test.
__device__ __forceinline__ uint32_t NonFinite(float x) {
  return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}

// Sets a step flag (UpdateArgs::flags) to `param` unless an earlier update
// set it. Launches on one stream do not overlap, and every writer of one
// launch writes the same value, so the read and the write need no atomic.
__device__ void ReportStep(unsigned long long* flag, int param) {
  volatile unsigned long long* f = flag;
  if (*f == 0) *f = kStepFlagSet | static_cast<uint32_t>(param);
  __threadfence_system();
}

// std::clamp's comparisons: NaN stays NaN (fminf/fmaxf would make it -c and
// hide it from the check).
__device__ __forceinline__ float ClampKeepNan(float x, float c) {
  return x < -c ? -c : (c < x ? c : x);
}

// One element of rule R: returns the weight written, updating the slots
// (slot j of element i at state[j * n + i]). The CPU's expressions (nvcc may
// fuse them into FMAs: equal within rounding).
template <UpdateRule R>
__device__ __forceinline__ float UpdateOne(const UpdateArgs& a, float gi, float w,
                                           float* __restrict__ state, int64_t i, int64_t n) {
  auto clip = [&a](float x) { return a.do_clip ? ClampKeepNan(x, a.clip) : x; };
  auto clip_w = [&a](float x) { return a.do_clip_weights ? ClampKeepNan(x, a.clip_weights) : x; };
  if constexpr (R == UpdateRule::kTest) {
    return w + a.rescale * gi;
  } else if constexpr (R == UpdateRule::kSgd) {
    const float g = clip(a.rescale * gi);
    if (a.momentum == 0.0f) return w - a.lr * (g + a.wd * w);
    const float m = a.momentum * state[i] - a.lr * (g + a.wd * w);
    state[i] = m;
    return w + m;
  } else if constexpr (R == UpdateRule::kNag) {
    const float step = a.lr * (clip(a.rescale * gi) + a.wd * w);
    if (a.momentum == 0.0f) return w - step;
    const float m = a.momentum * state[i];
    state[i] = m - step;
    return w - m + (a.momentum + 1.0f) * (m - step);
  } else if constexpr (R == UpdateRule::kAdam) {
    const float h = clip(a.rescale * gi + a.wd * w);
    const float mean = a.beta1 * state[i] + (1.0f - a.beta1) * h;
    const float var = a.beta2 * state[n + i] + (1.0f - a.beta2) * (h * h);
    state[i] = mean;
    state[n + i] = var;
    return w - a.lr * mean / (sqrtf(var) + a.eps);
  } else if constexpr (R == UpdateRule::kRmsProp) {
    const float h = clip(a.rescale * gi + a.wd * w);
    const float sq = (1.0f - a.gamma1) * (h * h) + a.gamma1 * state[i];
    state[i] = sq;
    return clip_w(w - a.lr * (h / sqrtf(sq + a.eps)));
  } else if constexpr (R == UpdateRule::kRmsPropCentered) {
    const float h = clip(a.rescale * gi + a.wd * w);
    const float sq = (1.0f - a.gamma1) * (h * h) + a.gamma1 * state[i];
    const float mg = (1.0f - a.gamma1) * h + a.gamma1 * state[n + i];
    const float delta = a.gamma2 * state[2 * n + i] - a.lr * (h / sqrtf(sq - mg * mg + a.eps));
    state[i] = sq;
    state[n + i] = mg;
    state[2 * n + i] = delta;
    return clip_w(w + delta);
  } else {
    static_assert(R == UpdateRule::kAdaGrad);
    const float h = clip(a.rescale * gi);
    const float hist = state[i] + h * h;
    state[i] = hist;
    return w - a.lr * (h / sqrtf(hist + a.eps) + a.wd * w);
  }
}

template <UpdateRule R>
__global__ void UpdateKernel(UpdateArgs a, const float* __restrict__ grad, float* __restrict__ w,
                             float* __restrict__ state, int64_t n) {
  uint32_t bad = 0;  // bit 0: a gradient value, bit 1: a weight written (the CPU's)
  PSTRAIN_GRID_STRIDE_LOOP(i, n) {
    const float gi = grad[i];
    const float wi = UpdateOne<R>(a, gi, w[i], state, i, n);
    w[i] = wi;
    bad |= NonFinite(gi) | NonFinite(wi) << 1;
  }
  // One write over the bus per block that saw one (every thread of the
  // block gets here: no thread leaves the loop early).
  const int bad_grad = __syncthreads_or(bad & 1u);
  const int bad_weight = __syncthreads_or(bad & 2u);
  if (a.flags != nullptr && threadIdx.x == 0) {
    if (bad_grad != 0) ReportStep(&a.flags[0], a.param);
    if (bad_weight != 0) ReportStep(&a.flags[1], a.param);
  }
}

// splitmix64: a counter-based generator, so every element's draw depends
// only on (seed, i) and any launch configuration gives the same mask.
__device__ __forceinline__ uint64_t Mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

__global__ void DropoutForwardKernel(const float* __restrict__ x, float* __restrict__ y,
                                     uint8_t* __restrict__ mask, int64_t n, uint32_t threshold,
                                     float scale, uint64_t seed) {
  PSTRAIN_GRID_STRIDE_LOOP(i, n) {
    // 24 random bits, as the CPU draws them (p's granularity is 2^-24).
    const uint32_t r = static_cast<uint32_t>(Mix(seed ^ static_cast<uint64_t>(i))) & 0xFFFFFFu;
    const bool keep = r >= threshold;
    mask[i] = keep ? 1 : 0;
    y[i] = keep ? x[i] * scale : 0.0f;
  }
}

__global__ void DropoutBackwardKernel(const float* __restrict__ dy,
                                      const uint8_t* __restrict__ mask, float* __restrict__ dx,
                                      int64_t n, float scale) {
  PSTRAIN_GRID_STRIDE_LOOP(i, n) { dx[i] = mask[i] ? dy[i] * scale : 0.0f; }
}

__device__ __forceinline__ int64_t LabelIndex(float label, int64_t K) {
  return label >= 0.0f && label < static_cast<float>(K) ? static_cast<int64_t>(label) : -1;
}

__global__ void SoftmaxLossKernel(const float* prob, const float* label, float* loss, int64_t N,
                                  int64_t K) {
  PSTRAIN_GRID_STRIDE_LOOP(n, N) {
    const int64_t l = LabelIndex(label[n], K);
    loss[n] = l >= 0 ? -logf(fmaxf(prob[n * K + l], 1e-30f)) : 0.0f;
  }
}

__global__ void SoftmaxBackwardKernel(const float* prob, const float* label, float* dx, int64_t N,
                                      int64_t K, float scale) {
  PSTRAIN_GRID_STRIDE_LOOP(i, N * K) {
    const int64_t n = i / K, k = i % K;
    const int64_t l = LabelIndex(label[n], K);
    dx[i] = scale * (prob[i] - (k == l ? 1.0f : 0.0f));
  }
}

__global__ void BatchNormMovingStatsKernel(const float* saved_mean, const float* saved_invstd,
                                           float eps, float m, float* mm, float* mv, int64_t C) {
  PSTRAIN_GRID_STRIDE_LOOP(c, C) {
    const float inv = saved_invstd[c];
    const float var = fmaxf(1.0f / (inv * inv) - eps, 0.0f);
    mm[c] = m * mm[c] + (1 - m) * saved_mean[c];
    mv[c] = m * mv[c] + (1 - m) * var;
  }
}

__global__ void AddBiasKernel(const float* __restrict__ bias, float* __restrict__ y, int64_t N,
                              int64_t M) {
  PSTRAIN_GRID_STRIDE_LOOP(i, N * M) { y[i] += bias[i % M]; }
}

template <typename I>
__global__ void PoolForwardKernel(PoolArgs a, const float* __restrict__ x, float* __restrict__ y,
                                  int32_t* __restrict__ argmax, I n) {
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<I>(blockDim.x) * gridDim.x) {
    PoolForwardAt<I>(a, x, y, argmax, i);
  }
}

// One thread per input element gathers from the outputs whose windows hold
// it (no atomics: the result does not depend on the schedule).
template <typename I>
__global__ void PoolBackwardKernel(PoolArgs a, const int32_t* __restrict__ argmax,
                                   const float* __restrict__ dy, float* __restrict__ dx, bool add,
                                   I n) {
  for (I i = static_cast<I>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<I>(blockDim.x) * gridDim.x) {
    PoolBackwardAt<I>(a, argmax, dy, dx, add, i);
  }
}

}  // namespace

void Fill(float* p, int64_t n, float value, cudaStream_t stream) {
  if (n <= 0) return;
  FillKernel<<<Blocks(n), kThreads, 0, stream>>>(p, n, value);
  PSTRAIN_CUDA_CHECK_LAUNCH();
}

void Add(const float* src, float* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  AddKernel<<<Blocks(n), kThreads, 0, stream>>>(src, dst, n);
  PSTRAIN_CUDA_CHECK_LAUNCH();
}

void Add2(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  Add2Kernel<<<Blocks(n), kThreads, 0, stream>>>(a, b, out, n);
  PSTRAIN_CUDA_CHECK_LAUNCH();
}

void OptimizerUpdate(const UpdateArgs& a, const float* grad, float* weight, float* state, int64_t n,
                     cudaStream_t stream) {
  if (n <= 0) return;
  const unsigned blocks = Blocks(n);
  switch (a.rule) {
    case UpdateRule::kSgd:
      UpdateKernel<UpdateRule::kSgd><<<blocks, kThreads, 0, stream>>>(a, grad, weight, state, n);
      break;
    case UpdateRule::kTest:
      UpdateKernel<UpdateRule::kTest><<<blocks, kThreads, 0, stream>>>(a, grad, weight, state, n);
      break;
    case UpdateRule::kNag:
      UpdateKernel<UpdateRule::kNag><<<blocks, kThreads, 0, stream>>>(a, grad, weight, state, n);
      break;
    case UpdateRule::kAdam:
      UpdateKernel<UpdateRule::kAdam><<<blocks, kThreads, 0, stream>>>(a, grad, weight, state, n);
      break;
    case UpdateRule::kRmsProp:
      UpdateKernel<UpdateRule::kRmsProp>
          <<<blocks, kThreads, 0, stream>>>(a, grad, weight, state, n);
      break;
    case UpdateRule::kRmsPropCentered:
      UpdateKernel<UpdateRule::kRmsPropCentered>
          <<<blocks, kThreads, 0, stream>>>(a, grad, weight, state, n);
      break;
    case UpdateRule::kAdaGrad:
      UpdateKernel<UpdateRule::kAdaGrad>
          <<<blocks, kThreads, 0, stream>>>(a, grad, weight, state, n);
      break;
  }
  PSTRAIN_CUDA_CHECK_LAUNCH();
}

void DropoutForward(const float* x, float* y, uint8_t* mask, int64_t n, float p, uint64_t seed,
                    cudaStream_t stream) {
  if (n <= 0) return;
  const uint32_t threshold = static_cast<uint32_t>(p * 16777216.0f);
  DropoutForwardKernel<<<Blocks(n), kThreads, 0, stream>>>(x, y, mask, n, threshold,
                                                           1.0f / (1.0f - p), seed);
  PSTRAIN_CUDA_CHECK_LAUNCH();
}

void DropoutBackward(const float* dy, const uint8_t* mask, float* dx, int64_t n, float p,
                     cudaStream_t stream) {
  if (n <= 0) return;
  DropoutBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(dy, mask, dx, n, 1.0f / (1.0f - p));
  PSTRAIN_CUDA_CHECK_LAUNCH();
}

void SoftmaxLoss(const float* prob, const float* label, float* loss, int64_t N, int64_t K,
                 cudaStream_t stream) {
  if (N <= 0) return;
  SoftmaxLossKernel<<<Blocks(N), kThreads, 0, stream>>>(prob, label, loss, N, K);
  PSTRAIN_CUDA_CHECK_LAUNCH();
}

void SoftmaxOutputBackward(const float* prob, const float* label, float* dx, int64_t N, int64_t K,
                           float scale, cudaStream_t stream) {
  if (N * K <= 0) return;
  SoftmaxBackwardKernel<<<Blocks(N * K), kThreads, 0, stream>>>(prob, label, dx, N, K, scale);
  PSTRAIN_CUDA_CHECK_LAUNCH();
}

void BatchNormMovingStats(const float* saved_mean, const float* saved_invstd, float eps,
                          float momentum, float* moving_mean, float* moving_var, int64_t C,
                          cudaStream_t stream) {
  if (C <= 0) return;
  BatchNormMovingStatsKernel<<<Blocks(C), kThreads, 0, stream>>>(
      saved_mean, saved_invstd, eps, momentum, moving_mean, moving_var, C);
  PSTRAIN_CUDA_CHECK_LAUNCH();
}

void AddBias(const float* bias, float* y, int64_t N, int64_t M, cudaStream_t stream) {
  if (N * M <= 0) return;
  AddBiasKernel<<<Blocks(N * M), kThreads, 0, stream>>>(bias, y, N, M);
  PSTRAIN_CUDA_CHECK_LAUNCH();
}

void PoolForward(const PoolArgs& a, const float* x, float* y, int32_t* argmax,
                 cudaStream_t stream) {
  const int64_t n = a.NC * a.OH * a.OW;
  if (n <= 0) return;
  CHECK(!a.is_max || argmax != nullptr) << "max pooling records its maxima";
  if (PoolFitsInt32(a)) {
    PoolForwardKernel<int32_t>
        <<<Blocks(n), kThreads, 0, stream>>>(a, x, y, argmax, static_cast<int32_t>(n));
  } else {
    PoolForwardKernel<int64_t><<<Blocks(n), kThreads, 0, stream>>>(a, x, y, argmax, n);
  }
  PSTRAIN_CUDA_CHECK_LAUNCH();
}

void PoolBackward(const PoolArgs& a, const int32_t* argmax, const float* dy, float* dx, bool add,
                  cudaStream_t stream) {
  const int64_t n = a.NC * a.H * a.W;
  if (n <= 0) return;
  CHECK(!a.is_max || argmax != nullptr) << "max pooling's backward reads the forward's maxima";
  if (PoolFitsInt32(a)) {
    PoolBackwardKernel<int32_t>
        <<<Blocks(n), kThreads, 0, stream>>>(a, argmax, dy, dx, add, static_cast<int32_t>(n));
  } else {
    PoolBackwardKernel<int64_t><<<Blocks(n), kThreads, 0, stream>>>(a, argmax, dy, dx, add, n);
  }
  PSTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace pstrain::internal::cuda
