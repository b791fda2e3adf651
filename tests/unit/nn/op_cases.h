// The operator configurations the gradient and kernel-comparison tests run:
// fixed corner cases plus seeded random shapes, strides and pads.
#ifndef PSTRAIN_TESTS_UNIT_NN_OP_CASES_H_
#define PSTRAIN_TESTS_UNIT_NN_OP_CASES_H_

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "nn/graph.h"

namespace pstrain::testing {

struct OpCase {
  std::string name;
  std::function<NodeId(Graph*)> build;  // returns the node under test
  int batch = 2;
  // Max pooling: no ties within a step (a step of the gradient check, or a
  // window: cuDNN routes a tie's gradient by no documented rule, the
  // reference to the first maximum; see CudaPooling in nn/cuda/cuda_ops.cc).
  bool distinct_inputs = false;
  bool relu_kink = false;  // skip inputs within the step of 0
};

inline std::vector<OpCase> AllOpCases() {
  std::vector<OpCase> cases;
  auto conv = [](std::string name, Shape in, ConvParam p) {
    return OpCase{name,
                  [in, p](Graph* g) { return g->Convolution("conv", g->Input("data", in), p); }};
  };
  cases.push_back(conv("conv_3x3_pad1", {3, 7, 6}, {4, 3, 3, 1, 1, 1, 1, 1, false}));
  cases.push_back(conv("conv_3x2_stride2x1", {2, 7, 5}, {3, 3, 2, 2, 1, 0, 1, 1, false}));
  cases.push_back(conv("conv_group2", {4, 5, 5}, {6, 3, 3, 1, 1, 1, 1, 2, false}));
  cases.push_back(conv("conv_1x1_nobias", {5, 4, 4}, {3, 1, 1, 1, 1, 0, 0, 1, true}));
  cases.push_back(conv("conv_5x5_lenet", {1, 9, 9}, {4, 5, 5, 1, 1, 0, 0, 1, false}));
  std::mt19937 rng(1701);
  auto r = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int i = 0; i < 4; ++i) {
    ConvParam p;
    p.num_group = r(1, 2);
    const int c = p.num_group * r(1, 3);
    p.num_filter = p.num_group * r(1, 3);
    p.kernel_h = r(1, 4);
    p.kernel_w = r(1, 4);
    p.stride_h = r(1, 3);
    p.stride_w = r(1, 3);
    p.pad_h = r(0, p.kernel_h - 1);
    p.pad_w = r(0, p.kernel_w - 1);
    p.no_bias = r(0, 1) == 1;
    cases.push_back(
        conv("conv_random" + std::to_string(i), {c, r(p.kernel_h, 8), r(p.kernel_w, 8)}, p));
  }
  auto pool = [](std::string name, Shape in, PoolParam p) {
    return OpCase{name, [in, p](Graph* g) { return g->Pooling("pool", g->Input("data", in), p); },
                  2, p.type == PoolType::kMax};
  };
  cases.push_back(pool("maxpool_2x2_s2", {3, 6, 6},
                       {PoolType::kMax, 2, 2, 2, 2, 0, 0, false, PoolConvention::kValid}));
  cases.push_back(pool("maxpool_3x3_s2_full", {2, 7, 8},
                       {PoolType::kMax, 3, 3, 2, 2, 0, 0, false, PoolConvention::kFull}));
  cases.push_back(pool("avgpool_3x3_s1_pad1", {2, 5, 5},
                       {PoolType::kAvg, 3, 3, 1, 1, 1, 1, false, PoolConvention::kValid}));
  cases.push_back(pool("avgpool_3x3_s2_full", {2, 8, 6},
                       {PoolType::kAvg, 3, 3, 2, 2, 0, 0, false, PoolConvention::kFull}));
  // "full" with padding that adds a window, partly clipped (none wholly in the
  // padding: their lowest() output would swamp a finite difference).
  cases.push_back(pool("maxpool_3x3_s2_pad1_full", {2, 6, 6},
                       {PoolType::kMax, 3, 3, 2, 2, 1, 1, false, PoolConvention::kFull}));
  cases.push_back(pool("avgpool_3x3_s2_pad1_full", {2, 6, 8},
                       {PoolType::kAvg, 3, 3, 2, 2, 1, 1, false, PoolConvention::kFull}));
  cases.push_back(pool("maxpool_3x3_s2_pad1", {2, 7, 7},
                       {PoolType::kMax, 3, 3, 2, 2, 1, 1, false, PoolConvention::kValid}));
  cases.push_back(pool("avgpool_global", {3, 4, 5},
                       {PoolType::kAvg, 1, 1, 1, 1, 0, 0, true, PoolConvention::kValid}));
  cases.push_back(pool("maxpool_global", {3, 4, 5},
                       {PoolType::kMax, 1, 1, 1, 1, 0, 0, true, PoolConvention::kValid}));
  for (int i = 0; i < 4; ++i) {
    PoolParam p;
    p.type = r(0, 1) ? PoolType::kMax : PoolType::kAvg;
    p.kernel_h = r(1, 4);
    p.kernel_w = r(1, 4);
    p.stride_h = r(1, 3);
    p.stride_w = r(1, 3);
    p.pad_h = r(0, p.kernel_h - 1);
    p.pad_w = r(0, p.kernel_w - 1);
    p.convention = r(0, 1) ? PoolConvention::kFull : PoolConvention::kValid;
    cases.push_back(
        pool("pool_random" + std::to_string(i), {r(1, 3), r(p.kernel_h, 9), r(p.kernel_w, 9)}, p));
  }
  cases.push_back({"fc_4d_input",
                   [](Graph* g) {
                     return g->FullyConnected("fc", g->Input("data", {3, 4, 5}), {7, false});
                   },
                   3});
  cases.push_back({"fc_nobias",
                   [](Graph* g) {
                     return g->FullyConnected("fc", g->Input("data", {6}), {4, true});
                   },
                   5});
  cases.push_back({"batchnorm_4d",
                   [](Graph* g) {
                     return g->BatchNorm("bn", g->Input("data", {4, 3, 5}), {1e-5f, 0.9f, false});
                   },
                   3});
  cases.push_back({"batchnorm_fix_gamma",
                   [](Graph* g) {
                     return g->BatchNorm("bn", g->Input("data", {3, 4, 4}), {2e-5f, 0.9f, true});
                   },
                   2});
  // Channels then more than two dimensions, or one: each channel is
  // normalised over the batch and all the rest.
  cases.push_back({"batchnorm_3d",
                   [](Graph* g) {
                     return g->BatchNorm("bn", g->Input("data", {4, 6}), {1e-3f, 0.9f, false});
                   },
                   3});
  cases.push_back(
      {"batchnorm_5d",
       [](Graph* g) {
         return g->BatchNorm("bn", g->Input("data", {3, 2, 2, 3}), {1e-3f, 0.9f, false});
       },
       2});
  cases.push_back({"batchnorm_2d",
                   [](Graph* g) {
                     return g->BatchNorm("bn", g->Input("data", {5}), {1e-3f, 0.9f, false});
                   },
                   6});
  cases.push_back({"relu",
                   [](Graph* g) {
                     return g->Activation("act", g->Input("data", {3, 4, 5}), ActType::kRelu);
                   },
                   2, false, true});
  cases.push_back({"tanh", [](Graph* g) {
                     return g->Activation("act", g->Input("data", {3, 4, 5}), ActType::kTanh);
                   }});
  cases.push_back({"sigmoid", [](Graph* g) {
                     return g->Activation("act", g->Input("data", {7}), ActType::kSigmoid);
                   }});
  cases.push_back({"concat3", [](Graph* g) {
                     return g->Concat("cat", {g->Input("a", {2, 3, 3}), g->Input("b", {1, 3, 3}),
                                              g->Input("c", {3, 3, 3})});
                   }});
  cases.push_back({"add3", [](Graph* g) {
                     return g->Add("add", {g->Input("a", {2, 3, 3}), g->Input("b", {2, 3, 3}),
                                           g->Input("c", {2, 3, 3})});
                   }});
  cases.push_back({"dropout",
                   [](Graph* g) {
                     return g->Dropout("drop", g->Input("data", {4, 5}), {0.3f});
                   },
                   3});
  cases.push_back({"flatten", [](Graph* g) {
                     return g->Flatten("flat", g->Input("data", {2, 3, 4}));
                   }});
  cases.push_back({"softmax_output",
                   [](Graph* g) { return g->SoftmaxOutput("softmax", g->Input("data", {6})); }, 4});
  cases.push_back(
      {"softmax_output_scaled",
       [](Graph* g) { return g->SoftmaxOutput("softmax", g->Input("data", {3}), 0.5f); }, 5});
  return cases;
}

}  // namespace pstrain::testing

#endif  // PSTRAIN_TESTS_UNIT_NN_OP_CASES_H_
