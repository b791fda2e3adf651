// Times one training step (forward + backward + SGD update) of a model on
// synthetic data and prints samples/s, the memory the step needs and, with
// --profile, a per-layer table. --gpus N runs it on GPU N (the CUDA backend).
//
//   nn_step_bench [--network lenet] [--batch 128] [--steps 50] [--warmup 5]
//                 [--kernels onednn|reference] [--threads 0] [--gpus N] [--profile]
//                 [--image-shape C,H,W] [--num-classes K] [--num-layers L]
//                 [--plain-layouts] [--no-fusion]
// (--plain-layouts and --no-fusion turn off the CPU backend's blocked
// activation layouts and its batch norm + ReLU fusion, to measure them.)
// (defaults: the network's MNIST shape; resnet: 20 layers on 3,28,28, 10 classes)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "models/models.h"
#include "nn/executor.h"
#include "nn/initializer.h"

namespace {

int Run(int argc, char** argv) {
  std::string network = "lenet", kernels = "onednn";
  int batch = 128, steps = 50, warmup = 5, threads = 0, gpu = -1, num_classes = 0, layers = 0;
  std::vector<int64_t> image_shape;
  bool profile = false, plain_layouts = false, no_fusion = false;
  for (int i = 1; i < argc; ++i) {
    auto value = [&](const char* flag) -> const char* {
      if (std::strcmp(argv[i], flag) != 0) return nullptr;
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    if (const char* v = value("--network")) {
      network = v;
    } else if (const char* v = value("--batch")) {
      batch = std::atoi(v);
    } else if (const char* v = value("--steps")) {
      steps = std::atoi(v);
    } else if (const char* v = value("--warmup")) {
      warmup = std::atoi(v);
    } else if (const char* v = value("--kernels")) {
      kernels = v;
    } else if (const char* v = value("--threads")) {
      threads = std::atoi(v);
    } else if (const char* v = value("--gpus")) {
      if (std::strchr(v, ',') != nullptr) {
        std::fprintf(stderr, "--gpus takes one GPU\n");
        return 2;
      }
      gpu = std::atoi(v);
    } else if (const char* v = value("--num-classes")) {
      num_classes = std::atoi(v);
    } else if (const char* v = value("--num-layers")) {
      layers = std::atoi(v);
    } else if (const char* v = value("--image-shape")) {
      for (const char* p = v; *p != '\0';) {
        image_shape.push_back(std::strtoll(p, const_cast<char**>(&p), 10));
        if (*p == ',')
          ++p;
        else if (*p != '\0') {
          std::fprintf(stderr, "--image-shape takes C,H,W\n");
          return 2;
        }
      }
    } else if (std::strcmp(argv[i], "--profile") == 0) {
      profile = true;
    } else if (std::strcmp(argv[i], "--plain-layouts") == 0) {
      plain_layouts = true;
    } else if (std::strcmp(argv[i], "--no-fusion") == 0) {
      no_fusion = true;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  pstrain::ModelOptions mo;
  mo.name = network;
  mo.num_layers = layers > 0 ? layers : (network == "resnet" ? 20 : 0);
  if (network == "resnet") mo.image_shape = pstrain::Shape{3, 28, 28};
  if (!image_shape.empty()) mo.image_shape = pstrain::Shape(image_shape);
  mo.num_classes = num_classes > 0 ? num_classes : (network == "resnet" ? 10 : 0);
  auto graph = pstrain::BuildModel(mo);
  if (!graph.ok()) {
    std::fprintf(stderr, "%s\n", graph.status().ToString().c_str());
    return 1;
  }
  pstrain::ExecutorOptions eo;
  eo.batch_size = batch;
  eo.backend.num_threads = threads;
  eo.profile = profile;
  eo.backend.cpu_blocked_layouts = !plain_layouts;
  eo.backend.cpu_fusion = !no_fusion;
  eo.backend.cpu_kernels =
      kernels == "reference" ? pstrain::CpuKernels::kReference : pstrain::CpuKernels::kOneDnn;
  if (gpu >= 0) eo.backend.device = pstrain::Device::Gpu(gpu);
  auto made = pstrain::Executor::Create(*graph, eo);
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
    return 1;
  }
  pstrain::Executor* e = made->get();
  pstrain::Backend& be = e->backend();
  pstrain::InitializeParams(*pstrain::InitializerSpec::Parse("xavier(gaussian,in,2)"), 1, e);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(0, 1);
  std::vector<float> data(static_cast<size_t>(e->data().num_elements()));
  for (float& x : data) x = u(rng);
  const int classes = static_cast<int>(e->output().shape()[1]);
  std::vector<float> label(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) label[i] = static_cast<float>(i % classes);
  if (!e->LoadData(data.data(), data.size()).ok() ||
      !e->LoadLabel(label.data(), label.size()).ok()) {
    std::fprintf(stderr, "the synthetic batch does not fit the network\n");
    return 1;
  }

  pstrain::Optimizer::Step sgd;
  sgd.lr = 1e-4f;
  auto step = [&] {
    e->Forward(true);
    e->Backward();
    for (int p = 0; p < e->num_params(); ++p) {
      be.ApplyOptimizerStep(sgd, e->grad(p), e->param(p), pstrain::Tensor());
    }
  };
  for (int i = 0; i < warmup; ++i) step();
  be.Synchronize();
  const pstrain::BackendCounters before = be.counters();
  std::vector<double> step_s(static_cast<size_t>(steps));
  const std::clock_t c0 = std::clock();
  for (int i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    step();
    be.Synchronize();
    step_s[i] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  const pstrain::BackendCounters after = be.counters();
  // The median step: a shared machine's stalls (another tenant, the
  // hypervisor) land in a few steps and would move the mean by tens of %.
  std::sort(step_s.begin(), step_s.end());
  const double s = step_s[step_s.size() / 2];
  // CPU ms/step (all threads) is the steadier figure on a shared machine.
  std::printf("| network | batch | kernels | threads | ms/step | cpu ms/step | samples/s |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::printf("| %s | %d | %s | %d | %.2f | %.2f | %.1f |\n", network.c_str(), batch,
              gpu >= 0 ? "cuda" : kernels.c_str(), threads, 1e3 * s, 1e3 * cpu / steps, batch / s);
  std::printf("\non %s\n", be.Describe().c_str());
  std::printf("activation memory: %.2f MB planned, %.2f MB with one buffer per tensor\n",
              e->planned_bytes() / 1e6, e->unplanned_bytes() / 1e6);
  std::printf("peak memory held by the backend: %.2f MB\n", be.memory_stats().peak / 1e6);
  std::printf("reorders per step: %.1f of activations, %.1f of parameters\n",
              static_cast<double>(after.activation_reorders - before.activation_reorders) / steps,
              static_cast<double>(after.param_reorders - before.param_reorders) / steps);
  if (profile) {
    std::printf("\n| layer | op | forward ms | backward ms |\n|---|---|---|---|\n");
    for (const pstrain::NodeProfile& row : e->Profile()) {
      std::printf("| %s | %s | %.3f | %.3f |\n", row.name.c_str(), row.op.c_str(),
                  1e3 * row.forward_s / (steps + warmup), 1e3 * row.backward_s / (steps + warmup));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
