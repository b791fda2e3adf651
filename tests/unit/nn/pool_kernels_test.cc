// The CUDA pooling kernels' element functions (nn/cuda/pool_kernels.h) run on
// the host against the CPU reference operator: every pooling op case, inputs
// with ties, NaNs and -inf, both index widths, overwriting and adding to the
// input gradient. The same functions are the kernels' bodies on a GPU, so
// this checks their arithmetic on machines without one (the `gpu` tests check
// the kernels themselves where a GPU is present).
#include "nn/cuda/pool_kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "tests/unit/nn/op_cases.h"
#include "tests/unit/nn/op_harness.h"

namespace pstrain::testing {
namespace {

using internal::cuda::PoolArgs;

struct Pooled {
  std::vector<float> y;
  std::vector<int32_t> argmax;
  std::vector<float> dx;
};

// The kernels' loops, one element at a time, with index type I.
template <typename I>
Pooled RunElementwise(const PoolArgs& a, const Tensor& x, const Tensor& dy,
                      const std::vector<float>& dx_before, bool add) {
  Pooled r;
  const int64_t outs = a.NC * a.OH * a.OW, ins = a.NC * a.H * a.W;
  r.y.assign(outs, 0.0f);
  r.argmax.assign(outs, -2);
  for (I i = 0; i < static_cast<I>(outs); ++i) {
    internal::cuda::PoolForwardAt<I>(a, x.data(), r.y.data(), r.argmax.data(), i);
  }
  r.dx = dx_before;
  for (I i = 0; i < static_cast<I>(ins); ++i) {
    internal::cuda::PoolBackwardAt<I>(a, r.argmax.data(), dy.data(), r.dx.data(), add, i);
  }
  return r;
}

// NaN-aware equality: both NaN, or the same value.
bool Same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

// Runs one pooling graph through the reference and the element functions
// (both widths), `edit` changing the reference's input first. Overwriting
// must give the reference's bits (same operations in the same order); adding
// sums the windows' parts before adding them, so within rounding.
template <typename Edit>
void CheckAgainstReference(const Graph& g, NodeId id, int batch, bool distinct, Edit edit) {
  for (bool add : {false, true}) {
    SCOPED_TRACE(add ? "adding to the input gradient" : "overwriting the input gradient");
    OpHarness ref(g, id, CpuKernels::kReference, batch, /*seed=*/11, distinct, add);
    OpTensors& t = ref.tensors();
    edit(t.in[0]);
    std::vector<float> before(t.in_grads[0].data(),
                              t.in_grads[0].data() + t.in_grads[0].num_elements());
    ref.Objective(/*is_train=*/true);
    ref.Backward();
    const PoolArgs a = internal::cuda::PoolArgsOf(g.node(id).pool, t.in[0].shape(), t.out.shape());
    ASSERT_TRUE(internal::cuda::PoolFitsInt32(a));
    const Pooled p32 = RunElementwise<int32_t>(a, t.in[0], t.out_grad, before, add);
    const Pooled p64 = RunElementwise<int64_t>(a, t.in[0], t.out_grad, before, add);
    EXPECT_EQ(p32.argmax, p64.argmax);
    for (int64_t i = 0; i < t.out.num_elements(); ++i) {
      ASSERT_TRUE(Same(p32.y[i], t.out.at(i)))
          << "output " << i << ": " << p32.y[i] << " vs " << t.out.at(i);
      ASSERT_TRUE(Same(p64.y[i], p32.y[i])) << "output " << i;
      if (a.is_max && p32.argmax[i] >= 0) {
        // The recorded maximum is an element of the window holding the output.
        const int64_t plane = i / (a.OH * a.OW);
        EXPECT_TRUE(Same(t.in[0].at(plane * a.H * a.W + p32.argmax[i]), p32.y[i])) << i;
      }
    }
    for (int64_t i = 0; i < t.in_grads[0].num_elements(); ++i) {
      const float want = t.in_grads[0].at(i);
      if (add) {
        EXPECT_NEAR(p32.dx[i], want, 1e-6 * std::max(1.0f, std::fabs(want))) << "dx " << i;
      } else {
        ASSERT_EQ(p32.dx[i], want) << "dx " << i;
      }
      ASSERT_EQ(p64.dx[i], p32.dx[i]) << "dx " << i;
    }
  }
}

TEST(PoolKernelsTest, EveryPoolingCaseMatchesTheReference) {
  int checked = 0;
  for (const OpCase& c : AllOpCases()) {
    Graph g;
    const NodeId id = c.build(&g);
    ASSERT_TRUE(g.status().ok()) << g.status();
    if (g.node(id).op != OpType::kPooling) continue;
    SCOPED_TRACE(c.name);
    CheckAgainstReference(g, id, c.batch, c.distinct_inputs, [](const Tensor&) {});
    ++checked;
  }
  EXPECT_GE(checked, 11);  // the op cases' pooling rows
}

// Which pools cuDNN runs (CudnnPoolingFits, decided before planning: our
// kernels' backward keeps neither the input nor the output alive): every
// "valid" one, and a "full" one only where its rounding adds no window.
// Inception-BN-28-small's downsampling pools (28 -> 14, 14 -> 7) are ours; its
// global pool and ResNet's stem pool are cuDNN's.
TEST(PoolKernelsTest, CudnnRunsThePoolsWhoseWindowsItHas) {
  struct Row {
    int64_t hw;
    int kernel, stride, pad;
    PoolConvention convention;
    bool global;
    int64_t out;  // the graph's output size
    bool cudnn;
  };
  constexpr PoolConvention kFull = PoolConvention::kFull, kValid = PoolConvention::kValid;
  const Row rows[] = {
      {28, 3, 2, 0, kFull, false, 14, false},   // inception-bn-28-small in3c
      {14, 3, 2, 0, kFull, false, 7, false},    // inception-bn-28-small in4e
      {7, 7, 1, 0, kValid, true, 1, true},      // its global pool
      {112, 3, 2, 1, kValid, false, 56, true},  // ResNet-50's stem
      {27, 3, 2, 0, kFull, false, 13, true},    // full, but the stride fits exactly
      {28, 3, 2, 0, kValid, false, 13, true},
      {5, 2, 2, 1, kFull, false, 4, false},  // 5 + 2 - 2 = 5: full rounding adds one
  };
  for (const Row& r : rows) {
    SCOPED_TRACE(::testing::Message() << r.hw << "x" << r.hw << " k" << r.kernel << " s" << r.stride
                                      << " p" << r.pad << (r.global ? " global" : ""));
    Graph g;
    PoolParam p;
    p.type = PoolType::kMax;
    p.kernel_h = p.kernel_w = r.kernel;
    p.stride_h = p.stride_w = r.stride;
    p.pad_h = p.pad_w = r.pad;
    p.convention = r.convention;
    p.global = r.global;
    const NodeId y = g.Pooling("pool", g.Input("data", Shape{4, r.hw, r.hw}), p);
    ASSERT_TRUE(g.status().ok()) << g.status();
    const Shape& out = g.node(y).out_shape;
    ASSERT_EQ(out, (Shape{4, r.out, r.out}));
    const PoolArgs a =
        internal::cuda::PoolArgsOf(p, Shape{1, 4, r.hw, r.hw}, Shape{1, out[0], out[1], out[2]});
    EXPECT_EQ(internal::cuda::CudnnPoolingFits(a), r.cudnn);
  }
}

// Ties (the first maximum in row-major order takes the gradient), NaNs
// (skipped, as the reference's max skips them) and -inf (a window of only
// -inf still routes its gradient to its first element).
TEST(PoolKernelsTest, TiesNansAndInfinitiesAsTheReference) {
  const float kNan = std::numeric_limits<float>::quiet_NaN();
  const float kInf = std::numeric_limits<float>::infinity();
  for (PoolConvention conv : {PoolConvention::kFull, PoolConvention::kValid}) {
    for (int stride : {1, 2}) {
      Graph g;
      const NodeId id =
          g.Pooling("pool", g.Input("data", {3, 9, 7}),
                    PoolParam{PoolType::kMax, 3, 3, stride, stride, 0, 0, false, conv});
      ASSERT_TRUE(g.status().ok()) << g.status();
      SCOPED_TRACE(StrCat("stride ", stride, conv == PoolConvention::kFull ? ", full" : ""));
      CheckAgainstReference(g, id, /*batch=*/2, /*distinct=*/false, [&](const Tensor& x) {
        std::mt19937_64 rng(5);
        std::uniform_int_distribution<int> pick(0, 9);
        for (int64_t i = 0; i < x.num_elements(); ++i) {
          const int k = pick(rng);
          float v = std::round(x.at(i) * 2.0f) / 2.0f;  // five levels: many ties
          if (k == 0) v = kNan;
          if (k == 1) v = -kInf;
          x.data()[i] = v;
        }
        // One plane of -inf only, and a window of NaNs only.
        for (int64_t i = 0; i < 9 * 7; ++i) x.data()[i] = -kInf;
        for (int64_t h = 0; h < 3; ++h)
          for (int64_t w = 0; w < 3; ++w) x.data()[9 * 7 + h * 7 + w] = kNan;
      });
    }
  }
}

// MXNet's "full" rounding can add an output whose window lies wholly in the
// right padding (input 2, kernel 2, pad 1, stride 3: outputs 2, the second's
// window [2, 3) holds only padding). MXNet 1.x's max pooling starts each
// window at the lowest float and so writes it there; average pooling writes
// 0. No gradient flows from such an output. The reference, oneDNN and the
// CUDA kernels' element functions agree.
TEST(PoolKernelsTest, AWindowWhollyInThePaddingAsMxnet) {
  for (PoolType type : {PoolType::kMax, PoolType::kAvg}) {
    SCOPED_TRACE(type == PoolType::kMax ? "max" : "avg");
    Graph g;
    const NodeId id = g.Pooling("pool", g.Input("data", {2, 2, 2}),
                                PoolParam{type, 2, 2, 3, 3, 1, 1, false, PoolConvention::kFull});
    ASSERT_TRUE(g.status().ok()) << g.status();
    ASSERT_EQ(g.node(id).out_shape, Shape({2, 2, 2}));
    const float want = type == PoolType::kMax ? std::numeric_limits<float>::lowest() : 0.0f;
    for (CpuKernels kernels : {CpuKernels::kReference, CpuKernels::kOneDnn}) {
      SCOPED_TRACE(kernels == CpuKernels::kReference ? "reference" : "oneDNN");
      OpHarness h(g, id, kernels, /*batch=*/3, /*seed=*/4);
      OpTensors& t = h.tensors();
      const double objective = h.Objective(/*is_train=*/true);
      EXPECT_TRUE(std::isfinite(objective)) << objective;
      h.Backward();
      for (int64_t i = 0; i < t.out.num_elements(); ++i) {
        const int64_t oh = (i / 2) % 2, ow = i % 2;
        if (oh == 1 || ow == 1) {
          EXPECT_EQ(t.out.at(i), want) << "output " << i;
        } else {
          EXPECT_TRUE(std::isfinite(t.out.at(i))) << "output " << i;
        }
      }
      // The input's gradient is the sum over the windows that hold it, as the
      // reference computes it for the non-empty windows only.
      for (int64_t i = 0; i < t.in_grads[0].num_elements(); ++i) {
        EXPECT_TRUE(std::isfinite(t.in_grads[0].at(i))) << "dx " << i;
      }
    }
    CheckAgainstReference(g, id, /*batch=*/3, /*distinct=*/true, [](const Tensor&) {});
  }
}

TEST(PoolKernelsTest, IndexWidthFollowsTheTensors) {
  PoolArgs a{};
  a.NC = 256 * 80;
  a.H = a.W = 28;
  a.OH = a.OW = 14;
  EXPECT_TRUE(internal::cuda::PoolFitsInt32(a));
  // Headroom for a grid-stride step past the last element.
  a.NC = (int64_t{1} << 30) / (28 * 28) + 1;
  EXPECT_FALSE(internal::cuda::PoolFitsInt32(a));
}

}  // namespace
}  // namespace pstrain::testing
