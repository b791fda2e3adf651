// The CPU backend's activation layouts and fusions (nn/cpu/layout.h): which
// tensors the plan keeps channel-blocked, that blocked layouts, in-place
// operators and the batch norm + ReLU fusion give the results of the plain
// unfused engine and of the reference loops (outputs, finite differences),
// and that they remove the reorders they are for.
#include "nn/cpu/layout.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "models/models.h"
#include "nn/cpu/cpu_backend.h"
#include "nn/executor.h"
#include "nn/initializer.h"
#include "tests/test_util.h"
#include "tests/unit/nn/op_harness.h"

namespace pstrain {
namespace {

using internal::CpuBackend;
using internal::PlanActivationLayouts;
using internal::PreferredChannelBlock;

Graph Model(const std::string& name, const Shape& image, int layers = 0) {
  ModelOptions mo;
  mo.name = name;
  mo.image_shape = image;
  mo.num_layers = layers;
  StatusOr<Graph> g = BuildModel(mo);
  CHECK(g.ok()) << g.status();
  return std::move(g).value();
}

int Layout(const Graph& g, const std::vector<int>& plan, const std::string& node) {
  const NodeId id = g.Find(node);
  CHECK_NE(id, kInvalidNode) << node;
  return plan[id];
}

TEST(LayoutPlanTest, ResnetIsBlockedFromTheFirstConvolutionToTheClassifier) {
  const Graph g = Model("resnet", Shape{3, 28, 28}, 20);
  const std::vector<int> plan = PlanActivationLayouts(g, 16);
  EXPECT_EQ(Layout(g, plan, "data"), 0);
  EXPECT_EQ(Layout(g, plan, "bn_data"), 0);  // 3 channels
  int blocked = 0;
  for (const Node& n : g.nodes()) {
    const bool image = n.out_shape.ndim() == 3;
    if (n.op == OpType::kInput || n.id == g.Find("bn_data") || !image) {
      EXPECT_EQ(plan[n.id], 0) << n.name;
      continue;
    }
    EXPECT_EQ(plan[n.id], 16) << n.name;  // every conv, bn, relu, sum and the global pool
    ++blocked;
  }
  EXPECT_GT(blocked, 60);
  EXPECT_EQ(Layout(g, plan, "flatten0"), 0);
  EXPECT_EQ(Layout(g, plan, "fc1"), 0);
}

TEST(LayoutPlanTest, InceptionConcatenatesBlockedBranches) {
  const Graph g = Model("inception-bn-28-small", Shape{3, 28, 28});
  const std::vector<int> plan = PlanActivationLayouts(g, 16);
  EXPECT_EQ(Layout(g, plan, "data"), 0);
  for (const Node& n : g.nodes()) {
    if (n.op == OpType::kConcat || n.op == OpType::kBatchNorm || n.op == OpType::kPooling) {
      EXPECT_EQ(plan[n.id], 16) << n.name;
    }
  }
}

TEST(LayoutPlanTest, ChannelsOffTheBlockAndPlainReadersStayPlain) {
  // LeNet: 20 and 50 channels.
  const Graph lenet = Model("lenet", Shape{1, 28, 28});
  for (int l : PlanActivationLayouts(lenet, 16)) EXPECT_EQ(l, 0);
  // keras-mnist-cnn: 32 channels, but the pooling feeds a dropout (whose mask
  // follows memory order), so the chain up to it is plain; the first
  // convolution's output and ReLU, read by a convolution, are blocked.
  const Graph keras = Model("keras-mnist-cnn", Shape{1, 28, 28});
  const std::vector<int> plan = PlanActivationLayouts(keras, 16);
  EXPECT_EQ(Layout(keras, plan, "relu1"), 16);
  EXPECT_EQ(Layout(keras, plan, "conv2"), 0);
  EXPECT_EQ(Layout(keras, plan, "pool1"), 0);
  EXPECT_EQ(Layout(keras, plan, "dropout1"), 0);
  // Block 0 (the reference kernels, or a CPU whose convolutions want NCHW).
  const Graph resnet = Model("resnet", Shape{3, 12, 12}, 8);
  for (int l : PlanActivationLayouts(resnet, 0)) EXPECT_EQ(l, 0);
}

TEST(LayoutPlanTest, TheGraphOutputIsPlain) {
  Graph g;
  NodeId x = g.Input("data", {16, 4, 4});
  ConvParam c;
  c.num_filter = 16;
  NodeId conv = g.Convolution("conv", x, c);
  g.BatchNorm("bn", conv, {});
  const std::vector<int> plan = PlanActivationLayouts(g, 16);
  EXPECT_EQ(plan[g.Find("bn")], 0);  // read by the caller as NCHW
  EXPECT_EQ(plan[conv], 0);          // the batch norm keeps its input's layout
}

// 16 filters of 3x3, padded to keep the image's size.
ConvParam Conv3x3Of16() {
  ConvParam c;
  c.num_filter = 16;
  c.kernel_h = c.kernel_w = 3;
  c.pad_h = c.pad_w = 1;
  return c;
}

// data -> conv(16) -> bn -> tanh -> {conv_a, avgpool} -> concat(32) -> bn2
//      -> sigmoid -> conv_b(16) -> add(conv_b, conv_c(data)) -> global avgpool
//      -> fc -> softmax
// Image tensors of 16 and 32 channels, so oneDNN's run keeps them blocked and
// runs the activations and the sum in place; smooth operators only, so finite
// differences are exact to O(h^2). conv and conv_a have no bias: one before a
// batch norm has no gradient, and its check compared float rounding with the
// 1e-3 floor (conv_a_bias failed so with AVX2's channel block of 8).
Graph BlockedDag() {
  Graph g;
  NodeId x = g.Input("data", {3, 5, 5});
  const ConvParam c3 = Conv3x3Of16();
  ConvParam c3_no_bias = c3;
  c3_no_bias.no_bias = true;
  NodeId conv = g.Convolution("conv", x, c3_no_bias);
  NodeId t = g.Activation("tanh", g.BatchNorm("bn", conv, {1e-5f, 0.9f, false}), ActType::kTanh);
  NodeId a = g.Convolution("conv_a", t, c3_no_bias);
  PoolParam pp;
  pp.type = PoolType::kAvg;
  pp.kernel_h = pp.kernel_w = 3;
  pp.pad_h = pp.pad_w = 1;
  NodeId cat = g.Concat("concat", {a, g.Pooling("pool", t, pp)});
  NodeId s =
      g.Activation("sigmoid", g.BatchNorm("bn2", cat, {1e-5f, 0.9f, false}), ActType::kSigmoid);
  NodeId sum = g.Add("sum", {g.Convolution("conv_b", s, c3), g.Convolution("conv_c", x, c3)});
  PoolParam gp;
  gp.type = PoolType::kAvg;
  gp.global = true;
  NodeId fc = g.FullyConnected("fc", g.Flatten("flatten", g.Pooling("gpool", sum, gp)), {4});
  g.SoftmaxOutput("softmax", fc);
  return g;
}

std::unique_ptr<Executor> Make(const Graph& g, CpuKernels kernels, bool blocked, bool fused,
                               bool plan = true) {
  ExecutorOptions o;
  o.batch_size = 3;
  o.plan_memory = plan;
  o.backend.cpu_kernels = kernels;
  o.backend.num_threads = 1;
  o.backend.cpu_blocked_layouts = blocked;
  o.backend.cpu_fusion = fused;
  auto e = Executor::Create(g, o);
  CHECK(e.ok()) << e.status();
  InitializeParams(*InitializerSpec::Parse("xavier(gaussian,in,2)"), 4, e->get());
  std::mt19937_64 rng(5);
  testing::FillUniform(e.value()->data(), &rng, 0, 1);
  for (int n = 0; n < 3; ++n) e.value()->label().data()[n] = static_cast<float>(n % 4);
  return std::move(e).value();
}

double RelDiff(const Tensor& a, const Tensor& b) { return testing::RelMaxDiff(a, b); }

// Every seventh element of every parameter: the analytic gradient of the
// batch's summed loss against central differences with step `h`, the worst
// error relative to the largest gradient of that parameter.
void ExpectGradientsMatchFiniteDifferences(Executor* e, const Graph& g, double h, double tol) {
  e->Forward(true);
  e->Backward();
  const double batch = e->output().shape()[0];
  for (int p = 0; p < e->num_params(); ++p) {
    const Tensor w = e->param(p);
    std::vector<float> analytic(e->grad(p).data(), e->grad(p).data() + w.num_elements());
    double worst = 0, mag = 1e-3;
    for (int64_t k = 0; k < w.num_elements(); k += 7) {
      const float saved = w.data()[k];
      w.data()[k] = saved + static_cast<float>(h);
      e->Forward(true);
      const double up = e->Loss() * batch;
      w.data()[k] = saved - static_cast<float>(h);
      e->Forward(true);
      const double down = e->Loss() * batch;
      w.data()[k] = saved;
      worst = std::max(worst, std::fabs((up - down) / (2 * h) - analytic[k]));
      mag = std::max(mag, std::fabs(static_cast<double>(analytic[k])));
    }
    EXPECT_LT(worst / mag, tol) << g.params()[p].name;
  }
}

TEST(LayoutExecutorTest, BlockedDagGradientsMatchFiniteDifferences) {
  if (PreferredChannelBlock() == 0) GTEST_SKIP() << "oneDNN's convolutions want NCHW on this CPU";
  const Graph g = BlockedDag();
  ASSERT_OK(g.status());
  std::unique_ptr<Executor> e = Make(g, CpuKernels::kOneDnn, true, true);
  EXPECT_LT(e->unplanned_bytes(),
            Make(g, CpuKernels::kOneDnn, true, true, false)->unplanned_bytes())
      << "tanh, sigmoid and the sum should run in place";
  ExpectGradientsMatchFiniteDifferences(e.get(), g, 1e-2, 2e-2);
}

// data -> conv(16) -> bn -> relu -> maxpool 2x2 -> conv(16) -> bn2 -> relu2
//      -> flatten -> fc -> softmax
// The batch norm + ReLU fusion, max pooling and a flatten of a (C, H, W)
// tensor, each in the layout oneDNN's run gives it. ReLU and max have kinks:
// a step of 1e-2 crosses some (0.09 off on conv_weight), one of 1e-3 leaves
// the worst error near 1e-3.
Graph ReluPoolDag() {
  Graph g;
  NodeId x = g.Input("data", {3, 6, 6});
  ConvParam c3 = Conv3x3Of16();
  c3.no_bias = true;  // a bias before a batch norm has no gradient
  NodeId r1 =
      g.Activation("relu", g.BatchNorm("bn", g.Convolution("conv", x, c3), {1e-5f, 0.9f, false}),
                   ActType::kRelu);
  PoolParam mp;
  mp.type = PoolType::kMax;
  mp.kernel_h = mp.kernel_w = 2;
  mp.stride_h = mp.stride_w = 2;
  NodeId pool = g.Pooling("pool", r1, mp);
  NodeId r2 = g.Activation(
      "relu2", g.BatchNorm("bn2", g.Convolution("conv2", pool, c3), {1e-5f, 0.9f, false}),
      ActType::kRelu);
  g.SoftmaxOutput("softmax", g.FullyConnected("fc", g.Flatten("flatten", r2), {4}));
  return g;
}

TEST(LayoutExecutorTest, FusedReluMaxPoolAndFlattenGradientsMatchFiniteDifferences) {
  const Graph g = ReluPoolDag();
  ASSERT_OK(g.status());
  const int block = PreferredChannelBlock();
  for (bool blocked : {false, true}) {
    if (blocked && block == 0) continue;  // said by BlockedDagGradientsMatchFiniteDifferences
    SCOPED_TRACE(blocked ? "blocked layouts" : "plain layouts");
    std::unique_ptr<Executor> e = Make(g, CpuKernels::kOneDnn, blocked, true);
    const auto* cpu = dynamic_cast<const CpuBackend*>(&e->backend());
    ASSERT_NE(cpu, nullptr);
    for (const char* bn : {"bn", "bn2"}) {
      EXPECT_TRUE(cpu->fuses_relu(g.Find(bn))) << bn << " should run its ReLU";
    }
    if (blocked) {
      for (const char* n : {"relu", "pool", "relu2"}) {
        EXPECT_EQ(cpu->layout(g.Find(n)), block) << n << " should be channel-blocked";
      }
    }
    ExpectGradientsMatchFiniteDifferences(e.get(), g, 1e-3, 2e-2);
  }
}

// One training step; outputs, loss, gradients and aux states must agree.
// Gradients are compared with `tol`, relative to max(1, their largest value),
// or with `grad_tol` > 0 relative to their largest value down to a tenth of
// the largest gradient of the network (below that, a parameter whose
// gradient vanishes, such as a bias before a batch norm, holds rounding).
void ExpectSameStep(Executor* a, Executor* b, const Graph& g, double tol, double grad_tol = 0) {
  for (Executor* e : {a, b}) {
    e->Forward(true);
    e->Backward();
  }
  EXPECT_LT(RelDiff(a->output(), b->output()), tol);
  EXPECT_NEAR(a->Loss(), b->Loss(), tol);
  double largest = 0;  // (of the network's gradients; with grad_tol only)
  for (int p = 0; grad_tol > 0 && p < b->num_params(); ++p) {
    const Tensor& gb = b->grad(p);
    for (int64_t k = 0; k < gb.num_elements(); ++k) {
      largest = std::max(largest, static_cast<double>(std::fabs(gb.data()[k])));
    }
  }
  for (int p = 0; p < a->num_params(); ++p) {
    const Tensor& ga = a->grad(p);
    const Tensor& gb = b->grad(p);
    ASSERT_EQ(ga.shape(), gb.shape()) << g.params()[p].name;
    if (grad_tol > 0) {
      EXPECT_LT(testing::RelMaxDiff(ga.data(), gb.data(), ga.num_elements(), largest / 10),
                grad_tol)
          << g.params()[p].name;
    } else {
      EXPECT_LT(RelDiff(ga, gb), tol) << g.params()[p].name;
    }
  }
  for (int x = 0; x < a->num_aux(); ++x) {
    EXPECT_LT(RelDiff(a->aux(x), b->aux(x)), tol) << g.aux_states()[x].name;
  }
}

TEST(LayoutExecutorTest, BlockedFusedPlainAndReferenceRunsAgree) {
  const Graph dag = BlockedDag();
  const Graph resnet = Model("resnet", Shape{3, 12, 12}, 8);
  for (const Graph* g : {&dag, &resnet}) {
    auto fast = Make(*g, CpuKernels::kOneDnn, true, true);
    auto plain = Make(*g, CpuKernels::kOneDnn, false, false, false);
    auto ref = Make(*g, CpuKernels::kReference, false, false);
    ExpectSameStep(fast.get(), plain.get(), *g, 1e-4);
    auto fast2 = Make(*g, CpuKernels::kOneDnn, true, true);
    ExpectSameStep(fast2.get(), ref.get(), *g, 1e-4);
  }
}

// A random network of the operators the layouts, fusions and in-place runs
// touch: convolutions (1x1 or 3x3, stride 1 or 2), batch norms, ReLU / tanh /
// sigmoid, max and average pooling (3x3 same-size or 2x2 halving), concats of
// two or three tensors of one size, sums of two of one shape, channels of 8,
// 12, 16 and 32 (blocked and plain tensors side by side); every tensor no
// other node reads is pooled globally, and those are concatenated into the
// classifier, so every branch has a gradient. Each seed's graph is the same
// on every run.
Graph RandomGraph(uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&rng](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  Graph g;
  std::vector<NodeId> live = {g.Input("data", {3, 8, 8})};
  std::vector<int> readers(1, 0);
  auto add = [&](NodeId id, const std::vector<NodeId>& ins) {
    for (NodeId in : ins) {
      for (size_t i = 0; i < live.size(); ++i) readers[i] += live[i] == in;
    }
    live.push_back(id);
    readers.push_back(0);
    return id;
  };
  auto shape = [&g](NodeId id) { return g.node(id).out_shape; };
  const int ops = 8 + pick(12);
  for (int k = 0; k < ops; ++k) {
    const std::string name = StrCat("n", k);
    // Mostly one of the last three tensors (depth), else any (branches).
    const int n = static_cast<int>(live.size());
    const NodeId in = live[pick(4) ? std::max(0, n - 1 - pick(3)) : pick(n)];
    const Shape s = shape(in);
    const bool can_halve = s[1] >= 4;
    const int kind = k == 0 ? 0 : pick(7);
    switch (kind == 6 ? 4 : kind) {  // (a concat or a sum twice as often)
      case 0: {                      // the first node is a convolution: the data has 3 channels
        ConvParam c;
        static constexpr int kChannels[] = {8, 12, 16, 32};
        c.num_filter = kChannels[pick(4)];
        c.kernel_h = c.kernel_w = pick(2) ? 3 : 1;
        c.pad_h = c.pad_w = c.kernel_h / 2;
        c.stride_h = c.stride_w = can_halve && pick(4) == 0 ? 2 : 1;
        c.no_bias = pick(2);
        add(g.Convolution(name, in, c), {in});
        break;
      }
      case 1:
        add(g.BatchNorm(name, in, {1e-3f, 0.9f, pick(4) == 0}), {in});
        break;
      case 2: {
        static constexpr ActType kActs[] = {ActType::kRelu, ActType::kTanh, ActType::kSigmoid};
        add(g.Activation(name, in, kActs[pick(3)]), {in});
        break;
      }
      case 3: {
        PoolParam p;
        p.type = pick(2) ? PoolType::kMax : PoolType::kAvg;
        if (can_halve && pick(2)) {
          p.kernel_h = p.kernel_w = p.stride_h = p.stride_w = 2;
        } else {
          p.kernel_h = p.kernel_w = 3;
          p.pad_h = p.pad_w = 1;
        }
        add(g.Pooling(name, in, p), {in});
        break;
      }
      case 4: {  // a concat or a sum of `in` and tensors like it, where there are any
        const bool cat = pick(2);
        std::vector<NodeId> ins = {in};
        for (NodeId other : live) {
          const Shape o = shape(other);
          if (other == in || g.node(other).op == OpType::kInput || o.ndim() != 3 || o[1] != s[1] ||
              o[2] != s[2] || (!cat && o[0] != s[0])) {
            continue;
          }
          if (ins.size() < (cat ? 3u : 2u) && pick(2)) ins.push_back(other);
        }
        if (ins.size() < 2 || g.node(in).op == OpType::kInput) {
          add(g.Activation(name, in, ActType::kRelu), {in});
        } else {
          add(cat ? g.Concat(name, ins) : g.Add(name, ins), ins);
        }
        break;
      }
      default: {  // another convolution, the commonest layer
        ConvParam c;
        c.num_filter = pick(2) ? 16 : 8 + 4 * pick(3);
        c.kernel_h = c.kernel_w = 3;
        c.pad_h = c.pad_w = 1;
        add(g.Convolution(name, in, c), {in});
        break;
      }
    }
  }
  std::vector<NodeId> heads;
  for (size_t i = 1; i < live.size(); ++i) {
    if (readers[i] > 0) continue;
    PoolParam gp;
    gp.type = PoolType::kAvg;
    gp.global = true;
    heads.push_back(g.Flatten(StrCat("flat", i), g.Pooling(StrCat("gpool", i), live[i], gp)));
  }
  const NodeId top = heads.size() == 1 ? heads[0] : g.Concat("heads", heads);
  g.SoftmaxOutput("softmax", g.FullyConnected("fc", top, {4}));
  return g;
}

// 200 random networks (as RandomGraph makes them): a training step, an SGD
// update and a step on another batch (what the first left in the planned and
// in-place buffers, or in weights reordered for oneDNN, must not leak into
// it), by the engine with its layouts, fusions and memory plan, by the plain
// unfused engine without a plan, and by the reference loops; all three agree,
// each gradient to 1e-3 of its own size (down to a tenth of the network's
// largest: deep chains of batch norms over 12 values a channel amplify
// rounding past 1e-4 of it).
TEST(LayoutExecutorTest, RandomGraphsAgreeWithThePlainEngineAndTheReference) {
  for (uint64_t seed = 1; seed <= 200; ++seed) {
    const Graph g = RandomGraph(seed);
    SCOPED_TRACE(StrCat("seed ", seed, ": ", g.nodes().size(), " nodes"));
    ASSERT_OK(g.status());
    auto fast = Make(g, CpuKernels::kOneDnn, true, true);
    auto plain = Make(g, CpuKernels::kOneDnn, false, false, false);
    auto fast2 = Make(g, CpuKernels::kOneDnn, true, true);
    auto ref = Make(g, CpuKernels::kReference, false, false, false);
    EXPECT_LE(fast->planned_bytes(), plain->unplanned_bytes());
    for (int step = 0; step < 2; ++step) {
      SCOPED_TRACE(StrCat("step ", step));
      ExpectSameStep(fast.get(), plain.get(), g, 1e-4, 1e-3);
      ExpectSameStep(fast2.get(), ref.get(), g, 1e-4, 1e-3);
      // The same update everywhere (the reference's gradient), so that the
      // next step starts from the same weights: rounding in a gradient that
      // should vanish (a bias before a batch norm) moved a beta off 0 in one
      // engine only, onto the other side of a ReLU's kink.
      std::vector<std::vector<float>> update;
      for (int p = 0; p < ref->num_params(); ++p) {
        const Tensor& gr = ref->grad(p);
        update.emplace_back(gr.data(), gr.data() + gr.num_elements());
      }
      for (Executor* e : {fast.get(), plain.get(), fast2.get(), ref.get()}) {
        for (int p = 0; p < e->num_params(); ++p) {
          float* w = e->param(p).data();
          for (size_t k = 0; k < update[p].size(); ++k) w[k] -= 0.05f * update[p][k];
        }
        std::mt19937_64 rng(seed * 100 + step);
        testing::FillUniform(e->data(), &rng, 0, 1);
        for (int n = 0; n < 3; ++n) e->label().data()[n] = static_cast<float>((n + 1) % 4);
      }
    }
  }
}

TEST(LayoutExecutorTest, BlockedLayoutsLeaveOnlyTheEdgeReorders) {
  if (PreferredChannelBlock() == 0) GTEST_SKIP() << "oneDNN's convolutions want NCHW on this CPU";
  const Graph g = Model("resnet", Shape{3, 12, 12}, 8);
  int convs = 0;
  for (const Node& n : g.nodes()) convs += n.op == OpType::kConvolution;
  auto reorders = [&](bool blocked) {
    auto e = Make(g, CpuKernels::kOneDnn, blocked, blocked);
    const BackendCounters before = e->backend().counters();
    e->Forward(true);
    e->Backward();
    const BackendCounters after = e->backend().counters();
    return after.activation_reorders - before.activation_reorders;
  };
  // Plain: each convolution but the first reorders its input, its output, the
  // output's gradient and the input's gradient (the first one reads NCHW).
  EXPECT_GE(reorders(false), 4 * (convs - 1));
  // Blocked: at most the data batch into the first convolution and the
  // classifier's edge, whatever the depth.
  EXPECT_LE(reorders(true), 3);
}

}  // namespace
}  // namespace pstrain
