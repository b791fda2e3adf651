// `pstrain summary`: each layer's output shape and parameter count of a model;
// with --gpus, also the device memory one training step at --batch-size needs
// on each GPU (what the seeds compare per GPU), measured on the GPUs or, on a
// host without one, planned without them.
#include <gflags/gflags.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "nn/backend.h"
#include "nn/device_group.h"
#include "nn/executor.h"
#include "tools/commands.h"
#include "tools/fit_flags.h"
#include "worker/param_sync.h"
#include "worker/train_config.h"
#include "worker/trainer.h"

DECLARE_int32(batch_size);
DECLARE_string(gpus);
DECLARE_string(gpu_weights);
DECLARE_int32(gpu_tf32);
DECLARE_int32(gpu_conv_graph);
DECLARE_string(kv_store);
DECLARE_int32(num_threads);
DECLARE_double(mom);
DECLARE_string(gc_type);
DECLARE_double(gc_threshold);

namespace pstrain {

namespace {

// Builds the devices of one training step at --batch-size as `train` does
// (TrainingDeviceGroupOptions: the split, the merge of --kv-store), runs the
// step on a zero batch (its upload, the convolutions' workspaces, the merge)
// with `train`'s optimizer for `local` and `device` (its state on the
// device where the update runs there), and prints what each device held.
int PrintStepMemory(const Graph& graph, const TrainConfig& cfg) {
  auto go = TrainingDeviceGroupOptions(cfg);
  if (!go.ok()) {
    std::fprintf(stderr, "pstrain summary: %s\n", go.status().ToString().c_str());
    return 2;
  }
  auto group = DeviceGroup::Create(graph, *go);
  if (!group.ok()) {
    std::fprintf(stderr, "pstrain summary: %s\n", group.status().ToString().c_str());
    return 1;
  }
  DeviceGroup& g = **group;
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "pstrain summary: %s\n", s.ToString().c_str());
    return 1;
  };
  // The dist kvstores update on the servers: the worker holds no optimizer state.
  const bool local_update = cfg.kv_store() == "local" || cfg.kv_store() == "device";
  std::unique_ptr<LocalParamSync> sync;
  if (local_update) {
    auto opt = MakeOptimizerConfig(cfg, /*epoch_size=*/1, /*num_workers=*/1);
    if (!opt.ok()) return fail(opt.status());
    auto made = LocalParamSync::Create(*opt);
    if (!made.ok()) return fail(made.status());
    sync = std::move(made).value();
    if (Status s = sync->Init(&g); !s.ok()) return fail(s);
    LocalParamSync* p = sync.get();
    g.SetGradReadyCallback([p](int i) { p->OnGradReady(i); });
    g.SetParamNeededCallback([p](int i) { p->WaitParam(i); });
  }
  const Shape in = g.executor(0).data().shape();
  std::vector<float> data(static_cast<size_t>(in.ProductFrom(1) * cfg.batch_size()), 0.0f);
  std::vector<float> label(static_cast<size_t>(cfg.batch_size()), 0.0f);
  if (Status s = g.LoadData(data.data(), data.size()); !s.ok()) return fail(s);
  if (Status s = g.LoadLabel(label.data(), label.size()); !s.ok()) return fail(s);
  g.Forward(/*is_train=*/true);
  g.Backward();
  g.Drain();
  const double params =
      static_cast<double>(2 * graph.NumParams() + graph.NumAuxElements()) * sizeof(float);
  std::printf("training step at batch %d, --kv-store %s (%s):\n", cfg.batch_size(),
              cfg.kv_store().c_str(),
              local_update ? "the optimizer's state included" : "the optimizer on the servers");
  for (int d = 0; d < g.num_devices(); ++d) {
    Executor& e = g.executor(d);
    e.backend().Synchronize();
    const MemoryStats m = e.backend().memory_stats();
    std::printf(
        "  %s, listing %d, %d examples: peak %.1f MiB, reserved %.1f MiB; activations and "
        "their gradients %.1f MiB planned (%.1f unplanned); parameters, gradients, aux states "
        "%.1f MiB\n",
        e.backend().Describe().c_str(), d, g.shares()[d], m.peak / 1048576.0,
        m.reserved / 1048576.0, e.planned_bytes() / 1048576.0, e.unplanned_bytes() / 1048576.0,
        params / 1048576.0);
  }
  return 0;
}

// Where no GPU is visible: the plan each listed GPU's executor would make,
// made without the device (Executor::PlanWithoutDevice), without cuDNN's
// workspaces (the algorithm search on the GPU decides them).
int PrintPlannedMemory(const Graph& graph, int batch_size, const TrainingDevices& devices,
                       const std::string& why) {
  auto shares = SplitBatch(batch_size, static_cast<int>(devices.gpus.size()), devices.weights);
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
      batch_size, why.c_str());
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
  auto merged = MergedConfigFromFlags();
  if (!merged.ok()) {
    std::fprintf(stderr, "pstrain summary: %s\n", merged.status().ToString().c_str());
    return 2;
  }
  auto graph = ModelFromConfig(*merged);
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
  // The fields a training step's memory depends on, as `train` reads them.
  const TrainConfig& cfg = *merged;
  if (cfg.gpus().empty()) return 0;
  if (Status s = ValidateKvStore(cfg.kv_store()); !s.ok()) {
    std::fprintf(stderr, "pstrain summary: %s\n", s.ToString().c_str());
    return 2;
  }
  auto devices = ParseTrainingDevices(cfg);
  if (!devices.ok()) {
    std::fprintf(stderr, "pstrain summary: %s\n", devices.status().ToString().c_str());
    return 2;
  }
  std::string why;
  if (GpuCount(&why) == 0) return PrintPlannedMemory(*graph, cfg.batch_size(), *devices, why);
  return PrintStepMemory(*graph, cfg);
}

}  // namespace pstrain
