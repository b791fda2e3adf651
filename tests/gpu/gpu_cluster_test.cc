// GPU workers in real distributed jobs (issue 11): the `pstrain` binary under
// the local launcher, one server and two workers on 127.0.0.1 that train on
// GPU 0 (both share it); and `pstrain train --gpus 0`'s own switches. Skips
// without a GPU.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "common/env.h"
#include "nn/backend.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/test_util.h"
#include "tracker/process.h"
#include "worker/checkpoint.h"

namespace pstrain {
namespace {

using testing::PstrainBinary;
using testing::ReadFile;
using testing::SharedDataDir;
using testing::TempDir;

// `pstrain launch -n 2 -s 1 --launcher local -- pstrain train <train...>`,
// the logs in `dir`; the job's exit code (-1 if it could not run).
int LaunchTwoWorkers(const std::string& dir, const std::vector<std::string>& train) {
  std::vector<std::string> argv = {
      PstrainBinary(), "launch", "-n",      "2",         "-s",          "1",
      "--launcher",    "local",  "--quiet", "--log-dir", dir + "/logs", "--",
      PstrainBinary(), "train"};
  argv.insert(argv.end(), train.begin(), train.end());
  std::string output;
  int wait_status = 0;
  Status s = tracker::RunAndCapture(argv, Environment().All(), 240000, &output, &wait_status);
  EXPECT_TRUE(s.ok()) << s << "\n" << output;
  if (!s.ok() || !WIFEXITED(wait_status)) return -1;
  if (WEXITSTATUS(wait_status) != 0) {
    ADD_FAILURE() << output << "\nworker-0:\n" << ReadFile(dir + "/logs/worker-0.log");
  }
  return WEXITSTATUS(wait_status);
}

std::vector<double> Accuracies(const std::string& log) {
  std::vector<double> values;
  std::regex re("Epoch\\[\\d+\\] Validation-accuracy=([0-9.]+)");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), re); it != std::sregex_iterator();
       ++it) {
    values.push_back(std::stod((*it)[1].str()));
  }
  return values;
}

std::vector<std::string> LenetJob(const std::string& dir, const std::string& examples,
                                  const std::string& epochs,
                                  const std::string& kv_store = "dist_sync") {
  return {"--network",      "lenet",  "--data-dir",     SharedDataDir() + "/mnist",
          "--kv-store",     kv_store, "--batch-size",   "64",
          "--num-examples", examples, "--num-epochs",   epochs,
          "--lr",           "0.05",   "--model-prefix", dir + "/lenet"};
}

// Two dist_sync steps (each of the two workers two batches of 64) with GPU
// workers give the parameters the same steps with CPU workers give: the
// servers summed the same gradients (up to float and TF32 rounding). With
// `--gpus 0` the gradients cross to the host through the sync's pusher thread
// and the pulled weights go back before the second step's forward; with
// `--gpus 0,0` (the same GPU listed twice, the local merge) each half batch's
// gradients are summed on the group's merge thread, which pushes.
class GpuDistStepTest : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuDistStepTest, AGpuWorkersDistSyncStepsEqualACpuWorkers) {
  SKIP_WITHOUT_GPU();
  TempDir gpu, cpu;
  std::vector<std::string> on_gpu = LenetJob(gpu.path(), "256", "1");
  on_gpu.insert(on_gpu.end(), {"--gpus", GetParam()});
  ASSERT_EQ(LaunchTwoWorkers(gpu.path(), on_gpu), 0);
  ASSERT_EQ(LaunchTwoWorkers(cpu.path(), LenetJob(cpu.path(), "256", "1")), 0);
  EXPECT_NE(ReadFile(gpu.path() + "/logs/worker-1.log").find("gpu(0)"), std::string::npos)
      << "the GPU job's worker 1 did not say it trains on gpu(0)";
  auto got = LoadArrays(gpu.path() + "/lenet-0001.params");
  auto want = LoadArrays(cpu.path() + "/lenet-0001.params");
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(got->size(), want->size());
  for (size_t a = 0; a < got->size(); ++a) {
    const NamedArray& g = (*got)[a];
    const NamedArray& w = (*want)[a];
    ASSERT_EQ(g.name, w.name);
    ASSERT_EQ(g.data.size(), w.data.size()) << g.name;
    double diff = 0, mag = 1e-3;
    for (size_t i = 0; i < g.data.size(); ++i) {
      diff = std::max(diff, double(std::fabs(g.data[i] - w.data[i])));
      mag = std::max(mag, double(std::fabs(w.data[i])));
    }
    EXPECT_LT(diff / mag, 2e-3) << g.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Gpus, GpuDistStepTest, ::testing::Values("0", "0,0"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param) == "0" ? std::string("once")
                                                                 : std::string("twice");
                         });

// Two GPU workers learn MNIST in a dist_sync job: one epoch of LeNet.
TEST(GpuClusterTest, TwoGpuWorkersLearnMnistInDistSync) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  std::vector<std::string> train = LenetJob(dir.path(), "60000", "1");
  train.insert(train.end(), {"--gpus", "0"});
  ASSERT_EQ(LaunchTwoWorkers(dir.path(), train), 0);
  for (int w = 0; w < 2; ++w) {
    const std::string log = ReadFile(dir.path() + "/logs/worker-" + std::to_string(w) + ".log");
    const std::vector<double> acc = Accuracies(log);
    ASSERT_EQ(acc.size(), 1u) << log;
    EXPECT_GT(acc[0], 0.95) << "worker " << w << ":\n" << log;
  }
}

// `--gpu-tf32 0 --gpu-conv-graph 1` (the second the default) reach the backend: the worker's log
// names full-float convolutions and the graph engines' race over LeNet's five
// convolution directions (two forwards, two filter gradients, one data
// gradient: the first convolution's input is the data), every one built;
// and it learns.
TEST(GpuClusterTest, TrainTakesTheConvolutionSwitches) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  std::vector<std::string> argv = {PstrainBinary(), "train"};
  for (const std::string& a : LenetJob(dir.path(), "12800", "1", "local")) argv.push_back(a);
  argv.insert(argv.end(), {"--gpus", "0", "--gpu-tf32", "0", "--gpu-conv-graph", "1"});
  std::string output;
  int wait_status = 0;
  ASSERT_OK(tracker::RunAndCapture(argv, Environment().All(), 240000, &output, &wait_status));
  ASSERT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << output;
  EXPECT_NE(output.find("; full-float convolutions"), std::string::npos) << output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(output, m,
                                std::regex("graph engines: (\\d+) of (\\d+) searched, (\\d+) the "
                                           "graph API could not build")))
      << output;
  EXPECT_EQ(m[2].str(), "5") << output;
  EXPECT_EQ(m[3].str(), "0") << output;
  const std::vector<double> acc = Accuracies(output);
  ASSERT_EQ(acc.size(), 1u) << output;
  EXPECT_GT(acc[0], 0.9) << output;
}

// The graph engines' race is on by default; `--gpu-conv-graph 0` turns it
// off: the log's backend names no race (and TF32 convolutions, the default).
TEST(GpuClusterTest, TrainTurnsTheGraphEnginesOff) {
  SKIP_WITHOUT_GPU();
  TempDir dir;
  std::vector<std::string> argv = {PstrainBinary(), "train"};
  for (const std::string& a : LenetJob(dir.path(), "12800", "1", "local")) argv.push_back(a);
  argv.insert(argv.end(), {"--gpus", "0", "--gpu-conv-graph", "0"});
  std::string output;
  int wait_status = 0;
  ASSERT_OK(tracker::RunAndCapture(argv, Environment().All(), 240000, &output, &wait_status));
  ASSERT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << output;
  EXPECT_NE(output.find("; TF32 convolutions)"), std::string::npos) << output;
  EXPECT_EQ(output.find("graph engines"), std::string::npos) << output;
  const std::vector<double> acc = Accuracies(output);
  ASSERT_EQ(acc.size(), 1u) << output;
  EXPECT_GT(acc[0], 0.9) << output;
}

// `pstrain summary --gpus` measures the step `train` runs: the same peak as
// the training log's memory line for the same flags (a 2 MiB granule apart
// at most: validation and the metrics copy nothing more onto the device),
// and with `--kv-store device` the momentum that `dist_sync` keeps on the
// servers (LeNet: 431,080 floats, 1.6 MiB). Each process searches cuDNN's
// algorithms anew, and their workspaces are planned memory: the runs use
// the legacy search alone (--gpu-conv-graph 0: fewer candidates) and the
// momentum is read net of the two plans' difference.
TEST(GpuClusterTest, SummaryMeasuresTheStepThatTrainRuns) {
  SKIP_WITHOUT_GPU();
  auto run = [](std::vector<std::string> argv, std::string* output) {
    argv.insert(argv.begin(), PstrainBinary());
    int wait_status = 0;
    const Status s =
        tracker::RunAndCapture(argv, Environment().All(), 240000, output, &wait_status);
    return s.ok() && WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
  };
  auto peak = [](const std::string& output, const std::string& after) {
    std::smatch m;
    const std::regex re(after + "[^\n]*peak ([0-9.]+) MiB");
    return std::regex_search(output, m, re) ? std::stod(m[1].str()) : -1.0;
  };
  auto planned = [](const std::string& output) {
    std::smatch m;
    const std::regex re("gpu\\(0\\)[^\n]*activations and their gradients ([0-9.]+) MiB planned");
    return std::regex_search(output, m, re) ? std::stod(m[1].str()) : -1.0;
  };
  std::string device, dist;
  ASSERT_TRUE(run({"summary", "--network", "lenet", "--gpus", "0", "--batch-size", "64",
                   "--kv-store", "device", "--gpu-conv-graph", "0"},
                  &device))
      << device;
  ASSERT_TRUE(run({"summary", "--network", "lenet", "--gpus", "0", "--batch-size", "64",
                   "--kv-store", "dist_sync", "--gpu-conv-graph", "0"},
                  &dist))
      << dist;
  const double with_momentum = peak(device, "gpu\\(0\\)"), without = peak(dist, "gpu\\(0\\)");
  ASSERT_GT(with_momentum, 0) << device;
  ASSERT_GT(without, 0) << dist;
  ASSERT_GE(planned(device), 0) << device;
  ASSERT_GE(planned(dist), 0) << dist;
  EXPECT_GE((with_momentum - planned(device)) - (without - planned(dist)), 1.5) << device << dist;

  TempDir dir;
  std::vector<std::string> argv = {"train"};
  for (const std::string& a : LenetJob(dir.path(), "1280", "1", "device")) argv.push_back(a);
  argv.insert(argv.end(), {"--gpus", "0", "--gpu-conv-graph", "0"});
  std::string train;
  ASSERT_TRUE(run(argv, &train)) << train;
  const double trained = peak(train, "Epoch\\[0\\] gpu\\(0\\) memory:");
  ASSERT_GT(trained, 0) << train;
  EXPECT_LE(std::fabs(trained - with_momentum), 2.0) << device << train;
}

}  // namespace
}  // namespace pstrain
