// `pstrain summary`: each layer's output shape and parameter count of a model;
// with --gpus, also the device memory one training step at --batch-size needs
// on each GPU (what the seeds compare per GPU), measured on the GPUs or, on a
// host without one, planned without them.
#include <gflags/gflags.h>

#include <cstdio>
#include <string>
#include <vector>

#include "nn/backend.h"
#include "nn/device_group.h"
#include "nn/executor.h"
#include "tools/commands.h"
#include "tools/fit_flags.h"
#include "worker/train_config.h"

DECLARE_int32(batch_size);
DECLARE_string(gpus);
DECLARE_string(gpu_weights);
DECLARE_int32(gpu_tf32);
DECLARE_int32(gpu_conv_graph);

namespace pstrain {

namespace {

// Builds the training executors of one step at --batch-size split over the
// GPUs (as `train --gpus` does), runs one step on zeros (the peak includes
// the convolutions' workspace), and prints what each device held.
int PrintStepMemory(const Graph& graph, const TrainingDevices& devices) {
  DeviceGroupOptions go;
  go.batch_size = FLAGS_batch_size;
  go.devices.clear();
  for (int gpu : devices.gpus) {
    BackendOptions b;
    b.device = Device::Gpu(gpu);
    b.gpu_tf32 = devices.tf32;  // both change the convolutions' workspaces
    b.gpu_conv_graph = devices.conv_graph;
    go.devices.push_back(b);
  }
  go.weights = devices.weights;
  auto group = DeviceGroup::Create(graph, go);
  if (!group.ok()) {
    std::fprintf(stderr, "pstrain summary: %s\n", group.status().ToString().c_str());
    return 1;
  }
  DeviceGroup& g = **group;
  g.Forward(/*is_train=*/true);
  g.Backward();
  const double params =
      static_cast<double>(2 * graph.NumParams() + graph.NumAuxElements()) * sizeof(float);
  std::printf("training step at batch %d:\n", FLAGS_batch_size);
  for (int d = 0; d < g.num_devices(); ++d) {
    Executor& e = g.executor(d);
    e.backend().Synchronize();
    const MemoryStats m = e.backend().memory_stats();
    std::printf(
        "  %s, %d examples: peak %.1f MiB, reserved %.1f MiB; activations and their "
        "gradients %.1f MiB planned (%.1f unplanned); parameters, gradients, aux states "
        "%.1f MiB\n",
        e.backend().Describe().c_str(), g.shares()[d], m.peak / 1048576.0, m.reserved / 1048576.0,
        e.planned_bytes() / 1048576.0, e.unplanned_bytes() / 1048576.0, params / 1048576.0);
  }
  return 0;
}

// Where no GPU is visible: the plan each listed GPU's executor would make,
// made without the device (Executor::PlanWithoutDevice), without cuDNN's
// workspaces (the algorithm search on the GPU decides them).
int PrintPlannedMemory(const Graph& graph, const TrainingDevices& devices, const std::string& why) {
  auto shares =
      SplitBatch(FLAGS_batch_size, static_cast<int>(devices.gpus.size()), devices.weights);
  if (!shares.ok()) {
    std::fprintf(stderr, "pstrain summary: %s\n", shares.status().ToString().c_str());
    return 2;
  }
  std::vector<MemoryPlanFigures> plans;
  for (size_t d = 0; d < devices.gpus.size(); ++d) {
    ExecutorOptions o;
    o.batch_size = (*shares)[d];
    o.backend.device = Device::Gpu(devices.gpus[d]);
    auto plan = Executor::PlanWithoutDevice(graph, o);
    if (!plan.ok()) {
      std::fprintf(stderr, "pstrain summary: %s\n", plan.status().ToString().c_str());
      return 1;
    }
    plans.push_back(*plan);
  }
  std::printf(
      "training step at batch %d, planned without a GPU (%s); the operators' scratch (cuDNN's "
      "workspaces, a batch norm's unwanted data gradient) comes on top where it does not fit the "
      "plan's gaps:\n",
      FLAGS_batch_size, why.c_str());
  const double params =
      static_cast<double>(2 * graph.NumParams() + graph.NumAuxElements()) * sizeof(float);
  for (size_t d = 0; d < devices.gpus.size(); ++d) {
    std::printf(
        "  gpu(%d), %d examples: activations and their gradients %.1f MiB planned (%.1f "
        "unplanned); parameters, gradients, aux states %.1f MiB\n",
        devices.gpus[d], (*shares)[d], plans[d].planned_bytes / 1048576.0,
        plans[d].unplanned_bytes / 1048576.0, params / 1048576.0);
  }
  return 0;
}

}  // namespace

int RunSummary(int argc, char** argv) {
  auto graph = ModelFromFlags();
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
  cfg.set_gpu_weights(FLAGS_gpu_weights);
  cfg.set_gpu_tf32(FLAGS_gpu_tf32);
  cfg.set_gpu_conv_graph(FLAGS_gpu_conv_graph);
  auto devices = ParseTrainingDevices(cfg);
  if (!devices.ok()) {
    std::fprintf(stderr, "pstrain summary: %s\n", devices.status().ToString().c_str());
    return 2;
  }
  std::string why;
  if (GpuCount(&why) == 0) return PrintPlannedMemory(*graph, *devices, why);
  return PrintStepMemory(*graph, *devices);
}

}  // namespace pstrain
