// ModelParams: a model's parameters, their gradients and its aux states on
// one device, as the code that updates or exchanges them sees them (the
// worker's ParamSync, the initializers, checkpoints). An Executor is one; a
// DeviceGroup (several devices of one worker) is another, whose parameters
// and gradients are its merge buffers.
//
// Who writes: the parameters change only through WriteParam, or in place
// (param(i), host_param(i)) after parameter i's gradient was handed over and
// before the next forward reads it; a DeviceGroup relies on that to know
// which parameters to copy to its devices.
//
// Threads: as the implementation says (Executor: ReadParam/WriteParam from
// any thread on the CPU; the rest on the executor's thread).
#ifndef PSTRAIN_NN_MODEL_PARAMS_H_
#define PSTRAIN_NN_MODEL_PARAMS_H_

#include <cstddef>

#include "common/status.h"
#include "nn/backend.h"
#include "nn/graph.h"
#include "nn/tensor.h"

namespace pstrain {

class ModelParams {
 public:
  virtual ~ModelParams() = default;

  virtual const Graph& graph() const = 0;
  int num_params() const { return static_cast<int>(graph().params().size()); }
  int num_aux() const { return static_cast<int>(graph().aux_states().size()); }
  // Parameter i and its gradient of the last Backward, on backend()'s device.
  virtual const Tensor& param(int i) const = 0;
  virtual const Tensor& grad(int i) const = 0;
  // The device they live on: its optimizer step and memory figures.
  virtual Backend& backend() const = 0;

  // Copies of parameter i, its gradient, aux state i (n floats of host
  // memory). InvalidArgument for an index out of range or a wrong n.
  virtual Status ReadParam(int i, float* dst, size_t n) const = 0;
  virtual Status WriteParam(int i, const float* src, size_t n) = 0;
  virtual Status ReadGrad(int i, float* dst, size_t n) const = 0;
  virtual Status ReadAux(int i, float* dst, size_t n) const = 0;
  virtual Status WriteAux(int i, const float* src, size_t n) = 0;
  // Host addresses of parameter i and its gradient when backend() is the
  // host's (zero-copy use), else nullptr.
  virtual float* host_param(int i) const = 0;
  virtual float* host_grad(int i) const = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_NN_MODEL_PARAMS_H_
