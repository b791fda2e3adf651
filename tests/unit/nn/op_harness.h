// A single operator bound to random tensors, for gradient checks and for
// comparing kernel implementations (tests only).
#ifndef PSTRAIN_TESTS_UNIT_NN_OP_HARNESS_H_
#define PSTRAIN_TESTS_UNIT_NN_OP_HARNESS_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "nn/backend.h"
#include "nn/graph.h"
#include "nn/operator.h"
#include "nn/tensor.h"

namespace pstrain::testing {

// max |a - b| over n values, relative to max(floor, max |b|).
inline double RelMaxDiff(const float* a, const float* b, int64_t n, double floor = 1) {
  double diff = 0, mag = floor;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(a[i] - b[i])));
    mag = std::max(mag, static_cast<double>(std::fabs(b[i])));
  }
  return diff / mag;
}

// max |a - b| relative to max(1, max |b|).
inline double RelMaxDiff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  return RelMaxDiff(a.data(), b.data(), std::min(a.num_elements(), b.num_elements()));
}

// The same of two vectors, relative to at least `floor`: with a floor below 1
// a tensor of small values (gradients) is compared, not passed under an
// absolute tolerance.
inline double RelMaxDiff(const std::vector<float>& a, const std::vector<float>& b, double floor) {
  EXPECT_EQ(a.size(), b.size());
  return RelMaxDiff(a.data(), b.data(), static_cast<int64_t>(std::min(a.size(), b.size())), floor);
}

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

// Builds the tensors of graph.node(op_node) for `batch` and binds them to the
// operator of a backend (the CPU's kernels, or a GPU's). Inputs "<x>_label"
// get integer labels in [0, classes); others uniform(-1, 1) (or distinct
// values when `distinct_inputs`). tensors() are host tensors whatever the
// device: on a device backend, Objective() uploads the inputs and parameters
// (so a test may change them between calls) and downloads the output and aux
// states, and Backward() downloads the gradients.
// With `add_to`, each input gradient the operator can add to
// (Operator::CanAddToInputGradient) starts as prefill() (uniform(-1, 1)
// from a generator of its own, so the other tensors are those without it)
// and is bound with OpTensors::in_grad_add.
class OpHarness {
 public:
  OpHarness(const Graph& graph, NodeId op_node, CpuKernels kernels, int batch, uint64_t seed,
            bool distinct_inputs = false, bool add_to = false)
      : OpHarness(graph, op_node, CpuOptions(kernels), batch, seed, distinct_inputs, add_to) {}

  OpHarness(const Graph& graph, NodeId op_node, const BackendOptions& options, int batch,
            uint64_t seed, bool distinct_inputs = false, bool add_to = false)
      : graph_(graph), rng_(seed) {
    const Node& node = graph_.node(op_node);
    node_ = &node;
    auto backend = Backend::Create(options);
    CHECK(backend.ok()) << backend.status();
    backend_ = std::move(backend).value();
    ctx_.backend = backend_.get();
    ctx_.rng = &dropout_rng_;
    ctx_.is_train = true;
    auto made = backend_->CreateOperator(node);
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
        host_.in_grads.emplace_back();
      } else {
        if (distinct_inputs) {
          FillDistinct(x, &rng_, 0.05f);
        } else {
          FillUniform(x, &rng_, -1.0f, 1.0f);
        }
        host_.in_grads.push_back(Tensor::Zeros(x.shape()));
      }
      host_.in.push_back(x);
    }
    host_.out = Tensor::Zeros(node.out_shape.WithBatch(batch));
    for (int p : node.params) {
      Tensor w = Tensor::Empty(graph_.params()[p].shape);
      FillUniform(w, &rng_, -1.0f, 1.0f);
      if (graph_.params()[p].role == ParamRole::kGamma) FillUniform(w, &rng_, 0.5f, 1.5f);
      host_.params.push_back(w);
      host_.param_grads.push_back(Tensor::Zeros(w.shape()));
    }
    for (int a : node.aux) {
      Tensor s = Tensor::Empty(graph_.aux_states()[a].shape);
      FillUniform(s, &rng_, 0.5f, 1.5f);
      host_.aux.push_back(s);
    }
    if (node.op != OpType::kSoftmaxOutput) {
      host_.out_grad = Tensor::Empty(host_.out.shape());
      FillUniform(host_.out_grad, &rng_, -1.0f, 1.0f);
    }
    prefill_.resize(host_.in.size());
    host_.in_grad_add.assign(host_.in.size(), false);
    std::mt19937_64 prefill_rng(seed + 1);
    for (size_t i = 0; add_to && i < host_.in.size(); ++i) {
      if (!host_.in_grads[i].defined() || !op_->CanAddToInputGradient(i)) continue;
      FillUniform(host_.in_grads[i], &prefill_rng, -1.0f, 1.0f);
      prefill_[i] = Tensor::Empty(host_.in_grads[i].shape());
      prefill_[i].CopyFrom(host_.in_grads[i]);
      host_.in_grad_add[i] = true;
    }
    if (backend_->host_accessible()) {
      t_ = host_;
    } else {
      t_.in = Upload(host_.in);
      t_.in_grads = Upload(host_.in_grads);
      t_.out = Upload(host_.out);
      t_.params = Upload(host_.params);
      t_.param_grads = Upload(host_.param_grads);
      t_.aux = Upload(host_.aux);
      t_.out_grad = Upload(host_.out_grad);
      t_.in_grad_add = host_.in_grad_add;
    }
    Status s = op_->Setup(ctx_, t_);
    CHECK(s.ok()) << s;
  }

  // Runs Forward (same dropout seed every time, unless `same_dropout_seed`
  // is false: the generator goes on as in training) and returns the scalar
  // whose gradient Backward computes: sum(out * out_grad), or for
  // SoftmaxOutput grad_scale * sum of cross-entropies.
  double Objective(bool is_train = true, bool same_dropout_seed = true) {
    if (same_dropout_seed) dropout_rng_.seed(77);
    ctx_.is_train = is_train;
    if (!backend_->host_accessible()) {
      for (size_t i = 0; i < t_.in.size(); ++i)
        backend_->CopyFromHost(host_.in[i].data(), t_.in[i]);
      for (size_t i = 0; i < t_.params.size(); ++i) {
        backend_->CopyFromHost(host_.params[i].data(), t_.params[i]);
      }
    }
    op_->Forward(ctx_);
    if (!backend_->host_accessible()) {
      Download(t_.out, host_.out);
      for (size_t i = 0; i < t_.aux.size(); ++i) Download(t_.aux[i], host_.aux[i]);
    }
    double obj = 0;
    const float* y = host_.out.data();
    if (node_->op == OpType::kSoftmaxOutput) {
      const int64_t n = host_.out.shape()[0], k = host_.out.shape()[1];
      for (int64_t i = 0; i < n; ++i) {
        const float label = host_.in[1].data()[i];
        if (!(label >= 0.0f && label < static_cast<float>(k))) continue;  // no target, no loss
        obj -= std::log(static_cast<double>(y[i * k + static_cast<int64_t>(label)]));
      }
      return obj * node_->softmax_grad_scale;
    }
    for (int64_t i = 0; i < host_.out.num_elements(); ++i) {
      obj += double(y[i]) * host_.out_grad.data()[i];
    }
    return obj;
  }

  void Backward() {
    op_->Backward(ctx_);
    if (backend_->host_accessible()) return;
    for (size_t i = 0; i < t_.in_grads.size(); ++i) Download(t_.in_grads[i], host_.in_grads[i]);
    for (size_t i = 0; i < t_.param_grads.size(); ++i) {
      Download(t_.param_grads[i], host_.param_grads[i]);
    }
  }

  // Host copies of the operator's tensors (see the class comment).
  OpTensors& tensors() { return host_; }
  // Per input: what its gradient held before Backward added to it
  // (undefined where it is overwritten).
  const std::vector<Tensor>& prefill() const { return prefill_; }
  Operator* op() { return op_.get(); }
  Backend& backend() { return *backend_; }

 private:
  static BackendOptions CpuOptions(CpuKernels kernels) {
    BackendOptions o;
    o.cpu_kernels = kernels;
    return o;
  }
  Tensor Upload(const Tensor& host) {
    if (!host.defined()) return Tensor();
    Tensor d = backend_->Empty(host.shape());
    backend_->CopyFromHost(host.data(), d);
    return d;
  }
  std::vector<Tensor> Upload(const std::vector<Tensor>& host) {
    std::vector<Tensor> out;
    for (const Tensor& h : host) out.push_back(Upload(h));
    return out;
  }
  void Download(const Tensor& device, const Tensor& host) {
    if (device.defined()) backend_->CopyToHost(device, host.data());
  }

  const Graph& graph_;
  const Node* node_;
  std::mt19937_64 rng_;
  std::mt19937_64 dropout_rng_;
  std::unique_ptr<Backend> backend_;
  OpContext ctx_;
  std::unique_ptr<Operator> op_;
  OpTensors host_;  // what the test reads and writes
  std::vector<Tensor> prefill_;
  OpTensors t_;  // what the operator is bound to (host_ itself on the CPU)
};

// A SoftmaxOutput bound by `h` (batch 6) with labels outside [0, K) among
// valid ones (-1, K, NaN, 1e9): those rows get no target and add no loss,
// and the valid rows are as usual. The loss is the mean over the whole batch
// (rows without a target count as 0), as on every backend.
inline void ExpectLabelsOutsideTheClassesGetNoTarget(OpHarness* h, float grad_scale) {
  OpTensors& t = h->tensors();
  const int64_t n = t.out.shape()[0], k = t.out.shape()[1];
  ASSERT_EQ(n, 6) << "the case needs a batch of 6";
  const float labels[6] = {1.0f, -1.0f, static_cast<float>(k), std::nanf(""), 0.0f, 1e9f};
  std::copy(labels, labels + 6, t.in[1].data());
  h->Objective(/*is_train=*/true);
  h->Backward();
  double loss = 0;
  for (int64_t i = 0; i < n; ++i) {
    const bool valid = i == 0 || i == 4;
    const int64_t l = valid ? static_cast<int64_t>(labels[i]) : -1;
    double sum = 0;
    for (int64_t c = 0; c < k; ++c) sum += t.out.at(i * k + c);
    EXPECT_NEAR(sum, 1.0, 1e-5) << "row " << i << " is not a distribution";
    for (int64_t c = 0; c < k; ++c) {
      const float y = t.out.at(i * k + c);
      EXPECT_NEAR(t.in_grads[0].at(i * k + c), grad_scale * (y - (c == l ? 1.0f : 0.0f)), 1e-6)
          << "row " << i << " (label " << labels[i] << "), class " << c;
    }
    if (valid) loss -= std::log(static_cast<double>(t.out.at(i * k + l)));
  }
  EXPECT_NEAR(h->op()->Loss(), loss / static_cast<double>(n), 1e-5);
}

}  // namespace pstrain::testing

#endif  // PSTRAIN_TESTS_UNIT_NN_OP_HARNESS_H_
