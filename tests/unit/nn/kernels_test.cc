// The oneDNN CPU kernels against the reference loops, operator by operator:
// same random tensors, forward (training and inference) and backward.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "tests/unit/nn/op_cases.h"
#include "tests/unit/nn/op_harness.h"

namespace pstrain::testing {
namespace {

constexpr double kTol = 1e-5;

class KernelsTest : public ::testing::TestWithParam<int> {};

TEST_P(KernelsTest, OneDnnMatchesReference) {
  const OpCase c = AllOpCases()[GetParam()];
  Graph g;
  NodeId id = c.build(&g);
  ASSERT_TRUE(g.status().ok()) << g.status();
  OpHarness fast(g, id, CpuKernels::kOneDnn, c.batch, /*seed=*/7, c.distinct_inputs);
  OpHarness ref(g, id, CpuKernels::kReference, c.batch, /*seed=*/7, c.distinct_inputs);
  OpTensors& f = fast.tensors();
  OpTensors& r = ref.tensors();

  // Inference first (BatchNorm reads the moving stats, which training changes).
  fast.Objective(/*is_train=*/false);
  ref.Objective(/*is_train=*/false);
  EXPECT_LT(RelMaxDiff(f.out, r.out), kTol) << "inference output";

  fast.Objective(/*is_train=*/true);
  ref.Objective(/*is_train=*/true);
  EXPECT_LT(RelMaxDiff(f.out, r.out), kTol) << "training output";
  for (size_t i = 0; i < f.aux.size(); ++i) {
    EXPECT_LT(RelMaxDiff(f.aux[i], r.aux[i]), kTol) << "aux " << i;
  }
  fast.Backward();
  ref.Backward();
  for (size_t i = 0; i < f.in_grads.size(); ++i) {
    if (!r.in_grads[i].defined()) continue;
    EXPECT_LT(RelMaxDiff(f.in_grads[i], r.in_grads[i]), kTol) << "input gradient " << i;
  }
  for (size_t i = 0; i < f.param_grads.size(); ++i) {
    EXPECT_LT(RelMaxDiff(f.param_grads[i], r.param_grads[i]), kTol) << "param gradient " << i;
  }
}

// Labels are checked by the trainer; an operator handed one outside [0, K)
// anyway must neither read nor write out of bounds: the row gets no target.
TEST(SoftmaxOutputTest, RowsWithALabelOutsideTheClassesGetNoTargetAndNoLoss) {
  Graph g;
  const NodeId id = g.SoftmaxOutput("softmax", g.Input("data", {5}), 0.5f);
  ASSERT_TRUE(g.status().ok()) << g.status();
  for (CpuKernels kernels : {CpuKernels::kReference, CpuKernels::kOneDnn}) {
    SCOPED_TRACE(kernels == CpuKernels::kReference ? "reference" : "oneDNN");
    OpHarness h(g, id, kernels, /*batch=*/6, /*seed=*/3);
    ExpectLabelsOutsideTheClassesGetNoTarget(&h, 0.5f);
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, KernelsTest,
                         ::testing::Range(0, static_cast<int>(AllOpCases().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return AllOpCases()[info.param].name;
                         });

}  // namespace
}  // namespace pstrain::testing
