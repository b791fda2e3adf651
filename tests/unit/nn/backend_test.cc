// The backend factory and the CPU backend's own steps: copies, fills, sums,
// the optimizer step (Optimizer::ApplyStep's arithmetic), memory figures, and
// the errors for devices this build or machine does not have.
#include "nn/backend.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "nn/operator.h"
#include "tests/test_util.h"

namespace pstrain {
namespace {

TEST(BackendTest, TheCpuIsAlwaysThere) {
  const std::vector<std::string> names = Backend::Names();
  ASSERT_FALSE(names.empty());
  EXPECT_EQ(names[0], "cpu");
  auto b = Backend::Create(BackendOptions());
  ASSERT_OK(b.status());
  EXPECT_TRUE((*b)->device().is_cpu());
  EXPECT_TRUE((*b)->host_accessible());
  EXPECT_NE((*b)->Describe().find("oneDNN"), std::string::npos) << (*b)->Describe();
}

TEST(BackendTest, NegativeThreadsAreAnError) {
  BackendOptions o;
  o.num_threads = -1;
  auto b = Backend::Create(o);
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
}

TEST(BackendTest, AGpuWithoutCudaOrWithoutADeviceIsAnErrorNamingIt) {
  std::string why;
  const int gpus = GpuCount(&why);
  if (gpus == 0) {
    EXPECT_FALSE(why.empty());
  }
  BackendOptions o;
  o.device = Device::Gpu(gpus);  // one past the last
  auto b = Backend::Create(o);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find(o.device.ToString()), std::string::npos) << b.status();
  const std::vector<std::string> names = Backend::Names();
  const bool has_cuda = std::find(names.begin(), names.end(), "cuda") != names.end();
  EXPECT_EQ(b.status().code(), has_cuda ? StatusCode::kInvalidArgument : StatusCode::kUnimplemented)
      << b.status();
}

// Memory a backend cannot give is an error naming what was asked, for the
// device's memory and for the host memory its copies use alike.
TEST(BackendTest, MemoryPastWhatFitsIsResourceExhausted) {
  auto made = Backend::Create(BackendOptions());
  ASSERT_OK(made.status());
  const size_t too_many = std::numeric_limits<size_t>::max() / sizeof(float);
  for (const Status& s :
       {(*made)->TryAllocate(too_many).status(), (*made)->TryAllocatePinned(too_many).status(),
        Buffer::TryAllocate(too_many).status()}) {
    EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s;
    EXPECT_NE(s.message().find(std::to_string(too_many) + " floats"), std::string::npos) << s;
  }
  auto fits = (*made)->TryAllocatePinned(16);
  ASSERT_OK(fits.status());
  EXPECT_EQ((*fits)->num_floats(), 16u);
}

// The asynchronous seam on the CPU: plain aligned host memory, copies that
// are done on return (so a fence recorded after them is done at once), and
// the same values as the synchronous copies.
TEST(BackendTest, CpuAsyncCopiesAreDoneAtOnceAndFencesAreDone) {
  auto made = Backend::Create(BackendOptions());
  ASSERT_OK(made.status());
  Backend& b = **made;
  const int64_t n = 1000;
  std::shared_ptr<Buffer> pinned = b.AllocatePinned(n);
  ASSERT_NE(pinned, nullptr);
  EXPECT_TRUE(pinned->device().is_cpu());
  EXPECT_EQ(pinned->num_floats(), static_cast<size_t>(n));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pinned->data()) % 64, 0u);
  for (int64_t i = 0; i < n; ++i) pinned->data()[i] = 0.5f * static_cast<float>(i) - 7.0f;
  Tensor t = b.Zeros({n});
  b.CopyFromHostAsync(pinned->data(), t);
  // The CPU backend copied already: overwriting the source changes nothing.
  const std::vector<float> want(pinned->data(), pinned->data() + n);
  std::fill(pinned->data(), pinned->data() + n, -1.0f);
  std::unique_ptr<Fence> f = b.RecordFence();
  EXPECT_TRUE(f->Done());
  ASSERT_OK(f->Wait(Deadline::In(kDeviceWaitTimeout)));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(t.at(i), want[i]) << i;
  b.Add(t, t);  // ordered before the download
  b.CopyToHostAsync(t, pinned->data());
  std::unique_ptr<Fence> g = b.RecordFence();
  ASSERT_OK(g->Wait(Deadline::In(kDeviceWaitTimeout)));
  EXPECT_TRUE(g->Done());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(pinned->data()[i], 2.0f * want[i]) << i;
  // A fence may be waited on from another thread.
  std::unique_ptr<Fence> h = b.RecordFence();
  bool done = false;
  std::thread waiter([&] {
    ASSERT_OK(h->Wait(Deadline::In(kDeviceWaitTimeout)));
    done = h->Done();
  });
  waiter.join();
  EXPECT_TRUE(done);
}

// The CPU playing a device orders its asynchronous copies as late as a GPU's
// streams may: an upload before the next call into the backend (a GPU's
// compute stream waits for it), a download only at a fence after it, a
// CopyToHost or Synchronize (a GPU's download stream may read its source
// after later work wrote it). A caller that writes a download's source
// before the fence reads the later values here, as it might on a GPU.
TEST(BackendTest, ACpuPlayingADeviceRunsDownloadsAtTheirFence) {
  BackendOptions o;
  o.cpu_as_device = true;
  auto made = Backend::Create(o);
  ASSERT_OK(made.status());
  Backend& b = **made;
  EXPECT_FALSE(b.host_accessible());
  std::shared_ptr<Buffer> up = b.AllocatePinned(4), down = b.AllocatePinned(4);
  std::fill(up->data(), up->data() + 4, 3.0f);
  std::fill(down->data(), down->data() + 4, -1.0f);
  Tensor t = b.Zeros({4});
  b.CopyFromHostAsync(up->data(), t);
  b.Fill(t, 1.0f);  // runs the upload first: the fill wins
  b.CopyToHostAsync(t, down->data());
  EXPECT_EQ(down->data()[0], -1.0f) << "a download ran before its fence";
  b.Fill(t, 7.0f);  // the caller's mistake: the source written before the fence
  EXPECT_EQ(down->data()[0], -1.0f) << "a download ran at the next call";
  std::unique_ptr<Fence> f = b.RecordFence();
  ASSERT_OK(f->Wait(Deadline::In(kDeviceWaitTimeout)));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(down->data()[i], 7.0f) << i;
  // CopyToHost and Synchronize run the downloads too.
  b.Fill(t, 5.0f);
  b.CopyToHostAsync(t, down->data());
  std::vector<float> back(4);
  b.CopyToHost(t, back.data());
  EXPECT_EQ(down->data()[3], 5.0f);
  b.Fill(t, 2.0f);
  b.CopyToHostAsync(t, down->data());
  b.Synchronize();
  EXPECT_EQ(down->data()[3], 2.0f);
}

TEST(BackendTest, CpuCopiesFillsAndSums) {
  auto made = Backend::Create(BackendOptions());
  ASSERT_OK(made.status());
  Backend& b = **made;
  const int64_t n = 100000;  // above the parallel threshold
  Tensor x = b.Empty({n}), y = b.Zeros({n});
  std::vector<float> src(n);
  for (int64_t i = 0; i < n; ++i) src[i] = static_cast<float>(i % 97) - 40.0f;
  b.CopyFromHost(src.data(), x);
  b.Add(x, y);
  b.Add(x, y);
  std::vector<float> back(n);
  b.CopyToHost(y, back.data());
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(back[i], 2 * src[i]) << i;
  b.Fill(y, -1.5f);
  b.Copy(y, x);
  b.CopyToHost(x, back.data());
  EXPECT_EQ(back, std::vector<float>(n, -1.5f));
  const MemoryStats s = b.memory_stats();
  EXPECT_GE(s.in_use, 2 * n * sizeof(float));
  EXPECT_GE(s.peak, s.in_use);
}

TEST(BackendTest, CpuOptimizerStepIsTheOptimizersRule) {
  OptimizerConfig cfg;
  cfg.set_learning_rate(0.1f);
  cfg.set_momentum(0.9f);
  cfg.set_wd(0.01f);
  cfg.set_rescale_grad(0.5f);
  cfg.set_clip_gradient(0.3f);
  auto opt_a = Optimizer::Create(cfg);
  auto opt_b = Optimizer::Create(cfg);
  ASSERT_OK(opt_a.status());
  ASSERT_OK(opt_b.status());
  auto made = Backend::Create(BackendOptions());
  ASSERT_OK(made.status());
  Backend& b = **made;
  const int64_t n = 257;
  std::vector<float> w(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    w[i] = 0.01f * static_cast<float>(i) - 1.0f;
    g[i] = static_cast<float>((i * 7) % 13) - 6.0f;
  }
  Tensor tw = b.Empty({n}), tg = b.Empty({n}), tm = b.Zeros({n});
  b.CopyFromHost(w.data(), tw);
  b.CopyFromHost(g.data(), tg);
  ParamState sa, sb;
  for (int step = 0; step < 3; ++step) {
    (*opt_a)->Update(g.data(), w.data(), n, &sa);
    const Optimizer::Step s = (*opt_b)->NextStep(&sb);
    EXPECT_EQ(s.num_slots(), 1);
    b.ApplyOptimizerStep(s, tg, tw, tm);
  }
  std::vector<float> back(n);
  b.CopyToHost(tw, back.data());
  EXPECT_EQ(back, w);
  b.CopyToHost(tm, back.data());
  EXPECT_EQ(back, sa.slots);
  EXPECT_EQ(sb.num_updates, 3);
  EXPECT_TRUE(sb.slots.empty()) << "NextStep leaves the slots to the caller";
}

// The check of the updates a backend applies: the first bad gradient's and
// the first bad weight's parameter, until taken; a NaN gradient stays NaN
// through the clipping (std::clamp), as the CUDA kernel keeps it.
TEST(BackendTest, CpuOptimizerStepReportsNonFiniteValuesUntilTaken) {
  auto made = Backend::Create(BackendOptions());
  ASSERT_OK(made.status());
  Backend& b = **made;
  const int64_t n = 40;
  Tensor tw = b.Zeros({n}), tg = b.Zeros({n}), tm = b.Zeros({n});
  Optimizer::Step s;
  s.lr = 0.1f;
  s.mom = 0.9f;
  s.clip = 0.5f;
  s.do_clip = true;
  s.param = 3;
  b.ApplyOptimizerStep(s, tg, tw, tm);
  EXPECT_TRUE(b.TakeStepCheck().ok());
  tg.data()[17] = std::nanf("");
  b.ApplyOptimizerStep(s, tg, tw, tm);
  EXPECT_TRUE(std::isnan(tw.at(17))) << "clipping keeps NaN: " << tw.at(17);
  s.param = 5;  // a later bad update is not the one reported
  b.ApplyOptimizerStep(s, tg, tw, tm);
  StepCheck c = b.TakeStepCheck();
  EXPECT_TRUE(c.bad_grad);
  EXPECT_EQ(c.grad_param, 3);
  EXPECT_TRUE(c.bad_weight);
  EXPECT_EQ(c.weight_param, 3);
  EXPECT_TRUE(b.TakeStepCheck().ok()) << "taken once";
  // A finite gradient that overflows the weights.
  Tensor w2 = b.Zeros({n}), g2 = b.Zeros({n});
  b.Fill(g2, 100.0f);
  Optimizer::Step huge;
  huge.lr = 3e38f;
  huge.param = 7;
  b.ApplyOptimizerStep(huge, g2, w2, Tensor());
  c = b.TakeStepCheck();
  EXPECT_FALSE(c.bad_grad);
  EXPECT_TRUE(c.bad_weight);
  EXPECT_EQ(c.weight_param, 7);
}

TEST(BackendTest, CpuOperatorForAnInputNodeIsAnError) {
  Graph g;
  NodeId in = g.Input("data", {3});
  auto made = Backend::Create(BackendOptions());
  ASSERT_OK(made.status());
  auto op = (*made)->CreateOperator(g.node(in));
  ASSERT_FALSE(op.ok());
  EXPECT_EQ(op.status().code(), StatusCode::kInvalidArgument);
}

TEST(BackendTest, SetupRejectsATensorOnAnotherDevice) {
  Graph g;
  NodeId act = g.Activation("act", g.Input("data", {4}), ActType::kRelu);
  auto made = Backend::Create(BackendOptions());
  ASSERT_OK(made.status());
  Backend& b = **made;
  auto op = b.CreateOperator(g.node(act));
  ASSERT_OK(op.status());
  // A buffer that claims to be on gpu(0) (never dereferenced).
  static float fake[8];
  Tensor on_gpu(Buffer::Wrap(fake, 8, Device::Gpu(0), [](float*) {}), 0, Shape{2, 4});
  OpTensors t;
  t.in = {on_gpu};
  t.out = b.Empty({2, 4});
  OpContext ctx;
  ctx.backend = &b;
  const Status s = (*op)->Setup(ctx, t);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("gpu(0)"), std::string::npos) << s;
}

TEST(BackendTest, ZerosPackedGivesAlignedZeroedTensorsInOneBuffer) {
  auto made = Backend::Create(BackendOptions());
  ASSERT_OK(made.status());
  const std::vector<Shape> shapes = {{3}, {20, 1, 5, 5}, {}, {1}, {500, 800}};
  std::vector<Tensor> t = (*made)->ZerosPacked(shapes);
  ASSERT_EQ(t.size(), shapes.size());
  for (size_t i = 0; i < t.size(); ++i) {
    EXPECT_EQ(t[i].shape(), shapes[i]);
    EXPECT_EQ(t[i].buffer(), t[0].buffer()) << i;
    // 256-byte steps from the buffer's start (64-byte aligned on the CPU).
    EXPECT_EQ((t[i].data() - t[0].data()) * sizeof(float) % 256, 0u) << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t[i].data()) % 64, 0u) << i;
    for (int64_t k = 0; k < t[i].num_elements(); ++k) ASSERT_EQ(t[i].at(k), 0.0f);
    if (i > 0) {  // in order, none overlapping the one before
      EXPECT_GE(t[i].data(), t[i - 1].data() + t[i - 1].num_elements()) << i;
    }
  }
  EXPECT_TRUE((*made)->ZerosPacked({}).empty());
}

// LeNet's second convolution (20 -> 50 channels, 5x5 on 12x12) bound at
// batch 64: oneDNN's backward kernels reduce through a scratchpad there.
struct ConvBinding {
  Graph g;
  NodeId conv = kInvalidNode;
  OpTensors t;
  explicit ConvBinding(Backend& b) {
    ConvParam c;
    c.num_filter = 50;
    c.kernel_h = c.kernel_w = 5;
    conv = g.Convolution("conv", g.Input("data", {20, 12, 12}), c);
    t.in = {b.Zeros({64, 20, 12, 12})};
    t.out = b.Empty({64, 50, 8, 8});
    t.params = {b.Zeros({50, 20, 5, 5}), b.Zeros({50})};
    t.param_grads = {b.Empty({50, 20, 5, 5}), b.Empty({50})};
    t.in_grads = {b.Empty({64, 20, 12, 12})};
    t.out_grad = b.Zeros({64, 50, 8, 8});
  }
};

TEST(BackendTest, ScratchIsPlannedFromTheShapesAndCheckedAtSetup) {
  BackendOptions o;
  o.num_threads = 2;
  auto made = Backend::Create(o);
  ASSERT_OK(made.status());
  Backend& b = **made;
  ConvBinding cb(b);
  OpContext ctx;
  ctx.backend = &b;
  auto op = b.CreateOperator(cb.g.node(cb.conv));
  ASSERT_OK(op.status());
  auto needs = (*op)->PlanScratch(ctx, OpShapes::Of(cb.t));
  ASSERT_OK(needs.status());
  if (needs->backward_bytes == 0) GTEST_SKIP() << "oneDNN's kernels here need no scratchpad";

  // Smaller than planned: refused, with both sizes.
  OpTensors small = cb.t;
  small.scratch_backward = b.Empty({1});
  Status s = (*op)->Setup(ctx, small);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(StrCat(needs->backward_bytes, " needed")), std::string::npos) << s;

  // Bound to other shapes than planned: refused, naming both.
  auto other = b.CreateOperator(cb.g.node(cb.conv));
  ASSERT_OK(other.status());
  OpShapes planned = OpShapes::Of(cb.t);
  planned.in_grads[0] = false;
  ASSERT_OK((*other)->PlanScratch(ctx, planned).status());
  s = (*other)->Setup(ctx, cb.t);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("planned as"), std::string::npos) << s;

  // Left undefined: Setup allocates it, and the operator runs.
  auto own = b.CreateOperator(cb.g.node(cb.conv));
  ASSERT_OK(own.status());
  ASSERT_OK((*own)->Setup(ctx, cb.t));
  EXPECT_GE((*own)->tensors().scratch_backward.bytes(), needs->backward_bytes);
  ctx.is_train = true;
  (*own)->Forward(ctx);
  (*own)->Backward(ctx);
}

}  // namespace
}  // namespace pstrain
