// Finite-difference gradient checks of every operator (central differences,
// tolerance scaled by max(|analytic|, |numeric|, 1) as in Caffe's
// GradientChecker), for the reference and the oneDNN kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/unit/nn/op_cases.h"
#include "tests/unit/nn/op_harness.h"

namespace pstrain::testing {
namespace {

constexpr float kStep = 1e-2f;
constexpr double kThreshold = 5e-3;
constexpr int kMaxChecksPerTensor = 60;

class GradientTest : public ::testing::TestWithParam<std::tuple<int, CpuKernels>> {};

TEST_P(GradientTest, MatchesCentralDifferences) {
  const OpCase c = AllOpCases()[std::get<0>(GetParam())];
  const CpuKernels kernels = std::get<1>(GetParam());
  SCOPED_TRACE(c.name);
  Graph g;
  NodeId id = c.build(&g);
  ASSERT_TRUE(g.status().ok()) << g.status();
  OpHarness h(g, id, kernels, c.batch, /*seed=*/1701, c.distinct_inputs);
  OpTensors& t = h.tensors();
  h.Objective();
  h.Backward();
  // Analytic gradients, copied before the probes overwrite anything.
  struct Probe {
    Tensor value;
    std::vector<float> grad;
    std::string what;
    bool is_input;
  };
  std::vector<Probe> probes;
  for (size_t i = 0; i < t.in.size(); ++i) {
    if (!t.in_grads[i].defined()) continue;
    probes.push_back(
        {t.in[i],
         std::vector<float>(t.in_grads[i].data(), t.in_grads[i].data() + t.in[i].num_elements()),
         "input " + std::to_string(i), true});
  }
  for (size_t i = 0; i < t.params.size(); ++i) {
    probes.push_back({t.params[i],
                      std::vector<float>(t.param_grads[i].data(),
                                         t.param_grads[i].data() + t.params[i].num_elements()),
                      g.params()[g.node(id).params[i]].name, false});
  }
  ASSERT_FALSE(probes.empty());
  std::mt19937 pick(42);
  int checked = 0;
  for (Probe& p : probes) {
    const int64_t n = p.value.num_elements();
    std::vector<int64_t> idx(n);
    for (int64_t i = 0; i < n; ++i) idx[i] = i;
    std::shuffle(idx.begin(), idx.end(), pick);
    if (n > kMaxChecksPerTensor) idx.resize(kMaxChecksPerTensor);
    for (int64_t i : idx) {
      float* x = p.value.data() + i;
      const float saved = *x;
      if (c.relu_kink && p.is_input && std::fabs(saved) < kStep) continue;
      *x = saved + kStep;
      const double plus = h.Objective();
      *x = saved - kStep;
      const double minus = h.Objective();
      *x = saved;
      const double numeric = (plus - minus) / (2.0 * kStep);
      const double analytic = p.grad[i];
      const double scale = std::max({std::fabs(numeric), std::fabs(analytic), 1.0});
      EXPECT_NEAR(analytic, numeric, kThreshold * scale) << p.what << " element " << i;
      ++checked;
    }
  }
  EXPECT_GT(checked, 0);
}

std::string CaseName(const ::testing::TestParamInfo<std::tuple<int, CpuKernels>>& info) {
  return AllOpCases()[std::get<0>(info.param)].name +
         (std::get<1>(info.param) == CpuKernels::kOneDnn ? "_onednn" : "_reference");
}

INSTANTIATE_TEST_SUITE_P(
    AllOps, GradientTest,
    ::testing::Combine(::testing::Range(0, static_cast<int>(AllOpCases().size())),
                       ::testing::Values(CpuKernels::kReference, CpuKernels::kOneDnn)),
    CaseName);

// An operator that can add to an input's gradient (a tensor with several
// readers: the executor sums their gradients where they lie) must add
// exactly what it would have written.
TEST(AddToInputGradientTest, EveryOperatorThatCanAddsWhatItWouldWrite) {
  std::set<std::string> adding;
  for (const CpuKernels kernels : {CpuKernels::kReference, CpuKernels::kOneDnn}) {
    for (const OpCase& c : AllOpCases()) {
      SCOPED_TRACE(c.name + (kernels == CpuKernels::kOneDnn ? " onednn" : " reference"));
      Graph g;
      NodeId id = c.build(&g);
      ASSERT_TRUE(g.status().ok()) << g.status();
      OpHarness plain(g, id, kernels, c.batch, /*seed=*/1701, c.distinct_inputs);
      OpHarness add(g, id, kernels, c.batch, /*seed=*/1701, c.distinct_inputs, /*add_to=*/true);
      for (OpHarness* h : {&plain, &add}) {
        h->Objective();
        h->Backward();
      }
      for (size_t i = 0; i < add.prefill().size(); ++i) {
        const Tensor& before = add.prefill()[i];
        if (!before.defined()) continue;
        adding.insert(OpTypeName(g.node(id).op));
        const Tensor& got = add.tensors().in_grads[i];
        const Tensor& alone = plain.tensors().in_grads[i];
        for (int64_t k = 0; k < got.num_elements(); ++k) {
          ASSERT_NEAR(got.at(k), before.at(k) + alone.at(k),
                      1e-6 * std::max(1.0f, std::fabs(alone.at(k))))
              << "input " << i << " element " << k;
        }
      }
    }
  }
  // The operators whose gradients the models' multi-reader tensors take.
  for (const char* op :
       {"Convolution", "Pooling", "FullyConnected", "BatchNorm", "Activation", "ElementWiseSum"}) {
    EXPECT_TRUE(adding.count(op)) << op << " never added to an input gradient";
  }
}

}  // namespace
}  // namespace pstrain::testing
