// `pstrain summary`: each layer's output shape and parameter count of a model;
// with --gpus N, also the device memory one training step at --batch-size
// needs on GPU N (what the seeds compare per GPU).
#include <gflags/gflags.h>

#include <cstdio>
#include <string>

#include "models/models.h"
#include "nn/executor.h"
#include "tools/commands.h"
#include "worker/train_config.h"

DECLARE_string(network);
DECLARE_int32(num_layers);
DECLARE_string(image_shape);
DECLARE_int32(num_classes);
DECLARE_int32(batch_size);
DECLARE_string(gpus);

namespace pstrain {

namespace {

// Builds a training executor on GPU `gpu` and runs one step on zeros (the
// peak includes the convolutions' workspace), then prints what it held.
int PrintStepMemory(const Graph& graph, int gpu) {
  ExecutorOptions eo;
  eo.batch_size = FLAGS_batch_size;
  eo.backend.device = Device::Gpu(gpu);
  auto exec = Executor::Create(graph, eo);
  if (!exec.ok()) {
    std::fprintf(stderr, "pstrain summary: %s\n", exec.status().ToString().c_str());
    return 1;
  }
  Executor& e = **exec;
  e.Forward(/*is_train=*/true);
  e.Backward();
  e.backend().Synchronize();
  const MemoryStats m = e.backend().memory_stats();
  const double params =
      static_cast<double>(2 * graph.NumParams() + graph.NumAuxElements()) * sizeof(float);
  std::printf("training step at batch %d on %s:\n", FLAGS_batch_size,
              e.backend().Describe().c_str());
  std::printf("  device memory: peak %.1f MiB, reserved %.1f MiB\n", m.peak / 1048576.0,
              m.reserved / 1048576.0);
  std::printf("  activations and their gradients: %.1f MiB planned (%.1f MiB unplanned)\n",
              e.planned_bytes() / 1048576.0, e.unplanned_bytes() / 1048576.0);
  std::printf("  parameters, gradients, aux states: %.1f MiB\n", params / 1048576.0);
  return 0;
}

}  // namespace

int RunSummary(int argc, char** argv) {
  if (FLAGS_network.empty()) {
    std::fprintf(stderr, "pstrain summary: --network is required\n");
    return 2;
  }
  auto dims = ParseIntList(FLAGS_image_shape, "--image-shape");
  if (!dims.ok() || (!dims->empty() && dims->size() != 3)) {
    std::fprintf(stderr, "pstrain summary: --image-shape='%s' must be C,H,W\n",
                 FLAGS_image_shape.c_str());
    return 2;
  }
  ModelOptions mo;
  mo.name = FLAGS_network;
  mo.num_layers = FLAGS_num_layers;
  mo.image_shape = Shape(*dims);
  mo.num_classes = FLAGS_num_classes;
  auto graph = BuildModel(mo);
  if (!graph.ok()) {
    std::fprintf(stderr, "pstrain summary: %s\n", graph.status().ToString().c_str());
    return 2;
  }
  std::printf("%-32s %-16s %-20s %12s\n", "layer", "op", "output shape", "parameters");
  for (const LayerSummary& row : graph->Summary()) {
    std::printf("%-32s %-16s %-20s %12lld\n", row.name.c_str(), row.op.c_str(),
                row.out_shape.ToString().c_str(), static_cast<long long>(row.num_params));
  }
  std::printf("total parameters: %lld\n", static_cast<long long>(graph->NumParams()));
  if (FLAGS_gpus.empty()) return 0;
  TrainConfig cfg;
  cfg.set_gpus(FLAGS_gpus);
  auto gpu = TrainingGpu(cfg);
  if (!gpu.ok()) {
    std::fprintf(stderr, "pstrain summary: %s\n", gpu.status().ToString().c_str());
    return 2;
  }
  return PrintStepMemory(*graph, *gpu);
}

}  // namespace pstrain
