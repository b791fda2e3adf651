// A graph for the ONNX export tests with every layer variant the zoo does not
// exercise: grouped convolution without bias, fix_gamma batch norm, sigmoid,
// dropout, MXNet "full" poolings that spill past the padding (average with and
// without padding, one whose last window covers padding only, max), floor
// average pooling with padding, global max pooling, fully
// connected layers on images and without bias, a sum of five, batch norm on a
// flat input. The output is that batch norm's (no softmax or tanh to flatten
// differences).
#ifndef PSTRAIN_TESTS_UNIT_ONNX_TEST_GRAPHS_H_
#define PSTRAIN_TESTS_UNIT_ONNX_TEST_GRAPHS_H_

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "models/models.h"
#include "nn/graph.h"
#include "worker/checkpoint.h"

namespace pstrain::testing {

inline PoolParam TestPool(PoolType type, int k, int s, int pad, PoolConvention conv) {
  PoolParam p;
  p.type = type;
  p.kernel_h = p.kernel_w = k;
  p.stride_h = p.stride_w = s;
  p.pad_h = p.pad_w = pad;
  p.convention = conv;
  return p;
}

inline Graph OddLayersGraph() {
  const PoolConvention kFull = PoolConvention::kFull, kValid = PoolConvention::kValid;
  Graph g;
  NodeId x = g.Input("data", Shape{4, 6, 6});
  ConvParam cg;
  cg.num_filter = 4;
  cg.kernel_h = cg.kernel_w = 3;
  cg.pad_h = cg.pad_w = 1;
  cg.num_group = 2;
  cg.no_bias = true;
  x = g.Convolution("conv_g", x, cg);
  x = g.BatchNorm("bn_fix", x, BatchNormParam{1e-3f, 0.9f, true});
  x = g.Activation("sig", x, ActType::kSigmoid);
  x = g.Dropout("drop", x, DropoutParam{0.5f});
  // 6 + 2 = 8: floor gives 3 windows, full 4 (the last one spills a row).
  NodeId pa = g.Pooling("avg_pad_full", x, TestPool(PoolType::kAvg, 3, 2, 1, kFull));
  NodeId pm = g.Pooling("max_pad_full", x, TestPool(PoolType::kMax, 3, 2, 1, kFull));
  NodeId pz = g.Pooling("avg_full", x, TestPool(PoolType::kAvg, 3, 2, 0, kFull));
  NodeId pv = g.Pooling("avg_valid", x, TestPool(PoolType::kAvg, 3, 1, 1, kValid));
  ConvParam c2;
  c2.num_filter = 4;
  c2.kernel_h = c2.kernel_w = 2;
  NodeId c5 = g.Convolution("conv5", x, c2);  // 5x5
  // 5 + 2 = 7: floor 2, full 3; the last window covers right padding only.
  NodeId pq = g.Pooling("avg_in_pad", c5, TestPool(PoolType::kAvg, 2, 3, 1, kFull));
  NodeId cat = g.Concat("cat", {pa, pm});
  PoolParam global;
  global.type = PoolType::kMax;
  global.global = true;
  NodeId gm = g.Pooling("gmax", cat, global);
  NodeId f1 = g.FullyConnected("fc_a", cat, FcParam{6, true});
  NodeId f2 = g.FullyConnected("fc_b", pz, FcParam{6, false});
  NodeId f3 = g.FullyConnected("fc_c", pq, FcParam{6, false});
  NodeId f4 = g.FullyConnected("fc_d", g.Flatten("flat_gm", gm), FcParam{6, false});
  NodeId f5 = g.FullyConnected("fc_e", pv, FcParam{6, false});
  NodeId sum = g.Add("sum", {f1, f2, f3, f4, f5});
  g.BatchNorm("bn_flat", sum, BatchNormParam{1e-5f, 0.9f, false});
  return g;
}

// Every model of the zoo, at small images where the model allows, and resnet
// in both its layouts (CIFAR 20 and ImageNet 18).
struct ZooCase {
  std::string name;
  Shape shape;  // empty: the model's default
  int num_layers = 0;
};
inline std::vector<ZooCase> ZooCases() {
  const std::map<std::string, ZooCase> small = {
      {"inception-bn", {"inception-bn", Shape{3, 64, 64}, 0}},
      {"inception-v3", {"inception-v3", Shape{3, 139, 139}, 0}},
      {"resnet", {"resnet", Shape{3, 28, 28}, 20}},
  };
  std::vector<ZooCase> cases;
  for (const std::string& name : KnownModels()) {
    auto it = small.find(name);
    cases.push_back(it != small.end() ? it->second : ZooCase{name, Shape(), 0});
  }
  cases.push_back({"resnet", Shape{3, 64, 64}, 18});
  return cases;
}

// Every parameter and aux state of `g` drawn uniformly from [-1, 1] (moving
// variances from [0.5, 2.5], positive), as a checkpoint holds them.
inline std::vector<NamedArray> RandomArrays(const Graph& g, uint32_t seed = 1701) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<NamedArray> out;
  auto add = [&](const ParamInfo& info, NamedArray::Kind kind) {
    NamedArray a;
    a.kind = kind;
    a.name = info.name;
    a.shape = info.shape.dims();
    a.data.resize(static_cast<size_t>(info.shape.num_elements()));
    for (float& v : a.data) v = info.role == ParamRole::kMovingVar ? 1.5f + u(rng) : u(rng);
    out.push_back(std::move(a));
  };
  for (const ParamInfo& p : g.params()) add(p, NamedArray::Kind::kParam);
  for (const ParamInfo& a : g.aux_states()) add(a, NamedArray::Kind::kAux);
  return out;
}

}  // namespace pstrain::testing

#endif  // PSTRAIN_TESTS_UNIT_ONNX_TEST_GRAPHS_H_
