// The training loop end to end on real MNIST: it learns, prints MXNet's lines,
// checkpoints and resumes on the same curve, and --test-io only reads.
#include "worker/trainer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "models/models.h"
#include "nn/device_group.h"
#include "nn/executor.h"
#include "nn/host_params.h"
#include "tests/test_util.h"
#include "worker/checkpoint.h"
#include "worker/train_data.h"

namespace pstrain {
namespace {

namespace fs = std::filesystem;

// A small MLP (784-64-10) built here so the loop is tested on its own; with
// `batch_norm`, a batch norm after its hidden layer (aux states to average).
StatusOr<Graph> SmallMlpOf(const ModelOptions& mo, bool batch_norm, bool dropout = false) {
  Graph g;
  NodeId x = g.Input("data", mo.image_shape);
  x = g.Flatten("flatten", x);
  FcParam fc1;
  fc1.num_hidden = 64;
  x = g.FullyConnected("fc1", x, fc1);
  if (batch_norm) x = g.BatchNorm("bn1", x, BatchNormParam());
  x = g.Activation("relu1", x, ActType::kRelu);
  if (dropout) x = g.Dropout("drop1", x, {0.5f});
  FcParam fc2;
  fc2.num_hidden = mo.num_classes;
  x = g.FullyConnected("fc2", x, fc2);
  g.SoftmaxOutput("softmax", x);
  if (!g.status().ok()) return g.status();
  return g;
}
StatusOr<Graph> SmallMlp(const ModelOptions& mo) { return SmallMlpOf(mo, false); }
StatusOr<Graph> SmallBnMlp(const ModelOptions& mo) { return SmallMlpOf(mo, true); }

// Every parameter of `a` and `b` equal, element by element.
void ExpectSameParams(const DeviceGroup& a, const DeviceGroup& b) {
  ASSERT_EQ(a.num_params(), b.num_params());
  for (int i = 0; i < a.num_params(); ++i) {
    const Tensor& pa = a.param(i);
    const Tensor& pb = b.param(i);
    ASSERT_EQ(pa.num_elements(), pb.num_elements()) << "param " << i;
    for (int64_t k = 0; k < pa.num_elements(); ++k) {
      ASSERT_EQ(pa.at(k), pb.at(k)) << "param " << i << " element " << k;
    }
  }
}

class TrainerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("pstrain_trainer_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    cfg_.set_network("small-mlp");
    cfg_.set_data_dir(testing::SharedDataDir() + "/mnist");
    cfg_.set_num_examples(3840);  // 30 batches of 128 per epoch
    cfg_.set_num_epochs(2);
    cfg_.set_disp_batches(10);
    cfg_.set_kv_store("local");
    cfg_.set_num_threads(1);
    cfg_.set_seed(3);
  }
  void TearDown() override { fs::remove_all(dir_); }

  StatusOr<std::unique_ptr<Trainer>> Make(const TrainConfig& cfg,
                                          decltype(TrainerEnv::build_model) build = SmallMlp) {
    TrainerEnv env;
    env.log = &log_;
    env.build_model = std::move(build);
    return Trainer::Create(cfg, env);
  }
  std::vector<std::string> Matching(const std::string& pattern) const {
    std::vector<std::string> out;
    std::regex re(pattern);
    for (const auto& l : lines_) {
      if (std::regex_match(l, re)) out.push_back(l);
    }
    return out;
  }

  fs::path dir_;
  TrainConfig cfg_;
  std::vector<std::string> lines_;
  TrainLog log_{[this](const std::string& l) { lines_.push_back(l); }};
};

TEST_F(TrainerTest, LearnsMnistAndPrintsMxnetLines) {
  auto t = Make(cfg_);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->epoch_size(), 30);
  ASSERT_OK((*t)->Run());
  const auto& h = (*t)->history();
  ASSERT_EQ(h.size(), 2u);
  EXPECT_GT(h[1].val[0].second, 0.85) << "validation accuracy after 7680 examples";
  EXPECT_GT(h[1].train[0].second, 0.8);
  // Speedometer at batches 10 and 20 of each epoch, then the epoch lines in order.
  auto speed = Matching(
      R"(INFO:root:Epoch\[[01]\] Batch \[[12]0\]\tSpeed: [0-9]+\.[0-9]{2} samples/sec\taccuracy=[01]\.[0-9]{6})");
  EXPECT_EQ(speed.size(), 4u);
  std::vector<std::string> epoch_lines;
  std::regex epoch_re(
      R"(INFO:root:Epoch\[1\] (Train-accuracy=[01]\.[0-9]{6}|Time cost=[0-9]+\.[0-9]{3}|Validation-accuracy=[01]\.[0-9]{6}))");
  for (const auto& l : lines_) {
    if (std::regex_match(l, epoch_re)) epoch_lines.push_back(l.substr(19, 5));
  }
  EXPECT_EQ(epoch_lines, (std::vector<std::string>{"Train", "Time ", "Valid"}));
}

TEST_F(TrainerTest, ModelsLenetAndMlpLearn) {
  for (const char* net : {"mlp", "lenet"}) {
    TrainConfig cfg = cfg_;
    cfg.set_network(net);
    cfg.set_num_epochs(1);
    cfg.set_num_threads(0);
    TrainerEnv env;
    env.log = &log_;
    env.build_model = BuildModel;
    auto t = Trainer::Create(cfg, env);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_OK((*t)->Run());
    ASSERT_EQ((*t)->history().size(), 1u);
    EXPECT_GT((*t)->history()[0].val[0].second, 0.6) << net << " after 3840 examples";
  }
}

// Wraps the local sync and records the order in which the loop drives it.
class RecordingSync : public ParamSync {
 public:
  RecordingSync(std::unique_ptr<ParamSync> inner, std::vector<std::pair<char, int>>* calls)
      : inner_(std::move(inner)), calls_(calls) {}
  Status Init(ModelParams* params) override { return inner_->Init(params); }
  void OnGradReady(int i) override {
    calls_->emplace_back('g', i);
    inner_->OnGradReady(i);
  }
  void WaitParam(int i) override {
    calls_->emplace_back('w', i);
    inner_->WaitParam(i);
  }
  Status TakeError() override { return inner_->TakeError(); }
  Status Drain() override { return inner_->Drain(); }
  std::vector<NamedArray> SaveState() const override { return inner_->SaveState(); }
  Status LoadState(const std::vector<NamedArray>& a) override { return inner_->LoadState(a); }

 private:
  std::unique_ptr<ParamSync> inner_;
  std::vector<std::pair<char, int>>* calls_;
};

TEST_F(TrainerTest, PushesEachGradientWhenReadyAndWaitsBeforeFirstUse) {
  TrainConfig cfg = cfg_;
  cfg.set_num_examples(256);  // 2 batches
  cfg.set_num_epochs(1);
  cfg.clear_data_dir();
  cfg.set_benchmark(1);
  cfg.set_image_shape("1,4,4");
  std::vector<std::pair<char, int>> calls;
  TrainerEnv env;
  env.log = &log_;
  env.build_model = SmallMlp;
  env.make_sync = [&](const OptimizerConfig& opt) -> StatusOr<std::unique_ptr<ParamSync>> {
    ASSIGN_OR_RETURN(std::unique_ptr<LocalParamSync> local, LocalParamSync::Create(opt));
    return std::unique_ptr<ParamSync>(new RecordingSync(std::move(local), &calls));
  };
  auto t = Trainer::Create(cfg, env);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_OK((*t)->Run());
  // Per training batch: forward waits fc1's params (0, 1) then fc2's (2, 3);
  // backward hands over fc2's gradients first, then fc1's.
  const std::vector<std::pair<char, int>> step = {{'w', 0}, {'w', 1}, {'w', 2}, {'w', 3},
                                                  {'g', 3}, {'g', 2}, {'g', 1}, {'g', 0}};
  ASSERT_GE(calls.size(), 2 * step.size());
  auto sorted_grads = [](std::vector<std::pair<char, int>> v) {
    // The order of a node's own weight and bias is the executor's choice.
    std::sort(v.begin() + 4, v.begin() + 6, std::greater<>());
    std::sort(v.begin() + 6, v.begin() + 8, std::greater<>());
    return v;
  };
  for (int b = 0; b < 2; ++b) {
    std::vector<std::pair<char, int>> got(calls.begin() + b * 8, calls.begin() + b * 8 + 8);
    EXPECT_EQ(sorted_grads(got), step) << "batch " << b;
  }
}

// --emulate-compute on a real model (LeNet): no data is opened, an epoch of 10
// batches at SECONDS each takes at least 10 x SECONDS (and, loosely, not much
// more), every parameter's gradient goes to the sync once per batch in the
// executor's backward order after the forward waited for each parameter, and
// the log has MXNet's speed and time lines but no accuracy.
TEST_F(TrainerTest, EmulatedComputeTakesItsTimeAndPushesEveryGradientInBackwardOrder) {
  constexpr double kSeconds = 0.04;
  TrainConfig cfg = cfg_;
  cfg.set_network("lenet");
  cfg.clear_data_dir();
  cfg.set_image_shape("1,28,28");
  cfg.set_num_examples(1280);  // 10 batches of 128
  cfg.set_num_epochs(2);
  cfg.set_disp_batches(5);
  cfg.set_emulate_compute(kSeconds);
  std::vector<std::pair<char, int>> calls;
  TrainerEnv env;
  env.log = &log_;
  env.build_model = BuildModel;
  env.make_sync = [&](const OptimizerConfig& opt) -> StatusOr<std::unique_ptr<ParamSync>> {
    ASSIGN_OR_RETURN(std::unique_ptr<LocalParamSync> local, LocalParamSync::Create(opt));
    return std::unique_ptr<ParamSync>(new RecordingSync(std::move(local), &calls));
  };
  auto t = Trainer::Create(cfg, env);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_NE((*t)->emulator(), nullptr);
  EXPECT_EQ((*t)->epoch_size(), 10);
  EXPECT_EQ((*t)->params().num_params(), 8);
  const auto start = SteadyClock::now();
  ASSERT_OK((*t)->Run());
  const double wall = std::chrono::duration<double>(SteadyClock::now() - start).count();
  EXPECT_GE(wall, 2 * 10 * kSeconds);
  EXPECT_LT(wall, 2 * 10 * kSeconds * 2 + 2.0);
  const auto& h = (*t)->history();
  ASSERT_EQ(h.size(), 2u);
  for (const EpochResult& r : h) {
    EXPECT_GE(r.seconds, 10 * kSeconds);
    EXPECT_LE(r.seconds, wall);
    EXPECT_TRUE(r.train.empty());
    EXPECT_TRUE(r.val.empty());
    EXPECT_EQ(r.samples, 1280);
  }
  // Per batch: the forward waits for conv1's weight and bias, conv2's, fc1's,
  // fc2's; the backward hands fc2's gradients over first, conv1's last.
  std::vector<std::pair<char, int>> step;
  for (int i = 0; i < 8; ++i) step.emplace_back('w', i);
  for (int node = 3; node >= 0; --node) {
    step.emplace_back('g', 2 * node);
    step.emplace_back('g', 2 * node + 1);
  }
  ASSERT_EQ(calls.size(), 20 * step.size());
  for (int b = 0; b < 20; ++b) {
    std::vector<std::pair<char, int>> got(calls.begin() + b * 16, calls.begin() + b * 16 + 16);
    EXPECT_EQ(got, step) << "batch " << b;
  }
  EXPECT_EQ(Matching("INFO:root:compute is emulated \\(--emulate-compute 0.04\\): .*").size(), 1u);
  EXPECT_EQ(Matching("INFO:root:train data: not opened, not read .* 10 batches per epoch").size(),
            1u);
  EXPECT_TRUE(Matching(".*(Train-|Validation-|accuracy=).*").empty());
  const auto speed =
      Matching(R"(INFO:root:Iter\[[01]\] Batch \[5\]\tSpeed: [0-9]+\.[0-9]{2} samples/sec)");
  ASSERT_EQ(speed.size(), 2u);
  for (const std::string& l : speed) {
    // 5 batches of 128 in no less than 5 x SECONDS: at most 3200 samples/s.
    const double v = std::stod(l.substr(l.find("Speed: ") + 7));
    EXPECT_LE(v, 5 * 128 / (5 * kSeconds) + 0.01) << l;
    EXPECT_GT(v, 5 * 128 / (5 * kSeconds) / 3) << l;
  }
  EXPECT_EQ(Matching(R"(INFO:root:Epoch\[[01]\] Time cost=[0-9]+\.[0-9]{3})").size(), 2u);
}

// --time-dilation K stretches the waits K times and divides what is reported
// by K. On a small case with nothing else to time (kv store `device`, which on
// the CPU is `local`: no link), K = 2 takes twice as long as K = 1 and
// reports the same time and speed; K = 2 with SECONDS halved takes as long as
// K = 1 and reports half the time.
TEST_F(TrainerTest, TimeDilationStretchesTheWaitsNotTheReportedTimes) {
  struct Result {
    double wall = 0, reported = 0, speed = 0;
  };
  auto run = [&](double seconds, double dilation) {
    Result r;
    lines_.clear();
    TrainConfig cfg = cfg_;
    cfg.set_network("mlp");
    cfg.set_kv_store("device");
    cfg.clear_data_dir();
    cfg.set_image_shape("1,28,28");
    cfg.set_num_examples(1280);  // 10 batches of 128
    cfg.set_num_epochs(1);
    cfg.set_disp_batches(5);
    cfg.set_emulate_compute(seconds);
    cfg.set_time_dilation(dilation);
    TrainerEnv env;
    env.log = &log_;
    env.build_model = BuildModel;
    auto t = Trainer::Create(cfg, env);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return r;
    const auto start = SteadyClock::now();
    EXPECT_OK((*t)->Run());
    r.wall = std::chrono::duration<double>(SteadyClock::now() - start).count();
    EXPECT_EQ((*t)->history().size(), 1u);
    if ((*t)->history().size() == 1) r.reported = (*t)->history()[0].seconds;
    auto speed = Matching(R"(INFO:root:Iter\[0\] Batch \[5\]\tSpeed: .*)");
    EXPECT_EQ(speed.size(), 1u);
    if (speed.size() == 1) r.speed = std::stod(speed[0].substr(speed[0].find("Speed: ") + 7));
    return r;
  };
  const Result a = run(0.04, 1), b = run(0.04, 2), c = run(0.02, 2);
  for (const auto& [name, r] :
       {std::pair{"0.04 s, K=1", a}, {"0.04 s, K=2", b}, {"0.02 s, K=2", c}}) {
    std::printf("%s: run %.3f s, reported %.3f s, %.2f samples/sec\n", name, r.wall, r.reported,
                r.speed);
  }
  // Lower bounds are tight: every batch waits SECONDS x K.
  EXPECT_GE(a.wall, 0.4);
  EXPECT_GE(b.wall, 0.8);
  EXPECT_GE(c.wall, 0.4);
  EXPECT_GE(a.reported, 0.4);
  EXPECT_GE(b.reported, 0.4);
  EXPECT_GE(c.reported, 0.2);
  // The reported time is the measured one divided by K (Run is the epoch).
  EXPECT_NEAR(a.reported, a.wall, 0.05);
  EXPECT_NEAR(2 * b.reported, b.wall, 0.05);
  EXPECT_NEAR(2 * c.reported, c.wall, 0.05);
  // Dilation leaves the report unchanged while the run takes twice as long;
  // loose upper bounds and tolerances for a loaded machine.
  EXPECT_LT(a.reported, 0.4 * 1.5 + 0.2);
  EXPECT_NEAR(b.reported, a.reported, 0.25 * a.reported) << "K=2 wall " << b.wall;
  EXPECT_NEAR(b.speed, a.speed, 0.25 * a.speed);
  EXPECT_LE(a.speed, 3200.01);  // 640 samples in >= 0.2 s
  EXPECT_LE(b.speed, 3200.01);
  // Halving SECONDS at K = 2 waits as K = 1 does, and reports half.
  EXPECT_NEAR(c.wall, a.wall, 0.25 * a.wall);
  EXPECT_NEAR(c.reported, a.reported / 2, 0.25 * a.reported / 2);
  EXPECT_LE(c.speed, 6400.01);
}

// With a data set and no --image-shape, the data is opened for its shape and
// size only: the epoch is as long as the real run's, and the readers go.
TEST_F(TrainerTest, EmulatedComputeTakesOnlyTheShapesOfTheData) {
  TrainConfig cfg = cfg_;
  cfg.set_network("lenet");
  cfg.clear_num_examples();  // all of MNIST: 60000 / 128
  cfg.set_emulate_compute(0.01);
  TrainerEnv env;
  env.log = &log_;
  env.build_model = BuildModel;
  auto t = Trainer::Create(cfg, env);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ((*t)->epoch_size(), 469);
  EXPECT_EQ(
      Matching("INFO:root:train data: MNIST train.*, not read \\(compute is emulated\\): 60000 "
               "examples of \\(1,28,28\\), 10 classes; 469 batches per epoch")
          .size(),
      1u);
}

TEST_F(TrainerTest, ResumeContinuesTheSameCurve) {
  TrainConfig straight = cfg_;
  straight.set_model_prefix((dir_ / "a").string());
  // An older run's optimizer state under the same prefix (a .states file, as
  // checkpoints kept it before): it must not be taken for this run's.
  NamedArray stale;
  stale.kind = NamedArray::Kind::kOptimizerState;
  stale.name = "fc1_weight_momentum";
  stale.shape = {1};
  stale.data = {1e3f};
  ASSERT_OK(SaveArrays((dir_ / "a-0001.states").string(), {stale}));
  auto a = Make(straight);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_OK((*a)->Run());
  ASSERT_TRUE(fs::exists(dir_ / "a-0001.params"));
  ASSERT_TRUE(fs::exists(dir_ / "a-0002.params"));
  // The momentum is in the .params (one rename commits it with the weights).
  EXPECT_FALSE(fs::exists(dir_ / "a-0001.states"));
  auto saved = LoadArrays((dir_ / "a-0001.params").string());
  ASSERT_OK(saved.status());
  EXPECT_TRUE(std::any_of(saved->begin(), saved->end(), [](const NamedArray& x) {
    return x.kind == NamedArray::Kind::kOptimizerState;
  }));
  EXPECT_EQ(Matching(R"(INFO:root:Saved checkpoint to ".*a-0002\.params")").size(), 1u);

  TrainConfig resumed = straight;
  resumed.set_load_epoch(1);
  auto expect_the_unbroken_curve = [&] {
    auto b = Make(resumed);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_OK((*b)->Run());
    ASSERT_EQ((*b)->history().size(), 1u);
    EXPECT_EQ((*b)->history()[0].epoch, 1);
    EXPECT_DOUBLE_EQ((*b)->history()[0].val[0].second, (*a)->history()[1].val[0].second);
    EXPECT_DOUBLE_EQ((*b)->history()[0].train[0].second, (*a)->history()[1].train[0].second);
    ExpectSameParams((*a)->devices(), (*b)->devices());
  };
  expect_the_unbroken_curve();

  // A checkpoint of the older layout (the momentum in a .states file beside
  // the .params) resumes the same way.
  std::vector<NamedArray> params, states;
  for (NamedArray& x : *saved) {
    (x.kind == NamedArray::Kind::kOptimizerState ? states : params).push_back(std::move(x));
  }
  ASSERT_OK(SaveArrays((dir_ / "a-0001.params").string(), params));
  ASSERT_OK(SaveArrays((dir_ / "a-0001.states").string(), states));
  expect_the_unbroken_curve();
}

// Every optimizer learns, and resumes on the unbroken run's curve with its
// state (Adam's mean, variance and update count, which its bias correction
// reads) from the checkpoint. A checkpoint of another optimizer is refused,
// naming what it holds.
TEST_F(TrainerTest, EveryOptimizerLearnsAndResumesOnTheSameCurve) {
  struct Case {
    const char* optimizer;
    float lr;
    std::vector<std::string> arrays;  // fc1_weight's state arrays
  };
  for (const Case& c :
       {Case{"nag", 0.1f, {"fc1_weight_momentum"}},
        Case{"adam", 0.002f, {"fc1_weight_mean", "fc1_weight_var", "fc1_weight_updates"}},
        Case{"rmsprop", 0.001f, {"fc1_weight_n"}},
        Case{"adagrad", 0.05f, {"fc1_weight_history"}}}) {
    SCOPED_TRACE(c.optimizer);
    TrainConfig straight = cfg_;
    straight.set_optimizer(c.optimizer);
    straight.set_lr(c.lr);
    straight.set_model_prefix((dir_ / c.optimizer).string());
    auto a = Make(straight);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_OK((*a)->Run());
    EXPECT_GT((*a)->history()[1].val[0].second, 0.8) << "it learns";
    auto saved = LoadArrays(StrCat(straight.model_prefix(), "-0001.params"));
    ASSERT_OK(saved.status());
    std::vector<std::string> state;
    for (const NamedArray& x : *saved) {
      if (x.kind == NamedArray::Kind::kOptimizerState && x.name.rfind("fc1_weight_", 0) == 0) {
        state.push_back(x.name);
        if (x.name == "fc1_weight_updates") {
          EXPECT_EQ(x.data, std::vector<float>({30.0f}));
        }
      }
    }
    EXPECT_EQ(state, c.arrays);

    TrainConfig resumed = straight;
    resumed.set_load_epoch(1);
    auto b = Make(resumed);
    ASSERT_TRUE(b.ok()) << b.status();
    ASSERT_OK((*b)->Run());
    EXPECT_DOUBLE_EQ((*b)->history()[0].val[0].second, (*a)->history()[1].val[0].second);
    ExpectSameParams((*a)->devices(), (*b)->devices());
  }
  // nag's checkpoint resumed under sgd: the same array names, refused by
  // the name of the optimizer that wrote them.
  TrainConfig sgd = cfg_;
  sgd.set_model_prefix((dir_ / "nag").string());
  sgd.set_load_epoch(1);
  auto d = Make(sgd);
  ASSERT_FALSE(d.ok()) << "nag's checkpoint taken by sgd";
  EXPECT_NE(d.status().message().find("written by nag, and this run's optimizer is sgd"),
            std::string::npos)
      << d.status();
  // Adam's checkpoint without one of its arrays: refused, naming it.
  auto arrays = LoadArrays((dir_ / "adam-0001.params").string());
  ASSERT_OK(arrays.status());
  std::vector<NamedArray> kept;
  for (NamedArray& x : *arrays) {
    if (x.name != "fc2_weight_var") kept.push_back(std::move(x));
  }
  ASSERT_OK(SaveArrays((dir_ / "adam-0001.params").string(), kept));
  TrainConfig adam = cfg_;
  adam.set_optimizer("adam");
  adam.set_model_prefix((dir_ / "adam").string());
  adam.set_load_epoch(1);
  auto e = Make(adam);
  ASSERT_FALSE(e.ok()) << "a state without fc2_weight_var";
  EXPECT_NE(e.status().message().find("the optimizer state of fc2_weight lacks fc2_weight_var"),
            std::string::npos)
      << e.status();
  // adagrad's checkpoint resumed under sgd with momentum.
  TrainConfig other = cfg_;
  other.set_model_prefix((dir_ / "adagrad").string());
  other.set_load_epoch(1);
  auto c = Make(other);
  ASSERT_FALSE(c.ok()) << "adagrad's checkpoint taken by sgd";
  const Status s = c.status();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("written by adagrad, and this run's optimizer is sgd"),
            std::string::npos)
      << s;
  EXPECT_NE(s.message().find("resume with the --optimizer (and --mom) it was written with"),
            std::string::npos)
      << s;
}

// --model-prefix in a folder that is not there yet: made before training, as
// fit.py does (found by review: the first save failed after its epoch had
// trained). A file in the way is an error before any epoch.
TEST_F(TrainerTest, TheCheckpointsFolderIsMadeBeforeTraining) {
  TrainConfig cfg = cfg_;
  cfg.set_num_epochs(1);
  cfg.set_model_prefix((dir_ / "new" / "deeper" / "m").string());
  auto made = Make(cfg);
  ASSERT_TRUE(made.ok()) << made.status();
  ASSERT_OK((*made)->Run());
  EXPECT_TRUE(fs::exists(dir_ / "new" / "deeper" / "m-0001.params"));

  std::ofstream(dir_ / "file") << "x";
  cfg.set_model_prefix((dir_ / "file" / "m").string());
  auto blocked = Make(cfg);
  ASSERT_TRUE(blocked.ok()) << blocked.status();
  const Status s = (*blocked)->Run();
  EXPECT_EQ(s.code(), StatusCode::kIOError) << s;
  EXPECT_NE(s.message().find("cannot make its folder " + (dir_ / "file").string()),
            std::string::npos)
      << s;
  EXPECT_TRUE((*blocked)->history().empty());
}

// Dropout masks follow from the seed and the epoch: a resumed run draws the
// unbroken run's (it drew the first epoch's again, and ended elsewhere).
TEST_F(TrainerTest, ResumeWithDropoutDrawsTheUnbrokenRunsMasks) {
  auto build = [](const ModelOptions& mo) { return SmallMlpOf(mo, false, /*dropout=*/true); };
  TrainConfig straight = cfg_;
  straight.set_model_prefix((dir_ / "d").string());
  auto a = Make(straight, build);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_OK((*a)->Run());
  TrainConfig resumed = straight;
  resumed.set_load_epoch(1);
  auto b = Make(resumed, build);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_OK((*b)->Run());
  ExpectSameParams((*a)->devices(), (*b)->devices());
}

// A part shorter than an epoch (here 2400 examples, 19 batches, for an epoch
// of 30) is gone round within each epoch, one more shuffle each time: a
// resumed run makes those too, and continues the unbroken run's curve.
TEST_F(TrainerTest, ResumeContinuesTheSameCurveWhenEpochsGoRoundTheirPart) {
  auto make = [&](const TrainConfig& cfg) {
    TrainerEnv env;
    env.log = &log_;
    env.build_model = SmallMlp;
    env.open_data = [&cfg](int, int) -> StatusOr<TrainData> {
      ASSIGN_OR_RETURN(TrainData d, OpenTrainData(cfg, /*rank=*/0, /*num_workers=*/25));
      if (d.train->num_examples() != 2400) return Status::Internal("expected 2400 examples");
      return d;
    };
    return Trainer::Create(cfg, env);
  };
  TrainConfig straight = cfg_;
  straight.set_num_epochs(3);
  straight.set_model_prefix((dir_ / "w").string());
  auto a = make(straight);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_OK((*a)->Run());
  TrainConfig resumed = straight;
  resumed.set_load_epoch(2);
  auto b = make(resumed);
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_OK((*b)->Run());
  ASSERT_EQ((*b)->history().size(), 1u);
  EXPECT_EQ((*b)->history()[0].train[0].second, (*a)->history()[2].train[0].second);
  EXPECT_EQ((*b)->history()[0].val[0].second, (*a)->history()[2].val[0].second);
  ExpectSameParams((*a)->devices(), (*b)->devices());
}

// The last batch is one the Speedometer reports (and then resets the metrics
// after): the epoch's Train- value is still the one it reported, not nan.
TEST_F(TrainerTest, TheTrainValueOfAnEpochWhoseLastBatchIsReportedIsANumber) {
  TrainConfig cfg = cfg_;
  cfg.set_num_epochs(1);
  cfg.set_disp_batches(29);  // batches 0..29: Batch [29] is the last
  auto t = Make(cfg);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_OK((*t)->Run());
  const double train = (*t)->history()[0].train[0].second;
  EXPECT_TRUE(std::isfinite(train)) << train;
  auto speed = Matching(R"(INFO:root:Epoch\[0\] Batch \[29\]\tSpeed: .*accuracy=([01]\.[0-9]{6}))");
  ASSERT_EQ(speed.size(), 1u);
  char want[32];
  std::snprintf(want, sizeof(want), "accuracy=%.6f", train);
  EXPECT_NE(speed[0].find(want), std::string::npos) << speed[0] << " vs " << want;
  EXPECT_TRUE(Matching(R"(INFO:root:Epoch\[0\] Train-accuracy=nan)").empty());
}

// Rank r > 0 of a dist job saved prefix-<r>: resumed, it loads its own file
// (its own BatchNorm statistics), as fit.py's _load_model; without one, the prefix.
TEST_F(TrainerTest, ARankAboveZeroResumesFromItsOwnCheckpoint) {
  TrainConfig cfg = cfg_;
  cfg.set_num_epochs(1);
  cfg.set_model_prefix((dir_ / "r").string());
  TrainerEnv env;
  env.log = &log_;
  env.build_model = SmallMlp;
  env.rank = 1;
  env.num_workers = 2;
  auto a = Trainer::Create(cfg, env);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_OK((*a)->Run());
  ASSERT_TRUE(fs::exists(dir_ / "r-1-0001.params"));
  ASSERT_FALSE(fs::exists(dir_ / "r-0001.params"));
  TrainConfig resumed = cfg;
  resumed.set_num_epochs(2);
  resumed.set_load_epoch(1);
  auto b = Trainer::Create(resumed, env);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(Matching(R"(INFO:root:Loaded parameters from ".*r-1-0001\.params")").size(), 1u);
  // Rank 0's file only: rank 1 falls back to it.
  fs::rename(dir_ / "r-1-0001.params", dir_ / "r-0001.params");
  lines_.clear();
  auto c = Trainer::Create(resumed, env);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(Matching(R"(INFO:root:Loaded parameters from ".*/r-0001\.params")").size(), 1u);
}

// MNIST's labels 0-9 against a network of 5 classes (--num-classes 5): the
// run stops at the first such label, naming it, instead of training a model
// that can never be right.
TEST_F(TrainerTest, ALabelPastTheNetworksClassesIsAnError) {
  TrainConfig cfg = cfg_;
  cfg.set_num_classes(5);
  auto t = Make(cfg);
  ASSERT_TRUE(t.ok()) << t.status();
  Status s = (*t)->Run();
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("MNIST train"), std::string::npos) << s;
  EXPECT_NE(s.message().find("not a class of the network's 5 outputs (--num-classes 5)"),
            std::string::npos)
      << s;
}

TEST_F(TrainerTest, BadCheckpointIsAClearError) {
  TrainConfig cfg = cfg_;
  cfg.set_model_prefix((dir_ / "missing").string());
  cfg.set_load_epoch(1);
  auto t = Make(cfg);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("missing-0001.params"), std::string::npos) << t.status();
  NamedArray wrong;
  wrong.name = "fc1_weight";
  wrong.shape = {3};
  wrong.data = {1, 2, 3};
  ASSERT_OK(SaveArrays((dir_ / "missing-0001.params").string(), {wrong}));
  t = Make(cfg);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("fc1_weight has shape (3)"), std::string::npos) << t.status();
}

TEST_F(TrainerTest, TestIoOnlyReads) {
  TrainConfig cfg = cfg_;
  cfg.clear_network();
  cfg.set_test_io(1);
  cfg.set_disp_batches(100);
  auto t = Make(cfg);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_OK((*t)->Run());
  EXPECT_EQ(Matching(R"(INFO:root:Batch \[[0-9]*99\]\tSpeed: [0-9]+\.[0-9]{2} samples/sec)").size(),
            4u);  // 469 batches: 99, 199, 299, 399
  EXPECT_GT((*t)->test_io_speed(), 0.0);
  EXPECT_TRUE((*t)->history().empty());
}

TEST_F(TrainerTest, SyntheticBenchmarkTrains) {
  TrainConfig cfg = cfg_;
  cfg.clear_data_dir();
  cfg.set_benchmark(1);
  cfg.set_image_shape("3,8,8");
  cfg.set_num_classes(5);
  cfg.set_num_examples(512);
  cfg.set_num_epochs(1);
  auto t = Make(cfg);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_OK((*t)->Run());
  ASSERT_EQ((*t)->history().size(), 1u);
  EXPECT_TRUE((*t)->history()[0].val.empty());
}

// The loop on devices the host cannot address (the CPU playing one:
// BackendOptions::cpu_as_device), as on GPUs: LocalParamSync's update and
// momentum in device memory, and with two devices the local merge's
// downloads and merge thread or the device merge's copies, the broadcasts,
// the epoch's aux averaging and the checkpoint's reads. It trains bit for bit
// as the host does, checkpoint files included.
TEST_F(TrainerTest, DevicesTheHostCannotAddressTrainExactlyAsTheHost) {
  // (One device merges nothing: its run is the same for both kv-stores.)
  // The optimizers' state on a device too: Adam's two arrays and update count
  // (in the checkpoint), and RMSProp's.
  struct Case {
    const char* kv;
    int devices;
    const char* optimizer;
    float lr;
  };
  for (const auto& [kv, devices, optimizer, lr] :
       {Case{"local", 1, "sgd", 0.1f}, Case{"local", 2, "sgd", 0.1f},
        Case{"device", 2, "sgd", 0.1f}, Case{"local", 1, "adam", 0.002f},
        Case{"device", 2, "rmsprop", 0.001f}}) {
    {
      SCOPED_TRACE(StrCat("--kv-store ", kv, ", ", devices, " device(s), --optimizer ", optimizer));
      std::vector<std::unique_ptr<Trainer>> runs;
      std::vector<std::string> checkpoints;
      for (bool as_device : {false, true}) {
        TrainConfig cfg = cfg_;
        cfg.set_kv_store(kv);
        cfg.set_num_examples(1280);
        cfg.set_optimizer(optimizer);
        cfg.set_lr(lr);
        const std::string prefix =
            (dir_ / StrCat(kv, devices, optimizer, as_device ? "-device" : "-host")).string();
        cfg.set_model_prefix(prefix);
        TrainerEnv env;
        env.log = &log_;
        env.build_model = SmallBnMlp;
        env.adjust_devices = [devices, as_device](DeviceGroupOptions* go) {
          go->devices.assign(devices, go->devices[0]);
          for (BackendOptions& b : go->devices) b.cpu_as_device = as_device;
        };
        auto t = Trainer::Create(cfg, env);
        ASSERT_OK(t.status());
        ASSERT_OK((*t)->Run());
        EXPECT_NE((*t)->devices().executor(0).backend().host_accessible(), as_device);
        runs.push_back(std::move(t).value());
        checkpoints.push_back(testing::ReadFile(StrCat(prefix, "-0002.params")));
        ASSERT_FALSE(checkpoints.back().empty());
      }
      const ModelParams& host = runs[0]->params();
      const ModelParams& dev = runs[1]->params();
      for (int i = 0; i < host.num_params(); ++i) {
        std::vector<float> want(static_cast<size_t>(host.param(i).num_elements()));
        std::vector<float> got(want.size());
        ASSERT_OK(host.ReadParam(i, want.data(), want.size()));
        ASSERT_OK(dev.ReadParam(i, got.data(), got.size()));
        EXPECT_EQ(got, want) << host.graph().params()[i].name;
      }
      EXPECT_EQ(runs[1]->history().back().val, runs[0]->history().back().val);
      EXPECT_TRUE(checkpoints[1] == checkpoints[0]) << "the checkpoints differ";
    }
  }
}

// With several devices the trainer averages their BatchNorm statistics at
// each epoch's end (MXNet's fit: get_params, set_params), so every device,
// the checkpoint and validation hold one set.
TEST_F(TrainerTest, SeveralDevicesEndEachEpochWithTheirMeanStatistics) {
  TrainConfig cfg = cfg_;
  cfg.set_num_examples(1280);
  cfg.set_num_epochs(1);
  TrainerEnv env;
  env.log = &log_;
  env.build_model = SmallBnMlp;
  env.adjust_devices = [](DeviceGroupOptions* go) {
    go->devices.assign(2, go->devices[0]);
    go->weights = {1, 3};  // different shares, so different statistics
  };
  auto t = Trainer::Create(cfg, env);
  ASSERT_OK(t.status());
  ASSERT_OK((*t)->Run());
  const DeviceGroup& g = (*t)->devices();
  ASSERT_EQ(g.num_devices(), 2);
  int means = 0;
  for (int i = 0; i < static_cast<int>(g.graph().aux_states().size()); ++i) {
    const size_t n = static_cast<size_t>(g.graph().aux_states()[i].shape.num_elements());
    std::vector<float> a0(n), a1(n);
    ASSERT_OK(g.executor(0).ReadAux(i, a0.data(), n));
    ASSERT_OK(g.executor(1).ReadAux(i, a1.data(), n));
    EXPECT_EQ(a0, a1) << g.graph().aux_states()[i].name;
    if (g.graph().aux_states()[i].role == ParamRole::kMovingMean) {
      ++means;
      EXPECT_NE(*std::max_element(a0.begin(), a0.end()), 0.0f) << "statistics were folded in";
    }
  }
  EXPECT_EQ(means, 1);
}

// --kv-store local: a gradient or an update with NaN or Inf is an error the
// loop returns (training stops non-zero), naming the parameter.
TEST(LocalParamSyncTest, NanGradientsAndOverflowingUpdatesAreErrors) {
  StatusOr<Graph> g = BuildModel({"mlp", 0, Shape(), 0});
  ASSERT_OK(g.status());
  ExecutorOptions eo;
  eo.batch_size = 2;
  auto exec = Executor::Create(*g, eo);
  ASSERT_OK(exec.status());
  Executor& e = **exec;
  OptimizerConfig oc;
  oc.set_learning_rate(0.1f);
  auto sync = LocalParamSync::Create(oc);
  ASSERT_OK(sync.status());
  ASSERT_OK((*sync)->Init(&e));
  (*sync)->OnGradReady(0);
  ASSERT_OK((*sync)->TakeError());
  e.host_grad(2)[7] = std::nanf("");
  (*sync)->OnGradReady(2);
  Status s = (*sync)->TakeError();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("gradient of fc2_weight holds NaN or Inf at update 1"),
            std::string::npos)
      << s;
  ASSERT_OK((*sync)->TakeError());  // reported once
  // One the loop has not taken yet (the last merge of an epoch) comes from
  // Drain, before a checkpoint could save the broken weights.
  e.host_grad(2)[7] = std::nanf("");
  (*sync)->OnGradReady(2);
  s = (*sync)->Drain();
  EXPECT_NE(s.message().find("gradient of fc2_weight holds NaN or Inf"), std::string::npos) << s;
  ASSERT_OK((*sync)->Drain());
  oc.set_learning_rate(3e38f);
  auto huge = LocalParamSync::Create(oc);
  ASSERT_OK(huge.status());
  ASSERT_OK((*huge)->Init(&e));
  e.host_grad(0)[0] = 100.0f;
  (*huge)->OnGradReady(0);
  s = (*huge)->TakeError();
  EXPECT_NE(s.message().find("learning rate is too large"), std::string::npos) << s;
}

// On a device the host cannot address (the CPU playing one), the update is
// the backend's and so is the check: TakeError reports it as on the host,
// naming the parameter, and so does Drain for the last step's updates.
TEST(LocalParamSyncTest, NanGradientsOnADeviceAreErrorsToo) {
  StatusOr<Graph> g = BuildModel({"mlp", 0, Shape(), 0});
  ASSERT_OK(g.status());
  ExecutorOptions eo;
  eo.batch_size = 2;
  eo.backend.cpu_as_device = true;
  auto exec = Executor::Create(*g, eo);
  ASSERT_OK(exec.status());
  Executor& e = **exec;
  ASSERT_EQ(e.host_param(0), nullptr);
  OptimizerConfig oc;
  oc.set_learning_rate(0.1f);
  oc.set_momentum(0.9f);
  oc.set_clip_gradient(1.0f);  // clipping keeps NaN NaN
  auto sync = LocalParamSync::Create(oc);
  ASSERT_OK(sync.status());
  ASSERT_OK((*sync)->Init(&e));
  (*sync)->OnGradReady(0);
  ASSERT_OK((*sync)->TakeError());
  e.grad(2).data()[7] = std::nanf("");
  (*sync)->OnGradReady(2);
  Status s = (*sync)->TakeError();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("gradient of fc2_weight holds NaN or Inf at update 1"),
            std::string::npos)
      << s;
  ASSERT_OK((*sync)->TakeError());  // reported once
  (*sync)->OnGradReady(2);
  s = (*sync)->Drain();
  EXPECT_NE(s.message().find("gradient of fc2_weight holds NaN or Inf at update 2"),
            std::string::npos)
      << s;
  ASSERT_OK((*sync)->Drain());
}

// A parameter of 1.5M floats is updated in pieces over threads: the same
// weights and momentum as Optimizer::Update's one pass, bit for bit, step
// after step; a NaN in its last piece is still reported.
// On a device the host cannot address (the CPU playing one), the momentum
// lives in the device's memory from Init, one buffer for every parameter,
// and only where the optimizer keeps one.
TEST(LocalParamSyncTest, TheMomentumOfADevicesParametersIsAllocatedByInit) {
  StatusOr<Graph> g = SmallMlp({"small-mlp", 0, Shape{1, 4, 4}, 3});
  ASSERT_OK(g.status());
  ExecutorOptions eo;
  eo.batch_size = 2;
  eo.backend.num_threads = 1;
  eo.backend.cpu_as_device = true;
  auto e = Executor::Create(*g, eo);
  ASSERT_OK(e.status());
  ASSERT_EQ((*e)->host_param(0), nullptr);
  OptimizerConfig oc;
  oc.set_learning_rate(0.1f);
  for (float mom : {0.0f, 0.9f}) {
    SCOPED_TRACE(StrCat("momentum ", mom));
    oc.set_momentum(mom);
    auto sync = LocalParamSync::Create(oc);
    ASSERT_OK(sync.status());
    const size_t before = (*e)->backend().memory_stats().in_use;
    ASSERT_OK((*sync)->Init(e->get()));
    const size_t grew = (*e)->backend().memory_stats().in_use - before;
    const std::vector<NamedArray> state = (*sync)->SaveState();
    if (mom == 0.0f) {
      EXPECT_EQ(grew, 0u);
      EXPECT_TRUE(state.empty());
      continue;
    }
    EXPECT_GE(grew, static_cast<size_t>(g->NumParams()) * sizeof(float));
    ASSERT_EQ(state.size(), g->params().size() + 1) << "each momentum, and whose they are";
    EXPECT_EQ(state.back().name, "__optimizer_sgd");
    for (const NamedArray& a : std::vector<NamedArray>(state.begin(), state.end() - 1)) {
      EXPECT_TRUE(std::all_of(a.data.begin(), a.data.end(), [](float v) { return v == 0; }))
          << a.name;
    }
  }
}

TEST(LocalParamSyncTest, LargeParametersUpdateInPiecesExactlyAsInOnePass) {
  Graph g;
  FcParam fc;
  fc.num_hidden = 1500;
  g.SoftmaxOutput("softmax", g.FullyConnected("fc", g.Input("data", {1000}), fc));
  ASSERT_OK(g.status());
  auto params = HostParams::Create(g);
  ASSERT_OK(params.status());
  HostParams& hp = **params;
  const size_t n = static_cast<size_t>(hp.param(0).num_elements());
  ASSERT_EQ(n, 1500000u);
  for (size_t k = 0; k < n; ++k) hp.host_param(0)[k] = 0.01f * static_cast<float>(k % 101) - 0.5f;
  std::vector<float> want(hp.host_param(0), hp.host_param(0) + n);
  OptimizerConfig oc;
  oc.set_learning_rate(0.1f);
  oc.set_momentum(0.9f);
  oc.set_wd(1e-4f);
  oc.set_rescale_grad(0.5f);
  auto sync = LocalParamSync::Create(oc);
  ASSERT_OK(sync.status());
  ASSERT_OK((*sync)->Init(&hp));
  auto ref = Optimizer::Create(oc);
  ASSERT_OK(ref.status());
  ParamState ref_state;
  ref_state.wd_mult = WeightDecayMult("fc_weight");
  for (int step = 0; step < 3; ++step) {
    for (size_t k = 0; k < n; ++k) {
      hp.host_grad(0)[k] = 1e-3f * static_cast<float>((k * 7 + step) % 13) - 6e-3f;
    }
    (*sync)->OnGradReady(0);
    ASSERT_OK((*sync)->TakeError());
    ASSERT_TRUE((*ref)->Update(hp.host_grad(0), want.data(), n, &ref_state).ok());
    ASSERT_EQ(0, std::memcmp(want.data(), hp.host_param(0), n * sizeof(float))) << "step " << step;
  }
  const std::vector<NamedArray> saved = (*sync)->SaveState();
  bool found = false;
  for (const NamedArray& a : saved) {
    if (a.name.find("fc_weight") == std::string::npos) continue;
    found = true;
    ASSERT_EQ(a.data.size(), n);
    EXPECT_EQ(0, std::memcmp(a.data.data(), ref_state.slots.data(), n * sizeof(float)));
  }
  EXPECT_TRUE(found) << "no momentum of fc_weight in the saved state";
  hp.host_grad(0)[n - 3] = std::nanf("");
  (*sync)->OnGradReady(0);
  const Status s = (*sync)->TakeError();
  EXPECT_NE(s.message().find("gradient of fc_weight holds NaN or Inf"), std::string::npos) << s;
}

// The devices and the merge of a training step, as `train` and `summary` make them.
TEST(TrainingDevicesTest, DeviceGroupOptionsFollowTheFlags) {
  TrainConfig cfg;
  cfg.set_batch_size(12);
  cfg.set_num_threads(3);
  auto cpu = TrainingDeviceGroupOptions(cfg);
  ASSERT_OK(cpu.status());
  ASSERT_EQ(cpu->devices.size(), 1u);
  EXPECT_TRUE(cpu->devices[0].device.is_cpu());
  EXPECT_EQ(cpu->devices[0].num_threads, 3);
  EXPECT_EQ(cpu->batch_size, 12);
  cfg.set_gpus("0,0,1");
  cfg.set_gpu_weights("2,1,1");
  cfg.set_gpu_tf32(0);
  for (const auto& [kv, merge] : std::vector<std::pair<std::string, MergeDevice>>{
           {"local", MergeDevice::kLocal},
           {"device", MergeDevice::kDevice},
           {"dist_sync", MergeDevice::kLocal},
           {"dist_async", MergeDevice::kLocal},
           {"dist_device_sync", MergeDevice::kDevice}}) {
    cfg.set_kv_store(kv);
    auto go = TrainingDeviceGroupOptions(cfg);
    ASSERT_OK(go.status());
    EXPECT_EQ(go->merge, merge) << kv;
    ASSERT_EQ(go->devices.size(), 3u);
    EXPECT_EQ(go->devices[2].device, Device::Gpu(1));
    EXPECT_FALSE(go->devices[0].gpu_tf32);
    EXPECT_EQ(go->weights, (std::vector<double>{2, 1, 1}));
  }
  cfg.set_kv_store("device");
  cfg.set_gc_type("2bit");
  auto gc = TrainingDeviceGroupOptions(cfg);
  ASSERT_OK(gc.status());
  EXPECT_TRUE(gc->compression.enabled()) << "device compresses before the merge";
  cfg.set_kv_store("dist_sync");
  auto dist = TrainingDeviceGroupOptions(cfg);
  ASSERT_OK(dist.status());
  EXPECT_FALSE(dist->compression.enabled()) << "the dist kvstores compress the push";
}

}  // namespace
}  // namespace pstrain
