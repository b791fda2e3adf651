// HostParams: a model's parameters, gradients and aux states in host memory,
// with no executor behind them: no operators, no activations, no memory plan.
// What `pstrain train --emulate-compute` exchanges in place of a real
// executor's (worker/compute_emulator.h), so the parameter sync sees the real
// model's arrays (names, shapes, key order) at the cost of their bytes alone.
//
// Every array starts zeroed. The gradients are written only by the owner,
// through host_grad(i) or FillGrads; nothing computes them.
//
// Threads: ReadParam/WriteParam/ReadAux/WriteAux may be called from any
// thread (each array has its own lock, as an Executor's node lock); the
// in-place addresses follow ModelParams' rules.
#ifndef PSTRAIN_NN_HOST_PARAMS_H_
#define PSTRAIN_NN_HOST_PARAMS_H_

#include <cstddef>
#include <memory>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "nn/backend.h"
#include "nn/graph.h"
#include "nn/model_params.h"
#include "nn/tensor.h"

namespace pstrain {

class HostParams : public ModelParams {
 public:
  // Allocates `graph`'s parameters, their gradients and its aux states on the
  // CPU backend. InvalidArgument if graph.status() is not ok.
  static StatusOr<std::unique_ptr<HostParams>> Create(const Graph& graph);
  ~HostParams() override;
  HostParams(const HostParams&) = delete;
  HostParams& operator=(const HostParams&) = delete;

  // Sets every gradient to the same fixed pattern, element k of each array
  // (k % 17 - 8) * 1e-5: small, zero-mean, finite, the same on every worker.
  void FillGrads();

  const Graph& graph() const override { return graph_; }
  const Tensor& param(int i) const override { return params_[i]; }
  const Tensor& grad(int i) const override { return grads_[i]; }
  Backend& backend() const override { return *backend_; }
  Status ReadParam(int i, float* dst, size_t n) const override;
  Status WriteParam(int i, const float* src, size_t n) override;
  Status ReadGrad(int i, float* dst, size_t n) const override;
  Status ReadAux(int i, float* dst, size_t n) const override;
  Status WriteAux(int i, const float* src, size_t n) override;
  float* host_param(int i) const override { return params_[i].data(); }
  float* host_grad(int i) const override { return grads_[i].data(); }

 private:
  explicit HostParams(const Graph& graph) : graph_(graph) {}

  const Graph graph_;
  std::unique_ptr<Backend> backend_;
  std::vector<Tensor> params_, grads_, aux_;
  // One lock per parameter and per aux state, held by the copies.
  std::unique_ptr<Mutex[]> param_mu_, aux_mu_;
};

}  // namespace pstrain

#endif  // PSTRAIN_NN_HOST_PARAMS_H_
