// Times one training step (forward + backward + SGD update) of a model on
// synthetic data and prints samples/s, the memory the step needs and, with
// --profile, a per-layer table. --gpus N runs it on GPU N (the CUDA backend).
//
//   nn_step_bench [--network lenet] [--batch 128] [--steps 50] [--warmup 5]
//                 [--kernels onednn|reference] [--threads 0] [--gpus N] [--profile]
//                 [--image-shape C,H,W] [--num-classes K] [--num-layers L]
//                 [--plain-layouts] [--no-fusion] [--no-conv-graph]
//   nn_step_bench --limits [--threads N]   this machine's oneDNN and memory limits
//   nn_step_bench --plan-only [--gpus N] ...  the memory plan alone, made without
//                 the device (a GPU's on a host without one; its workspaces left out)
// (--plain-layouts and --no-fusion turn off the CPU backend's blocked
// activation layouts and its batch norm + ReLU fusion, to measure them;
// --no-conv-graph runs the legacy algorithms alone, without timing cuDNN's
// graph-API engines beside them for every convolution direction:
// BackendOptions::gpu_conv_graph, on by default; --conv-graph, the old
// switch, is still taken.)
// (defaults: the network's MNIST shape; resnet: 20 layers on 3,28,28, 10 classes)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <string>
#include <vector>

#include "models/models.h"
#include "nn/executor.h"
#include "nn/initializer.h"

namespace {

using pstrain::Graph;
using pstrain::Node;
using pstrain::OpType;

// The least bytes a memory-bound layer moves: each input read and the output
// written once forward; backward, the output's gradient and the tensor the
// backward needs read, each input's gradient written.
double MinBytes(const Graph& g, const Node& n, int64_t batch, bool backward) {
  double in = 0;
  for (pstrain::NodeId i : n.inputs) in += static_cast<double>(g.node(i).out_shape.num_elements());
  const double out = static_cast<double>(n.out_shape.num_elements());
  double floats = in + out;
  if (backward) {
    const bool reads_x = n.op == OpType::kBatchNorm;
    const bool reads_y = n.op == OpType::kActivation;
    floats = out + in + (reads_x ? in : 0) + (reads_y ? out : 0);
  }
  return 4.0 * floats * static_cast<double>(batch);
}

// Per op type: time, share of the step, and for convolutions and fully
// connected layers the GFLOP/s (forward = 1x, backward = 2x the forward
// flops), for the memory-bound ones the GB/s of MinBytes.
void PrintOpSummary(const Graph& g, const std::vector<pstrain::NodeProfile>& rows, int64_t batch,
                    double runs) {
  struct Sum {
    double fwd_s = 0, bwd_s = 0, flops = 0, bytes = 0;
  };
  std::vector<std::pair<std::string, Sum>> sums;
  double total = 0;
  size_t r = 0;
  for (const Node& n : g.nodes()) {
    if (n.op == OpType::kInput) continue;
    const pstrain::NodeProfile& row = rows[r++];
    auto it = std::find_if(sums.begin(), sums.end(), [&](auto& s) { return s.first == row.op; });
    if (it == sums.end()) it = sums.insert(sums.end(), {row.op, Sum{}});
    Sum& s = it->second;
    s.fwd_s += row.forward_s / runs;
    s.bwd_s += row.backward_s / runs;
    total += (row.forward_s + row.backward_s) / runs;
    if (n.op == OpType::kConvolution || n.op == OpType::kFullyConnected) {
      s.flops += 3 * g.ForwardFlops(n.id) * static_cast<double>(batch);
    } else {
      s.bytes += MinBytes(g, n, batch, false) + MinBytes(g, n, batch, true);
    }
  }
  std::printf("\n| op | forward ms | backward ms | share | GFLOP/s | GB/s (least traffic) |\n");
  std::printf("|---|---|---|---|---|---|\n");
  for (const auto& [op, s] : sums) {
    const double t = s.fwd_s + s.bwd_s;
    std::printf("| %s | %.2f | %.2f | %.0f%% | %s | %s |\n", op.c_str(), 1e3 * s.fwd_s,
                1e3 * s.bwd_s, 100 * t / total,
                s.flops > 0 ? std::to_string(static_cast<int>(s.flops / t / 1e9)).c_str() : "",
                s.bytes > 0 && t > 0.01 * total
                    ? std::to_string(static_cast<int>(s.bytes / t / 1e9)).c_str()
                    : "");
  }
}

// This machine's limits as oneDNN and OpenMP reach them: a large sgemm, a
// blocked 3x3 convolution (64 -> 64 channels, 28x28, batch 128, forward) and
// a copy of 256 MB (GB/s of read + write).
void PrintLimits(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
  using clock = std::chrono::steady_clock;
  auto best_of = [](int reps, const std::function<void()>& fn) {
    double best = 1e30;
    for (int i = 0; i < reps; ++i) {
      const auto t0 = clock::now();
      fn();
      best = std::min(best, std::chrono::duration<double>(clock::now() - t0).count());
    }
    return best;
  };
  const int64_t n = 2048;
  std::vector<float> a(n * n, 1.0f), b(n * n, 0.5f), c(n * n);
  const double gemm_s = best_of(
      5, [&] { dnnl_sgemm('N', 'N', n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n); });
  using dnnl::memory;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  const memory::dims x = {128, 64, 28, 28}, w = {64, 64, 3, 3};
  auto any = [](const memory::dims& d) {
    return memory::desc(d, memory::data_type::f32, memory::format_tag::any);
  };
  dnnl::convolution_forward::primitive_desc pd({dnnl::prop_kind::forward_training,
                                                dnnl::algorithm::convolution_direct,
                                                any(x),
                                                any(w),
                                                memory::desc(),
                                                any(x),
                                                {1, 1},
                                                {1, 1},
                                                {1, 1}},
                                               eng);
  dnnl::convolution_forward conv(pd);
  memory src(pd.src_desc(), eng), wei(pd.weights_desc(), eng), dst(pd.dst_desc(), eng);
  std::fill_n(static_cast<float*>(src.get_data_handle()), src.get_desc().get_size() / 4, 1.0f);
  std::fill_n(static_cast<float*>(wei.get_data_handle()), wei.get_desc().get_size() / 4, 0.01f);
  const double conv_s = best_of(5, [&] {
    conv.execute(strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst}});
    strm.wait();
  });
  const double conv_flops = 2.0 * 128 * 64 * 28 * 28 * 64 * 9;
  const int64_t m = int64_t{64} << 20;  // floats: 256 MB
  std::vector<float> from(m, 1.0f), to(m, 0.0f);
  const double copy_s = best_of(5, [&] {
    float* t = to.data();
    const float* f = from.data();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < m; ++i) t[i] = f[i];
  });
  std::printf("\n| limit (%d threads) | figure |\n|---|---|\n", omp_get_max_threads());
  std::printf("| oneDNN sgemm 2048^3 | %.0f GFLOP/s |\n", 2.0 * n * n * n / gemm_s / 1e9);
  std::printf("| oneDNN conv 3x3 64->64 28x28 batch 128, forward, %s | %.0f GFLOP/s |\n",
              pd.impl_info_str(), conv_flops / conv_s / 1e9);
  std::printf("| copy 256 MB (read + write) | %.1f GB/s |\n", 2.0 * 4 * m / copy_s / 1e9);
}

int Run(int argc, char** argv) {
  std::string network = "lenet", kernels = "onednn";
  int batch = 128, steps = 50, warmup = 5, threads = 0, gpu = -1, num_classes = 0, layers = 0;
  std::vector<int64_t> image_shape;
  bool profile = false, plain_layouts = false, no_fusion = false, plan_only = false;
  bool conv_graph = true;
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
    } else if (std::strcmp(argv[i], "--limits") == 0) {
      PrintLimits(threads);
      return 0;
    } else if (std::strcmp(argv[i], "--plan-only") == 0) {
      plan_only = true;
    } else if (std::strcmp(argv[i], "--plain-layouts") == 0) {
      plain_layouts = true;
    } else if (std::strcmp(argv[i], "--conv-graph") == 0) {
      conv_graph = true;
    } else if (std::strcmp(argv[i], "--no-conv-graph") == 0) {
      conv_graph = false;
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
  eo.backend.gpu_conv_graph = conv_graph;
  eo.backend.cpu_kernels =
      kernels == "reference" ? pstrain::CpuKernels::kReference : pstrain::CpuKernels::kOneDnn;
  if (gpu >= 0) eo.backend.device = pstrain::Device::Gpu(gpu);
  if (plan_only) {
    auto plan = pstrain::Executor::PlanWithoutDevice(*graph, eo);
    if (!plan.ok()) {
      std::fprintf(stderr, "%s\n", plan.status().ToString().c_str());
      return 1;
    }
    std::printf(
        "%s, batch %d, the %s operators' plan (made without the device; operator scratch left "
        "out):\nactivation memory: %.2f MB planned (no plan of these lifetimes under %.2f MB), "
        "%.2f MB with one buffer per tensor\ngradients of tensors with several readers: %d added "
        "where they lie, %d summed from temporaries\n",
        network.c_str(), batch, gpu >= 0 ? "CUDA" : "CPU", plan->planned_bytes / 1e6,
        plan->least_planned_bytes / 1e6, plan->unplanned_bytes / 1e6,
        plan->gradients_added_in_place, plan->gradients_summed_from_temporaries);
    return 0;
  }
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
  // The profile counts the timed steps only (first calls JIT-compile kernels).
  const std::vector<pstrain::NodeProfile> warm = e->Profile();
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
  std::printf(
      "activation memory: %.2f MB planned (no plan of these lifetimes under %.2f MB), %.2f MB "
      "with one buffer per tensor\n",
      e->planned_bytes() / 1e6, e->least_planned_bytes() / 1e6, e->unplanned_bytes() / 1e6);
  std::printf(
      "operator scratch (convolution workspaces, in that plan): largest %.2f MB, all %.2f MB\n",
      e->largest_scratch_bytes() / 1e6, e->total_scratch_bytes() / 1e6);
  std::printf(
      "gradients of tensors with several readers: %d added where they lie, %d summed from "
      "temporaries\n",
      e->gradients_added_in_place(), e->gradients_summed_from_temporaries());
  std::printf("peak memory held by the backend: %.2f MB\n", be.memory_stats().peak / 1e6);
  std::printf("reorders per step: %.1f of activations, %.1f of parameters\n",
              static_cast<double>(after.activation_reorders - before.activation_reorders) / steps,
              static_cast<double>(after.param_reorders - before.param_reorders) / steps);
  if (profile) {
    const double runs = steps;
    std::vector<pstrain::NodeProfile> timed = e->Profile();
    for (size_t i = 0; i < timed.size(); ++i) {
      timed[i].forward_s -= warm[i].forward_s;
      timed[i].backward_s -= warm[i].backward_s;
    }
    std::printf("\n| layer | op | forward ms | backward ms |\n|---|---|---|---|\n");
    for (const pstrain::NodeProfile& row : timed) {
      std::printf("| %s | %s | %.3f | %.3f |\n", row.name.c_str(), row.op.c_str(),
                  1e3 * row.forward_s / runs, 1e3 * row.backward_s / runs);
    }
    PrintOpSummary(*graph, timed, batch, runs);
    double layers = 0;
    for (const pstrain::NodeProfile& row : timed) layers += row.forward_s + row.backward_s;
    std::printf(
        "\nthe layers' %s sums to %.2f ms per step (the step, waiting after every layer: "
        "%.2f ms)\n",
        gpu >= 0 ? "device time" : "time", 1e3 * layers / runs, 1e3 * s);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return Run(argc, argv); }
