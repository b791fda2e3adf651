// Operator: one node's computation on one device, behind a non-virtual
// interface (style.md habit 8).
//
// A Backend creates one Operator per graph node (Backend::CreateOperator) for
// its device; the executor binds its tensors once (Setup), then calls
// Forward/Backward every step with no allocation. Setup checks the bound
// tensors against the node (arity, shapes, every tensor on the backend's
// device) and then lets the implementation prepare its kernels (DoSetup).
// Each backend has its own subclasses (nn/cpu/, nn/cuda/): nothing falls back
// to another device.
//
// Thread safety: an Operator is used by one thread at a time (the executor's).
#ifndef PSTRAIN_NN_OPERATOR_H_
#define PSTRAIN_NN_OPERATOR_H_

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/status.h"
#include "nn/backend.h"
#include "nn/graph.h"
#include "nn/tensor.h"

namespace pstrain {

// Per-call state besides the tensors. Owned by the executor.
struct OpContext {
  Backend* backend = nullptr;      // REQUIRED: the backend that created the operator
  std::mt19937_64* rng = nullptr;  // dropout masks (CPU) and seeds (GPU); REQUIRED for Dropout
  bool is_train = false;           // set by the executor before each Forward
  Device device() const { return backend->device(); }
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
  // Per input (missing: false): Backward adds that input's gradient to what
  // in_grads[i] holds instead of overwriting it (another reader of the input
  // wrote it first). Only where Operator::CanAddToInputGradient(i).
  std::vector<bool> in_grad_add;
  // Scratch memory for the kernels of one Forward / one Backward call, at
  // least the operator's ScratchNeeds (undefined where it needs none). The
  // executor places them in its arena for that call's step only; Setup
  // allocates them when the caller leaves them undefined.
  Tensor scratch_forward, scratch_backward;
};

// The shapes of the tensors an operator will be bound to (batch included),
// known before any memory is planned, and which gradients are bound.
struct OpShapes {
  std::vector<Shape> in;
  Shape out;
  std::vector<Shape> params;
  bool out_grad = false;       // out_grad is bound
  bool param_grads = false;    // param_grads are bound
  std::vector<bool> in_grads;  // per input: its gradient is bound
  // Per input: Backward adds to its gradient (OpTensors::in_grad_add).
  std::vector<bool> in_grad_add;
  bool operator==(const OpShapes& o) const {
    return in == o.in && out == o.out && params == o.params && out_grad == o.out_grad &&
           param_grads == o.param_grads && in_grads == o.in_grads && in_grad_add == o.in_grad_add;
  }
  // The shapes of a binding.
  static OpShapes Of(const OpTensors& t);
  std::string ToString() const;
};

// Scratch bytes the kernels use within one call (cuDNN's convolution
// workspace, oneDNN's scratchpad); nothing in them outlives the call.
struct ScratchNeeds {
  size_t forward_bytes = 0;
  size_t backward_bytes = 0;
};

class Operator {
 public:
  virtual ~Operator() = default;
  Operator(const Operator&) = delete;
  Operator& operator=(const Operator&) = delete;

  // How much scratch memory Forward and Backward will use, for the shapes
  // Setup will bind (it chooses the kernels: oneDNN primitive descriptors,
  // cuDNN's algorithm search). The executor calls it before planning memory
  // and places the scratch in its arena for one step each, sharing memory
  // with tensors that are dead at that step. Call at most once, before Setup.
  StatusOr<ScratchNeeds> PlanScratch(const OpContext& ctx, const OpShapes& shapes);
  // Binds `t` (checked against the node's shapes and arity, against the
  // shapes PlanScratch was given, and every tensor against ctx's device) and
  // prepares the kernels (oneDNN primitives, cuDNN descriptors). Without an
  // earlier PlanScratch it plans here, and allocates scratch the binding
  // leaves undefined. Call once.
  Status Setup(const OpContext& ctx, const OpTensors& t);
  // Computes out from in, params, aux (and updates aux in training).
  // REQUIRES: Setup succeeded with the same backend.
  void Forward(const OpContext& ctx) { DoForward(ctx); }
  // Overwrites param_grads and every defined in_grad (adds to those marked in
  // in_grad_add) from out_grad (and the saved forward state).
  // REQUIRES: Forward(is_train=true) ran since the bind.
  void Backward(const OpContext& ctx) { DoBackward(ctx); }

  // Gives the operator its node's input shapes (per sample) from `graph`, the
  // graph the node is in. Called once right after the backend made it, before
  // memory is planned: an operator whose backward reads depend on its shapes
  // settles BackwardNeeds* here.
  void LearnInputShapes(const Graph& graph);
  // What Backward reads besides out_grad; the memory planner keeps only these
  // forward tensors alive until the backward.
  virtual bool BackwardNeedsInputs() const { return true; }
  virtual bool BackwardNeedsOutput() const { return false; }
  // Whether Forward may write out over in[0] and Backward in_grads[0] over
  // out_grad (element-wise operators). The executor then gives them the same
  // storage where nothing else reads in[0] (Backend::PlanGraph's in_place).
  virtual bool CanRunInPlace() const { return false; }
  // Whether Backward can add input i's gradient to what in_grads[i] holds
  // (OpTensors::in_grad_add; MXNet's kAddTo): a tensor read by several
  // operators then has its gradient summed where it lies, without a
  // temporary and a sum pass per extra reader.
  virtual bool CanAddToInputGradient(size_t i) const { return false; }

  // SoftmaxOutput: mean cross-entropy over the batch of the last Forward; 0
  // for others. May wait for the device.
  virtual float Loss() const { return 0.0f; }

  const Node& node() const { return node_; }
  const OpTensors& tensors() const { return t_; }

 protected:
  explicit Operator(const Node& node) : node_(node) {}

  // The device's kernels. DoPlanScratch runs once before DoSetup (shapes_
  // is set then); t_ is bound when DoSetup runs.
  virtual void DoLearnInputShapes(const std::vector<Shape>& per_sample) {}
  virtual StatusOr<ScratchNeeds> DoPlanScratch(const OpContext& ctx) { return ScratchNeeds{}; }
  virtual Status DoSetup(const OpContext& ctx) { return Status::Ok(); }
  virtual void DoForward(const OpContext& ctx) = 0;
  virtual void DoBackward(const OpContext& ctx) = 0;
  // Whether Backward adds input i's gradient (OpTensors::in_grad_add).
  bool AddsTo(size_t i) const { return t_.in_grad_add[i]; }

  const Node& node_;
  OpTensors t_;
  OpShapes shapes_;

 private:
  bool planned_ = false;
  ScratchNeeds needs_;
};

}  // namespace pstrain

#endif  // PSTRAIN_NN_OPERATOR_H_
