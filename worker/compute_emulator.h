// ComputeEmulator: a training step whose forward and backward passes are
// replaced by waits, while the parameter sync sees what a real step shows it
// (`pstrain train --emulate-compute SECONDS`; docs/architecture.md,
// "Emulated compute"). It reproduces clusters of GPU workers on a machine
// that cannot compute as fast: the network traffic is real, the compute is
// time.
//
// One step of `seconds` (the per-batch wait, already multiplied by the time
// dilation) is split into a forward share (1/3 by default) and a backward
// share (the rest: a layer's backward computes two products, its input's and
// its parameters' gradients, for the forward's one). Within each pass the
// share is spread over the layers in proportion to their forward flops
// (Graph::ForwardFlops); only if the graph's estimate is 0 everywhere, in
// proportion to their parameters. The backward's share goes only to the
// layers the executor runs a backward for (Graph::NodesWithBackward).
//
// Step() walks the layers as Executor::Forward and Backward do and calls the
// sync where they do: WaitParam(p) for each parameter of a layer before the
// layer's forward wait, OnGradReady(p) for each of its parameters after its
// backward wait (last layer first). The time those calls take on this thread
// (a wait for a pull, a push being sent) is added to the step, as it would
// hold a real device's thread; waits end at absolute times, so oversleeping
// one wait shortens the next and a step lasts at least `seconds`.
//
// Stats(): where the steps' time went beyond the compute waits: blocked in
// WaitParam (the part of the communication the step did not hide), the part
// of it spent before the forward of the first layer with parameters (the weights the step needs
// first), and in OnGradReady (handing gradients over).
//
// Threads: Step() and Stats() on one thread (the trainer's).
#ifndef PSTRAIN_WORKER_COMPUTE_EMULATOR_H_
#define PSTRAIN_WORKER_COMPUTE_EMULATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "common/status.h"
#include "nn/graph.h"
#include "worker/param_sync.h"

namespace pstrain {

struct ComputeEmulatorOptions {
  // The wait of one whole step, forward and backward.
  double seconds = 0;
  // The forward's part of it; the backward gets the rest.
  double forward_share = 1.0 / 3.0;
};

// One layer (a non-input node) of the emulated step.
struct EmulatedLayer {
  NodeId node = kInvalidNode;
  std::string name;
  double forward_s = 0;
  double backward_s = 0;  // 0 when the executor runs no backward for it
  bool runs_backward = false;
  std::vector<int> params;  // Graph::params() indices it reads and completes
};

// Time a run of Step()s spent in the sync's calls, summed over the steps.
struct EmulatedStepStats {
  int64_t steps = 0;
  double compute_s = 0;     // the planned waits (options.seconds per step)
  double wait_param_s = 0;  // blocked in WaitParam, all layers
  double wait_first_s = 0;  // of it, for the first layer with parameters
  double grad_ready_s = 0;  // blocked in OnGradReady
};

class ComputeEmulator {
 public:
  // Plans the step of `graph`. InvalidArgument when options.seconds is not
  // > 0 and finite, forward_share is outside [0, 1], the graph has an error,
  // or no layer has a backward (nothing to train: no SoftmaxOutput reached
  // from a parameter).
  static StatusOr<std::unique_ptr<ComputeEmulator>> Create(const Graph& graph,
                                                           const ComputeEmulatorOptions& options);

  // One emulated batch, driving `sync` (not owned) as the executor would.
  // Returns when the last layer's backward wait is over and its parameters'
  // gradients have been handed to the sync.
  void Step(ParamSync* sync);

  // Non-input nodes in forward order.
  const std::vector<EmulatedLayer>& layers() const { return layers_; }
  // What the waits are proportional to: "flops" or "parameters".
  const std::string& weighted_by() const { return weighted_by_; }
  // The graph's forward flops per sample (Graph::ForwardFlops summed).
  double forward_flops() const { return forward_flops_; }
  const ComputeEmulatorOptions& options() const { return options_; }
  // The steps since the last TakeStats() (or creation); resets them.
  EmulatedStepStats TakeStats();

 private:
  explicit ComputeEmulator(const ComputeEmulatorOptions& options) : options_(options) {}

  const ComputeEmulatorOptions options_;
  std::vector<EmulatedLayer> layers_;
  // layers_[i]'s waits as clock durations.
  std::vector<SteadyClock::duration> forward_, backward_;
  std::string weighted_by_;
  double forward_flops_ = 0;
  EmulatedStepStats stats_;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_COMPUTE_EMULATOR_H_
