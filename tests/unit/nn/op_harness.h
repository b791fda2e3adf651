// A single operator bound to random tensors, for gradient checks and for
// comparing kernel implementations (tests only).
#ifndef PSTRAIN_TESTS_UNIT_NN_OP_HARNESS_H_
#define PSTRAIN_TESTS_UNIT_NN_OP_HARNESS_H_

#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "nn/cpu/cpu_engine.h"
#include "nn/graph.h"
#include "nn/operator.h"
#include "nn/tensor.h"

namespace pstrain::testing {

inline void FillUniform(const Tensor& t, std::mt19937_64* rng, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  for (int64_t i = 0; i < t.num_elements(); ++i) t.data()[i] = d(*rng);
}

// Distinct values spaced `gap` apart in random order (no ties for max pooling).
inline void FillDistinct(const Tensor& t, std::mt19937_64* rng, float gap) {
  std::vector<float> v(t.num_elements());
  for (size_t i = 0; i < v.size(); ++i) v[i] = gap * (static_cast<float>(i) - v.size() / 2.0f);
  std::shuffle(v.begin(), v.end(), *rng);
  for (size_t i = 0; i < v.size(); ++i) t.data()[i] = v[i];
}

// Builds the tensors of graph.node(op_node) for `batch` and binds them.
// Inputs "<x>_label" get integer labels in [0, classes); others uniform(-1, 1)
// (or distinct values when `distinct_inputs`).
class OpHarness {
 public:
  OpHarness(const Graph& graph, NodeId op_node, CpuKernels kernels, int batch, uint64_t seed,
            bool distinct_inputs = false)
      : graph_(graph), kernels_(kernels), rng_(seed) {
    const Node& node = graph_.node(op_node);
    node_ = &node;
    ctx_.device = Device::Cpu();
    ctx_.cpu_kernels = kernels;
    ctx_.cpu = &engine_;
    ctx_.rng = &dropout_rng_;
    ctx_.is_train = true;
    auto made = Operator::Create(node, kernels);
    CHECK(made.ok()) << made.status();
    op_ = std::move(made).value();
    for (NodeId in : node.inputs) {
      const Node& src = graph_.node(in);
      Tensor x = Tensor::Empty(src.out_shape.WithBatch(batch));
      const bool is_label =
          src.name.size() > 6 && src.name.compare(src.name.size() - 6, 6, "_label") == 0;
      if (is_label) {
        std::uniform_int_distribution<int> d(0, static_cast<int>(node.out_shape[0]) - 1);
        for (int64_t i = 0; i < x.num_elements(); ++i) x.data()[i] = static_cast<float>(d(rng_));
        t_.in_grads.emplace_back();
      } else {
        if (distinct_inputs) {
          FillDistinct(x, &rng_, 0.05f);
        } else {
          FillUniform(x, &rng_, -1.0f, 1.0f);
        }
        t_.in_grads.push_back(Tensor::Zeros(x.shape()));
      }
      t_.in.push_back(x);
    }
    t_.out = Tensor::Zeros(node.out_shape.WithBatch(batch));
    for (int p : node.params) {
      Tensor w = Tensor::Empty(graph_.params()[p].shape);
      FillUniform(w, &rng_, -1.0f, 1.0f);
      if (graph_.params()[p].role == ParamRole::kGamma) FillUniform(w, &rng_, 0.5f, 1.5f);
      t_.params.push_back(w);
      t_.param_grads.push_back(Tensor::Zeros(w.shape()));
    }
    for (int a : node.aux) {
      Tensor s = Tensor::Empty(graph_.aux_states()[a].shape);
      FillUniform(s, &rng_, 0.5f, 1.5f);
      t_.aux.push_back(s);
    }
    if (node.op != OpType::kSoftmaxOutput) {
      t_.out_grad = Tensor::Empty(t_.out.shape());
      FillUniform(t_.out_grad, &rng_, -1.0f, 1.0f);
    }
    Status s = op_->Setup(ctx_, t_);
    CHECK(s.ok()) << s;
  }

  // Runs Forward (same dropout mask every time) and returns the scalar whose
  // gradient Backward computes: sum(out * out_grad), or for SoftmaxOutput
  // grad_scale * sum of cross-entropies.
  double Objective(bool is_train = true) {
    dropout_rng_.seed(77);
    ctx_.is_train = is_train;
    op_->Forward(ctx_);
    double obj = 0;
    const float* y = t_.out.data();
    if (node_->op == OpType::kSoftmaxOutput) {
      const int64_t n = t_.out.shape()[0], k = t_.out.shape()[1];
      for (int64_t i = 0; i < n; ++i) {
        obj -= std::log(static_cast<double>(y[i * k + static_cast<int64_t>(t_.in[1].data()[i])]));
      }
      return obj * node_->softmax_grad_scale;
    }
    for (int64_t i = 0; i < t_.out.num_elements(); ++i) obj += double(y[i]) * t_.out_grad.data()[i];
    return obj;
  }

  void Backward() { op_->Backward(ctx_); }
  OpTensors& tensors() { return t_; }
  Operator* op() { return op_.get(); }

 private:
  const Graph& graph_;
  const Node* node_;
  CpuKernels kernels_;
  std::mt19937_64 rng_;
  std::mt19937_64 dropout_rng_;
  CpuEngine engine_;
  OpContext ctx_;
  std::unique_ptr<Operator> op_;
  OpTensors t_;
};

}  // namespace pstrain::testing

#endif  // PSTRAIN_TESTS_UNIT_NN_OP_HARNESS_H_
