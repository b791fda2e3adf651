// The executor on whole graphs: a DAG with concat, add and a tensor read by
// several consumers, gradient-ready order, memory planning, parameter access,
// and a short training run that must learn.
#include "nn/executor.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "models/models.h"
#include "nn/initializer.h"
#include "tests/test_util.h"
#include "tests/unit/nn/op_harness.h"

namespace pstrain {
namespace {

// data -> conv -> {sigmoid -> conv_a, avgpool(s1,p1) -> conv_b} -> concat
//      -> add(concat, conv_c(data)) -> bn -> tanh -> fc -> softmax
// conv's output feeds two branches and data feeds two convolutions. Smooth
// operators only, so finite differences through the whole graph are exact to
// O(h^2) (a kink of relu or max pooling anywhere would break that).
Graph DagGraph() {
  Graph g;
  NodeId x = g.Input("data", {2, 6, 6});
  ConvParam c3;
  c3.num_filter = 3;
  c3.kernel_h = c3.kernel_w = 3;
  c3.pad_h = c3.pad_w = 1;
  NodeId conv = g.Convolution("conv", x, c3);
  NodeId a = g.Convolution("conv_a", g.Activation("sigmoid", conv, ActType::kSigmoid), c3);
  PoolParam pp;
  pp.type = PoolType::kAvg;
  pp.kernel_h = pp.kernel_w = 3;
  pp.pad_h = pp.pad_w = 1;
  NodeId b = g.Convolution("conv_b", g.Pooling("pool", conv, pp), c3);
  NodeId cat = g.Concat("concat", {a, b});
  ConvParam c6 = c3;
  c6.num_filter = 6;
  NodeId sum = g.Add("add", {cat, g.Convolution("conv_c", x, c6)});
  NodeId bn = g.BatchNorm("bn", sum, {1e-5f, 0.9f, false});
  NodeId fc = g.FullyConnected("fc", g.Activation("tanh", bn, ActType::kTanh), {4, false});
  g.SoftmaxOutput("softmax", fc);
  return g;
}

std::unique_ptr<Executor> MakeExec(const Graph& g, CpuKernels k, bool plan, int batch = 4,
                                   bool train = true) {
  ExecutorOptions o;
  o.batch_size = batch;
  o.backend.cpu_kernels = k;
  o.plan_memory = plan;
  o.for_training = train;
  o.backend.num_threads = 1;  // tiny tensors: threads would only add barrier waits
  auto e = Executor::Create(g, o);
  CHECK(e.ok()) << e.status();
  InitializeParams(*InitializerSpec::Parse("xavier(gaussian,in,2)"), 5, e->get());
  std::mt19937_64 rng(11);
  testing::FillUniform(e.value()->data(), &rng, -1, 1);
  if (train) {
    Tensor l = e.value()->label();
    for (int64_t i = 0; i < l.num_elements(); ++i) l.data()[i] = static_cast<float>(i % 4);
  }
  return std::move(e).value();
}

// Sum over the batch of the cross-entropy, as Backward differentiates it.
double TotalLoss(Executor* e) {
  e->Forward(true);
  return e->Loss() * e->options().batch_size;
}

class ExecutorKernelsTest : public ::testing::TestWithParam<CpuKernels> {};

TEST_P(ExecutorKernelsTest, DagGradientsMatchFiniteDifferences) {
  Graph g = DagGraph();
  ASSERT_OK(g.status());
  auto e = MakeExec(g, GetParam(), true);
  e->Forward(true);
  e->Backward();
  std::mt19937 pick(3);
  for (int p = 0; p < e->num_params(); ++p) {
    const Tensor w = e->param(p);
    std::vector<float> grad(e->grad(p).data(), e->grad(p).data() + w.num_elements());
    for (int k = 0; k < 6; ++k) {
      const int64_t i = std::uniform_int_distribution<int64_t>(0, w.num_elements() - 1)(pick);
      const float saved = w.data()[i];
      const float h = 1e-2f;
      w.data()[i] = saved + h;
      const double plus = TotalLoss(e.get());
      w.data()[i] = saved - h;
      const double minus = TotalLoss(e.get());
      w.data()[i] = saved;
      const double numeric = (plus - minus) / (2 * h);
      const double scale = std::max({std::fabs(numeric), std::fabs(double(grad[i])), 1.0});
      EXPECT_NEAR(grad[i], numeric, 1e-2 * scale) << g.params()[p].name << "[" << i << "]";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Kernels, ExecutorKernelsTest,
                         ::testing::Values(CpuKernels::kReference, CpuKernels::kOneDnn));

// (The reference kernels add the sigmoid's input gradient to what the
// pooling wrote; oneDNN's activation writes a temporary that is summed in.
// Either way the sum is the same float sum.)
TEST_P(ExecutorKernelsTest, PlannedMemoryGivesTheSameResultsWithLessMemory) {
  Graph g = DagGraph();
  auto planned = MakeExec(g, GetParam(), true);
  auto separate = MakeExec(g, GetParam(), false);
  EXPECT_LT(planned->planned_bytes(), separate->planned_bytes());
  EXPECT_EQ(separate->planned_bytes(), separate->unplanned_bytes());
  // conv's output has two readers: the sigmoid's gradient edge is the extra one.
  EXPECT_EQ(planned->gradients_added_in_place() + planned->gradients_summed_from_temporaries(), 1);
  EXPECT_EQ(planned->gradients_added_in_place(), GetParam() == CpuKernels::kReference ? 1 : 0);
  EXPECT_EQ(separate->gradients_added_in_place(), 0);
  EXPECT_EQ(separate->gradients_summed_from_temporaries(), 1);
  for (auto* e : {planned.get(), separate.get()}) {
    e->Forward(true);
    e->Backward();
  }
  for (int64_t i = 0; i < planned->output().num_elements(); ++i) {
    ASSERT_EQ(planned->output().at(i), separate->output().at(i));
  }
  for (int p = 0; p < planned->num_params(); ++p) {
    for (int64_t i = 0; i < planned->grad(p).num_elements(); ++i) {
      ASSERT_EQ(planned->grad(p).at(i), separate->grad(p).at(i)) << g.params()[p].name;
    }
  }
}

// The convolutions' scratch (oneDNN's scratchpads here, cuDNN's workspaces
// on a GPU) shares the arena with the tensors: placed for its own step only,
// it must not overlap anything alive then, so sharing changes no result.
TEST(ExecutorTest, ScratchSharesTheArenaWithoutChangingResults) {
  StatusOr<Graph> g = BuildModel({"lenet", 0, Shape(), 0});
  ASSERT_OK(g.status());
  auto exec = [&](bool plan) {
    ExecutorOptions o;
    o.batch_size = 64;
    o.plan_memory = plan;
    o.backend.num_threads = 2;
    auto e = Executor::Create(*g, o);
    CHECK(e.ok()) << e.status();
    InitializeParams(*InitializerSpec::Parse("xavier(gaussian,in,2)"), 5, e->get());
    std::mt19937_64 rng(11);
    testing::FillUniform(e.value()->data(), &rng, -1, 1);
    Tensor l = e.value()->label();
    for (int64_t i = 0; i < l.num_elements(); ++i) l.data()[i] = static_cast<float>(i % 10);
    return std::move(e).value();
  };
  auto planned = exec(true);
  auto separate = exec(false);
  if (planned->total_scratch_bytes() == 0) GTEST_SKIP() << "oneDNN's kernels need no scratchpad";
  EXPECT_EQ(planned->total_scratch_bytes(), separate->total_scratch_bytes());
  EXPECT_LE(planned->largest_scratch_bytes(), planned->total_scratch_bytes());
  // One buffer per tensor holds every scratch too; the plan holds less than
  // that and than the tensors plus one shared workspace.
  EXPECT_EQ(separate->planned_bytes(), separate->unplanned_bytes());
  EXPECT_GE(separate->unplanned_bytes(), separate->total_scratch_bytes());
  EXPECT_LT(planned->planned_bytes(), separate->planned_bytes());
  for (int step = 0; step < 2; ++step) {
    for (auto* e : {planned.get(), separate.get()}) {
      e->Forward(true);
      e->Backward();
    }
    for (int64_t i = 0; i < planned->output().num_elements(); ++i) {
      ASSERT_EQ(planned->output().at(i), separate->output().at(i)) << "step " << step;
    }
    for (int p = 0; p < planned->num_params(); ++p) {
      for (int64_t i = 0; i < planned->grad(p).num_elements(); ++i) {
        ASSERT_EQ(planned->grad(p).at(i), separate->grad(p).at(i)) << g->params()[p].name;
      }
    }
  }
}

// The plan made without the device is the plan an executor makes (the
// reference kernels have no scratch, which the dry run leaves out).
TEST(ExecutorTest, PlanWithoutTheDeviceIsTheExecutorsPlan) {
  StatusOr<Graph> lenet = BuildModel({"lenet", 0, Shape(), 0});
  ASSERT_OK(lenet.status());
  Graph dag = DagGraph();
  for (const Graph* g : {&*lenet, &dag}) {
    for (bool train : {true, false}) {
      auto e = MakeExec(*g, CpuKernels::kReference, true, 16, train);
      auto plan = Executor::PlanWithoutDevice(*g, e->options());
      ASSERT_OK(plan.status());
      EXPECT_EQ(plan->planned_bytes, e->planned_bytes());
      EXPECT_EQ(plan->least_planned_bytes, e->least_planned_bytes());
      EXPECT_EQ(plan->unplanned_bytes, e->unplanned_bytes());
      EXPECT_EQ(plan->gradients_added_in_place, e->gradients_added_in_place());
      EXPECT_EQ(plan->gradients_summed_from_temporaries, e->gradients_summed_from_temporaries());
    }
  }
}

// A GPU's plan, made on a host without one from the CUDA module's operators
// (skips where the build or host has no CUDA module): ResNet-50 at batch 32,
// bench/RESULTS.md's row. Each batch norm + ReLU pair keeps one tensor (the
// ReLU runs in place), every gradient of a tensor with several readers is
// added where it lies, and the plan meets the bound of its lifetimes. The
// whole plan stays under what PyTorch's step held on an H100 for the
// activations and workspaces of the same network (2,828 MB peak less 204 MB of
// weights and gradients): the workspaces, left out here, share its gaps.
TEST(ExecutorTest, CudaPlanOfResnet50WithoutAGpu) {
  ModelOptions mo;
  mo.name = "resnet";
  mo.num_layers = 50;
  mo.image_shape = Shape{3, 224, 224};
  mo.num_classes = 1000;
  StatusOr<Graph> g = BuildModel(mo);
  ASSERT_OK(g.status());
  ExecutorOptions o;
  o.batch_size = 32;
  o.backend.device = Device::Gpu(0);
  auto plan = Executor::PlanWithoutDevice(*g, o);
  if (plan.status().code() == StatusCode::kUnavailable ||
      plan.status().code() == StatusCode::kUnimplemented) {
    GTEST_SKIP() << plan.status();
  }
  ASSERT_OK(plan.status());
  EXPECT_EQ(plan->gradients_summed_from_temporaries, 0);
  EXPECT_EQ(plan->gradients_added_in_place, 16);
  EXPECT_LE(plan->planned_bytes, plan->least_planned_bytes * 101 / 100);
  EXPECT_LT(plan->planned_bytes, size_t{2624} * 1000 * 1000);
  // Without in-place operators and sharing it would be more than twice that.
  o.plan_memory = false;
  auto unplanned = Executor::PlanWithoutDevice(*g, o);
  ASSERT_OK(unplanned.status());
  EXPECT_GT(unplanned->planned_bytes, 2 * plan->planned_bytes);
}

// Inception-BN-28-small's CUDA plan at batch 256 (bench/RESULTS.md's slow
// row), made without a GPU: its two downsampling max pools ("full" rounding,
// on our kernels) keep neither their input nor their output for the backward
// (it reads the maxima the forward recorded), its global pool (cuDNN) keeps
// both. That took the plan from 1,112.7 MB to 1,089.4 MB.
TEST(ExecutorTest, CudaPlanOfInceptionBn28SmallWithoutAGpu) {
  ModelOptions mo;
  mo.name = "inception-bn-28-small";
  mo.image_shape = Shape{3, 28, 28};
  StatusOr<Graph> g = BuildModel(mo);
  ASSERT_OK(g.status());
  ExecutorOptions o;
  o.batch_size = 256;
  o.backend.device = Device::Gpu(0);
  auto ops = Backend::CreateOperatorsWithoutDevice(o.backend, *g);
  if (ops.status().code() == StatusCode::kUnavailable ||
      ops.status().code() == StatusCode::kUnimplemented) {
    GTEST_SKIP() << ops.status();
  }
  ASSERT_OK(ops.status());
  int ours = 0, cudnns = 0;
  for (const Node& n : g->nodes()) {
    if (n.op != OpType::kPooling) continue;
    const Operator& op = *(*ops)[n.id];
    SCOPED_TRACE(n.name);
    const bool global = n.pool.global;
    EXPECT_EQ(op.BackwardNeedsInputs(), global);
    EXPECT_EQ(op.BackwardNeedsOutput(), global);
    ++(global ? cudnns : ours);
  }
  EXPECT_EQ(ours, 2);
  EXPECT_EQ(cudnns, 1);
  auto plan = Executor::PlanWithoutDevice(*g, o);
  ASSERT_OK(plan.status());
  EXPECT_LE(plan->planned_bytes, plan->least_planned_bytes * 101 / 100);
  EXPECT_LT(plan->planned_bytes, size_t{1090} * 1000 * 1000);
}

TEST(ExecutorTest, LenetPlanReusesBuffers) {
  StatusOr<Graph> g = BuildModel({"lenet", 0, Shape(), 0});
  ASSERT_OK(g.status());
  auto train = MakeExec(*g, CpuKernels::kOneDnn, true, 32);
  auto infer = MakeExec(*g, CpuKernels::kOneDnn, true, 32, false);
  // (The activations run in place already share their input's storage, so
  // what is left to share is less than it was before they did.)
  EXPECT_LT(train->planned_bytes(), train->unplanned_bytes() * 4 / 5);
  EXPECT_LT(infer->planned_bytes(), infer->unplanned_bytes() * 3 / 4);
  // The bound is what is alive at the busiest step: no plan goes under it,
  // the greedy one stays within a quarter of it, and one buffer per tensor
  // (a plan too) is above it.
  for (auto* e : {train.get(), infer.get()}) {
    EXPECT_GT(e->least_planned_bytes(), 0u);
    EXPECT_LE(e->least_planned_bytes(), e->planned_bytes());
    EXPECT_LT(e->planned_bytes(), e->least_planned_bytes() * 5 / 4);
    EXPECT_LT(e->least_planned_bytes(), e->unplanned_bytes());
  }
}

TEST(ExecutorTest, GradReadyFiresOncePerParamLastLayerFirstWithFinalValues) {
  Graph g = DagGraph();
  auto e = MakeExec(g, CpuKernels::kOneDnn, true);
  std::vector<int> order;
  std::vector<std::vector<float>> at_callback(e->num_params());
  e->SetGradReadyCallback([&](int p) {
    order.push_back(p);
    at_callback[p].assign(e->grad(p).data(), e->grad(p).data() + e->grad(p).num_elements());
  });
  std::vector<int> needed;
  e->SetParamNeededCallback([&](int p) { needed.push_back(p); });
  e->Forward(true);
  e->Backward();
  ASSERT_EQ(static_cast<int>(order.size()), e->num_params());
  EXPECT_EQ(std::set<int>(order.begin(), order.end()).size(), order.size());
  // Owning nodes complete in reverse creation order.
  for (size_t i = 1; i < order.size(); ++i) {
    EXPECT_GE(g.params()[order[i - 1]].node, g.params()[order[i]].node);
  }
  EXPECT_EQ(g.params()[order.front()].name, "fc_weight");
  for (int p = 0; p < e->num_params(); ++p) {
    for (int64_t i = 0; i < e->grad(p).num_elements(); ++i) {
      ASSERT_EQ(at_callback[p][i], e->grad(p).at(i)) << g.params()[p].name;
    }
  }
  std::vector<int> expect(e->num_params());
  for (int p = 0; p < e->num_params(); ++p) expect[p] = p;
  EXPECT_EQ(needed, expect);
}

// A CPU backend's team is the process's OpenMP default whatever the calling
// thread ran before: running nodes sets the thread's OpenMP default to the
// last node's team (1 for a small node), and a backend made after that once
// took it for the default.
TEST(ExecutorTest, CpuTeamIsTheOpenMpDefaultAfterNodesRan) {
  int default_team = 0;
  std::thread([&] { default_team = omp_get_max_threads(); }).join();  // untouched ICV
  const std::string team = StrCat(default_team, default_team == 1 ? " thread)" : " threads)");
  StatusOr<Graph> g = BuildModel({"lenet", 0, Shape(), 0});
  ASSERT_OK(g.status());
  for (int round = 0; round < 2; ++round) {
    ExecutorOptions o;
    o.batch_size = 2;  // every node small: each runs on one thread
    auto e = Executor::Create(*g, o);
    ASSERT_OK(e.status());
    EXPECT_NE((*e)->backend().Describe().find(team), std::string::npos)
        << "round " << round << ": " << (*e)->backend().Describe();
    (*e)->Forward(true);
    (*e)->Backward();
    EXPECT_NE((*e)->backend().Describe().find(team), std::string::npos)
        << "round " << round << ": " << (*e)->backend().Describe();
  }
  ExecutorOptions two;
  two.batch_size = 2;
  two.backend.num_threads = 3;
  auto e = Executor::Create(*g, two);
  ASSERT_OK(e.status());
  EXPECT_NE((*e)->backend().Describe().find("3 threads)"), std::string::npos)
      << (*e)->backend().Describe();
}

TEST(ExecutorTest, ParamAccessChecksIndexAndSize) {
  Graph g = DagGraph();
  auto e = MakeExec(g, CpuKernels::kOneDnn, true);
  std::vector<float> buf(e->param(0).num_elements(), 0.5f);
  ASSERT_OK(e->WriteParam(0, buf.data(), buf.size()));
  std::vector<float> back(buf.size());
  ASSERT_OK(e->ReadParam(0, back.data(), back.size()));
  EXPECT_EQ(back, buf);
  EXPECT_FALSE(e->WriteParam(0, buf.data(), buf.size() + 1).ok());
  EXPECT_FALSE(e->ReadParam(e->num_params(), back.data(), back.size()).ok());
  EXPECT_FALSE(e->ReadAux(-1, back.data(), 1).ok());
}

TEST(ExecutorTest, BadOptionsAndGraphsAreErrors) {
  Graph g = DagGraph();
  ExecutorOptions o;
  o.batch_size = 0;
  EXPECT_FALSE(Executor::Create(g, o).ok());
  o.batch_size = 2;
  // A GPU that is not there: no CUDA backend in this build, or no such device.
  std::string why;
  o.backend.device = Device::Gpu(GpuCount(&why));
  StatusOr<std::unique_ptr<Executor>> gpu = Executor::Create(g, o);
  ASSERT_FALSE(gpu.ok());
  EXPECT_NE(gpu.status().message().find(o.backend.device.ToString()), std::string::npos)
      << gpu.status();
  Graph bad;
  bad.Convolution("c", bad.Input("data", {1, 2, 2}), ConvParam{4, 3, 3});
  EXPECT_FALSE(bad.status().ok());
  EXPECT_FALSE(Executor::Create(bad, ExecutorOptions()).ok());
  // Found by review: NaN passed the batch norm's checks (every comparison with
  // it is false) and made the moving statistics NaN after one step; a NaN
  // grad_scale was not checked at all.
  for (int which = 0; which < 3; ++which) {
    Graph nan;
    NodeId x = nan.Input("data", {4, 2, 2});
    if (which < 2) {
      BatchNormParam p;
      (which == 0 ? p.eps : p.momentum) = std::nanf("");
      nan.BatchNorm("bn", x, p);
    } else {
      nan.SoftmaxOutput("softmax", nan.FullyConnected("fc", x, FcParam{3}), std::nanf(""));
    }
    EXPECT_FALSE(nan.status().ok()) << which;
  }
}

// A batch whose memory plan no host can give (LeNet's is about 115 KB per
// example: over 200 TB here, past any address space) is an error that says
// what did not fit, as it is on a GPU, not a crash.
TEST(ExecutorTest, ABatchTooLargeForMemoryIsAnErrorNotACrash) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer ends the process at an allocation past its maximum instead "
                  "of returning null (allocator_may_return_null=0)";
#endif
  StatusOr<Graph> g = BuildModel({"lenet", 0, Shape(), 0});
  ASSERT_OK(g.status());
  ExecutorOptions o;
  o.batch_size = std::numeric_limits<int>::max();
  o.backend.num_threads = 1;
  StatusOr<std::unique_ptr<Executor>> e = Executor::Create(*g, o);
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kResourceExhausted) << e.status();
  for (const char* said : {"the activations and their gradients", "for a batch of 2147483647",
                           "out of host memory", "a smaller batch may fit"}) {
    EXPECT_NE(e.status().message().find(said), std::string::npos) << said << ": " << e.status();
  }
  // A batch that fits still makes an executor after the failed one.
  o.batch_size = 2;
  EXPECT_OK(Executor::Create(*g, o).status());
}

// cuDNN describes a tensor with int dimensions: a GPU batch whose largest
// activation passes 2^31 - 1 elements (LeNet's first convolution at about
// 186,000 examples, which fits an H100's memory) is an error naming the node
// and the batch that fits, before any GPU is touched, not a CHECK failure in
// the operator's setup. The CPU has no such limit.
TEST(ExecutorTest, AGpuBatchPastCudnnsIntIndexingIsAnError) {
  StatusOr<Graph> g = BuildModel({"lenet", 0, Shape(), 0});
  ASSERT_OK(g.status());
  const Node* largest = &g->nodes()[0];
  for (const Node& n : g->nodes()) {
    if (n.out_shape.num_elements() > largest->out_shape.num_elements()) largest = &n;
  }
  const int64_t fits = std::numeric_limits<int32_t>::max() / largest->out_shape.num_elements();
  ExecutorOptions o;
  o.backend.device = Device::Gpu(0);
  o.batch_size = fits + 1;
  for (const Status& s :
       {Executor::PlanWithoutDevice(*g, o).status(), Executor::Create(*g, o).status()}) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
    for (const std::string& said : {"node " + largest->name, std::string("a tensor on gpu(0)"),
                                    "a batch of at most " + std::to_string(fits) + " fits"}) {
      EXPECT_NE(s.message().find(said), std::string::npos) << said << ": " << s;
    }
  }
  o.batch_size = fits;
  const Status at_limit = Executor::PlanWithoutDevice(*g, o).status();
  EXPECT_NE(at_limit.code(), StatusCode::kInvalidArgument) << at_limit;
  o.backend.device = Device::Cpu();
  o.batch_size = fits + 1;
  EXPECT_OK(Executor::PlanWithoutDevice(*g, o).status());
}

// Ten classes, each a fixed random 28x28 pattern plus noise: LeNet with plain
// SGD must drive the loss far down within 60 steps.
TEST(ExecutorTest, LenetLearnsSyntheticClasses) {
  StatusOr<Graph> g = BuildModel({"lenet", 0, Shape(), 0});
  ASSERT_OK(g.status());
  ExecutorOptions o;
  o.batch_size = 32;
  o.backend.num_threads = 1;
  auto made = Executor::Create(*g, o);
  ASSERT_OK(made.status());
  Executor* e = made->get();
  InitializeParams(*InitializerSpec::Parse("xavier(gaussian,in,2)"), 1, e);
  std::mt19937_64 rng(9);
  std::vector<Tensor> patterns;
  for (int c = 0; c < 10; ++c) {
    patterns.push_back(Tensor::Empty({784}));
    testing::FillUniform(patterns.back(), &rng, -0.5f, 0.5f);
  }
  std::normal_distribution<float> noise(0, 0.3f);
  float first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    for (int n = 0; n < 32; ++n) {
      const int c = static_cast<int>(rng() % 10);
      e->label().data()[n] = static_cast<float>(c);
      for (int i = 0; i < 784; ++i) e->data().data()[n * 784 + i] = patterns[c].at(i) + noise(rng);
    }
    e->Forward(true);
    e->Backward();
    if (step == 0) first = e->Loss();
    last = e->Loss();
    for (int p = 0; p < e->num_params(); ++p) {
      float* w = e->param(p).data();
      const float* gr = e->grad(p).data();
      for (int64_t i = 0; i < e->param(p).num_elements(); ++i) w[i] -= 0.05f / 32 * gr[i];
    }
  }
  EXPECT_GT(first, 1.5f);
  EXPECT_LT(last, 0.3f) << "first loss " << first;
}

}  // namespace
}  // namespace pstrain

namespace pstrain {
namespace {

// Whole models on both kernel sets: same initialization, same data, one
// training step; outputs, loss, every gradient and aux state must agree.
// The initialization (seed 4) puts no ReLU input or max-pooling pair of
// inception-bn-28-small within float rounding of its kink: for about a quarter
// of seeds at batch 3 one lies there, the two kernel sets' rounding takes it
// to different sides, and the gradients then differ by 1e-3..1e-2 whatever
// the kernels' quality (found when the default -march changed the
// initializer's rounding under seed 3; with the reference convolution in
// place of oneDNN's those seeds agree to 1e-6 again).
class ModelKernelsTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelKernelsTest, OneDnnMatchesReferenceOnAWholeStep) {
  ModelOptions mo;
  mo.name = GetParam();
  if (mo.name == "resnet") {
    mo.num_layers = 8;
    mo.image_shape = Shape{3, 12, 12};
  }
  if (mo.name == "inception-bn-28-small") mo.image_shape = Shape{3, 16, 16};
  StatusOr<Graph> g = BuildModel(mo);
  ASSERT_OK(g.status());
  std::unique_ptr<Executor> e[2];
  const CpuKernels kinds[2] = {CpuKernels::kOneDnn, CpuKernels::kReference};
  for (int k = 0; k < 2; ++k) {
    ExecutorOptions o;
    o.batch_size = 3;
    o.backend.cpu_kernels = kinds[k];
    o.backend.num_threads = 1;
    auto made = Executor::Create(*g, o);
    ASSERT_OK(made.status());
    e[k] = std::move(made).value();
    InitializeParams(*InitializerSpec::Parse("xavier(gaussian,in,2)"), 4, e[k].get());
    std::mt19937_64 rng(5);
    testing::FillUniform(e[k]->data(), &rng, 0, 1);
    for (int n = 0; n < 3; ++n) e[k]->label().data()[n] = static_cast<float>(n);
    e[k]->Forward(true);
    e[k]->Backward();
  }
  auto close = [](const Tensor& a, const Tensor& b, const std::string& what) {
    double diff = 0, mag = 1;
    for (int64_t i = 0; i < a.num_elements(); ++i) {
      diff = std::max(diff, double(std::fabs(a.at(i) - b.at(i))));
      mag = std::max(mag, double(std::fabs(b.at(i))));
    }
    EXPECT_LT(diff / mag, 1e-4) << what;
  };
  close(e[0]->output(), e[1]->output(), "output");
  EXPECT_NEAR(e[0]->Loss(), e[1]->Loss(), 1e-4);
  for (int p = 0; p < e[0]->num_params(); ++p) {
    close(e[0]->grad(p), e[1]->grad(p), g->params()[p].name);
  }
  for (int a = 0; a < e[0]->num_aux(); ++a) {
    close(e[0]->aux(a), e[1]->aux(a), g->aux_states()[a].name);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ModelKernelsTest,
                         ::testing::Values("mlp", "lenet", "keras-mnist-cnn", "neon-cifar10-conv",
                                           "resnet", "inception-bn-28-small"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string s = info.param;
                           for (char& c : s) {
                             if (c == '-') c = '_';
                           }
                           return s;
                         });

}  // namespace
}  // namespace pstrain
