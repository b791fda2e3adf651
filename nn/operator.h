// Operator: one node's computation, with per-device kernels behind a
// non-virtual interface (style.md habit 8).
//
// The Executor creates one Operator per graph node for a fixed batch size,
// binds its tensors once (Setup), then calls Forward/Backward every step with
// no allocation. Setup checks the bound shapes against the node and dispatches
// on the device given in the OpContext: SetupCpu / SetupGpu. A device without a
// kernel fails in Setup with Unimplemented naming the operator and device; it
// never falls back to another device silently.
//
// CPU kernels come in two kinds: kOneDnn (the fast path; operators oneDNN does
// not cover run tuned loops) and kReference (plain loops, the oracle that
// every other backend is tested against).
//
// Thread safety: an Operator is used by one thread at a time (the executor's).
#ifndef PSTRAIN_NN_OPERATOR_H_
#define PSTRAIN_NN_OPERATOR_H_

#include <memory>
#include <random>
#include <vector>

#include "common/status.h"
#include "nn/graph.h"
#include "nn/tensor.h"

namespace pstrain {

enum class CpuKernels { kOneDnn, kReference };

class CpuEngine;  // nn/cpu_engine.h: the oneDNN engine and stream of an executor

// Per-call state besides the tensors. Owned by the executor.
struct OpContext {
  Device device = Device::Cpu();
  CpuKernels cpu_kernels = CpuKernels::kOneDnn;
  CpuEngine* cpu = nullptr;        // REQUIRED for kOneDnn on the CPU
  std::mt19937_64* rng = nullptr;  // dropout masks; REQUIRED for Dropout
  bool is_train = false;           // set by the executor before each Forward
};

// The tensors bound to one operator. Data tensors carry the batch dimension.
// An undefined Tensor in in_grads means "this input's gradient is not needed".
struct OpTensors {
  std::vector<Tensor> in;
  Tensor out;
  std::vector<Tensor> params;       // Node::params order
  std::vector<Tensor> param_grads;  // same order as params
  std::vector<Tensor> aux;          // Node::aux order
  std::vector<Tensor> in_grads;     // same order as in (undefined: skip)
  Tensor out_grad;                  // undefined for SoftmaxOutput (it starts backprop)
};

class Operator {
 public:
  // Creates the operator for `node` (which must outlive it). InvalidArgument
  // for an input node or an unknown op type.
  static StatusOr<std::unique_ptr<Operator>> Create(const Node& node, CpuKernels kernels);
  virtual ~Operator() = default;
  Operator(const Operator&) = delete;
  Operator& operator=(const Operator&) = delete;

  // Binds `t` (checked against the node's shapes and arity) and prepares the
  // kernels for ctx.device (oneDNN primitives, workspaces). Call once.
  Status Setup(const OpContext& ctx, const OpTensors& t);
  // Computes out from in, params, aux (and updates aux in training).
  // REQUIRES: Setup succeeded with the same ctx.device.
  void Forward(const OpContext& ctx);
  // Overwrites param_grads and every defined in_grad from out_grad (and the
  // saved forward state). REQUIRES: Forward(is_train=true) ran since the bind.
  void Backward(const OpContext& ctx);

  // What Backward reads besides out_grad; the memory planner keeps only these
  // forward tensors alive until the backward.
  virtual bool BackwardNeedsInputs() const { return true; }
  virtual bool BackwardNeedsOutput() const { return false; }

  // SoftmaxOutput: mean cross-entropy over the batch of the last Forward; 0 for others.
  virtual float Loss() const { return 0.0f; }

  const Node& node() const { return node_; }
  const OpTensors& tensors() const { return t_; }

 protected:
  explicit Operator(const Node& node) : node_(node) {}

  virtual Status SetupCpu(const OpContext& ctx) { return Status::Ok(); }
  virtual void ForwardCpu(const OpContext& ctx) = 0;
  virtual void BackwardCpu(const OpContext& ctx) = 0;
  // GPU kernels (CUDA/cuDNN backend). The default Setup reports Unimplemented.
  virtual Status SetupGpu(const OpContext& ctx);
  virtual void ForwardGpu(const OpContext& ctx);
  virtual void BackwardGpu(const OpContext& ctx);

  const Node& node_;
  OpTensors t_;
};

}  // namespace pstrain

#endif  // PSTRAIN_NN_OPERATOR_H_
