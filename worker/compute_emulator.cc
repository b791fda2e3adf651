#include "worker/compute_emulator.h"

#include <chrono>
#include <cmath>
#include <thread>

namespace pstrain {

StatusOr<std::unique_ptr<ComputeEmulator>> ComputeEmulator::Create(
    const Graph& graph, const ComputeEmulatorOptions& options) {
  if (!(options.seconds > 0) || !std::isfinite(options.seconds)) {
    return Status::InvalidArgument(
        StrCat("emulated compute of ", options.seconds, " s per batch: must be > 0"));
  }
  if (!(options.forward_share >= 0 && options.forward_share <= 1)) {
    return Status::InvalidArgument(
        StrCat("forward share ", options.forward_share, " of emulated compute is not in [0, 1]"));
  }
  if (!graph.status().ok()) return graph.status().WithContext("graph");
  std::unique_ptr<ComputeEmulator> e(new ComputeEmulator(options));
  const std::vector<bool> backward = graph.NodesWithBackward();
  std::vector<double> flops, params;
  for (const Node& n : graph.nodes()) {
    if (n.op == OpType::kInput) continue;
    EmulatedLayer l;
    l.node = n.id;
    l.name = n.name;
    l.runs_backward = backward[n.id];
    l.params = n.params;
    e->layers_.push_back(std::move(l));
    flops.push_back(graph.ForwardFlops(n.id));
    double count = 0;
    for (int p : n.params) count += static_cast<double>(graph.params()[p].shape.num_elements());
    params.push_back(count);
    e->forward_flops_ += flops.back();
  }
  double bwd_flops = 0, fwd_params = 0, bwd_params = 0;
  for (size_t i = 0; i < e->layers_.size(); ++i) {
    fwd_params += params[i];
    if (!e->layers_[i].runs_backward) continue;
    bwd_flops += flops[i];
    bwd_params += params[i];
  }
  if (bwd_params == 0 && bwd_flops == 0) {
    return Status::InvalidArgument(
        "the graph has nothing to train: no parameter reaches a SoftmaxOutput");
  }
  const bool by_flops = e->forward_flops_ > 0 && bwd_flops > 0;
  e->weighted_by_ = by_flops ? "flops" : "parameters";
  const std::vector<double>& w = by_flops ? flops : params;
  const double fwd_total = by_flops ? e->forward_flops_ : fwd_params;
  const double bwd_total = by_flops ? bwd_flops : bwd_params;
  const double fwd_s = options.seconds * options.forward_share;
  const double bwd_s = options.seconds - fwd_s;
  auto to_clock = [](double s) {
    return std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(s));
  };
  for (size_t i = 0; i < e->layers_.size(); ++i) {
    EmulatedLayer& l = e->layers_[i];
    l.forward_s = fwd_s * w[i] / fwd_total;
    l.backward_s = l.runs_backward ? bwd_s * w[i] / bwd_total : 0;
    e->forward_.push_back(to_clock(l.forward_s));
    e->backward_.push_back(to_clock(l.backward_s));
  }
  return e;
}

void ComputeEmulator::Step(ParamSync* sync) {
  // `t` is when the emulated device is done with the work so far.
  SteadyClock::time_point t = SteadyClock::now();
  auto timed = [&t](double* total, auto&& call) {
    const SteadyClock::time_point t0 = SteadyClock::now();
    call();
    const SteadyClock::duration d = SteadyClock::now() - t0;
    t += d;
    *total += std::chrono::duration<double>(d).count();
  };
  auto compute = [&t](SteadyClock::duration d) {
    if (d.count() <= 0) return;
    t += d;
    std::this_thread::sleep_until(t);
  };
  bool first = true;  // before the first layer with parameters
  for (size_t i = 0; i < layers_.size(); ++i) {
    double waited = 0;
    for (int p : layers_[i].params) timed(&waited, [&] { sync->WaitParam(p); });
    stats_.wait_param_s += waited;
    if (first && !layers_[i].params.empty()) {
      stats_.wait_first_s += waited;
      first = false;
    }
    compute(forward_[i]);
  }
  for (size_t i = layers_.size(); i-- > 0;) {
    if (!layers_[i].runs_backward) continue;
    compute(backward_[i]);
    for (int p : layers_[i].params) timed(&stats_.grad_ready_s, [&] { sync->OnGradReady(p); });
  }
  ++stats_.steps;
  stats_.compute_s += options_.seconds;
}

EmulatedStepStats ComputeEmulator::TakeStats() {
  EmulatedStepStats s = stats_;
  stats_ = EmulatedStepStats();
  return s;
}

}  // namespace pstrain
