// Our own CUDA kernels (nn/cuda/kernels.cu), for the steps no library call
// fits: element-wise sums and fills, the optimizers' updates, dropout, the
// softmax output's loss and gradient, the BatchNorm moving statistics, the
// fully connected bias, and pooling under MXNet's "full" rounding where a
// window spills past the padding (cuDNN has no such windows).
//
// Every launcher enqueues on `stream` and returns at once; a bad launch
// configuration is a CHECK failure naming the kernel. Pointers are device
// pointers. Each one's arithmetic is the CPU reference's (nn/cpu/), which the
// `gpu` tests compare it with.
#ifndef PSTRAIN_NN_CUDA_KERNELS_H_
#define PSTRAIN_NN_CUDA_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

#include "nn/cuda/pool_kernels.h"

namespace pstrain::internal::cuda {

// p[0, n) = value.
void Fill(float* p, int64_t n, float value, cudaStream_t stream);
// dst[i] += src[i].
void Add(const float* src, float* dst, int64_t n, cudaStream_t stream);
// out[i] = a[i] + b[i].
void Add2(const float* a, const float* b, float* out, int64_t n, cudaStream_t stream);

// The optimizer's rules (Optimizer::ApplyStep, nn/optimizer.h has each
// one's arithmetic), one kernel per rule. `state` holds the rule's slots, n
// floats each, back to back (SGD and NAG with momentum: momentum; ADAM: mean,
// var; RMSPROP: n; centered: n, g, delta; ADAGRAD: history); it may be null
// when the rule keeps none. clip keeps a NaN NaN, as std::clamp on the CPU.
// In the same pass, as the CPU's check (Optimizer::ApplyStep): where a
// gradient holds NaN or Inf, flags[0] is set to kStepFlagSet | param unless
// it is set already; where a weight written does, flags[1]. flags (two words
// the host reads: mapped pinned memory) may be null.
enum class UpdateRule : int { kSgd, kTest, kNag, kAdam, kRmsProp, kRmsPropCentered, kAdaGrad };
struct UpdateArgs {
  UpdateRule rule;
  float rescale, lr, wd, clip;
  bool do_clip;
  float momentum;      // SGD, NAG (0: none)
  float beta1, beta2;  // ADAM
  float gamma1, gamma2;
  float eps;
  float clip_weights;
  bool do_clip_weights;
  int param;
  unsigned long long* flags;
};
inline constexpr unsigned long long kStepFlagSet = 1ull << 32;
// `state`: Optimizer::Step::num_slots arrays of n floats (the caller,
// CudaBackend::ApplyOptimizerStep, checks its size).
void OptimizerUpdate(const UpdateArgs& a, const float* grad, float* weight, float* state, int64_t n,
                     cudaStream_t stream);

// Dropout in training: keep element i with probability 1 - p, drawn from a
// counter-based generator keyed by (seed, i); y = x * scale where kept, else 0.
// mask[i] = 1 where kept. Backward: dx = dy * mask * scale.
void DropoutForward(const float* x, float* y, uint8_t* mask, int64_t n, float p, uint64_t seed,
                    cudaStream_t stream);
void DropoutBackward(const float* dy, const uint8_t* mask, float* dx, int64_t n, float p,
                     cudaStream_t stream);

// Softmax output. prob is (N, K) (cuDNN's softmax). loss[n] = -log(max(p[n,
// label], 1e-30)), 0 for a label outside [0, K); grad = scale * (p - onehot).
void SoftmaxLoss(const float* prob, const float* label, float* loss, int64_t N, int64_t K,
                 cudaStream_t stream);
void SoftmaxOutputBackward(const float* prob, const float* label, float* dx, int64_t N, int64_t K,
                           float scale, cudaStream_t stream);

// BatchNorm moving statistics from cuDNN's saved batch mean and inverse
// standard deviation 1/sqrt(var + eps) (biased variance, as the CPU does):
// mm = m * mm + (1 - m) * mean;  mv = m * mv + (1 - m) * var.
void BatchNormMovingStats(const float* saved_mean, const float* saved_invstd, float eps,
                          float momentum, float* moving_mean, float* moving_var, int64_t C,
                          cudaStream_t stream);

// Fully connected: y (N, M) row-major += bias (M) on every row.
void AddBias(const float* bias, float* y, int64_t N, int64_t M, cudaStream_t stream);

// Pooling over NC planes of H x W into OH x OW with MXNet's windows
// (nn/cuda/pool_kernels.h, which holds each element's arithmetic). Max
// pooling's forward records each window's first maximum in argmax (NC * OH *
// OW offsets within the plane), which its backward reads; average pooling
// takes no argmax (null). The backward adds to dx when `add`, else writes it.
void PoolForward(const PoolArgs& a, const float* x, float* y, int32_t* argmax, cudaStream_t stream);
void PoolBackward(const PoolArgs& a, const int32_t* argmax, const float* dy, float* dx, bool add,
                  cudaStream_t stream);

}  // namespace pstrain::internal::cuda

#endif  // PSTRAIN_NN_CUDA_KERNELS_H_
