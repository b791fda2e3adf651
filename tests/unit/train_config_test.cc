// The job config: text files, flag overrides, validation, fit.py's derived
// optimizer settings.
#include "worker/train_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/mnist.h"
#include "tests/test_util.h"
#include "worker/train_data.h"

namespace pstrain {
namespace {

TrainConfig Valid() {
  TrainConfig cfg;
  cfg.set_network("lenet");
  cfg.set_data_dir("/data/mnist");
  return cfg;
}

// fit.py's defaults, except lr: 0.05 as MXNet's train_mnist.py and train_cifar10.py set it.
TEST(TrainConfigTest, DefaultsAreFitPys) {
  TrainConfig cfg;
  EXPECT_EQ(cfg.version(), 1);
  EXPECT_EQ(cfg.num_epochs(), 100);
  EXPECT_EQ(cfg.batch_size(), 128);
  EXPECT_FLOAT_EQ(cfg.lr(), 0.05f);
  EXPECT_FLOAT_EQ(cfg.lr_factor(), 0.1f);
  EXPECT_FLOAT_EQ(cfg.mom(), 0.9f);
  EXPECT_FLOAT_EQ(cfg.wd(), 0.0001f);
  EXPECT_EQ(cfg.disp_batches(), 20);
  EXPECT_EQ(cfg.kv_store(), "device");
  EXPECT_EQ(cfg.optimizer(), "sgd");
  EXPECT_EQ(cfg.initializer(), "default");
  EXPECT_EQ(cfg.top_k(), 0);
}

TEST(TrainConfigTest, ParsesTextAndNamesSyntaxErrors) {
  auto cfg = ParseTrainConfigText("network: \"mlp\"\nnum_epochs: 3\nlr: 0.05\n", "job.cfg");
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->network(), "mlp");
  EXPECT_EQ(cfg->num_epochs(), 3);
  auto bad = ParseTrainConfigText("network: \"mlp\"\nnum_epoch: 3\n", "job.cfg");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("job.cfg:2:"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("num_epoch"), std::string::npos) << bad.status();
  auto newer = ParseTrainConfigText("version: 2\n", "job.cfg");
  ASSERT_FALSE(newer.ok());
  EXPECT_NE(newer.status().message().find("version 2"), std::string::npos);
}

TEST(TrainConfigTest, ReadsFilesAndReportsMissingOnes) {
  auto path = std::filesystem::temp_directory_path() /
              ("pstrain_cfg_" + std::to_string(::getpid()) + ".txt");
  {
    std::ofstream out(path);
    out << "# a comment\nnetwork: \"lenet\"\nbatch_size: 64\n";
  }
  auto cfg = ReadTrainConfigFile(path.string());
  std::filesystem::remove(path);
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  EXPECT_EQ(cfg->batch_size(), 64);
  auto missing = ReadTrainConfigFile(path.string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  // A folder opens as a stream that reads nothing: not an empty config.
  auto folder = ReadTrainConfigFile(path.parent_path().string());
  EXPECT_EQ(folder.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(folder.status().message().find("is a directory"), std::string::npos) << folder.status();
}

TEST(TrainConfigTest, OverridesWinAndAreTyped) {
  auto cfg = ParseTrainConfigText("network: \"mlp\"\nnum_epochs: 3\nlr: 0.05\n", "f");
  ASSERT_TRUE(cfg.ok());
  ASSERT_OK(ApplyConfigOverrides({{"num-epochs", "7"},
                                  {"network", "lenet"},
                                  {"wd", "1e-5"},
                                  {"seed", "42"},
                                  {"num_examples", "1000"}},
                                 &*cfg));
  EXPECT_EQ(cfg->num_epochs(), 7);
  EXPECT_EQ(cfg->network(), "lenet");
  EXPECT_FLOAT_EQ(cfg->lr(), 0.05f);  // from the file, not overridden
  EXPECT_FLOAT_EQ(cfg->wd(), 1e-5f);
  EXPECT_EQ(cfg->seed(), 42u);
  EXPECT_EQ(cfg->num_examples(), 1000);
  Status s = ApplyConfigOverrides({{"num-epochs", "seven"}}, &*cfg);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--num-epochs='seven' is not an integer"), std::string::npos) << s;
  s = ApplyConfigOverrides({{"no-such-flag", "1"}}, &*cfg);
  EXPECT_NE(s.message().find("--no-such-flag"), std::string::npos) << s;
  s = ApplyConfigOverrides({{"lr", "0.1x"}}, &*cfg);
  EXPECT_NE(s.message().find("is not a number"), std::string::npos) << s;
  // The uint64 seed takes its whole range, and nothing signed.
  ASSERT_OK(ApplyConfigOverrides({{"seed", "18446744073709551615"}}, &*cfg));
  EXPECT_EQ(cfg->seed(), 18446744073709551615ull);
  for (const char* bad : {"-1", "+1", " 1", "18446744073709551616"}) {
    s = ApplyConfigOverrides({{"seed", bad}}, &*cfg);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
  }
}

TEST(TrainConfigTest, ValidationNamesTheBadValue) {
  EXPECT_OK(ValidateTrainConfig(Valid()));
  auto expect_bad = [](TrainConfig cfg, const std::string& needle) {
    Status s = ValidateTrainConfig(cfg);
    EXPECT_FALSE(s.ok()) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s;
  };
  TrainConfig c = Valid();
  c.set_batch_size(0);
  expect_bad(c, "--batch-size=0");
  c = Valid();
  c.set_kv_store("dist_foo");
  expect_bad(c, "--kv-store='dist_foo'");
  c = Valid();
  c.set_image_shape("1,28");
  expect_bad(c, "must be C,H,W");
  c = Valid();
  c.set_lr_step_epochs("10,5");
  expect_bad(c, "increasing");
  c = Valid();
  c.clear_network();
  expect_bad(c, "--network is required");
  c = Valid();
  c.clear_data_dir();
  expect_bad(c, "--data-dir (MNIST, CIFAR-10 binary) or --data-train (RecordIO) is required");
  c.set_data_train("/data/cifar_train.rec");
  EXPECT_OK(ValidateTrainConfig(c));
  c.set_benchmark(1);
  expect_bad(c, "--image-shape");
  c.set_image_shape("3,32,32");
  EXPECT_OK(ValidateTrainConfig(c));
  c = Valid();
  c.set_load_epoch(2);
  expect_bad(c, "--load-epoch needs --model-prefix");
  c = Valid();
  c.set_optimizer("lamb");
  expect_bad(c, "--optimizer='lamb'");
  c = Valid();
  c.set_mom(1.5f);
  expect_bad(c, "--mom=1.5");
}

// --emulate-compute and --time-dilation: bad values name the flag and the
// value, and emulation excludes what it cannot do honestly.
TEST(TrainConfigTest, EmulatedComputeFlagsAreChecked) {
  auto expect_bad = [](const TrainConfig& cfg, const std::string& needle) {
    Status s = ValidateTrainConfig(cfg);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << needle;
    EXPECT_NE(s.message().find(needle), std::string::npos) << s;
  };
  TrainConfig c = Valid();
  EXPECT_FALSE(EmulationNeedsNoData(c));
  c.set_emulate_compute(0.364);
  EXPECT_OK(ValidateTrainConfig(c));
  c.set_time_dilation(2.5);
  EXPECT_OK(ValidateTrainConfig(c));
  c.set_emulate_compute(0);  // set explicitly: not "off"
  expect_bad(c, "--emulate-compute=0 must be a number of seconds per batch > 0");
  c.set_emulate_compute(-0.5);
  expect_bad(c, "--emulate-compute=-0.5 must be");
  c.set_emulate_compute(std::nan(""));
  expect_bad(c, "--emulate-compute=nan must be");
  c.set_emulate_compute(0.1);
  c.set_time_dilation(0.5);
  expect_bad(c, "--time-dilation=0.5 must be a factor >= 1");
  c.set_time_dilation(0);
  expect_bad(c, "--time-dilation=0 must be");
  c = Valid();
  c.set_time_dilation(2);
  expect_bad(c, "--time-dilation=2 needs --emulate-compute");
  c.set_time_dilation(1);
  EXPECT_OK(ValidateTrainConfig(c));
  for (auto set : std::vector<void (*)(TrainConfig*)>{
           [](TrainConfig* t) { t->set_test_io(1); }, [](TrainConfig* t) { t->set_gpus("0"); },
           [](TrainConfig* t) { t->set_model_prefix("/tmp/m"); }}) {
    c = Valid();
    c.set_emulate_compute(0.1);
    set(&c);
    expect_bad(c, "--emulate-compute=0.1 ");
  }
  // No data set is needed when the flags say its shape and size.
  c = Valid();
  c.clear_data_dir();
  c.set_emulate_compute(0.1);
  expect_bad(c, "or --emulate-compute with --image-shape and --num-examples");
  c.set_image_shape("3,28,28");
  expect_bad(c, "--data-dir");
  c.set_num_examples(60000);
  EXPECT_TRUE(EmulationNeedsNoData(c));
  EXPECT_OK(ValidateTrainConfig(c));
  // A non-number from a flag names the flag as it is written.
  Status s = ApplyConfigOverrides({{"emulate_compute", "abc"}}, &c);
  EXPECT_NE(s.message().find("--emulate-compute='abc' is not a number"), std::string::npos) << s;
  s = ApplyConfigOverrides({{"time_dilation", "inf"}}, &c);
  EXPECT_NE(s.message().find("--time-dilation='inf' is not a number"), std::string::npos) << s;
}

TEST(TrainConfigTest, DevicesAreGpusAndTheirWeights) {
  TrainConfig cfg = Valid();
  auto cpu = ParseTrainingDevices(cfg);
  ASSERT_OK(cpu.status());
  EXPECT_TRUE(cpu->gpus.empty());
  EXPECT_TRUE(cpu->weights.empty());
  cfg.set_gpus("0,0,2");
  cfg.set_gpu_weights("2,1,0.5");
  auto three = ParseTrainingDevices(cfg);
  ASSERT_OK(three.status());
  EXPECT_EQ(three->gpus, (std::vector<int>{0, 0, 2}));
  EXPECT_EQ(three->weights, (std::vector<double>{2, 1, 0.5}));
  ASSERT_OK(ValidateTrainConfig(cfg));
  for (const char* bad : {"2,1", "2,1,0", "2,x,1", "2,,1", "1,2,-3"}) {
    cfg.set_gpu_weights(bad);
    const Status s = ValidateTrainConfig(cfg);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find("--gpu-weights"), std::string::npos) << s;
  }
  cfg.set_gpu_weights("");
  cfg.set_gpus("0,-1");
  EXPECT_FALSE(ValidateTrainConfig(cfg).ok());
  // Not cut to an int (4294967296 would have been GPU 0).
  cfg.set_gpus("4294967296");
  const Status huge = ValidateTrainConfig(cfg);
  EXPECT_NE(huge.message().find("GPU 4294967296 is not a device number"), std::string::npos)
      << huge;
}

TEST(TrainConfigTest, KvStoresAreMxnetsFive) {
  for (const char* kv : {"local", "device", "dist_sync", "dist_async", "dist_device_sync"}) {
    EXPECT_OK(ValidateKvStore(kv));
  }
  const Status s = ValidateKvStore("dist");
  EXPECT_NE(s.message().find("--kv-store='dist' is not one of"), std::string::npos) << s;
}

TEST(TrainConfigTest, GpuSwitchesAreZeroOrOne) {
  TrainConfig cfg = Valid();
  auto defaults = ParseTrainingDevices(cfg);
  ASSERT_OK(defaults.status());
  EXPECT_TRUE(defaults->tf32);        // PyTorch's default
  EXPECT_TRUE(defaults->conv_graph);  // the faster on an H100 (bench/RESULTS.md)
  ASSERT_OK(ApplyConfigOverrides({{"gpu_tf32", "0"}, {"gpu_conv_graph", "0"}}, &cfg));
  auto set = ParseTrainingDevices(cfg);
  ASSERT_OK(set.status());
  EXPECT_FALSE(set->tf32);
  EXPECT_FALSE(set->conv_graph);
  for (const auto& [flag, value] :
       std::vector<std::pair<std::string, int>>{{"gpu-tf32", 2}, {"gpu-conv-graph", -1}}) {
    TrainConfig bad = Valid();
    if (flag == "gpu-tf32") bad.set_gpu_tf32(value);
    if (flag == "gpu-conv-graph") bad.set_gpu_conv_graph(value);
    const Status s = ValidateTrainConfig(bad);
    EXPECT_FALSE(s.ok()) << flag;
    EXPECT_NE(s.message().find(StrCat("--", flag, "=", value, " must be 0 or 1")),
              std::string::npos)
        << s;
  }
}

TEST(TrainConfigTest, ShuffleTrainIsZeroOrOne) {
  TrainConfig cfg = Valid();
  EXPECT_EQ(cfg.shuffle_train(), 1);  // fit.py's readers shuffle
  ASSERT_OK(ApplyConfigOverrides({{"shuffle_train", "0"}}, &cfg));
  EXPECT_OK(ValidateTrainConfig(cfg));
  cfg.set_shuffle_train(2);
  const Status s = ValidateTrainConfig(cfg);
  EXPECT_NE(s.message().find("--shuffle-train=2 must be 0 or 1"), std::string::npos) << s;
}

// The labels of the first batch of the next pass.
std::vector<float> FirstLabelsOfNextPass(DataIter* it) {
  it->Reset();
  Batch b;
  auto more = it->Next(&b);
  EXPECT_TRUE(more.ok() && *more) << more.status();
  return b.label;
}

// --shuffle-train 0 reads MNIST's training file in its own order on every
// pass (MXNet's ImageRecordIter without shuffle); 1 draws a new order per pass.
TEST(TrainDataTest, ShuffleTrainZeroReadsTheFileOrderEveryPass) {
  const std::string dir = testing::SharedDataDir() + "/mnist";
  auto labels_file = FindMnistFile(dir, "train-labels-idx1-ubyte");
  auto images_file = FindMnistFile(dir, "train-images-idx3-ubyte");
  if (!labels_file.ok() || !images_file.ok()) GTEST_SKIP() << "no MNIST in " << dir;
  auto file = ReadMnist(*images_file, *labels_file);
  ASSERT_OK(file.status());
  TrainConfig cfg = Valid();
  cfg.set_data_dir(dir);
  cfg.set_batch_size(64);
  const std::vector<float> in_file(file->labels.begin(), file->labels.begin() + 64);
  cfg.set_shuffle_train(0);
  auto fixed = OpenTrainData(cfg, /*rank=*/0, /*num_workers=*/1);
  ASSERT_OK(fixed.status());
  EXPECT_EQ(fixed->train->Describe().find("shuffled"), std::string::npos)
      << fixed->train->Describe();
  for (int pass = 0; pass < 2; ++pass) {
    EXPECT_EQ(FirstLabelsOfNextPass(fixed->train.get()), in_file) << "pass " << pass;
  }
  cfg.set_shuffle_train(1);
  auto shuffled = OpenTrainData(cfg, 0, 1);
  ASSERT_OK(shuffled.status());
  const std::vector<float> first = FirstLabelsOfNextPass(shuffled->train.get());
  EXPECT_NE(first, in_file);
  EXPECT_NE(FirstLabelsOfNextPass(shuffled->train.get()), first) << "a new order per pass";
}

TEST(TrainConfigTest, EffectiveTextListsEveryField) {
  TrainConfig cfg = Valid();
  std::string text = EffectiveConfigText(cfg);
  EXPECT_NE(text.find("network: \"lenet\"\n"), std::string::npos) << text;
  EXPECT_NE(text.find("num_epochs: 100  # default\n"), std::string::npos) << text;
  EXPECT_NE(text.find("kv_store: \"device\"  # default\n"), std::string::npos) << text;
}

// The dist_async momentum hint: from 3 workers, when --mom plus the
// staleness's 1 - 1/W passes 1.5, for sgd and nag only, never in dist_sync.
TEST(TrainConfigTest, DistAsyncMomentumHintIsGivenWhereMomentumAddsUpPastOneAndAHalf) {
  TrainConfig cfg;
  cfg.set_kv_store("dist_async");
  cfg.set_mom(0.9f);
  EXPECT_EQ(DistAsyncMomentumHint(cfg, 2), "") << "0.9 + 0.5 = 1.4 learns";
  const std::string hint = DistAsyncMomentumHint(cfg, 4);
  EXPECT_NE(hint.find("dist_async with 4 workers adds momentum of about 0.75 to --mom 0.9"),
            std::string::npos)
      << hint;
  EXPECT_NE(hint.find("lower --mom (or --lr)"), std::string::npos) << hint;
  cfg.set_mom(0.5f);
  EXPECT_EQ(DistAsyncMomentumHint(cfg, 4), "") << "0.5 + 0.75 learns";
  cfg.set_mom(0.9f);
  cfg.set_optimizer("nag");
  EXPECT_NE(DistAsyncMomentumHint(cfg, 4), "");
  for (const char* other : {"adam", "rmsprop", "adagrad"}) {
    cfg.set_optimizer(other);
    EXPECT_EQ(DistAsyncMomentumHint(cfg, 8), "") << other << " takes no --mom";
  }
  cfg.set_optimizer("sgd");
  for (const char* kv : {"dist_sync", "dist_device_sync", "local"}) {
    cfg.set_kv_store(kv);
    EXPECT_EQ(DistAsyncMomentumHint(cfg, 8), "") << kv;
  }
}

TEST(TrainConfigTest, EpochSizeIsMxnets) {
  EXPECT_EQ(EpochSize(60000, 1, 128), 469);
  EXPECT_EQ(EpochSize(60000, 7, 128), 67);  // floor(60000/7)=8571 -> ceil(8571/128)
  EXPECT_EQ(EpochSize(100, 1, 100), 1);
}

TEST(TrainConfigTest, OptimizerConfigFollowsFitPy) {
  TrainConfig cfg = Valid();
  cfg.set_lr(0.1f);
  cfg.set_lr_factor(0.5f);
  cfg.set_lr_step_epochs("2,4");
  auto opt = MakeOptimizerConfig(cfg, 100, 1);
  ASSERT_TRUE(opt.ok());
  EXPECT_FLOAT_EQ(opt->learning_rate(), 0.1f);
  EXPECT_FLOAT_EQ(opt->rescale_grad(), 1.0f / 128);
  EXPECT_FLOAT_EQ(opt->momentum(), 0.9f);
  EXPECT_FLOAT_EQ(opt->wd(), 0.0001f);
  ASSERT_EQ(opt->lr_scheduler().type(), LrSchedulerConfig::MULTI_FACTOR);
  EXPECT_EQ(opt->lr_scheduler().steps_size(), 2);
  EXPECT_EQ(opt->lr_scheduler().steps(0), 200);
  EXPECT_EQ(opt->lr_scheduler().steps(1), 400);
  // Resuming after epoch 3: one drop already happened; steps are relative.
  cfg.set_model_prefix("m");
  cfg.set_load_epoch(3);
  opt = MakeOptimizerConfig(cfg, 100, 1);
  ASSERT_TRUE(opt.ok());
  EXPECT_FLOAT_EQ(opt->learning_rate(), 0.05f);
  ASSERT_EQ(opt->lr_scheduler().steps_size(), 1);
  EXPECT_EQ(opt->lr_scheduler().steps(0), 100);
  // dist_sync rescales by the global batch; lr_factor 1 means no schedule.
  cfg.set_kv_store("dist_sync");
  cfg.set_lr_factor(1.0f);
  opt = MakeOptimizerConfig(cfg, 100, 4);
  ASSERT_TRUE(opt.ok());
  EXPECT_FLOAT_EQ(opt->rescale_grad(), 1.0f / 512);
  EXPECT_FALSE(opt->has_lr_scheduler());
  // Regression: "dist_async" contains "sync"; each async push is one worker's batch.
  cfg.set_kv_store("dist_async");
  opt = MakeOptimizerConfig(cfg, 100, 4);
  ASSERT_TRUE(opt.ok());
  EXPECT_FLOAT_EQ(opt->rescale_grad(), 1.0f / 128);
  cfg.set_kv_store("dist_device_sync");
  opt = MakeOptimizerConfig(cfg, 100, 4);
  ASSERT_TRUE(opt.ok());
  EXPECT_FLOAT_EQ(opt->rescale_grad(), 1.0f / 512);
}

// --optimizer names MXNet's optimizers (any case); --mom goes to sgd and nag
// only, as fit.py passes it; the rest keep MXNet's own constants.
TEST(TrainConfigTest, OptimizersAreMxnetsAndTakeMomentumAsFitPyGivesIt) {
  TrainConfig cfg = Valid();
  for (const auto& [name, type, mom] :
       {std::tuple<const char*, OptimizerConfig::Type, float>{"sgd", OptimizerConfig::SGD, 0.9f},
        {"NAG", OptimizerConfig::NAG, 0.9f},
        {"adam", OptimizerConfig::ADAM, 0.0f},
        {"rmsprop", OptimizerConfig::RMSPROP, 0.0f},
        {"adagrad", OptimizerConfig::ADAGRAD, 0.0f}}) {
    SCOPED_TRACE(name);
    cfg.set_optimizer(name);
    EXPECT_OK(ValidateTrainConfig(cfg));
    auto opt = MakeOptimizerConfig(cfg, 100, 1);
    ASSERT_OK(opt.status());
    EXPECT_EQ(opt->type(), type);
    EXPECT_FLOAT_EQ(opt->momentum(), mom);
    EXPECT_FALSE(opt->has_beta1());
    EXPECT_FALSE(opt->has_epsilon());
  }
  for (const char* bad : {"test", "adamw", "", "sgd "}) {
    cfg.set_optimizer(bad);
    const Status s = ValidateTrainConfig(cfg);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find(
                  StrCat("--optimizer='", bad, "' is not one of sgd, nag, adam, rmsprop, adagrad")),
              std::string::npos)
        << s;
  }
}

}  // namespace
}  // namespace pstrain
