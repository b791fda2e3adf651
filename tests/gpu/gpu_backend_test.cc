// The CUDA backend against the CPU reference (label `gpu`): every operator
// forward and backward on the op cases' random shapes, the backend's copies
// and element-wise steps, the optimizer step, whole models' training steps,
// a LeNet run whose loss curve follows the CPU's, the caching allocator's
// reuse in a step loop, and the same GPU listed two and three times training
// like once (both merges), fence waits that time out. Without a GPU (or in a build without the
// CUDA backend) every test skips, saying why.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "models/models.h"
#include "nn/backend.h"
#include "nn/device_group.h"
#include "nn/executor.h"
#include "nn/initializer.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"
#include "tests/unit/nn/op_cases.h"
#include "tests/unit/nn/op_harness.h"
#include "worker/param_sync.h"

namespace pstrain::testing {
namespace {

// The convolution searches a backend's Describe() counts with
// gpu_conv_graph: directions that run a graph plan, that kept the legacy
// algorithm, that the graph API could not build.
struct GraphSearches {
  int graph = -1, legacy = -1, unbuilt = -1;
};
GraphSearches CountGraphSearches(const std::string& described) {
  std::smatch m;
  GraphSearches n;
  if (std::regex_search(described, m,
                        std::regex("graph engines: (\\d+) of (\\d+) searched, (\\d+) the "
                                   "graph API could not build"))) {
    n.graph = std::stoi(m[1].str());
    n.unbuilt = std::stoi(m[3].str());
    n.legacy = std::stoi(m[2].str()) - n.graph - n.unbuilt;
  }
  return n;
}

BackendOptions Gpu() {
  BackendOptions o;
  o.device = Device::Gpu(0);
  o.gpu_tf32 = false;  // full float, to compare with the reference
  // The legacy algorithms alone: the graph engines' own tests turn them on.
  o.gpu_conv_graph = false;
  return o;
}

// A GPU backend and the CPU one, side by side.
struct GpuAndCpu {
  std::unique_ptr<Backend> gpu, cpu;
};
::testing::AssertionResult MakeGpuAndCpu(GpuAndCpu* b) {
  auto gpu = Backend::Create(Gpu());
  if (!gpu.ok()) return ::testing::AssertionFailure() << gpu.status();
  auto cpu = Backend::Create(BackendOptions());
  if (!cpu.ok()) return ::testing::AssertionFailure() << cpu.status();
  b->gpu = std::move(gpu).value();
  b->cpu = std::move(cpu).value();
  return ::testing::AssertionSuccess();
}

// Every (n / 1000)-th element of device tensor `on_gpu` within 1e-6 of the
// host tensor `on_cpu` (n elements each).
::testing::AssertionResult SampledNear(Backend& G, const Tensor& on_gpu, const Tensor& on_cpu,
                                       int64_t n) {
  std::vector<float> back(n);
  G.CopyToHost(on_gpu, back.data());
  for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 1000)) {
    if (std::fabs(back[i] - on_cpu.at(i)) > 1e-6) {
      return ::testing::AssertionFailure()
             << "element " << i << ": device " << back[i] << ", host " << on_cpu.at(i);
    }
  }
  return ::testing::AssertionSuccess();
}

constexpr double kTol = 1e-4;

class GpuOpTest : public ::testing::TestWithParam<int> {};

TEST_P(GpuOpTest, MatchesTheCpuReference) {
  SKIP_WITHOUT_GPU();
  const OpCase c = AllOpCases()[GetParam()];
  Graph g;
  NodeId id = c.build(&g);
  ASSERT_TRUE(g.status().ok()) << g.status();
  OpHarness gpu(g, id, Gpu(), c.batch, /*seed=*/7, c.distinct_inputs);
  OpHarness ref(g, id, CpuKernels::kReference, c.batch, /*seed=*/7, c.distinct_inputs);
  OpTensors& d = gpu.tensors();
  OpTensors& r = ref.tensors();
  const bool dropout = g.node(id).op == OpType::kDropout;

  gpu.Objective(/*is_train=*/false);
  ref.Objective(/*is_train=*/false);
  EXPECT_LT(RelMaxDiff(d.out, r.out), kTol) << "inference output";

  gpu.Objective(/*is_train=*/true);
  ref.Objective(/*is_train=*/true);
  gpu.Backward();
  ref.Backward();
  if (dropout) {
    // The masks come from different generators: check the GPU's against its
    // own definition instead (kept elements scaled by 1/(1-p), the gradient
    // through the same mask).
    const float scale = 1.0f / (1.0f - g.node(id).dropout.p);
    for (int64_t i = 0; i < d.out.num_elements(); ++i) {
      const bool kept = d.out.at(i) != 0.0f;
      if (kept) {
        EXPECT_NEAR(d.out.at(i), d.in[0].at(i) * scale, 1e-6) << i;
      }
      EXPECT_NEAR(d.in_grads[0].at(i), kept ? d.out_grad.at(i) * scale : 0.0f, 1e-6) << i;
    }
    return;
  }
  EXPECT_LT(RelMaxDiff(d.out, r.out), kTol) << "training output";
  for (size_t i = 0; i < d.aux.size(); ++i) {
    EXPECT_LT(RelMaxDiff(d.aux[i], r.aux[i]), kTol) << "aux " << i;
  }
  for (size_t i = 0; i < d.in_grads.size(); ++i) {
    if (!r.in_grads[i].defined()) continue;
    EXPECT_LT(RelMaxDiff(d.in_grads[i], r.in_grads[i]), kTol) << "input gradient " << i;
  }
  for (size_t i = 0; i < d.param_grads.size(); ++i) {
    EXPECT_LT(RelMaxDiff(d.param_grads[i], r.param_grads[i]), kTol) << "param gradient " << i;
  }
  if (g.node(id).op == OpType::kSoftmaxOutput) {
    EXPECT_NEAR(gpu.op()->Loss(), ref.op()->Loss(), 1e-5);
  }
}

// Each training forward draws a new dropout mask, and backward goes through
// the mask of the forward before it (found by review: the op test reseeded
// before every forward, so a mask that never changed, or a backward reading
// an earlier one, passed).
void ExpectEachForwardDrawsANewMask(const BackendOptions& backend) {
  Graph g;
  const NodeId id = g.Dropout("drop", g.Input("data", {64, 64}), {0.5f});
  ASSERT_TRUE(g.status().ok()) << g.status();
  OpHarness h(g, id, backend, /*batch=*/64, /*seed=*/7);
  OpTensors& d = h.tensors();
  const float scale = 2.0f;
  std::vector<bool> first(d.out.num_elements());
  h.Objective(/*is_train=*/true, /*same_dropout_seed=*/false);
  for (int64_t i = 0; i < d.out.num_elements(); ++i) first[i] = d.out.at(i) != 0.0f;
  h.Objective(/*is_train=*/true, /*same_dropout_seed=*/false);
  h.Backward();
  int64_t changed = 0;
  for (int64_t i = 0; i < d.out.num_elements(); ++i) {
    const bool kept = d.out.at(i) != 0.0f;
    changed += kept != first[i];
    ASSERT_NEAR(d.in_grads[0].at(i), kept ? d.out_grad.at(i) * scale : 0.0f, 1e-6) << i;
  }
  // Two independent masks of p = 0.5 differ at about half the places.
  EXPECT_GT(changed, d.out.num_elements() / 4) << "the second forward kept the first mask";
}

TEST(GpuDropoutTest, EachForwardDrawsANewMaskAndBackwardUsesTheLast) {
  SKIP_WITHOUT_GPU();
  ExpectEachForwardDrawsANewMask(Gpu());
}

// The same check of the CPU's dropout (and of the check itself, where no GPU is).
TEST(GpuDropoutTest, TheCpuDrawsANewMaskEachForwardToo) {
  BackendOptions cpu;
  cpu.cpu_kernels = CpuKernels::kReference;
  ExpectEachForwardDrawsANewMask(cpu);
}

// Input gradients added to what they held (a tensor with several readers):
// the GPU adds what the reference adds, from the same starting values.
TEST_P(GpuOpTest, AddsToInputGradientsAsTheReferenceDoes) {
  SKIP_WITHOUT_GPU();
  const OpCase c = AllOpCases()[GetParam()];
  Graph g;
  NodeId id = c.build(&g);
  ASSERT_TRUE(g.status().ok()) << g.status();
  if (g.node(id).op == OpType::kDropout) GTEST_SKIP() << "masks differ between the backends";
  OpHarness gpu(g, id, Gpu(), c.batch, /*seed=*/7, c.distinct_inputs, /*add_to=*/true);
  OpHarness ref(g, id, CpuKernels::kReference, c.batch, /*seed=*/7, c.distinct_inputs,
                /*add_to=*/true);
  for (OpHarness* h : {&gpu, &ref}) {
    h->Objective(/*is_train=*/true);
    h->Backward();
  }
  for (size_t i = 0; i < gpu.prefill().size(); ++i) {
    if (!gpu.prefill()[i].defined()) continue;
    ASSERT_TRUE(ref.prefill()[i].defined()) << "the reference overwrites input gradient " << i;
    EXPECT_LT(RelMaxDiff(gpu.tensors().in_grads[i], ref.tensors().in_grads[i]), kTol)
        << "input gradient " << i;
  }
}

// Convolutions through cuDNN's graph API (BackendOptions::gpu_conv_graph,
// with a graph plan wherever one runs even where the legacy algorithm is
// faster: gpu_conv_graph_preferred): the same results as the reference,
// written and added to. Every direction of the writing pass is built; an
// input gradient added to (beta = 1) may find no engine and keep the legacy
// algorithm, which the warning then names.
TEST_P(GpuOpTest, GraphEngineConvolutionsMatchTheReference) {
  SKIP_WITHOUT_GPU();
  const OpCase c = AllOpCases()[GetParam()];
  Graph g;
  NodeId id = c.build(&g);
  ASSERT_TRUE(g.status().ok()) << g.status();
  if (g.node(id).op != OpType::kConvolution) GTEST_SKIP() << "not a convolution";
  BackendOptions graph = Gpu();
  graph.gpu_conv_graph = true;
  graph.gpu_conv_graph_preferred = true;
  for (bool add : {false, true}) {
    SCOPED_TRACE(add ? "adding to the input gradient" : "writing the input gradient");
    OpHarness gpu(g, id, graph, c.batch, /*seed=*/7, c.distinct_inputs, add);
    OpHarness ref(g, id, CpuKernels::kReference, c.batch, /*seed=*/7, c.distinct_inputs, add);
    for (OpHarness* h : {&gpu, &ref}) {
      h->Objective(/*is_train=*/true);
      h->Backward();
    }
    OpTensors& d = gpu.tensors();
    OpTensors& r = ref.tensors();
    EXPECT_LT(RelMaxDiff(d.out, r.out), kTol) << "output";
    EXPECT_LT(RelMaxDiff(d.in_grads[0], r.in_grads[0]), kTol) << "input gradient";
    for (size_t i = 0; i < d.param_grads.size(); ++i) {
      EXPECT_LT(RelMaxDiff(d.param_grads[i], r.param_grads[i]), kTol) << "param gradient " << i;
    }
    const std::string described = gpu.backend().Describe();
    const GraphSearches n = CountGraphSearches(described);
    ASSERT_GE(n.graph, 0) << described;
    // Forward and filter gradient at least (the data gradient too unless cuDNN
    // has no engine for adding to it).
    EXPECT_GE(n.graph, 2) << described;
    EXPECT_EQ(n.legacy, 0) << described;
    if (!add) {
      EXPECT_EQ(n.unbuilt, 0) << described;
    }
    std::printf("%s: %s\n", add ? "adding" : "writing", described.c_str());
  }
}

INSTANTIATE_TEST_SUITE_P(AllOps, GpuOpTest,
                         ::testing::Range(0, static_cast<int>(AllOpCases().size())),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return AllOpCases()[info.param].name;
                         });

// Bigger random shapes than the op cases, where cuDNN picks other algorithms.
TEST(GpuOpTest, LargerConvolutionsAndPoolingMatchTheReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(1701);
  auto r = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int i = 0; i < 6; ++i) {
    Graph g;
    ConvParam p;
    p.num_group = r(1, 2);
    p.num_filter = p.num_group * r(4, 12);
    p.kernel_h = p.kernel_w = 2 * r(0, 2) + 1;
    p.stride_h = p.stride_w = r(1, 2);
    p.pad_h = p.pad_w = p.kernel_h / 2;
    const int c = p.num_group * r(2, 8), hw = r(10, 20);
    NodeId conv = g.Convolution("conv", g.Input("data", {c, hw, hw}), p);
    PoolParam pp;
    pp.type = r(0, 1) ? PoolType::kMax : PoolType::kAvg;
    pp.kernel_h = pp.kernel_w = 3;
    pp.stride_h = pp.stride_w = 2;
    pp.convention = r(0, 1) ? PoolConvention::kFull : PoolConvention::kValid;
    NodeId pool = g.Pooling("pool", conv, pp);
    ASSERT_OK(g.status());
    for (NodeId id : {conv, pool}) {
      SCOPED_TRACE(StrCat("case ", i, " node ", g.node(id).name));
      const bool distinct = id == pool && pp.type == PoolType::kMax;
      OpHarness gpu(g, id, Gpu(), 4, 11, distinct);
      OpHarness ref(g, id, CpuKernels::kReference, 4, 11, distinct);
      gpu.Objective();
      ref.Objective();
      gpu.Backward();
      ref.Backward();
      EXPECT_LT(RelMaxDiff(gpu.tensors().out, ref.tensors().out), kTol);
      EXPECT_LT(RelMaxDiff(gpu.tensors().in_grads[0], ref.tensors().in_grads[0]), kTol);
      for (size_t k = 0; k < gpu.tensors().param_grads.size(); ++k) {
        EXPECT_LT(RelMaxDiff(gpu.tensors().param_grads[k], ref.tensors().param_grads[k]), kTol);
      }
    }
  }
}

// A label outside [0, K) reaches the loss and gradient kernels as on the
// CPU: that row gets no target and adds no loss (and nothing out of bounds).
TEST(GpuOpTest, SoftmaxRowsWithALabelOutsideTheClassesGetNoTarget) {
  SKIP_WITHOUT_GPU();
  Graph g;
  const NodeId id = g.SoftmaxOutput("softmax", g.Input("data", {5}), 0.5f);
  ASSERT_TRUE(g.status().ok()) << g.status();
  OpHarness gpu(g, id, Gpu(), /*batch=*/6, /*seed=*/3);
  ExpectLabelsOutsideTheClassesGetNoTarget(&gpu, 0.5f);
}

TEST(GpuOpTest, DropoutKeepsAboutOneMinusP) {
  SKIP_WITHOUT_GPU();
  Graph g;
  NodeId id = g.Dropout("drop", g.Input("data", {100, 100}), {0.3f});
  OpHarness gpu(g, id, Gpu(), 8, 3);
  gpu.Objective();
  int64_t kept = 0;
  for (int64_t i = 0; i < gpu.tensors().out.num_elements(); ++i)
    kept += gpu.tensors().out.at(i) != 0;
  const double frac = static_cast<double>(kept) / gpu.tensors().out.num_elements();
  EXPECT_NEAR(frac, 0.7, 0.01);
}

TEST(GpuBackendTest, CopiesFillAddAndTheOptimizerStepMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  GpuAndCpu b;
  ASSERT_TRUE(MakeGpuAndCpu(&b));
  Backend& G = *b.gpu;
  Backend& C = *b.cpu;
  EXPECT_FALSE(G.host_accessible());
  // Sizes around the staging buffers' 4 MiB and past the first ring's 16 MiB, so the
  // chunked copies and the ring's growth run.
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{1} << 20, (int64_t{5} << 20) + 3}) {
    SCOPED_TRACE(n);
    std::mt19937_64 rng(n);
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> a(n), b(n), m(n);
    for (int64_t i = 0; i < n; ++i) {
      a[i] = u(rng);
      b[i] = u(rng);
      m[i] = u(rng);
    }
    Tensor ga = G.Empty({n}), gb = G.Empty({n}), gm = G.Empty({n});
    G.CopyFromHost(a.data(), ga);
    G.CopyFromHost(b.data(), gb);
    G.CopyFromHost(m.data(), gm);
    std::vector<float> back(n);
    G.CopyToHost(ga, back.data());
    EXPECT_EQ(back, a);
    G.Add(ga, gb);  // gb = a + b
    Tensor ca = C.Empty({n}), cb = C.Empty({n}), cm = C.Empty({n});
    C.CopyFromHost(a.data(), ca);
    C.CopyFromHost(b.data(), cb);
    C.CopyFromHost(m.data(), cm);
    C.Add(ca, cb);
    Optimizer::Step step;
    step.rescale = 0.5f;
    step.lr = 0.1f;
    step.wd = 1e-3f;
    step.mom = 0.9f;
    step.clip = 0.4f;
    step.do_clip = true;
    G.ApplyOptimizerStep(step, ga, gb, gm);
    C.ApplyOptimizerStep(step, ca, cb, cm);
    ASSERT_TRUE(SampledNear(G, gb, cb, n));
    ASSERT_TRUE(SampledNear(G, gm, cm, n));
    G.Fill(ga, 2.5f);
    Tensor gc = G.Empty({n});
    G.Copy(ga, gc);
    G.CopyToHost(gc, back.data());
    EXPECT_EQ(back, std::vector<float>(n, 2.5f));
  }
}

// Every optimizer rule on the device against the CPU's: SGD plain, with
// momentum, with weight decay alone; TEST (w += rescale * g); NAG; Adam;
// RMSProp plain (with clipped weights) and centered; AdaGrad. Each with
// clipping somewhere, and three steps so that the slots carry over.
TEST(GpuBackendTest, EveryOptimizerRuleMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  GpuAndCpu b;
  ASSERT_TRUE(MakeGpuAndCpu(&b));
  Backend& G = *b.gpu;
  Backend& C = *b.cpu;
  using Rule = Optimizer::Rule;
  std::vector<Optimizer::Step> rules(10);
  rules[0].lr = 0.1f;   // plain SGD
  rules[1].lr = 0.05f;  // momentum, no clipping
  rules[1].mom = 0.9f;
  rules[1].rescale = 0.25f;
  rules[2].lr = 0.1f;  // weight decay alone
  rules[2].wd = 0.01f;
  rules[3].rule = Rule::kTest;  // TEST: w += rescale * g
  rules[3].rescale = 2.0f;
  rules[4].rule = Rule::kNag;
  rules[4].lr = 0.05f;
  rules[4].mom = 0.9f;
  rules[4].wd = 0.001f;
  rules[5].rule = Rule::kNag;  // NAG without momentum: SGD's
  rules[5].lr = 0.05f;
  rules[6].rule = Rule::kAdam;
  rules[6].lr = 0.003f;
  rules[6].beta1 = 0.9f;
  rules[6].beta2 = 0.999f;
  rules[6].eps = 1e-8f;
  rules[6].wd = 0.001f;
  rules[6].do_clip = true;
  rules[6].clip = 0.5f;
  rules[7].rule = Rule::kRmsProp;
  rules[7].lr = 0.001f;
  rules[7].gamma1 = 0.9f;
  rules[7].eps = 1e-8f;
  rules[7].do_clip_weights = true;
  rules[7].clip_weights = 0.75f;
  rules[8].rule = Rule::kRmsPropCentered;
  rules[8].lr = 0.001f;
  rules[8].gamma1 = 0.95f;
  rules[8].gamma2 = 0.9f;
  rules[8].eps = 1e-4f;
  rules[9].rule = Rule::kAdaGrad;
  rules[9].lr = 0.01f;
  rules[9].eps = 1e-7f;
  rules[9].wd = 0.01f;
  rules[9].do_clip = true;
  rules[9].clip = 0.3f;
  for (size_t k = 0; k < rules.size(); ++k) {
    for (int64_t n : {int64_t{7}, (int64_t{5} << 20) + 3}) {
      SCOPED_TRACE(StrCat("rule ", k, ", ", n, " elements"));
      std::mt19937_64 rng(n + k);
      std::uniform_real_distribution<float> u(-1, 1);
      const int64_t slots = rules[k].num_slots();
      std::vector<float> grad(n), w(n);
      for (int64_t i = 0; i < n; ++i) {
        grad[i] = u(rng);
        w[i] = u(rng);
      }
      Tensor gg = G.Empty({n}), gw = G.Empty({n});
      Tensor cg = C.Empty({n}), cw = C.Empty({n});
      Tensor gs, cs;
      if (slots > 0) {
        gs = G.Zeros({slots * n});
        cs = C.Zeros({slots * n});
      }
      G.CopyFromHost(grad.data(), gg);
      G.CopyFromHost(w.data(), gw);
      C.CopyFromHost(grad.data(), cg);
      C.CopyFromHost(w.data(), cw);
      for (int repeat = 0; repeat < 3; ++repeat) {  // the slots carry over
        G.ApplyOptimizerStep(rules[k], gg, gw, gs);
        C.ApplyOptimizerStep(rules[k], cg, cw, cs);
      }
      ASSERT_TRUE(SampledNear(G, gw, cw, n));
      if (slots > 0) {
        ASSERT_TRUE(SampledNear(G, gs, cs, slots * n));
      }
    }
  }
}

// NaN and Inf through the optimizer step: clipping keeps a NaN gradient NaN
// (as std::clamp on the CPU; fminf/fmaxf would make it -clip), the weights
// match the CPU's element for element (NaN where it is NaN), and the
// backend's check names the same parameters as the CPU backend's.
TEST(GpuBackendTest, TheOptimizerStepReportsNonFiniteValuesAsTheCpu) {
  SKIP_WITHOUT_GPU();
  GpuAndCpu b;
  ASSERT_TRUE(MakeGpuAndCpu(&b));
  Backend& G = *b.gpu;
  Backend& C = *b.cpu;
  const int64_t n = 100003;  // several blocks, a partial last warp
  for (float mom : {0.0f, 0.9f}) {
    SCOPED_TRACE(StrCat("momentum ", mom));
    std::vector<float> w(n), g(n), m(n, 0.0f);
    for (int64_t i = 0; i < n; ++i) {
      w[i] = 0.001f * static_cast<float>(i % 1000) - 0.5f;
      g[i] = 0.01f * static_cast<float>(i % 97) - 0.4f;
    }
    g[5] = std::nanf("");
    g[n - 1] = -std::numeric_limits<float>::infinity();
    Tensor gw = G.Empty({n}), gg = G.Empty({n}), gm = G.Empty({n});
    Tensor cw = C.Empty({n}), cg = C.Empty({n}), cm = C.Empty({n});
    G.CopyFromHost(w.data(), gw);
    G.CopyFromHost(g.data(), gg);
    G.CopyFromHost(m.data(), gm);
    C.CopyFromHost(w.data(), cw);
    C.CopyFromHost(g.data(), cg);
    C.CopyFromHost(m.data(), cm);
    Optimizer::Step step;
    step.lr = 0.1f;
    step.wd = 1e-3f;
    step.mom = mom;
    step.clip = 0.3f;
    step.do_clip = true;
    step.param = 4;
    G.ApplyOptimizerStep(step, gg, gw, gm);
    C.ApplyOptimizerStep(step, cg, cw, cm);
    step.param = 9;  // a later bad update: the first is reported
    G.ApplyOptimizerStep(step, gg, gw, gm);
    C.ApplyOptimizerStep(step, cg, cw, cm);
    std::vector<float> back(n);
    G.CopyToHost(gw, back.data());
    EXPECT_TRUE(std::isnan(back[5])) << "a NaN gradient clipped to " << back[5];
    // -Inf is clipped to -clip (a finite update), and still reported below.
    EXPECT_TRUE(std::isfinite(back[n - 1])) << back[n - 1];
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(cw.at(i))) {
        ASSERT_TRUE(std::isnan(back[i])) << i;
      } else {
        ASSERT_NEAR(back[i], cw.at(i), 1e-6) << i;
      }
    }
    G.Synchronize();
    for (Backend* b : {&G, &C}) {
      SCOPED_TRACE(b->Describe());
      const StepCheck c = b->TakeStepCheck();
      EXPECT_TRUE(c.bad_grad);
      EXPECT_EQ(c.grad_param, 4);
      EXPECT_TRUE(c.bad_weight);
      EXPECT_EQ(c.weight_param, 4);
      EXPECT_TRUE(b->TakeStepCheck().ok()) << "taken once";
    }
  }
  // A finite gradient whose update overflows: the weights only.
  Tensor gw = G.Zeros({n}), gg = G.Zeros({n});
  G.Fill(gg, 100.0f);
  Optimizer::Step huge;
  huge.lr = 3e38f;
  huge.param = 2;
  G.ApplyOptimizerStep(huge, gg, gw, Tensor());
  G.Synchronize();
  const StepCheck c = G.TakeStepCheck();
  EXPECT_FALSE(c.bad_grad);
  EXPECT_TRUE(c.bad_weight);
  EXPECT_EQ(c.weight_param, 2);
  // A clean update reports nothing.
  G.Fill(gw, 0.0f);
  G.Fill(gg, 1.0f);
  huge.lr = 0.1f;
  G.ApplyOptimizerStep(huge, gg, gw, Tensor());
  G.Synchronize();
  EXPECT_TRUE(G.TakeStepCheck().ok());
}

// The asynchronous seam on a GPU: pinned memory, a download that sees the
// kernels asked before it once its fence is done, an upload the kernels
// asked after it see, and fences waited on from another thread.
TEST(GpuBackendTest, AsyncCopiesThroughPinnedMemoryFollowTheQueue) {
  SKIP_WITHOUT_GPU();
  auto gpu = Backend::Create(Gpu());
  ASSERT_OK(gpu.status());
  Backend& G = **gpu;
  for (int64_t n : {int64_t{1}, int64_t{1000}, (int64_t{5} << 20) + 3}) {
    SCOPED_TRACE(n);
    std::shared_ptr<Buffer> up = G.AllocatePinned(n), down = G.AllocatePinned(n);
    ASSERT_TRUE(up->device().is_cpu());
    ASSERT_EQ(up->num_floats(), static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) up->data()[i] = static_cast<float>(i % 1001) - 500.0f;
    Tensor t = G.Empty({n});
    G.Fill(t, 3.0f);
    G.Synchronize();  // nothing unfinished touches t (CopyFromHostAsync's REQUIRES)
    G.CopyFromHostAsync(up->data(), t);
    G.Add(t, t);  // after the upload: 2 * up
    G.CopyToHostAsync(t, down->data());
    std::unique_ptr<Fence> f = G.RecordFence();
    bool done = false;
    std::thread waiter([&] {
      ASSERT_OK(f->Wait(Deadline::In(kDeviceWaitTimeout)));
      done = f->Done();
    });
    waiter.join();
    ASSERT_TRUE(done);
    for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 1000)) {
      ASSERT_EQ(down->data()[i], 2.0f * up->data()[i]) << i;
    }
    ASSERT_EQ(down->data()[n - 1], 2.0f * up->data()[n - 1]);
  }
}

// backend.h: CopyToHost waits for everything asked before it, the
// asynchronous downloads too, which run on a stream of their own (found by
// review: it waited for the compute stream alone, so a large download asked
// before it could still be in flight when it returned).
TEST(GpuBackendTest, CopyToHostWaitsForTheDownloadsAskedBeforeIt) {
  SKIP_WITHOUT_GPU();
  auto gpu = Backend::Create(Gpu());
  ASSERT_OK(gpu.status());
  Backend& G = **gpu;
  constexpr int64_t kFloats = int64_t{64} << 20;  // 256 MiB: a download of tens of ms
  Tensor big = G.Empty({kFloats});
  Tensor one = G.Empty({1});
  G.Fill(big, 1.0f);
  for (int i = 0; i < 20; ++i) G.Add(big, big);  // queued: 2^20 once they ran
  G.Fill(one, 5.0f);
  std::shared_ptr<Buffer> down = G.AllocatePinned(kFloats);
  std::fill(down->data(), down->data() + kFloats, -1.0f);
  G.CopyToHostAsync(big, down->data());
  float small = 0;
  G.CopyToHost(one, &small);  // no fence: it alone must cover the download
  ASSERT_EQ(small, 5.0f);
  for (int64_t i : {int64_t{0}, kFloats / 2, kFloats - 1}) {
    ASSERT_EQ(down->data()[i], 1048576.0f) << i;
  }
  for (int64_t i = 0; i < kFloats; i += 4093) ASSERT_EQ(down->data()[i], 1048576.0f) << i;
}

// Found by review: a staging slot added while the ring grows takes its
// device buffer from the caching allocator, which reuses blocks in the compute
// stream's order; its first upload ran on the copy stream without waiting for
// the compute stream, so it could overwrite a freed block that queued kernels
// still read. Now a new slot's first upload waits for the work queued before it.
TEST(GpuBackendTest, ANewStagingSlotWaitsForTheKernelsReadingItsBlock) {
  SKIP_WITHOUT_GPU();
  auto gpu = Backend::Create(Gpu());
  ASSERT_OK(gpu.status());
  Backend& G = **gpu;
  constexpr int64_t kFloats = int64_t{1} << 20;  // one staging slot's 4 MiB
  Tensor a = G.Empty({kFloats});
  Tensor b = G.Zeros({kFloats});
  G.Fill(a, 1.0f);
  for (int i = 0; i < 500; ++i) G.Add(a, b);  // queued: reads `a` 500 times
  a = Tensor();  // its block goes back to the cache with the adds still queued
  // 30 slots' worth grows the ring to its most: new slots take cached blocks.
  std::vector<float> host(30 * kFloats, -7.0f);
  Tensor big = G.Empty({30 * kFloats});
  G.CopyFromHost(host.data(), big);
  std::vector<float> sums(kFloats), copied(30 * kFloats);
  G.CopyToHost(b, sums.data());
  G.CopyToHost(big, copied.data());
  for (int64_t i = 0; i < kFloats; i += 997) ASSERT_EQ(sums[i], 500.0f) << i;
  for (int64_t i = 0; i < 30 * kFloats; i += 9973) ASSERT_EQ(copied[i], -7.0f) << i;
}

// CopyPeer between two backends of the same GPU (as --gpus 0,0 makes them):
// the copy follows the source's earlier work, and the source's later work
// (here a fill that overwrites it at once) waits for the copy, which the
// destination's queue holds back behind 300 additions. Found by review: the
// second order was not kept.
TEST(GpuBackendTest, CopyPeerFollowsTheSourcesEarlierWorkAndPrecedesItsLater) {
  SKIP_WITHOUT_GPU();
  auto first = Backend::Create(Gpu());
  auto second = Backend::Create(Gpu());
  ASSERT_OK(first.status());
  ASSERT_OK(second.status());
  Backend& A = **first;
  Backend& B = **second;
  constexpr int64_t kFloats = int64_t{4} << 20;
  Tensor busy = B.Zeros({kFloats}), ones = B.Empty({kFloats});
  B.Fill(ones, 1.0f);
  for (int i = 0; i < 300; ++i) B.Add(ones, busy);  // B's stream is busy a while
  Tensor src = A.Empty({kFloats});
  A.Fill(src, 2.0f);
  Tensor dst = B.Empty({kFloats});
  B.CopyPeer(A, src, dst);
  A.Fill(src, 5.0f);  // must not reach the copy
  std::vector<float> got(kFloats), sums(kFloats), left(kFloats);
  B.CopyToHost(dst, got.data());
  B.CopyToHost(busy, sums.data());
  A.CopyToHost(src, left.data());
  for (int64_t i = 0; i < kFloats; i += 4093) {
    ASSERT_EQ(got[i], 2.0f) << i;
    ASSERT_EQ(sums[i], 300.0f) << i;
    ASSERT_EQ(left[i], 5.0f) << i;
  }
}

ModelOptions SmallModel(const std::string& name) {
  ModelOptions mo;
  mo.name = name;
  if (name == "resnet") {
    mo.num_layers = 8;
    mo.image_shape = Shape{3, 12, 12};
  }
  if (name == "inception-bn-28-small") mo.image_shape = Shape{3, 16, 16};
  // The ImageNet networks on small inputs, 2x2 before their global pool
  // (a batch norm there normalises over 12 values of the batch of 3).
  if (name == "inception-bn") mo.image_shape = Shape{3, 64, 64};
  if (name == "inception-v3") mo.image_shape = Shape{3, 107, 107};
  if (name == "inception-bn" || name == "inception-v3") mo.num_classes = 10;
  return mo;
}

std::unique_ptr<Executor> MakeExecutor(const Graph& g, const BackendOptions& b, int batch) {
  ExecutorOptions o;
  o.batch_size = batch;
  o.backend = b;
  auto made = Executor::Create(g, o);
  CHECK(made.ok()) << made.status();
  InitializeParams(*InitializerSpec::Parse("xavier(gaussian,in,2)"), 3, made->get());
  return std::move(made).value();
}

// A whole training step of each model on both devices: output, loss, every
// gradient and aux state must agree.
class GpuModelTest : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuModelTest, OneTrainingStepMatchesTheCpu) {
  SKIP_WITHOUT_GPU();
  StatusOr<Graph> g = BuildModel(SmallModel(GetParam()));
  ASSERT_OK(g.status());
  constexpr int kBatch = 3;
  BackendOptions cpu;
  cpu.cpu_kernels = CpuKernels::kReference;
  cpu.num_threads = 1;
  std::unique_ptr<Executor> e[2] = {MakeExecutor(*g, Gpu(), kBatch), MakeExecutor(*g, cpu, kBatch)};
  std::vector<float> data(static_cast<size_t>(e[1]->data().num_elements()));
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(0, 1);
  for (float& x : data) x = u(rng);
  const std::vector<float> label = {0, 1, 2};
  std::vector<std::vector<float>> out(2), grad(2);
  auto close = [](const std::vector<float>& a, const std::vector<float>& b, const std::string& w) {
    ASSERT_EQ(a.size(), b.size()) << w;
    EXPECT_LT(RelMaxDiff(a, b, 1e-3), 1e-3) << w;
  };
  // Dropout draws its masks from each backend's own generator, so a training
  // step of a model with dropout cannot agree element by element (the op test
  // checks the GPU's dropout against its definition). Such a model is
  // compared in inference, where dropout passes its input through, and its
  // training step must give finite gradients; the other models cover every
  // other operator's training step.
  bool has_dropout = false;
  for (const Node& n : g->nodes()) has_dropout |= n.op == OpType::kDropout;
  for (int k = 0; k < 2; ++k) {
    ASSERT_OK(e[k]->LoadData(data.data(), data.size()));
    ASSERT_OK(e[k]->LoadLabel(label.data(), label.size()));
    e[k]->Forward(!has_dropout);
    if (!has_dropout) e[k]->Backward();
    out[k].resize(static_cast<size_t>(e[k]->output().num_elements()));
    ASSERT_OK(e[k]->ReadOutput(out[k].data(), out[k].size()));
  }
  close(out[0], out[1], "output");
  if (has_dropout) {
    e[0]->Forward(true);
    e[0]->Backward();
    for (int p = 0; p < e[0]->num_params(); ++p) {
      grad[0].resize(static_cast<size_t>(e[0]->param(p).num_elements()));
      ASSERT_OK(e[0]->ReadGrad(p, grad[0].data(), grad[0].size()));
      double norm = 0;
      for (float x : grad[0]) norm += double(x) * x;
      EXPECT_TRUE(std::isfinite(norm) && norm > 0) << g->params()[p].name << ": " << norm;
    }
    return;
  }
  EXPECT_NEAR(e[0]->Loss(), e[1]->Loss(), 1e-3);
  // Each gradient is compared relative to its largest element (at least
  // 1e-3), a bias's relative to its layer's largest: a bias whose layer feeds
  // a batch norm (neon's fc1) has a gradient that is zero but for rounding,
  // the sum of its layer's output gradients cancelling, and both backends'
  // rounding is of the size of those terms, which the layer's weight
  // gradient shows.
  const int num_params = e[0]->num_params();
  std::vector<std::vector<float>> grads[2];
  std::map<NodeId, double> layer_scale;
  for (int k = 0; k < 2; ++k) {
    for (int p = 0; p < num_params; ++p) {
      std::vector<float>& gr = grads[k].emplace_back(e[k]->param(p).num_elements());
      ASSERT_OK(e[k]->ReadGrad(p, gr.data(), gr.size()));
      double& scale = layer_scale[g->params()[p].node];
      for (float x : gr) scale = std::max(scale, double{std::fabs(x)});
    }
  }
  for (int p = 0; p < num_params; ++p) {
    const ParamInfo& info = g->params()[p];
    const double floor =
        info.role == ParamRole::kBias ? std::max(1e-3, layer_scale[info.node]) : 1e-3;
    EXPECT_LT(RelMaxDiff(grads[0][p], grads[1][p], floor), 1e-3) << g->params()[p].name;
  }
  for (int a = 0; a < e[0]->num_aux(); ++a) {
    for (int k = 0; k < 2; ++k) {
      grad[k].resize(static_cast<size_t>(e[k]->aux(a).num_elements()));
      ASSERT_OK(e[k]->ReadAux(a, grad[k].data(), grad[k].size()));
    }
    close(grad[0], grad[1], g->aux_states()[a].name);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GpuModelTest,
                         ::testing::Values("mlp", "lenet", "keras-mnist-cnn", "neon-cifar10-conv",
                                           "resnet", "inception-bn-28-small", "inception-bn",
                                           "inception-v3"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

// One training step of `graph` on `a` and on `b` from the same random batch:
// the losses within `loss_tol` (relative to max(1, |loss|)), each parameter's
// gradient within `grad_tol` of its largest element (at least 1e-3).
void ExpectStepsAgree(const Graph& graph, Executor* a, Executor* b, double loss_tol,
                      double grad_tol) {
  std::vector<float> data(static_cast<size_t>(a->data().num_elements()));
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<float> u(0, 1);
  for (float& x : data) x = u(rng);
  std::vector<float> label(static_cast<size_t>(a->data().shape()[0]));
  for (size_t n = 0; n < label.size(); ++n) label[n] = static_cast<float>(n % 10);
  for (Executor* ex : {a, b}) {
    ASSERT_OK(ex->LoadData(data.data(), data.size()));
    ASSERT_OK(ex->LoadLabel(label.data(), label.size()));
    ex->Forward(true);
    ex->Backward();
  }
  EXPECT_NEAR(a->Loss(), b->Loss(), loss_tol * std::max(1.0f, std::fabs(b->Loss())));
  for (int p = 0; p < a->num_params(); ++p) {
    std::vector<float> grad[2];
    Executor* ex[2] = {a, b};
    for (int k = 0; k < 2; ++k) {
      grad[k].resize(static_cast<size_t>(ex[k]->param(p).num_elements()));
      ASSERT_OK(ex[k]->ReadGrad(p, grad[k].data(), grad[k].size()));
    }
    EXPECT_LT(RelMaxDiff(grad[0], grad[1], 1e-3), grad_tol) << graph.params()[p].name;
  }
}

// TF32 convolutions (the default, as PyTorch's): each direction runs under
// the math its search result was timed with, in the workspace planned for
// it. A training step agrees with full float within TF32's rounding (a
// 10-bit mantissa in the products).
TEST(GpuTrainingTest, Tf32StepFollowsFullFloat) {
  SKIP_WITHOUT_GPU();
  for (const char* model : {"resnet", "inception-bn-28-small"}) {
    SCOPED_TRACE(model);
    StatusOr<Graph> g = BuildModel(SmallModel(model));
    ASSERT_OK(g.status());
    BackendOptions tf32 = Gpu();
    tf32.gpu_tf32 = true;
    std::unique_ptr<Executor> a = MakeExecutor(*g, tf32, 4), b = MakeExecutor(*g, Gpu(), 4);
    // (The option reached each backend; that TF32 changes the numbers shows
    // only within the tolerance below.)
    EXPECT_NE(a->backend().Describe().find("; TF32 convolutions"), std::string::npos)
        << a->backend().Describe();
    EXPECT_NE(b->backend().Describe().find("; full-float convolutions"), std::string::npos)
        << b->backend().Describe();
    ExpectStepsAgree(*g, a.get(), b.get(), 1e-2, 5e-2);
  }
}

// ResNet-20's step with cuDNN's graph engines racing the legacy algorithms
// (BackendOptions::gpu_conv_graph, full float): directions were searched,
// those that write their output all built (the ones adding to an input
// gradient may find no engine), and the step agrees with the legacy-only one.
TEST(GpuTrainingTest, GraphEngineSearchBuildsEveryDirection) {
  SKIP_WITHOUT_GPU();
  StatusOr<Graph> g = BuildModel(SmallModel("resnet"));
  ASSERT_OK(g.status());
  BackendOptions graph = Gpu();
  graph.gpu_conv_graph = true;
  std::unique_ptr<Executor> a = MakeExecutor(*g, graph, 8), b = MakeExecutor(*g, Gpu(), 8);
  const std::string described = a->backend().Describe();
  std::printf("%s\n", described.c_str());
  const GraphSearches n = CountGraphSearches(described);
  ASSERT_GE(n.graph, 0) << described;
  EXPECT_GT(n.graph + n.legacy, 0) << described;
  // ResNet-20 adds to an input gradient at most where a block's input has two
  // readers: 9 blocks, each one convolution's data gradient.
  EXPECT_LE(n.unbuilt, 9) << described;
  ExpectStepsAgree(*g, a.get(), b.get(), 1e-4, 1e-3);
}

// Ten classes of fixed random patterns plus noise: LeNet with momentum SGD,
// the same batches on both devices. The GPU's loss curve must follow the
// CPU's, and the caching allocator must make no device allocation after the
// first step.
TEST(GpuTrainingTest, LenetLossCurveFollowsTheCpuAndTheLoopAllocatesNothing) {
  SKIP_WITHOUT_GPU();
  StatusOr<Graph> g = BuildModel({"lenet", 0, Shape(), 0});
  ASSERT_OK(g.status());
  constexpr int kBatch = 32, kSteps = 40;
  BackendOptions cpu;
  cpu.num_threads = 1;
  std::unique_ptr<Executor> e[2] = {MakeExecutor(*g, Gpu(), kBatch), MakeExecutor(*g, cpu, kBatch)};
  OptimizerConfig oc;
  // 0.01: these inputs are dense (every pixel about +-0.5, unlike MNIST's
  // mostly black digits), and at MNIST's 0.05 the CPU run itself diverges.
  oc.set_learning_rate(0.01f);
  oc.set_momentum(0.9f);
  oc.set_wd(1e-4f);
  oc.set_rescale_grad(1.0f / kBatch);
  std::unique_ptr<Optimizer> opt[2];
  std::vector<ParamState> state[2];
  std::vector<Tensor> mom[2];
  for (int k = 0; k < 2; ++k) {
    opt[k] = std::move(Optimizer::Create(oc)).value();
    state[k].resize(e[k]->num_params());
    for (int p = 0; p < e[k]->num_params(); ++p) {
      mom[k].push_back(e[k]->backend().Zeros(e[k]->param(p).shape()));
    }
  }
  std::mt19937_64 rng(9);
  std::vector<std::vector<float>> patterns(10, std::vector<float>(784));
  std::uniform_real_distribution<float> u(-0.5f, 0.5f);
  for (auto& p : patterns) {
    for (float& x : p) x = u(rng);
  }
  std::normal_distribution<float> noise(0, 0.3f);
  std::vector<float> data(kBatch * 784), label(kBatch);
  double loss[2][kSteps];
  size_t reserved_after_first_step = 0;
  for (int step = 0; step < kSteps; ++step) {
    for (int n = 0; n < kBatch; ++n) {
      const int c = static_cast<int>(rng() % 10);
      label[n] = static_cast<float>(c);
      for (int i = 0; i < 784; ++i) data[n * 784 + i] = patterns[c][i] + noise(rng);
    }
    for (int k = 0; k < 2; ++k) {
      ASSERT_OK(e[k]->LoadData(data.data(), data.size()));
      ASSERT_OK(e[k]->LoadLabel(label.data(), label.size()));
      e[k]->Forward(true);
      e[k]->Backward();
      for (int p = 0; p < e[k]->num_params(); ++p) {
        e[k]->backend().ApplyOptimizerStep(opt[k]->NextStep(&state[k][p]), e[k]->grad(p),
                                           e[k]->param(p), mom[k][p]);
      }
      loss[k][step] = e[k]->Loss();
    }
    if (step == 0) reserved_after_first_step = e[0]->backend().memory_stats().reserved;
  }
  EXPECT_GT(loss[1][0], 1.5);
  EXPECT_LT(loss[1][kSteps - 1], 0.3);
  for (int step = 0; step < kSteps; ++step) {
    EXPECT_NEAR(loss[0][step], loss[1][step], 0.02 + 0.02 * loss[1][step]) << "step " << step;
  }
  EXPECT_EQ(e[0]->backend().memory_stats().reserved, reserved_after_first_step)
      << "the step loop took more device memory after the first step";
}

// `--kv-store local` and `device` on one GPU: LocalParamSync keeps the
// momentum on the device, allocated by Init (so a GPU too small for it says
// so before training) and not at the first update; it saves and loads
// through the host, and without momentum it allocates nothing.
TEST(GpuTrainingTest, TheLocalSyncsMomentumIsOnTheDeviceFromInit) {
  SKIP_WITHOUT_GPU();
  StatusOr<Graph> g = BuildModel({"lenet", 0, Shape(), 0});
  ASSERT_OK(g.status());
  constexpr int kBatch = 16;
  std::unique_ptr<Executor> e[2] = {MakeExecutor(*g, Gpu(), kBatch),
                                    MakeExecutor(*g, Gpu(), kBatch)};
  size_t param_bytes = 0;
  for (int p = 0; p < e[0]->num_params(); ++p) {
    param_bytes += static_cast<size_t>(e[0]->param(p).num_elements()) * sizeof(float);
  }
  OptimizerConfig oc;
  oc.set_learning_rate(0.05f);
  oc.set_momentum(0.9f);
  oc.set_rescale_grad(1.0f / kBatch);
  auto sync = LocalParamSync::Create(oc);
  ASSERT_OK(sync.status());
  const size_t before = e[0]->backend().memory_stats().in_use;
  ASSERT_OK((*sync)->Init(e[0].get()));
  const size_t after_init = e[0]->backend().memory_stats().in_use;
  EXPECT_GE(after_init - before, param_bytes) << "Init allocates the momentum on the GPU";
  for (const NamedArray& a : (*sync)->SaveState()) {
    EXPECT_TRUE(std::all_of(a.data.begin(), a.data.end(), [](float v) { return v == 0.0f; }))
        << a.name << ": the momentum starts at zero";
  }

  e[0]->SetGradReadyCallback([&sync](int i) { (*sync)->OnGradReady(i); });
  std::mt19937_64 rng(6);
  std::uniform_real_distribution<float> u(0, 1);
  std::vector<float> data(kBatch * 784), label(kBatch);
  for (int step = 0; step < 2; ++step) {
    for (float& x : data) x = u(rng);
    for (float& l : label) l = static_cast<float>(rng() % 10);
    ASSERT_OK(e[0]->LoadData(data.data(), data.size()));
    ASSERT_OK(e[0]->LoadLabel(label.data(), label.size()));
    e[0]->Forward(true);
    e[0]->Backward();
  }
  ASSERT_OK((*sync)->TakeError());
  const std::vector<NamedArray> saved = (*sync)->SaveState();
  ASSERT_EQ(saved.size(), static_cast<size_t>(e[0]->num_params()));
  for (const NamedArray& a : saved) {
    double sum = 0;
    for (float v : a.data) sum += std::fabs(v);
    EXPECT_GT(sum, 0) << a.name << ": two momentum updates left it zero";
  }

  // Loaded into another GPU executor's sync, saved again: the same values.
  auto restored = LocalParamSync::Create(oc);
  ASSERT_OK(restored.status());
  ASSERT_OK((*restored)->Init(e[1].get()));
  ASSERT_OK((*restored)->LoadState(saved));
  const std::vector<NamedArray> again = (*restored)->SaveState();
  ASSERT_EQ(again.size(), saved.size());
  for (size_t i = 0; i < saved.size(); ++i) {
    EXPECT_EQ(again[i].name, saved[i].name);
    EXPECT_EQ(again[i].data, saved[i].data) << saved[i].name;
  }

  // Plain SGD keeps no state.
  oc.set_momentum(0.0f);
  auto plain = LocalParamSync::Create(oc);
  ASSERT_OK(plain.status());
  const size_t before_plain = e[1]->backend().memory_stats().in_use;
  ASSERT_OK((*plain)->Init(e[1].get()));
  EXPECT_EQ(e[1]->backend().memory_stats().in_use, before_plain);
  EXPECT_TRUE((*plain)->SaveState().empty());
}

// cuDNN's workspaces are the convolutions' scratch, placed in the executor's
// arena for their own step: at a batch where the chosen algorithms want
// workspace, a planned step gives what an unplanned one (every tensor and
// workspace apart) gives, and the device holds no workspace besides the plan.
TEST(GpuTrainingTest, ConvolutionWorkspacesShareTheArena) {
  SKIP_WITHOUT_GPU();
  ModelOptions mo;
  mo.name = "resnet";
  mo.num_layers = 20;
  mo.image_shape = Shape{3, 28, 28};
  StatusOr<Graph> g = BuildModel(mo);
  ASSERT_OK(g.status());
  constexpr int kBatch = 64;
  std::unique_ptr<Executor> e[2];
  for (int k = 0; k < 2; ++k) {
    ExecutorOptions o;
    o.batch_size = kBatch;
    o.backend = Gpu();
    o.plan_memory = k == 0;
    auto made = Executor::Create(*g, o);
    ASSERT_OK(made.status());
    e[k] = std::move(made).value();
    InitializeParams(*InitializerSpec::Parse("xavier(gaussian,in,2)"), 3, e[k].get());
  }
  std::printf("workspace: largest %zu bytes, all %zu; arena %zu bytes planned, %zu unplanned\n",
              e[0]->largest_scratch_bytes(), e[0]->total_scratch_bytes(), e[0]->planned_bytes(),
              e[1]->planned_bytes());
  if (e[0]->largest_scratch_bytes() == 0) {
    GTEST_SKIP() << "no chosen algorithm wants workspace at batch " << kBatch
                 << " on this GPU: nothing to place";
  }
  EXPECT_LT(e[0]->planned_bytes(), e[1]->planned_bytes());
  // The plan made without the device (Executor::PlanWithoutDevice) is this
  // one less the workspaces: one runs at a time (its node's step), so they
  // raise the lifetimes' least bound by the largest at most (256-byte
  // alignment aside).
  auto dry = Executor::PlanWithoutDevice(*g, e[0]->options());
  ASSERT_OK(dry.status());
  // (The least bound of the lifetimes: greedy placement is not monotone.)
  EXPECT_GE(e[0]->least_planned_bytes(), dry->least_planned_bytes);
  EXPECT_LE(e[0]->least_planned_bytes(),
            dry->least_planned_bytes + e[0]->largest_scratch_bytes() + 4096);
  EXPECT_EQ(e[0]->gradients_added_in_place(), dry->gradients_added_in_place);
  EXPECT_EQ(e[0]->gradients_summed_from_temporaries(), 0);
  std::vector<float> data(static_cast<size_t>(e[0]->data().num_elements()));
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> u(0, 1);
  for (float& x : data) x = u(rng);
  std::vector<float> label(kBatch);
  for (int n = 0; n < kBatch; ++n) label[n] = static_cast<float>(n % 10);
  std::vector<float> grad[2];
  for (int k = 0; k < 2; ++k) {
    ASSERT_OK(e[k]->LoadData(data.data(), data.size()));
    ASSERT_OK(e[k]->LoadLabel(label.data(), label.size()));
    e[k]->Forward(true);
    e[k]->Backward();
  }
  EXPECT_NEAR(e[0]->Loss(), e[1]->Loss(), 1e-4);
  for (int p = 0; p < e[0]->num_params(); ++p) {
    for (int k = 0; k < 2; ++k) {
      grad[k].resize(static_cast<size_t>(e[k]->param(p).num_elements()));
      ASSERT_OK(e[k]->ReadGrad(p, grad[k].data(), grad[k].size()));
    }
    EXPECT_LT(RelMaxDiff(grad[0], grad[1], 1e-3), 1e-3) << g->params()[p].name;
  }
  // What the planned executor's device holds: the arena, parameters and
  // their gradients, aux states, the batch, the label, the backend's staging
  // buffers (4 x 4 MiB) and the operators' own small state (batch norm's
  // saved statistics, the loss): a workspace held outside the plan would
  // show here.
  size_t tensors = e[0]->planned_bytes() + e[0]->data().bytes() + e[0]->label().bytes();
  for (int p = 0; p < e[0]->num_params(); ++p) tensors += 2 * e[0]->param(p).bytes();
  for (int a = 0; a < e[0]->num_aux(); ++a) tensors += e[0]->aux(a).bytes();
  EXPECT_LE(e[0]->backend().memory_stats().peak, tensors + (size_t{24} << 20));
}

// Issue 11's check on one physical GPU: the same GPU listed twice (two
// backends, two streams, two executors on half the batch each) gives the
// parameters one listing gives after a few momentum-SGD steps, for the local
// (CPU) and the device (first GPU, peer copies) merge, and every device ends
// with the merged weights.
class GpuGroupTest : public ::testing::TestWithParam<MergeDevice> {};

TEST_P(GpuGroupTest, TheSameGpuTwiceTrainsLikeOnce) {
  SKIP_WITHOUT_GPU();
  StatusOr<Graph> g = BuildModel({"lenet", 0, Shape(), 0});
  ASSERT_OK(g.status());
  auto make = [&](int copies, std::vector<double> weights) {
    DeviceGroupOptions o;
    o.batch_size = 16;
    o.devices.assign(copies, Gpu());
    o.weights = std::move(weights);
    o.merge = GetParam();
    auto made = DeviceGroup::Create(*g, o);
    CHECK(made.ok()) << made.status();
    InitializeParams(*InitializerSpec::Parse("xavier(gaussian,in,2)"), 3, made->get());
    return std::move(made).value();
  };
  std::unique_ptr<DeviceGroup> groups[3] = {make(1, {}), make(2, {}), make(3, {2, 1, 1})};
  OptimizerConfig oc;
  oc.set_learning_rate(0.05f);
  oc.set_momentum(0.9f);
  oc.set_rescale_grad(1.0f / 16);
  std::unique_ptr<Optimizer> opt[3];
  std::vector<ParamState> state[3];
  std::vector<Tensor> mom[3];
  for (int k = 0; k < 3; ++k) {
    opt[k] = std::move(Optimizer::Create(oc)).value();
    state[k].resize(groups[k]->num_params());
    mom[k].resize(groups[k]->num_params());
    DeviceGroup* grp = groups[k].get();
    grp->SetGradReadyCallback([&, k, grp](int i) {
      if (!mom[k][i].defined()) mom[k][i] = grp->backend().Zeros(grp->param(i).shape());
      grp->backend().ApplyOptimizerStep(opt[k]->NextStep(&state[k][i]), grp->grad(i), grp->param(i),
                                        mom[k][i]);
    });
  }
  std::mt19937_64 rng(4);
  std::uniform_real_distribution<float> u(0, 1);
  std::vector<float> data(16 * 784), label(16);
  for (int step = 0; step < 4; ++step) {
    for (float& x : data) x = u(rng);
    for (float& l : label) l = static_cast<float>(rng() % 10);
    for (auto& grp : groups) {
      ASSERT_OK(grp->LoadData(data.data(), data.size()));
      ASSERT_OK(grp->LoadLabel(label.data(), label.size()));
      grp->Forward(true);
      grp->Backward();
    }
  }
  for (auto& grp : groups) grp->Forward(false);  // hands the devices the last update
  for (int p = 0; p < groups[0]->num_params(); ++p) {
    std::vector<float> want(static_cast<size_t>(groups[0]->param(p).num_elements()));
    ASSERT_OK(groups[0]->ReadParam(p, want.data(), want.size()));
    for (int k = 1; k < 3; ++k) {
      for (int d = 0; d < groups[k]->num_devices(); ++d) {
        std::vector<float> got(want.size());
        ASSERT_OK(groups[k]->executor(d).ReadParam(p, got.data(), got.size()));
        EXPECT_LT(RelMaxDiff(got, want, 1e-3), 1e-4)
            << k + 1 << " listings, device " << d << ", " << g->params()[p].name;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Merges, GpuGroupTest,
                         ::testing::Values(MergeDevice::kLocal, MergeDevice::kDevice),
                         [](const ::testing::TestParamInfo<MergeDevice>& info) {
                           return info.param == MergeDevice::kLocal ? std::string("local")
                                                                    : std::string("device");
                         });

// Device memory and pinned host memory past what the machine has are
// ResourceExhausted errors, and the backend works on after them (a failed
// cudaMalloc or cudaHostAlloc leaves no sticky error behind).
TEST(GpuBackendTest, MemoryPastWhatFitsIsResourceExhausted) {
  SKIP_WITHOUT_GPU();
  auto made = Backend::Create(Gpu());
  ASSERT_OK(made.status());
  Backend& G = **made;
  const size_t past_any_machine = size_t{1} << 44;  // floats: 64 TiB
  for (const Status& s :
       {G.TryAllocate(past_any_machine).status(), G.TryAllocatePinned(past_any_machine).status()}) {
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
  }
  const std::vector<float> want = {1, 2, 3, 4};
  Tensor t = G.Empty({4});
  G.CopyFromHost(want.data(), t);
  std::shared_ptr<Buffer> pinned = G.AllocatePinned(4);
  G.CopyToHost(t, pinned->data());
  EXPECT_EQ(std::vector<float>(pinned->data(), pinned->data() + 4), want);
}

// A copy from the host far larger than the staging ring's cap (32 slots of
// 4 MiB) goes through the ring chunk by chunk: the data arrive whole, and
// the device memory the ring holds stays bounded by the cap.
TEST(GpuBackendTest, LargeHostCopiesGoThroughACappedStagingRing) {
  SKIP_WITHOUT_GPU();
  auto made = Backend::Create(Gpu());
  ASSERT_OK(made.status());
  Backend& G = **made;
  const int64_t n = (int64_t{200} << 20) / 4 + 5;  // 200 MiB and a bit: 51 chunks
  std::vector<float> src(n);
  for (int64_t i = 0; i < n; ++i) src[i] = static_cast<float>(i % 100003);
  Tensor t = G.Empty({n});
  const size_t before = G.memory_stats().reserved;
  for (int round = 0; round < 2; ++round) {
    G.CopyFromHost(src.data(), t);
    std::vector<float> back(n);
    G.CopyToHost(t, back.data());
    ASSERT_EQ(back, src) << "round " << round;
  }
  const size_t ring_cap = size_t{32} << 22;
  EXPECT_LE(G.memory_stats().reserved - before, ring_cap) << "the staging ring grew past its cap";
}

// A fence whose work is still running when its deadline passes is
// DeadlineExceeded naming the device (what a hung device looks like to the
// merge and push threads), and waiting again with time to spare succeeds.
// The device is kept busy for far longer than the deadline with queued
// additions of a 1 GiB tensor (each reads and writes 3 GiB).
TEST(GpuBackendTest, AFenceWaitThatOutlivesItsDeadlineIsDeadlineExceeded) {
  SKIP_WITHOUT_GPU();
  auto made = Backend::Create(Gpu());
  ASSERT_OK(made.status());
  Backend& G = **made;
  const int64_t n = int64_t{1} << 28;
  Tensor a = G.Empty({n}), b = G.Empty({n});
  G.Fill(a, 1.0f);
  G.Fill(b, 0.0f);
  constexpr int kAdds = 500;  // half a second or more on an H100
  for (int i = 0; i < kAdds; ++i) G.Add(a, b);
  std::unique_ptr<Fence> f = G.RecordFence();
  const Status late = f->Wait(Deadline::In(std::chrono::milliseconds(1)));
  EXPECT_EQ(late.code(), StatusCode::kDeadlineExceeded) << late;
  EXPECT_NE(late.message().find("gpu(0)"), std::string::npos) << late;
  ASSERT_OK(f->Wait(Deadline::In(kDeviceWaitTimeout)));
  EXPECT_TRUE(f->Done());
  // The polled waits (Synchronize, a copy to the host) see the whole queue.
  for (int i = 0; i < kAdds; ++i) G.Add(a, b);
  G.Synchronize();
  float last = 0;
  G.CopyToHost(b.Slice(n - 1, n), &last);
  EXPECT_EQ(last, 2.0f * kAdds);
}

TEST(GpuBackendTest, AGpuThatIsNotThereIsAnErrorNamingIt) {
  SKIP_WITHOUT_GPU();
  BackendOptions o = Gpu();
  o.device = Device::Gpu(GpuCount(nullptr));
  auto b = Backend::Create(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find(o.device.ToString()), std::string::npos) << b.status();
}

}  // namespace
}  // namespace pstrain::testing
