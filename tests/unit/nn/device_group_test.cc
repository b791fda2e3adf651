// DeviceGroup on CPU devices (the same code path as several GPUs, whose
// copies and sums go through the same Backend calls): the batch split, the
// merged gradients and the parameters after training steps equal one device
// on the whole batch, for both merges; callbacks once per parameter; errors.
#include "nn/device_group.h"

#include <gtest/gtest.h>

#include <cmath>
#include <ostream>
#include <random>
#include <vector>

#include "models/models.h"
#include "nn/initializer.h"
#include "tests/test_util.h"

namespace pstrain {
namespace {

TEST(SplitBatchTest, EqualWeightedAndRoundedShares) {
  EXPECT_EQ(*SplitBatch(128, 2, {}), (std::vector<int>{64, 64}));
  EXPECT_EQ(*SplitBatch(128, 3, {}), (std::vector<int>{43, 43, 42}));
  EXPECT_EQ(*SplitBatch(10, 2, {3, 1}), (std::vector<int>{8, 2}));
  EXPECT_EQ(*SplitBatch(7, 1, {}), (std::vector<int>{7}));
  EXPECT_EQ(*SplitBatch(100, 3, {1, 1, 2}), (std::vector<int>{25, 25, 50}));
  // As MXNet's _split_input_slice rounds under Python 3 (halves to even, the shortfall to the
  // last device): half-way shares went up, and 15 over 6 was refused.
  EXPECT_EQ(*SplitBatch(15, 6, {}), (std::vector<int>{2, 2, 2, 2, 2, 5}));
  EXPECT_EQ(*SplitBatch(20, 8, {}), (std::vector<int>{2, 2, 2, 2, 2, 2, 2, 6}));
  EXPECT_EQ(*SplitBatch(10, 4, {}), (std::vector<int>{2, 2, 2, 4}));
  EXPECT_EQ(*SplitBatch(5, 2, {}), (std::vector<int>{2, 3}));
  EXPECT_EQ(*SplitBatch(7, 2, {}), (std::vector<int>{4, 3}));  // 3.5 -> 4 (even)
  // Shares past the batch are cut at its end: 5 over 3 rounds to 2, 2, 2.
  EXPECT_EQ(*SplitBatch(5, 3, {}), (std::vector<int>{2, 2, 1}));
}

TEST(SplitBatchTest, BadWeightsAndEmptySharesAreErrors) {
  EXPECT_FALSE(SplitBatch(2, 3, {}).ok());
  EXPECT_NE(SplitBatch(2, 3, {}).status().message().find("no example"), std::string::npos);
  EXPECT_FALSE(SplitBatch(8, 2, {1}).ok());
  EXPECT_FALSE(SplitBatch(8, 2, {1, 0}).ok());
  EXPECT_FALSE(SplitBatch(8, 2, {1, -2}).ok());
  EXPECT_FALSE(SplitBatch(8, 0, {}).ok());
}

Graph Lenet() {
  StatusOr<Graph> g = BuildModel({"lenet", 0, Shape(), 0});
  CHECK(g.ok()) << g.status();
  return *g;
}

// The CPU, or the CPU playing a device the host cannot address
// (BackendOptions::cpu_as_device): the paths written for GPUs, run here.
BackendOptions Cpu(bool as_device = false) {
  BackendOptions b;
  b.num_threads = 1;
  b.cpu_as_device = as_device;
  return b;
}

std::unique_ptr<DeviceGroup> MakeGroup(const Graph& g, int devices, MergeDevice merge,
                                       std::vector<double> weights = {}, bool as_device = false) {
  DeviceGroupOptions o;
  o.batch_size = 8;
  o.devices.assign(devices, Cpu(as_device));
  o.weights = std::move(weights);
  o.merge = merge;
  auto made = DeviceGroup::Create(g, o);
  CHECK(made.ok()) << made.status();
  InitializeParams(*InitializerSpec::Parse("xavier(gaussian,in,2)"), 7, made->get());
  return std::move(made).value();
}

struct Batch {
  std::vector<float> data, label;
};
Batch RandomBatch(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0, 1);
  Batch b;
  b.data.resize(8 * 784);
  for (float& x : b.data) x = u(rng);
  for (int n = 0; n < 8; ++n) b.label.push_back(static_cast<float>(rng() % 10));
  return b;
}

void ExpectClose(const std::vector<float>& a, const std::vector<float>& b, double tol,
                 const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  double diff = 0, mag = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
    mag = std::max(mag, double(std::fabs(b[i])));
  }
  EXPECT_LE(diff / mag, tol) << what;
}

std::vector<float> Read(const ModelParams& m, int i, bool grad) {
  std::vector<float> v(static_cast<size_t>(m.graph().params()[i].shape.num_elements()));
  const Status s = grad ? m.ReadGrad(i, v.data(), v.size()) : m.ReadParam(i, v.data(), v.size());
  CHECK(s.ok()) << s;
  return v;
}

// A training loop as the trainer and LocalParamSync run it, on any group.
class Trainer {
 public:
  explicit Trainer(DeviceGroup* g) : g_(g), states_(g->num_params()), mom_(g->num_params()) {
    OptimizerConfig oc;
    oc.set_learning_rate(0.1f);
    oc.set_momentum(0.9f);
    oc.set_wd(1e-4f);
    oc.set_rescale_grad(1.0f / 8);
    opt_ = std::move(Optimizer::Create(oc)).value();
    g_->SetGradReadyCallback([this](int i) {
      ++grads_;
      const Optimizer::Step s = opt_->NextStep(&states_[i]);
      if (!mom_[i].defined()) mom_[i] = g_->backend().Zeros(g_->param(i).shape());
      g_->backend().ApplyOptimizerStep(s, g_->grad(i), g_->param(i), mom_[i]);
    });
    g_->SetParamNeededCallback([this](int) { ++needed_; });
  }
  void Step(const Batch& b) {
    ASSERT_OK(g_->LoadData(b.data.data(), b.data.size()));
    ASSERT_OK(g_->LoadLabel(b.label.data(), b.label.size()));
    g_->Forward(true);
    g_->Backward();
  }
  int grads_ = 0, needed_ = 0;

 private:
  DeviceGroup* g_;
  std::unique_ptr<Optimizer> opt_;
  std::vector<ParamState> states_;
  std::vector<Tensor> mom_;
};

// Each merge, between host devices and between devices the host cannot
// address (their own copies, fences and the merge thread of `local`).
struct GroupCase {
  MergeDevice merge;
  bool as_device;
};

void PrintTo(const GroupCase& c, std::ostream* os) {
  *os << (c.merge == MergeDevice::kLocal ? "local" : "device")
      << (c.as_device ? " merge from devices" : " merge from host devices");
}

class DeviceGroupTest : public ::testing::TestWithParam<GroupCase> {
 protected:
  std::unique_ptr<DeviceGroup> Make(const Graph& g, int devices, std::vector<double> weights = {}) {
    return MakeGroup(g, devices, GetParam().merge, std::move(weights), GetParam().as_device);
  }
};

TEST_P(DeviceGroupTest, TwoDevicesComputeWhatOneDoesOnTheWholeBatch) {
  const Graph g = Lenet();
  auto one = Make(g, 1);
  auto two = Make(g, 2);
  auto skew = Make(g, 3, {3, 1, 2});  // shares 4, 1, 3
  EXPECT_EQ(two->shares(), (std::vector<int>{4, 4}));
  EXPECT_EQ(skew->shares(), (std::vector<int>{4, 1, 3}));
  const Batch b = RandomBatch(1);
  for (DeviceGroup* d : {one.get(), two.get(), skew.get()}) {
    ASSERT_OK(d->LoadData(b.data.data(), b.data.size()));
    ASSERT_OK(d->LoadLabel(b.label.data(), b.label.size()));
    d->Forward(true);
    d->Backward();
    d->Drain();  // the merges of `local` from devices run on the group's thread
  }
  std::vector<float> out1(80), out2(80), out3(80);
  ASSERT_OK(one->ReadOutput(out1.data(), out1.size()));
  ASSERT_OK(two->ReadOutput(out2.data(), out2.size()));
  ASSERT_OK(skew->ReadOutput(out3.data(), out3.size()));
  ExpectClose(out2, out1, 1e-6, "output, 2 devices");
  ExpectClose(out3, out1, 1e-6, "output, 3 devices");
  EXPECT_NEAR(two->Loss(), one->Loss(), 1e-5);
  EXPECT_NEAR(skew->Loss(), one->Loss(), 1e-5);
  for (int i = 0; i < one->num_params(); ++i) {
    ExpectClose(Read(*two, i, true), Read(*one, i, true), 1e-5, g.params()[i].name);
    ExpectClose(Read(*skew, i, true), Read(*one, i, true), 1e-5, g.params()[i].name);
  }
}

TEST_P(DeviceGroupTest, TrainingStepsMatchOneDeviceAndEveryDeviceGetsTheWeights) {
  const Graph g = Lenet();
  auto one = Make(g, 1);
  auto two = Make(g, 2, {1, 3});
  Trainer t1(one.get()), t2(two.get());
  for (int step = 0; step < 5; ++step) {
    const Batch b = RandomBatch(step + 10);
    t1.Step(b);
    t2.Step(b);
  }
  two->Drain();
  // Once per parameter and step, whatever the device count.
  EXPECT_EQ(t2.grads_, 5 * g.params().size());
  EXPECT_EQ(t2.needed_, 5 * g.params().size());
  EXPECT_EQ(t1.grads_, t2.grads_);
  // 1e-3: each step moves a weight by 0.007-0.13 here, so a merge that loses
  // or doubles a device's share of the batch is far off (one that dropped
  // device 0's 2 examples of 8 left the weights 0.03-0.16 off after 5 steps,
  // tried). Rounding alone stays near 1e-8, until a max-pooling window
  // whose tanh outputs tie (saturated at 1) routes its gradient elsewhere:
  // with AVX2's kernels (DNNL_MAX_CPU_ISA=AVX2) that happened at step 1 and
  // left conv2_weight 2e-4 off after 5 steps.
  for (int i = 0; i < one->num_params(); ++i) {
    ExpectClose(Read(*two, i, false), Read(*one, i, false), 1e-3, g.params()[i].name);
  }
  // The next forward hands every device the merged weights.
  two->Forward(false);
  for (int d = 0; d < two->num_devices(); ++d) {
    for (int i = 0; i < two->num_params(); ++i) {
      ExpectClose(Read(two->executor(d), i, false), Read(*two, i, false), 0,
                  StrCat("device ", d, " ", g.params()[i].name));
    }
  }
}

// MXNet's device kvstore with 2-bit compression (CommDevice::ReduceCompressed):
// each device's gradient is quantized with its own residual before the sum,
// with one device too. The uncompressed twin (kLocal: its devices keep their
// own gradients) gives the raw gradients; no update runs, so every step has
// the same ones and the residuals carry over.
TEST_P(DeviceGroupTest, CompressionQuantizesEachDevicesGradientBeforeTheMerge) {
  const Graph g = Lenet();
  const float t = 0.05f;
  for (int devices : {1, 2}) {
    SCOPED_TRACE(StrCat(devices, " device(s)"));
    DeviceGroupOptions o;
    o.batch_size = 8;
    o.devices.assign(devices, Cpu(GetParam().as_device));
    o.merge = MergeDevice::kLocal;
    auto plain = DeviceGroup::Create(g, o);
    ASSERT_OK(plain.status());
    o.merge = GetParam().merge;
    o.compression.type = GradientCompressionType::kTwoBit;
    o.compression.threshold = t;
    auto gc = DeviceGroup::Create(g, o);
    if (GetParam().as_device) {
      // The merge quantizes in host memory: not on a device the host cannot address.
      EXPECT_EQ(gc.status().code(), StatusCode::kUnimplemented) << gc.status();
      continue;
    }
    ASSERT_OK(gc.status());
    InitializeParams(*InitializerSpec::Parse("xavier(gaussian,in,2)"), 7, plain->get());
    InitializeParams(*InitializerSpec::Parse("xavier(gaussian,in,2)"), 7, gc->get());
    std::vector<std::vector<std::vector<float>>> residual(
        devices, std::vector<std::vector<float>>(g.params().size()));
    const Batch b = RandomBatch(5);
    for (int step = 0; step < 3; ++step) {
      for (DeviceGroup* d : {plain->get(), gc->get()}) {
        ASSERT_OK(d->LoadData(b.data.data(), b.data.size()));
        ASSERT_OK(d->LoadLabel(b.label.data(), b.label.size()));
        d->Forward(true);
        d->Backward();
      }
      int sent = 0;
      for (int i = 0; i < (*gc)->num_params(); ++i) {
        std::vector<float> want;
        for (int d = 0; d < devices; ++d) {
          std::vector<float> raw = Read((*plain)->executor(d), i, true);
          std::vector<float>& r = residual[d][i];
          if (r.empty()) r.assign(raw.size(), 0.0f);
          if (want.empty()) want.assign(raw.size(), 0.0f);
          for (size_t k = 0; k < raw.size(); ++k) {
            r[k] += raw[k];
            const float q = r[k] >= t ? t : (r[k] <= -t ? -t : 0.0f);
            r[k] -= q;
            want[k] += q;
            sent += q != 0;
          }
        }
        ASSERT_EQ(Read(**gc, i, true), want) << "step " << step << " " << g.params()[i].name;
      }
      EXPECT_GT(sent, 0) << "step " << step;
    }
  }
}

// Two host devices and two devices the host cannot address compute the same
// steps, bit for bit: the merge, the update and the broadcast only move
// values differently (downloads on the merge thread for `local`, a scratch
// copy for `device`).
TEST_P(DeviceGroupTest, DevicesTheHostCannotAddressTrainExactlyAsHostDevices) {
  const Graph g = Lenet();
  auto host = MakeGroup(g, 2, GetParam().merge, {1, 3});
  auto dev = MakeGroup(g, 2, GetParam().merge, {1, 3}, /*as_device=*/true);
  EXPECT_NE(host->host_param(0), nullptr);
  EXPECT_EQ(dev->host_param(0) != nullptr, GetParam().merge == MergeDevice::kLocal)
      << "the local merge keeps the weights in host memory, the device merge on device 0";
  Trainer th(host.get()), td(dev.get());
  for (int step = 0; step < 4; ++step) {
    const Batch b = RandomBatch(step + 20);
    th.Step(b);
    td.Step(b);
  }
  dev->Drain();
  EXPECT_EQ(td.grads_, th.grads_);
  for (int i = 0; i < host->num_params(); ++i) {
    EXPECT_EQ(Read(*dev, i, false), Read(*host, i, false)) << g.params()[i].name;
  }
  host->Forward(false);
  dev->Forward(false);
  for (int d = 0; d < dev->num_devices(); ++d) {
    for (int i = 0; i < dev->num_params(); ++i) {
      EXPECT_EQ(Read(dev->executor(d), i, false), Read(*host, i, false))
          << "device " << d << " " << g.params()[i].name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Merges, DeviceGroupTest,
    ::testing::Values(GroupCase{MergeDevice::kLocal, false}, GroupCase{MergeDevice::kDevice, false},
                      GroupCase{MergeDevice::kLocal, true}, GroupCase{MergeDevice::kDevice, true}),
    [](const ::testing::TestParamInfo<GroupCase>& info) {
      return StrCat(info.param.merge == MergeDevice::kLocal ? "local" : "device",
                    info.param.as_device ? "_from_devices" : "");
    });

TEST(DeviceGroupTest, OneDeviceIsItsExecutor) {
  const Graph g = Lenet();
  auto one = MakeGroup(g, 1, MergeDevice::kLocal);
  EXPECT_EQ(one->param(0).data(), one->executor(0).param(0).data());
  EXPECT_EQ(one->grad(0).data(), one->executor(0).grad(0).data());
  EXPECT_EQ(one->host_param(0), one->executor(0).host_param(0));
  EXPECT_EQ(&one->backend(), &one->executor(0).backend());
}

class DeviceGroupAuxTest : public ::testing::TestWithParam<bool> {};

TEST_P(DeviceGroupAuxTest, AuxStatesStayPerDeviceUntilAveraged) {
  StatusOr<Graph> g = BuildModel({"neon-cifar10-conv", 0, Shape(), 0});
  ASSERT_OK(g.status());
  DeviceGroupOptions o;
  o.batch_size = 4;
  o.devices.assign(2, Cpu(/*as_device=*/GetParam()));
  auto made = DeviceGroup::Create(*g, o);
  ASSERT_OK(made.status());
  DeviceGroup& d = **made;
  InitializeParams(*InitializerSpec::Parse("xavier(gaussian,in,2)"), 3, &d);
  std::vector<float> data(4 * 3 * 32 * 32), label = {0, 1, 2, 3};
  std::mt19937_64 rng(3);
  std::uniform_real_distribution<float> u(0, 1);
  for (float& x : data) x = u(rng);
  ASSERT_OK(d.LoadData(data.data(), data.size()));
  ASSERT_OK(d.LoadLabel(label.data(), label.size()));
  d.Forward(true);
  const size_t n = static_cast<size_t>(g->aux_states()[0].shape.num_elements());
  std::vector<float> a0(n), a1(n), group(n);
  ASSERT_OK(d.executor(0).ReadAux(0, a0.data(), n));
  ASSERT_OK(d.executor(1).ReadAux(0, a1.data(), n));
  ASSERT_OK(d.ReadAux(0, group.data(), n));
  EXPECT_NE(a0, a1) << "each device folds its own batch statistics in";
  EXPECT_EQ(group, a0);

  // At an epoch's end every device gets their mean (MXNet's get_params then
  // set_params), as do checkpoints, which read the group.
  ASSERT_OK(d.AverageAux());
  std::vector<float> mean(n), b0(n), b1(n);
  for (size_t k = 0; k < n; ++k) mean[k] = (a0[k] + a1[k]) / 2.0f;
  ASSERT_OK(d.executor(0).ReadAux(0, b0.data(), n));
  ASSERT_OK(d.executor(1).ReadAux(0, b1.data(), n));
  ASSERT_OK(d.ReadAux(0, group.data(), n));
  EXPECT_EQ(b0, mean);
  EXPECT_EQ(b1, mean);
  EXPECT_EQ(group, mean);
}

INSTANTIATE_TEST_SUITE_P(HostAndDevices, DeviceGroupAuxTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "devices" : "host");
                         });

TEST(DeviceGroupTest, BadShapesAndDevicesAreErrors) {
  const Graph g = Lenet();
  auto two = MakeGroup(g, 2, MergeDevice::kLocal);
  std::vector<float> v(10);
  EXPECT_FALSE(two->LoadData(v.data(), v.size()).ok());
  EXPECT_FALSE(two->LoadLabel(v.data(), 3).ok());
  EXPECT_FALSE(two->ReadOutput(v.data(), v.size()).ok());
  EXPECT_FALSE(two->ReadParam(99, v.data(), 1).ok());
  DeviceGroupOptions o;
  o.batch_size = 8;
  BackendOptions gpu;
  gpu.device = Device::Gpu(0);
  o.devices = {Cpu(), gpu};
  auto mixed = DeviceGroup::Create(g, o);
  ASSERT_FALSE(mixed.ok());
  EXPECT_NE(mixed.status().message().find("one kind"), std::string::npos) << mixed.status();
  o.devices = {Cpu(), Cpu(/*as_device=*/true)};
  auto half = DeviceGroup::Create(g, o);
  EXPECT_NE(half.status().message().find("cpu (as a device) and cpu"), std::string::npos)
      << half.status();
  o.devices = {Cpu(), Cpu(), Cpu()};
  o.batch_size = 2;
  EXPECT_FALSE(DeviceGroup::Create(g, o).ok());
  // Compression in the merge needs host memory (checked before any GPU is touched).
  o.batch_size = 8;
  o.devices = {gpu};
  o.compression.type = GradientCompressionType::kTwoBit;
  auto on_gpu = DeviceGroup::Create(g, o);
  EXPECT_EQ(on_gpu.status().code(), StatusCode::kUnimplemented) << on_gpu.status();
  EXPECT_NE(on_gpu.status().message().find("runs on the CPU only"), std::string::npos)
      << on_gpu.status();
  // An inference group has no gradients to read (the host merge read a null
  // buffer).
  o.compression = GradientCompression();
  o.devices = {Cpu(), Cpu()};
  o.for_training = false;
  auto inference = DeviceGroup::Create(g, o);
  ASSERT_OK(inference.status());
  std::vector<float> grad(static_cast<size_t>(g.params()[0].shape.num_elements()));
  const Status read = (*inference)->ReadGrad(0, grad.data(), grad.size());
  EXPECT_EQ(read.code(), StatusCode::kFailedPrecondition) << read;
}

// Devices after the first start from the merge buffers' values even when
// those were written in place, not through WriteParam (with the device
// merge they kept their own zeros).
TEST(DeviceGroupTest, EveryDeviceStartsFromTheMergeBuffers) {
  const Graph g = Lenet();
  for (MergeDevice merge : {MergeDevice::kLocal, MergeDevice::kDevice}) {
    DeviceGroupOptions o;
    o.batch_size = 8;
    o.devices.assign(2, Cpu());
    o.merge = merge;
    auto made = DeviceGroup::Create(g, o);
    ASSERT_OK(made.status());
    DeviceGroup& group = **made;
    for (int i = 0; i < group.num_params(); ++i) {
      const Tensor& p = group.param(i);
      for (int64_t k = 0; k < p.num_elements(); ++k)
        p.data()[k] = 0.01f * static_cast<float>(k % 7);
    }
    const Batch b = RandomBatch(3);
    ASSERT_OK(group.LoadData(b.data.data(), b.data.size()));
    group.Forward(false);
    for (int i = 0; i < group.num_params(); ++i) {
      EXPECT_EQ(Read(group.executor(1), i, false), Read(group, i, false))
          << "parameter " << i << (merge == MergeDevice::kLocal ? " (local" : " (device")
          << " merge)";
    }
  }
}

// With the host merge from devices, the grad-ready callback runs on the merge
// thread; the group's WriteParam there would wait for its own merge (it hung
// for 10 minutes, then CHECK-failed): an error instead.
TEST(DeviceGroupTest, WriteParamFromTheMergeThreadIsAnError) {
  const Graph g = Lenet();
  auto group = MakeGroup(g, 2, MergeDevice::kLocal, {}, /*as_device=*/true);
  std::vector<Status> got(group->num_params());
  group->SetGradReadyCallback([&](int i) {
    const std::vector<float> w = Read(*group, i, false);
    got[i] = group->WriteParam(i, w.data(), w.size());
  });
  const Batch b = RandomBatch(4);
  ASSERT_OK(group->LoadData(b.data.data(), b.data.size()));
  ASSERT_OK(group->LoadLabel(b.label.data(), b.label.size()));
  group->Forward(true);
  group->Backward();
  group->Drain();
  for (int i = 0; i < group->num_params(); ++i) {
    EXPECT_EQ(got[i].code(), StatusCode::kFailedPrecondition)
        << "parameter " << i << ": " << got[i];
  }
}

}  // namespace
}  // namespace pstrain
