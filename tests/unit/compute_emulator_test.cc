// --emulate-compute's parts: the host-only arrays (HostParams) and the
// emulated step (ComputeEmulator): its waits follow the flops, it drives the
// parameter sync exactly as the executor's forward and backward do, and a step
// lasts at least its seconds.
#include "worker/compute_emulator.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "models/models.h"
#include "nn/executor.h"
#include "nn/host_params.h"
#include "tests/test_util.h"

namespace pstrain {
namespace {

Graph Build(const std::string& name) {
  StatusOr<Graph> g = BuildModel({name, 0, Shape(), 0});
  EXPECT_TRUE(g.ok()) << g.status();
  return g.ok() ? std::move(g).value() : Graph();
}

// Records every call with its time since `start`.
class TimedSync : public ParamSync {
 public:
  struct Call {
    char kind;  // 'w': WaitParam, 'g': OnGradReady
    int param;
    double at_s;
  };
  Status Init(ModelParams*) override { return Status::Ok(); }
  void OnGradReady(int i) override { calls.push_back({'g', i, Since()}); }
  void WaitParam(int i) override { calls.push_back({'w', i, Since()}); }
  Status TakeError() override { return Status::Ok(); }
  Status Drain() override { return Status::Ok(); }
  std::vector<NamedArray> SaveState() const override { return {}; }
  Status LoadState(const std::vector<NamedArray>&) override { return Status::Ok(); }

  double Since() const { return std::chrono::duration<double>(SteadyClock::now() - start).count(); }
  std::vector<std::pair<char, int>> Order() const {
    std::vector<std::pair<char, int>> out;
    for (const Call& c : calls) out.emplace_back(c.kind, c.param);
    return out;
  }

  SteadyClock::time_point start = SteadyClock::now();
  std::vector<Call> calls;
};

TEST(ComputeEmulatorTest, WaitsAreSharedByFlopsAThirdForward) {
  const Graph g = Build("lenet");
  ComputeEmulatorOptions o;
  o.seconds = 0.3;
  auto e = ComputeEmulator::Create(g, o);
  ASSERT_OK(e.status());
  EXPECT_EQ((*e)->weighted_by(), "flops");
  EXPECT_DOUBLE_EQ((*e)->forward_flops(), 4661640);
  double fwd = 0, bwd = 0;
  for (const EmulatedLayer& l : (*e)->layers()) {
    EXPECT_NE(g.node(l.node).op, OpType::kInput);
    EXPECT_NEAR(l.forward_s, 0.1 * g.ForwardFlops(l.node) / 4661640, 1e-12) << l.name;
    // Every LeNet layer runs a backward (conv1 for its weights' gradients).
    EXPECT_TRUE(l.runs_backward) << l.name;
    EXPECT_NEAR(l.backward_s, 2 * l.forward_s, 1e-12) << l.name;
    fwd += l.forward_s;
    bwd += l.backward_s;
  }
  EXPECT_EQ((*e)->layers().size(), 11u);  // 13 nodes less the data and label inputs
  EXPECT_NEAR(fwd, 0.1, 1e-12);
  EXPECT_NEAR(bwd, 0.2, 1e-12);
}

TEST(ComputeEmulatorTest, BadOptionsAndUntrainableGraphsAreErrors) {
  const Graph g = Build("mlp");
  for (double s : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    ComputeEmulatorOptions o;
    o.seconds = s;
    auto e = ComputeEmulator::Create(g, o);
    EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument) << s;
  }
  ComputeEmulatorOptions o;
  o.seconds = 1;
  o.forward_share = 1.5;
  EXPECT_EQ(ComputeEmulator::Create(g, o).status().code(), StatusCode::kInvalidArgument);
  Graph no_loss;
  FcParam fc;
  fc.num_hidden = 3;
  no_loss.FullyConnected("fc", no_loss.Input("data", {4}), fc);
  o.forward_share = 1.0 / 3;
  auto e = ComputeEmulator::Create(no_loss, o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("nothing to train"), std::string::npos) << e.status();
}

// The sync sees the same calls in the same order from an emulated step as
// from the real executor's Forward + Backward, for a model with several
// parameters per layer and layers without any (LeNet, the Keras CNN with
// dropout), and the calls come at the planned points of the step.
TEST(ComputeEmulatorTest, StepCallsTheSyncAsTheExecutorDoesWhenTheWaitsSay) {
  for (const char* net : {"lenet", "keras-mnist-cnn"}) {
    const Graph g = Build(net);
    ExecutorOptions eo;
    eo.batch_size = 2;
    auto exec = Executor::Create(g, eo);
    ASSERT_OK(exec.status());
    TimedSync real;
    (*exec)->SetParamNeededCallback([&](int i) { real.WaitParam(i); });
    (*exec)->SetGradReadyCallback([&](int i) { real.OnGradReady(i); });
    (*exec)->Forward(true);
    (*exec)->Backward();

    ComputeEmulatorOptions o;
    o.seconds = 0.15;
    auto e = ComputeEmulator::Create(g, o);
    ASSERT_OK(e.status());
    TimedSync emulated;
    (*e)->Step(&emulated);
    const double took = emulated.Since();
    ASSERT_EQ(emulated.Order(), real.Order()) << net;
    EXPECT_GE(took, 0.15) << net;
    EXPECT_LT(took, 0.15 + 1.0) << net;  // loose: a loaded machine oversleeps

    // Each call comes no earlier than the waits planned before it.
    double planned = 0;
    size_t c = 0;
    const auto& layers = (*e)->layers();
    for (const EmulatedLayer& l : layers) {
      for (size_t k = 0; k < l.params.size(); ++k, ++c) {
        EXPECT_GE(emulated.calls[c].at_s, planned - 1e-6) << net << " wait " << l.name;
      }
      planned += l.forward_s;
    }
    for (auto l = layers.rbegin(); l != layers.rend(); ++l) {
      planned += l->backward_s;
      for (size_t k = 0; k < l->params.size(); ++k, ++c) {
        EXPECT_GE(emulated.calls[c].at_s, planned - 1e-6) << net << " push " << l->name;
      }
    }
    EXPECT_NEAR(planned, 0.15, 1e-9);
    EXPECT_EQ(c, emulated.calls.size());
  }
}

// A sync call that blocks (a pull still on the wire) delays the rest of the
// step by as long: it does not eat into the emulated compute.
TEST(ComputeEmulatorTest, ASyncCallThatBlocksAddsToTheStep) {
  class SlowPull : public TimedSync {
   public:
    void WaitParam(int i) override {
      TimedSync::WaitParam(i);
      if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  };
  const Graph g = Build("mlp");
  ComputeEmulatorOptions o;
  o.seconds = 0.1;
  auto e = ComputeEmulator::Create(g, o);
  ASSERT_OK(e.status());
  SlowPull sync;
  (*e)->Step(&sync);
  EXPECT_GE(sync.Since(), 0.2);
}

// Stats() says where a step's time beyond the compute went: a pull of the
// first layer's weight that blocks is counted as waiting, before the first
// layer; a push that blocks as handing gradients over. TakeStats resets.
TEST(ComputeEmulatorTest, StatsCountTheTimeBlockedInTheSync) {
  class Slow : public TimedSync {
   public:
    void WaitParam(int i) override {
      TimedSync::WaitParam(i);
      if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(60));
      if (i == last) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    void OnGradReady(int i) override {
      TimedSync::OnGradReady(i);
      if (i == last) std::this_thread::sleep_for(std::chrono::milliseconds(40));
    }
    int last = -1;
  };
  const Graph g = Build("mlp");
  ComputeEmulatorOptions o;
  o.seconds = 0.05;
  auto e = ComputeEmulator::Create(g, o);
  ASSERT_OK(e.status());
  Slow sync;
  sync.last = static_cast<int>(g.params().size()) - 1;
  ASSERT_GT(sync.last, 0);
  (*e)->Step(&sync);
  (*e)->Step(&sync);
  const EmulatedStepStats s = (*e)->TakeStats();
  EXPECT_EQ(s.steps, 2);
  EXPECT_DOUBLE_EQ(s.compute_s, 0.1);
  EXPECT_GE(s.wait_first_s, 2 * 0.060);
  EXPECT_LT(s.wait_first_s, 2 * 0.060 + 0.5);  // loose: a loaded machine oversleeps
  EXPECT_GE(s.wait_param_s, 2 * 0.090);
  EXPECT_GE(s.wait_param_s - s.wait_first_s, 2 * 0.030 - 1e-3);
  EXPECT_GE(s.grad_ready_s, 2 * 0.040);
  EXPECT_LT(s.grad_ready_s, 2 * 0.040 + 0.5);
  const EmulatedStepStats none = (*e)->TakeStats();
  EXPECT_EQ(none.steps, 0);
  EXPECT_EQ(none.wait_param_s, 0);
}

TEST(HostParamsTest, ArraysOfTheModelCopiesAndAFixedGradientPattern) {
  const Graph g = Build("lenet");
  auto p = HostParams::Create(g);
  ASSERT_OK(p.status());
  HostParams& h = **p;
  ASSERT_EQ(h.num_params(), 8);
  EXPECT_EQ(h.num_aux(), 0);
  EXPECT_TRUE(h.backend().host_accessible());
  for (int i = 0; i < h.num_params(); ++i) {
    EXPECT_EQ(h.param(i).shape(), g.params()[i].shape);
    EXPECT_EQ(h.grad(i).shape(), g.params()[i].shape);
    EXPECT_EQ(h.host_param(i), h.param(i).data());
    EXPECT_EQ(h.host_grad(i), h.grad(i).data());
  }
  std::vector<float> v(500, 0.5f);
  ASSERT_OK(h.WriteParam(5, v.data(), v.size()));  // fc1_bias
  std::vector<float> back(500);
  ASSERT_OK(h.ReadParam(5, back.data(), back.size()));
  EXPECT_EQ(back, v);
  Status s = h.WriteParam(5, v.data(), 499);
  EXPECT_NE(s.message().find("fc1_bias"), std::string::npos) << s;
  EXPECT_EQ(h.ReadParam(8, back.data(), 1).code(), StatusCode::kInvalidArgument);

  h.FillGrads();
  std::vector<float> grad(500);
  ASSERT_OK(h.ReadGrad(5, grad.data(), grad.size()));
  double sum = 0;
  for (size_t k = 0; k < grad.size(); ++k) {
    EXPECT_FLOAT_EQ(grad[k], static_cast<float>(static_cast<int>(k % 17) - 8) * 1e-5f);
    sum += grad[k];
  }
  EXPECT_LT(std::abs(sum), 1e-3);

  // Aux states (batch norm's moving statistics) exist and copy too.
  const Graph bn = Build("inception-bn-28-small");
  auto q = HostParams::Create(bn);
  ASSERT_OK(q.status());
  ASSERT_GT((*q)->num_aux(), 0);
  std::vector<float> aux(static_cast<size_t>(bn.aux_states()[0].shape.num_elements()), 2.0f);
  ASSERT_OK((*q)->WriteAux(0, aux.data(), aux.size()));
  std::vector<float> aux_back(aux.size());
  ASSERT_OK((*q)->ReadAux(0, aux_back.data(), aux_back.size()));
  EXPECT_EQ(aux_back, aux);
}

}  // namespace
}  // namespace pstrain
