// Pooling with MXNet's windows, one element at a time: the bodies of the CUDA
// pooling kernels (nn/cuda/kernels.cu), written once for the device and the
// host so that a CPU test (tests/unit/nn/pool_kernels_test.cc) checks them
// against the reference operator on machines without a GPU.
//
// The CUDA backend runs these where cuDNN has no such windows: MXNet's "full"
// rounding adds an output whose window spills past the padding (the
// downsampling pools of Inception-BN-28-small). Max pooling records the first
// maximum of each window in the forward, so the backward reads one index per
// covering output instead of scanning each window again; both kernels index
// in 32 bits whenever the tensors allow (64-bit division costs tens of
// instructions on a GPU).
//
// Plain C++ (no CUDA headers): the macro below marks the element functions
// for both compilers; what only host code needs is left out of nvcc's view.
#ifndef PSTRAIN_NN_CUDA_POOL_KERNELS_H_
#define PSTRAIN_NN_CUDA_POOL_KERNELS_H_

#include <cstdint>

#ifndef __CUDACC__
#include "nn/graph.h"
#endif

#ifdef __CUDACC__
#define PSTRAIN_HOST_DEVICE __host__ __device__
#else
#define PSTRAIN_HOST_DEVICE
#endif

namespace pstrain::internal::cuda {

// NC planes of H x W pooled into OH x OW; windows of kernel_h x kernel_w at
// stride_h, stride_w from -pad_h, -pad_w.
struct PoolArgs {
  int64_t NC, H, W, OH, OW;
  int kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
  bool is_max;
};

#ifndef __CUDACC__
// A pooling node's arguments for input shape xs and output shape ys (NCHW);
// a global pool's window is the whole plane. Host code only.
inline PoolArgs PoolArgsOf(const PoolParam& p, const Shape& xs, const Shape& ys) {
  PoolArgs a{};
  a.NC = xs[0] * xs[1];
  a.H = xs[2];
  a.W = xs[3];
  a.OH = ys[2];
  a.OW = ys[3];
  a.is_max = p.type == PoolType::kMax;
  if (p.global) {
    a.kernel_h = static_cast<int>(a.H);
    a.kernel_w = static_cast<int>(a.W);
    a.stride_h = a.stride_w = 1;
    a.pad_h = a.pad_w = 0;
  } else {
    a.kernel_h = p.kernel_h;
    a.kernel_w = p.kernel_w;
    a.stride_h = p.stride_h;
    a.stride_w = p.stride_w;
    a.pad_h = p.pad_h;
    a.pad_w = p.pad_w;
  }
  return a;
}
#endif

// Whether cuDNN's pooling has the node's windows: its output size, 1 + (H +
// 2 pad - kernel) / stride rounded down, is the node's. Else MXNet's "full"
// rounding added an output whose window spills past the padding, and our
// kernels run (their backward reads neither the input nor the output).
PSTRAIN_HOST_DEVICE inline bool CudnnPoolingFits(const PoolArgs& a) {
  return a.H + 2 * a.pad_h >= a.kernel_h && a.W + 2 * a.pad_w >= a.kernel_w &&
         1 + (a.H + 2 * a.pad_h - a.kernel_h) / a.stride_h == a.OH &&
         1 + (a.W + 2 * a.pad_w - a.kernel_w) / a.stride_w == a.OW;
}

// Whether 32-bit indices serve: every element index of the input and the
// output, plus a grid-stride step (the kernels' grids stay under 2^28
// threads), stays below 2^31.
inline bool PoolFitsInt32(const PoolArgs& a) {
  const int64_t plane = a.H * a.W > a.OH * a.OW ? a.H * a.W : a.OH * a.OW;
  return a.NC * plane <= (int64_t{1} << 30);
}

// Window [start, end) of output position o along one axis (the reference's
// PoolWindow): clipped to the padded input, whose size divides average
// pooling, then to the input itself.
template <typename I>
struct PoolWindow {
  I start, end, padded_size;
};
template <typename I>
PSTRAIN_HOST_DEVICE inline PoolWindow<I> PoolWindowAt(I o, I stride, I pad, I kernel, I size) {
  const I start = o * stride - pad;
  const I end = start + kernel < size + pad ? start + kernel : size + pad;
  return PoolWindow<I>{start > 0 ? start : 0, end < size ? end : size, end - start};
}

// Output element i of NC * OH * OW: y[i]; for max pooling also argmax[i], the
// offset h * W + w within its plane of the window's first maximum in
// row-major order (the reference's choice: the first element equal to the
// maximum, NaNs skipped), or -1 where the window holds only NaNs or no
// element at all.
template <typename I>
PSTRAIN_HOST_DEVICE inline void PoolForwardAt(const PoolArgs& a, const float* x, float* y,
                                              int32_t* argmax, I i) {
  const I OW = static_cast<I>(a.OW), OH = static_cast<I>(a.OH);
  const I W = static_cast<I>(a.W), H = static_cast<I>(a.H);
  const I ow = i % OW, oh = (i / OW) % OH, nc = i / (OW * OH);
  const PoolWindow<I> wh = PoolWindowAt<I>(oh, a.stride_h, a.pad_h, a.kernel_h, H);
  const PoolWindow<I> ww = PoolWindowAt<I>(ow, a.stride_w, a.pad_w, a.kernel_w, W);
  const float* plane = x + nc * H * W;
  if (a.is_max) {
    float best = -__builtin_inff();
    int32_t at = -1;
    for (I h = wh.start; h < wh.end; ++h)
      for (I w = ww.start; w < ww.end; ++w) {
        const float v = plane[h * W + w];
        // The first non-NaN value, then only a strictly larger one.
        if (at < 0 ? v == v : v > best) {
          best = v;
          at = static_cast<int32_t>(h * W + w);
        }
      }
    // A window wholly in the padding holds no element: the lowest float, as
    // MXNet's max pooling (and the reference) write there.
    if (wh.start >= wh.end || ww.start >= ww.end) best = -3.40282347e+38f;
    y[i] = best;
    argmax[i] = at;
    return;
  }
  float sum = 0.0f;
  for (I h = wh.start; h < wh.end; ++h)
    for (I w = ww.start; w < ww.end; ++w) sum += plane[h * W + w];
  y[i] = sum / static_cast<float>(wh.padded_size * ww.padded_size);
}

// Input element i of NC * H * W: its gradient, summed over the outputs whose
// windows hold it in the order of those outputs (the reference's order), for
// max pooling from the outputs whose recorded maximum it is. Added to dx[i]
// when `add`, else written.
template <typename I>
PSTRAIN_HOST_DEVICE inline void PoolBackwardAt(const PoolArgs& a, const int32_t* argmax,
                                               const float* dy, float* dx, bool add, I i) {
  const I OW = static_cast<I>(a.OW), OH = static_cast<I>(a.OH);
  const I W = static_cast<I>(a.W), H = static_cast<I>(a.H);
  const I w = i % W, h = (i / W) % H, nc = i / (W * H);
  const I sh = a.stride_h, sw = a.stride_w, ph = a.pad_h, pw = a.pad_w;
  // The outputs whose unclipped windows [o * s - p, o * s - p + k) hold (h, w).
  const I lo_h = h + ph - a.kernel_h + 1, lo_w = w + pw - a.kernel_w + 1;
  const I oh0 = lo_h <= 0 ? 0 : (lo_h + sh - 1) / sh;
  const I ow0 = lo_w <= 0 ? 0 : (lo_w + sw - 1) / sw;
  const I oh1 = (h + ph) / sh < OH - 1 ? (h + ph) / sh : OH - 1;
  const I ow1 = (w + pw) / sw < OW - 1 ? (w + pw) / sw : OW - 1;
  const I plane_out = nc * OH * OW;
  float acc = 0.0f;
  if (a.is_max) {
    const int32_t me = static_cast<int32_t>(h * W + w);
    for (I oh = oh0; oh <= oh1; ++oh)
      for (I ow = ow0; ow <= ow1; ++ow) {
        const I o = plane_out + oh * OW + ow;
        if (argmax[o] == me) acc += dy[o];
      }
  } else {
    for (I oh = oh0; oh <= oh1; ++oh) {
      const PoolWindow<I> wh = PoolWindowAt<I>(oh, sh, ph, a.kernel_h, H);
      if (h < wh.start || h >= wh.end) continue;
      for (I ow = ow0; ow <= ow1; ++ow) {
        const PoolWindow<I> ww = PoolWindowAt<I>(ow, sw, pw, a.kernel_w, W);
        if (w < ww.start || w >= ww.end) continue;
        acc += dy[plane_out + oh * OW + ow] / static_cast<float>(wh.padded_size * ww.padded_size);
      }
    }
  }
  dx[i] = add ? dx[i] + acc : acc;
}

}  // namespace pstrain::internal::cuda

#endif  // PSTRAIN_NN_CUDA_POOL_KERNELS_H_
