// Executor: runs a Graph for one batch size on one device, through that
// device's Backend (nn/backend.h).
//
// Created once; it creates the backend, plans memory once (forward and
// gradient buffers whose lifetimes do not overlap share storage, allocated on
// the device), creates and binds every operator (oneDNN primitives, cuDNN
// algorithms included), and allocates parameters, their gradients and the aux
// states. A step is then:
//
//   exec->LoadData(batch, n);  exec->LoadLabel(labels, m);   // host -> device
//   exec->Forward(/*is_train=*/true);
//   exec->Backward();   // fires on_grad_ready(param_index) as each gradient completes
//   exec->ReadOutput(probs, k);                              // device -> host
//   ... update parameters (WriteParam, or the backend's optimizer step) ...
//
// Forward runs nodes in topological (creation) order, Backward in reverse.
// Gradients are overwritten (not accumulated) by every Backward. Every copy
// between the host and the device goes through the executor (Load*, Read*,
// Write*), so callers never dereference device memory; on the CPU backend
// host_param/host_grad give the tensors' host addresses for zero-copy use.
//
// Threads: Forward, Backward, the Load/ReadOutput calls and the tensor
// accessors belong to one thread (the trainer's). ReadParam/WriteParam may be
// called from any thread at any time, including from on_grad_ready or a
// KV-client thread during Backward: they lock the owning node, so they never
// see or cause a half-applied update while that node's Forward/Backward runs.
// The value of param p is no longer read by the current Backward once
// on_grad_ready(p) has fired, so a pull may write it then. (On a GPU backend,
// whose copies are ordered on its stream, only the executor's thread may call
// them.)
#ifndef PSTRAIN_NN_EXECUTOR_H_
#define PSTRAIN_NN_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "nn/backend.h"
#include "nn/graph.h"
#include "nn/model_params.h"
#include "nn/operator.h"
#include "nn/tensor.h"

namespace pstrain {

struct ExecutorOptions {
  int batch_size = 1;
  // The device (backend.device), its kernels and threads.
  BackendOptions backend;
  // false: inference only (no gradient buffers, Backward is a CHECK failure,
  // forward buffers are reused as soon as their last reader ran).
  bool for_training = true;
  // Share storage between buffers with disjoint lifetimes, and run
  // element-wise operators in place where nothing else reads their input
  // (which lets the CPU backend fuse a ReLU into the batch norm before it).
  // false gives every tensor its own buffer (tests compare the two).
  bool plan_memory = true;
  uint64_t seed = 1;  // dropout masks
  // Time every node's Forward/Backward (see Profile()): Backend::StartTiming
  // and StopTiming around each, so on a GPU the device's own time (events on
  // its stream), at the cost of a synchronization per node.
  bool profile = false;
};

// An executor's memory plan in figures (Executor::planned_bytes() etc.).
struct MemoryPlanFigures {
  size_t planned_bytes = 0;
  size_t unplanned_bytes = 0;
  size_t least_planned_bytes = 0;
  size_t largest_scratch_bytes = 0;
  size_t total_scratch_bytes = 0;
  int gradients_added_in_place = 0;
  int gradients_summed_from_temporaries = 0;
};

// Seconds spent per node since creation (options.profile only): the host
// clock on the CPU, the device's time between events on a GPU (the kernels
// and copies, not their launch).
struct NodeProfile {
  std::string name;
  std::string op;
  double forward_s = 0;
  double backward_s = 0;
};

// Checks a copy of `n` floats into or out of array `i` of `infos` (a
// parameter, its gradient or an aux state, named by `what`): InvalidArgument
// naming the array for an index out of range or a wrong length.
Status CheckArrayCopy(const char* what, int i, const std::vector<ParamInfo>& infos, size_t n);

class Executor : public ModelParams {
 public:
  // Builds the executor. InvalidArgument if graph.status() is not ok, the batch
  // size is < 1 or the graph has no SoftmaxOutput when for_training; the
  // backend's errors for its device (Backend::Create); ResourceExhausted,
  // naming what did not fit, when the device's memory cannot hold the plan,
  // the batch or the parameters.
  static StatusOr<std::unique_ptr<Executor>> Create(const Graph& graph,
                                                    const ExecutorOptions& options);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Called from Backward (the executor's thread) with the index into
  // graph.params() of each parameter whose gradient has just been completed, in
  // completion order (last layer first). Set before Backward; may be empty.
  // On a GPU the gradient is complete in stream order: a copy asked for now
  // (ReadGrad) sees it.
  void SetGradReadyCallback(std::function<void(int param_index)> fn);
  // Called from Forward just before the first node that reads parameter
  // `param_index` runs (first layer first): the worker waits here for that
  // parameter's pull. May be empty.
  void SetParamNeededCallback(std::function<void(int param_index)> fn);
  // Dropout masks from now on come from `seed` (options.seed at first).
  // Between steps only.
  void Reseed(uint64_t seed);

  void Forward(bool is_train);
  // REQUIRES: options.for_training and a Forward(true) since the last Backward.
  void Backward();

  // Node by node (a DeviceGroup runs its executors in lockstep): Forward(t)
  // is ForwardNode(i, t) for i = 0 .. num_nodes()-1, Backward() is
  // BackwardNode(i) for i = num_nodes()-1 .. 0. Input nodes do nothing; the
  // callbacks fire as in Forward and Backward.
  int num_nodes() const { return static_cast<int>(graph_.nodes().size()); }
  void ForwardNode(NodeId i, bool is_train);
  void BackwardNode(NodeId i);

  // ---- host <-> device ----

  // Copies a batch into the data input ((batch, per-sample shape...), n values)
  // and the labels into the SoftmaxOutput's label input (n >= batch: the
  // first batch labels are used). InvalidArgument when n does not fit.
  Status LoadData(const float* src, size_t n);
  Status LoadLabel(const float* src, size_t n);
  // Copies the graph's output (softmax probabilities (batch, classes)) to
  // dst, which holds n = output().num_elements() floats. Waits for the device.
  Status ReadOutput(float* dst, size_t n) const;
  // Thread-safe copies of parameter i (n floats). InvalidArgument when i is out
  // of range or n differs from its size.
  Status ReadParam(int i, float* dst, size_t n) const override;
  Status WriteParam(int i, const float* src, size_t n) override;
  // Parameter i's gradient of the last Backward (executor's thread).
  Status ReadGrad(int i, float* dst, size_t n) const override;
  // Same for aux state i (checkpoints).
  Status ReadAux(int i, float* dst, size_t n) const override;
  Status WriteAux(int i, const float* src, size_t n) override;
  // Host addresses of parameter i and its gradient when the backend's memory
  // is the host's (the CPU), else nullptr: a KV client reads gradients from
  // and writes weights into them without a copy. Writes through host_param
  // follow the rules of WriteParam's callers (after on_grad_ready(i), before
  // the Forward that reads it).
  float* host_param(int i) const override;
  float* host_grad(int i) const override;

  // ---- tensors (owned by the executor; views stay valid for its lifetime;
  // on the device: host code reads them through the copies above) ----

  // Input node `name` ((batch, per-sample shape...)); undefined if unknown.
  Tensor input(const std::string& name) const;
  // The first input (the data) and the SoftmaxOutput's label (batch,).
  Tensor data() const;
  Tensor label() const;
  // The graph's output (softmax probabilities (batch, classes) for a classifier).
  Tensor output() const;
  // Mean cross-entropy of the last Forward over the batch (SoftmaxOutput
  // graphs). Waits for the device.
  float Loss() const;

  const Tensor& param(int i) const override { return params_[i]; }
  const Tensor& grad(int i) const override { return grads_[i]; }
  const Tensor& aux(int i) const { return aux_[i]; }
  const Graph& graph() const override { return graph_; }
  const ExecutorOptions& options() const { return options_; }
  // The device's backend (its memory figures, its optimizer step).
  Backend& backend() const override { return *backend_; }

  // Per-node times, in node order (input nodes omitted); empty unless options.profile.
  std::vector<NodeProfile> Profile() const;

  // Memory plan figures: bytes of activation + activation-gradient storage
  // (and the operators' scratch, Operator::PlanScratch) actually allocated,
  // and what one buffer per tensor would have needed.
  size_t planned_bytes() const { return figures_.planned_bytes; }
  size_t unplanned_bytes() const { return figures_.unplanned_bytes; }
  // The least any placement of the same lifetimes could take (the most bytes
  // alive at one step): planned_bytes() over this is the plan's overhead.
  size_t least_planned_bytes() const { return figures_.least_planned_bytes; }
  // The operators' scratch: the largest one call needs (what one scratch
  // buffer shared by every operator would hold), and the sum of them all.
  size_t largest_scratch_bytes() const { return figures_.largest_scratch_bytes; }
  size_t total_scratch_bytes() const { return figures_.total_scratch_bytes; }
  // Gradient edges of tensors with several readers, beyond the first reader:
  // those the reader's operator adds where the gradient lies
  // (Operator::CanAddToInputGradient), and those written to a temporary and
  // summed in after its backward.
  int gradients_added_in_place() const { return figures_.gradients_added_in_place; }
  int gradients_summed_from_temporaries() const {
    return figures_.gradients_summed_from_temporaries;
  }
  const MemoryPlanFigures& plan_figures() const { return figures_; }

  // The plan an executor for `graph` and `options` would make, from the
  // operators of options.backend.device made without the device
  // (Backend::CreateOperatorsWithoutDevice: a GPU's plan on a host without
  // one), and without the operators' scratch, which their kernels' choice on
  // the device decides (cuDNN's workspaces). Nothing is allocated.
  static StatusOr<MemoryPlanFigures> PlanWithoutDevice(const Graph& graph,
                                                       const ExecutorOptions& options);

 private:
  struct Impl;
  Executor(const Graph& graph, const ExecutorOptions& options);
  Status Init();
  int OwnerNodeOfParam(int i) const { return graph_.params()[i].node; }

  const Graph graph_;  // a copy: the executor does not depend on the caller's
  const ExecutorOptions options_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Impl> impl_;
  std::vector<Tensor> params_, grads_, aux_;
  // One lock per node: held by Forward/Backward of that node and by Read/Write.
  std::unique_ptr<Mutex[]> node_mu_;
  std::function<void(int)> on_grad_ready_;
  std::function<void(int)> on_param_needed_;
  MemoryPlanFigures figures_;
};

}  // namespace pstrain

#endif  // PSTRAIN_NN_EXECUTOR_H_
