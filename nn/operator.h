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
};

class Operator {
 public:
  virtual ~Operator() = default;
  Operator(const Operator&) = delete;
  Operator& operator=(const Operator&) = delete;

  // Binds `t` (checked against the node's shapes and arity, and every tensor
  // against ctx's device) and prepares the kernels (oneDNN primitives, cuDNN
  // descriptors and algorithms, workspaces). Call once.
  Status Setup(const OpContext& ctx, const OpTensors& t);
  // Computes out from in, params, aux (and updates aux in training).
  // REQUIRES: Setup succeeded with the same backend.
  void Forward(const OpContext& ctx) { DoForward(ctx); }
  // Overwrites param_grads and every defined in_grad from out_grad (and the
  // saved forward state). REQUIRES: Forward(is_train=true) ran since the bind.
  void Backward(const OpContext& ctx) { DoBackward(ctx); }

  // What Backward reads besides out_grad; the memory planner keeps only these
  // forward tensors alive until the backward.
  virtual bool BackwardNeedsInputs() const { return true; }
  virtual bool BackwardNeedsOutput() const { return false; }
  // Whether Forward may write out over in[0] and Backward in_grads[0] over
  // out_grad (element-wise operators). The executor then gives them the same
  // storage where nothing else reads in[0] (Backend::PlanGraph's in_place).
  virtual bool CanRunInPlace() const { return false; }

  // SoftmaxOutput: mean cross-entropy over the batch of the last Forward; 0
  // for others. May wait for the device.
  virtual float Loss() const { return 0.0f; }

  const Node& node() const { return node_; }
  const OpTensors& tensors() const { return t_; }

 protected:
  explicit Operator(const Node& node) : node_(node) {}

  // The device's kernels. t_ is bound when DoSetup runs.
  virtual Status DoSetup(const OpContext& ctx) { return Status::Ok(); }
  virtual void DoForward(const OpContext& ctx) = 0;
  virtual void DoBackward(const OpContext& ctx) = 0;

  const Node& node_;
  OpTensors t_;
};

}  // namespace pstrain

#endif  // PSTRAIN_NN_OPERATOR_H_
