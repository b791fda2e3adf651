// Times one training step (forward + backward + SGD update) of a model on
// synthetic data and prints samples/s and, with --profile, a per-layer table.
//
//   nn_step_bench [--network lenet] [--batch 128] [--steps 50] [--warmup 5]
//                 [--kernels onednn|reference] [--threads 0] [--profile]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>

#include "models/models.h"
#include "nn/executor.h"
#include "nn/initializer.h"

namespace {

int Run(int argc, char** argv) {
  std::string network = "lenet", kernels = "onednn";
  int batch = 128, steps = 50, warmup = 5, threads = 0;
  bool profile = false;
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
    } else if (std::strcmp(argv[i], "--profile") == 0) {
      profile = true;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  pstrain::ModelOptions mo;
  mo.name = network;
  mo.num_layers = network == "resnet" ? 20 : 0;
  if (network == "resnet") mo.image_shape = pstrain::Shape{3, 28, 28};
  if (network == "resnet") mo.num_classes = 10;
  auto graph = pstrain::BuildModel(mo);
  if (!graph.ok()) {
    std::fprintf(stderr, "%s\n", graph.status().ToString().c_str());
    return 1;
  }
  pstrain::ExecutorOptions eo;
  eo.batch_size = batch;
  eo.num_threads = threads;
  eo.profile = profile;
  eo.cpu_kernels =
      kernels == "reference" ? pstrain::CpuKernels::kReference : pstrain::CpuKernels::kOneDnn;
  auto made = pstrain::Executor::Create(*graph, eo);
  if (!made.ok()) {
    std::fprintf(stderr, "%s\n", made.status().ToString().c_str());
    return 1;
  }
  pstrain::Executor* e = made->get();
  pstrain::InitializeExecutor(*pstrain::InitializerSpec::Parse("xavier(gaussian,in,2)"), 1, e);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(0, 1);
  for (int64_t i = 0; i < e->data().num_elements(); ++i) e->data().data()[i] = u(rng);
  const int classes = static_cast<int>(e->output().shape()[1]);
  for (int64_t i = 0; i < batch; ++i) e->label().data()[i] = static_cast<float>(i % classes);

  auto step = [&] {
    e->Forward(true);
    e->Backward();
    for (int p = 0; p < e->num_params(); ++p) {
      float* w = e->param(p).data();
      const float* g = e->grad(p).data();
      const int64_t n = e->param(p).num_elements();
      for (int64_t k = 0; k < n; ++k) w[k] -= 1e-4f * g[k];
    }
  };
  for (int i = 0; i < warmup; ++i) step();
  const auto t0 = std::chrono::steady_clock::now();
  const std::clock_t c0 = std::clock();
  for (int i = 0; i < steps; ++i) step();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  // CPU ms/step (all threads) is the steadier figure on a shared machine.
  std::printf("| network | batch | kernels | threads | ms/step | cpu ms/step | samples/s |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  std::printf("| %s | %d | %s | %d | %.2f | %.2f | %.1f |\n", network.c_str(), batch,
              kernels.c_str(), threads, 1e3 * s / steps, 1e3 * cpu / steps, batch * steps / s);
  std::printf("\nactivation memory: %.2f MB planned, %.2f MB with one buffer per tensor\n",
              e->planned_bytes() / 1e6, e->unplanned_bytes() / 1e6);
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
