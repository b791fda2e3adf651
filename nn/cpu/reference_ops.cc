// Plain-loop CPU operators: the reference every other kernel is checked
// against, and the CPU kernel of the ops oneDNN does not cover (those loops are
// OpenMP-parallel over the batch, which does not change their results).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "nn/cpu/cpu_ops.h"

namespace pstrain::internal {
namespace {

// Loops over fewer elements than this stay on one thread: waking the team
// costs more than the work.
constexpr int64_t kParallelMin = 1 << 15;

class ConvolutionRef : public Operator {
 public:
  explicit ConvolutionRef(const Node& node) : Operator(node) {}
  bool CanAddToInputGradient(size_t i) const override { return true; }

 protected:
  void DoForward(const OpContext& ctx) override {
    const ConvParam& p = node_.conv;
    const Shape& xs = t_.in[0].shape();
    const Shape& ys = t_.out.shape();
    const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3];
    const int64_t F = ys[1], OH = ys[2], OW = ys[3];
    const int64_t G = p.num_group, Cg = C / G, Fg = F / G;
    const float* x = t_.in[0].data();
    const float* w = t_.params[0].data();
    const float* b = p.no_bias ? nullptr : t_.params[1].data();
    float* y = t_.out.data();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t f = 0; f < F; ++f) {
        const int64_t g = f / Fg;
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            double acc = b ? b[f] : 0.0;
            for (int64_t c = 0; c < Cg; ++c)
              for (int64_t kh = 0; kh < p.kernel_h; ++kh) {
                const int64_t ih = oh * p.stride_h - p.pad_h + kh;
                if (ih < 0 || ih >= H) continue;
                for (int64_t kw = 0; kw < p.kernel_w; ++kw) {
                  const int64_t iw = ow * p.stride_w - p.pad_w + kw;
                  if (iw < 0 || iw >= W) continue;
                  acc +=
                      static_cast<double>(w[((f * Cg + c) * p.kernel_h + kh) * p.kernel_w + kw]) *
                      x[((n * C + g * Cg + c) * H + ih) * W + iw];
                }
              }
            y[((n * F + f) * OH + oh) * OW + ow] = static_cast<float>(acc);
          }
      }
  }

  void DoBackward(const OpContext& ctx) override {
    const ConvParam& p = node_.conv;
    const Shape& xs = t_.in[0].shape();
    const Shape& ys = t_.out.shape();
    const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3];
    const int64_t F = ys[1], OH = ys[2], OW = ys[3];
    const int64_t G = p.num_group, Cg = C / G, Fg = F / G;
    const float* x = t_.in[0].data();
    const float* w = t_.params[0].data();
    const float* dy = t_.out_grad.data();
    float* dx = t_.in_grads[0].defined() ? t_.in_grads[0].data() : nullptr;
    std::vector<double> dw(t_.params[0].num_elements(), 0.0), db(F, 0.0);
    std::vector<double> dxa(dx ? t_.in[0].num_elements() : 0, 0.0);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t f = 0; f < F; ++f) {
        const int64_t g = f / Fg;
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            const double d = dy[((n * F + f) * OH + oh) * OW + ow];
            db[f] += d;
            for (int64_t c = 0; c < Cg; ++c)
              for (int64_t kh = 0; kh < p.kernel_h; ++kh) {
                const int64_t ih = oh * p.stride_h - p.pad_h + kh;
                if (ih < 0 || ih >= H) continue;
                for (int64_t kw = 0; kw < p.kernel_w; ++kw) {
                  const int64_t iw = ow * p.stride_w - p.pad_w + kw;
                  if (iw < 0 || iw >= W) continue;
                  const int64_t wi = ((f * Cg + c) * p.kernel_h + kh) * p.kernel_w + kw;
                  const int64_t xi = ((n * C + g * Cg + c) * H + ih) * W + iw;
                  dw[wi] += d * x[xi];
                  if (dx) dxa[xi] += d * w[wi];
                }
              }
          }
      }
    float* gw = t_.param_grads[0].data();
    for (size_t i = 0; i < dw.size(); ++i) gw[i] = static_cast<float>(dw[i]);
    if (!p.no_bias) {
      float* gb = t_.param_grads[1].data();
      for (int64_t f = 0; f < F; ++f) gb[f] = static_cast<float>(db[f]);
    }
    if (dx && AddsTo(0)) {
      for (size_t i = 0; i < dxa.size(); ++i) dx[i] += static_cast<float>(dxa[i]);
    } else if (dx) {
      for (size_t i = 0; i < dxa.size(); ++i) dx[i] = static_cast<float>(dxa[i]);
    }
  }
};

// Window [start, end) of output position o along one axis, MXNet's rules:
// the window is clipped to the padded input (that size divides avg pooling),
// then to the real input.
struct Window {
  int64_t start, end, padded_size;
};
inline Window PoolWindow(int64_t o, int64_t stride, int64_t pad, int64_t kernel, int64_t size) {
  int64_t start = o * stride - pad;
  int64_t end = std::min(start + kernel, size + pad);
  Window w{std::max<int64_t>(start, 0), std::min(end, size), end - start};
  return w;
}

class PoolingRef : public Operator {
 public:
  explicit PoolingRef(const Node& node) : Operator(node) {}
  bool CanAddToInputGradient(size_t i) const override { return true; }
  bool BackwardNeedsOutput() const override { return node_.pool.type == PoolType::kMax; }
  bool BackwardNeedsInputs() const override { return node_.pool.type == PoolType::kMax; }

 protected:
  template <typename Fn>
  void ForEachWindow(Fn fn) const {
    const PoolParam& p = node_.pool;
    const Shape& xs = t_.in[0].shape();
    const Shape& ys = t_.out.shape();
    const int64_t NC = xs[0] * xs[1], H = xs[2], W = xs[3], OH = ys[2], OW = ys[3];
#pragma omp parallel for schedule(static) if (NC * OH * OW > kParallelMin / 8)
    for (int64_t nc = 0; nc < NC; ++nc)
      for (int64_t oh = 0; oh < OH; ++oh) {
        const Window wh = PoolWindow(oh, p.stride_h, p.pad_h, p.kernel_h, H);
        for (int64_t ow = 0; ow < OW; ++ow) {
          const Window ww = PoolWindow(ow, p.stride_w, p.pad_w, p.kernel_w, W);
          fn(nc * H * W, wh, ww, W, (nc * OH + oh) * OW + ow);
        }
      }
  }

  void DoForward(const OpContext& ctx) override {
    const float* x = t_.in[0].data();
    float* y = t_.out.data();
    const bool is_max = node_.pool.type == PoolType::kMax;
    ForEachWindow([&](int64_t base, const Window& wh, const Window& ww, int64_t W, int64_t yi) {
      float acc = is_max ? -std::numeric_limits<float>::infinity() : 0.0f;
      for (int64_t h = wh.start; h < wh.end; ++h)
        for (int64_t w = ww.start; w < ww.end; ++w) {
          const float v = x[base + h * W + w];
          acc = is_max ? std::max(acc, v) : acc + v;
        }
      // A window wholly in the padding ("full" rounding can add one) holds
      // no element: MXNet's max pooling writes the lowest float there.
      if (is_max && (wh.start >= wh.end || ww.start >= ww.end)) {
        acc = std::numeric_limits<float>::lowest();
      }
      y[yi] = is_max ? acc : acc / static_cast<float>(wh.padded_size * ww.padded_size);
    });
  }

  void DoBackward(const OpContext& ctx) override {
    if (!t_.in_grads[0].defined()) return;
    const float* x = t_.in[0].data();
    const float* y = t_.out.data();
    const float* dy = t_.out_grad.data();
    float* dx = t_.in_grads[0].data();
    if (!AddsTo(0)) t_.in_grads[0].Fill(0.0f);  // the windows' gradients add up in dx
    const bool is_max = node_.pool.type == PoolType::kMax;
    // Windows of one (n, c) plane only touch that plane, and the plane loop is
    // the parallel one, so the scatter below has no races.
    ForEachWindow([&](int64_t base, const Window& wh, const Window& ww, int64_t W, int64_t yi) {
      if (is_max) {
        for (int64_t h = wh.start; h < wh.end; ++h)
          for (int64_t w = ww.start; w < ww.end; ++w) {
            if (x[base + h * W + w] == y[yi]) {
              dx[base + h * W + w] += dy[yi];
              return;  // the first maximum takes the gradient
            }
          }
      } else {
        const float g = dy[yi] / static_cast<float>(wh.padded_size * ww.padded_size);
        for (int64_t h = wh.start; h < wh.end; ++h)
          for (int64_t w = ww.start; w < ww.end; ++w) dx[base + h * W + w] += g;
      }
    });
  }
};

class FullyConnectedRef : public Operator {
 public:
  explicit FullyConnectedRef(const Node& node) : Operator(node) {}
  bool CanAddToInputGradient(size_t i) const override { return true; }

 protected:
  void DoForward(const OpContext& ctx) override {
    const int64_t N = t_.in[0].shape()[0], K = t_.in[0].shape().ProductFrom(1);
    const int64_t M = node_.fc.num_hidden;
    const float* x = t_.in[0].data();
    const float* w = t_.params[0].data();
    const float* b = node_.fc.no_bias ? nullptr : t_.params[1].data();
    float* y = t_.out.data();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t m = 0; m < M; ++m) {
        double acc = b ? b[m] : 0.0;
        for (int64_t k = 0; k < K; ++k) acc += static_cast<double>(x[n * K + k]) * w[m * K + k];
        y[n * M + m] = static_cast<float>(acc);
      }
  }

  void DoBackward(const OpContext& ctx) override {
    const int64_t N = t_.in[0].shape()[0], K = t_.in[0].shape().ProductFrom(1);
    const int64_t M = node_.fc.num_hidden;
    const float* x = t_.in[0].data();
    const float* w = t_.params[0].data();
    const float* dy = t_.out_grad.data();
    float* dw = t_.param_grads[0].data();
    for (int64_t m = 0; m < M; ++m)
      for (int64_t k = 0; k < K; ++k) {
        double acc = 0;
        for (int64_t n = 0; n < N; ++n) acc += static_cast<double>(dy[n * M + m]) * x[n * K + k];
        dw[m * K + k] = static_cast<float>(acc);
      }
    if (!node_.fc.no_bias) {
      float* db = t_.param_grads[1].data();
      for (int64_t m = 0; m < M; ++m) {
        double acc = 0;
        for (int64_t n = 0; n < N; ++n) acc += dy[n * M + m];
        db[m] = static_cast<float>(acc);
      }
    }
    if (t_.in_grads[0].defined()) {
      float* dx = t_.in_grads[0].data();
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k) {
          double acc = 0;
          for (int64_t m = 0; m < M; ++m) acc += static_cast<double>(dy[n * M + m]) * w[m * K + k];
          if (AddsTo(0)) {
            dx[n * K + k] += static_cast<float>(acc);
          } else {
            dx[n * K + k] = static_cast<float>(acc);
          }
        }
    }
  }
};

class BatchNormRef : public Operator {
 public:
  explicit BatchNormRef(const Node& node) : Operator(node) {}
  bool CanAddToInputGradient(size_t i) const override { return true; }

 protected:
  Status DoSetup(const OpContext& ctx) override {
    const int64_t C = t_.in[0].shape()[1];
    mean_.assign(C, 0.0f);
    invstd_.assign(C, 0.0f);
    return Status::Ok();
  }

  void DoForward(const OpContext& ctx) override {
    const BatchNormParam& p = node_.bn;
    const Shape& s = t_.in[0].shape();
    const int64_t N = s[0], C = s[1], S = s.ProductFrom(2);
    const float* x = t_.in[0].data();
    float* y = t_.out.data();
    const float* gamma = t_.params[0].data();
    const float* beta = t_.params[1].data();
    float* mm = t_.aux[0].data();
    float* mv = t_.aux[1].data();
    for (int64_t c = 0; c < C; ++c) {
      double mean, var;
      if (ctx.is_train) {
        double sum = 0, sq = 0;
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < S; ++i) sum += x[(n * C + c) * S + i];
        mean = sum / static_cast<double>(N * S);
        for (int64_t n = 0; n < N; ++n)
          for (int64_t i = 0; i < S; ++i) {
            const double d = x[(n * C + c) * S + i] - mean;
            sq += d * d;
          }
        var = sq / static_cast<double>(N * S);
        mm[c] = p.momentum * mm[c] + (1 - p.momentum) * static_cast<float>(mean);
        mv[c] = p.momentum * mv[c] + (1 - p.momentum) * static_cast<float>(var);
      } else {
        mean = mm[c];
        var = mv[c];
      }
      const double invstd = 1.0 / std::sqrt(var + p.eps);
      mean_[c] = static_cast<float>(mean);
      invstd_[c] = static_cast<float>(invstd);
      const double g = p.fix_gamma ? 1.0 : gamma[c];
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < S; ++i) {
          const int64_t k = (n * C + c) * S + i;
          y[k] = static_cast<float>((x[k] - mean) * invstd * g + beta[c]);
        }
    }
  }

  void DoBackward(const OpContext& ctx) override {
    const BatchNormParam& p = node_.bn;
    const Shape& s = t_.in[0].shape();
    const int64_t N = s[0], C = s[1], S = s.ProductFrom(2);
    const double M = static_cast<double>(N * S);
    const float* x = t_.in[0].data();
    const float* dy = t_.out_grad.data();
    const float* gamma = t_.params[0].data();
    float* dgamma = t_.param_grads[0].data();
    float* dbeta = t_.param_grads[1].data();
    float* dx = t_.in_grads[0].defined() ? t_.in_grads[0].data() : nullptr;
    for (int64_t c = 0; c < C; ++c) {
      double sdy = 0, sdyx = 0;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < S; ++i) {
          const int64_t k = (n * C + c) * S + i;
          sdy += dy[k];
          sdyx += dy[k] * (x[k] - mean_[c]) * invstd_[c];
        }
      dbeta[c] = static_cast<float>(sdy);
      dgamma[c] = p.fix_gamma ? 0.0f : static_cast<float>(sdyx);
      if (!dx) continue;
      const double g = p.fix_gamma ? 1.0 : gamma[c];
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < S; ++i) {
          const int64_t k = (n * C + c) * S + i;
          const double xhat = (x[k] - mean_[c]) * invstd_[c];
          const float d = static_cast<float>(g * invstd_[c] * (dy[k] - sdy / M - xhat * sdyx / M));
          dx[k] = AddsTo(0) ? dx[k] + d : d;
        }
    }
  }

 private:
  std::vector<float> mean_, invstd_;  // of the last forward
};

class ActivationRef : public Operator {
 public:
  explicit ActivationRef(const Node& node) : Operator(node) {}
  bool BackwardNeedsInputs() const override { return false; }
  bool BackwardNeedsOutput() const override { return true; }
  bool CanAddToInputGradient(size_t i) const override { return true; }

 protected:
  void DoForward(const OpContext& ctx) override {
    const float* x = t_.in[0].data();
    float* y = t_.out.data();
    const int64_t n = t_.out.num_elements();
    switch (node_.act) {
      case ActType::kRelu:
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
        for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
        break;
      case ActType::kTanh:
#pragma omp parallel for schedule(static) if (n > kParallelMin)
        for (int64_t i = 0; i < n; ++i) y[i] = std::tanh(x[i]);
        break;
      case ActType::kSigmoid:
#pragma omp parallel for schedule(static) if (n > kParallelMin)
        for (int64_t i = 0; i < n; ++i) y[i] = 1.0f / (1.0f + std::exp(-x[i]));
        break;
    }
  }

  void DoBackward(const OpContext& ctx) override {
    if (!t_.in_grads[0].defined()) return;
    const float* y = t_.out.data();
    const float* dy = t_.out_grad.data();
    float* dx = t_.in_grads[0].data();
    const int64_t n = t_.out.num_elements();
    switch (node_.act) {
      case ActType::kRelu:
        return Store(dx, n, [=](int64_t i) { return y[i] > 0.0f ? dy[i] : 0.0f; });
      case ActType::kTanh:
        return Store(dx, n, [=](int64_t i) { return dy[i] * (1.0f - y[i] * y[i]); });
      case ActType::kSigmoid:
        return Store(dx, n, [=](int64_t i) { return dy[i] * y[i] * (1.0f - y[i]); });
    }
  }

 private:
  // dx = grad(i), or dx += grad(i) where another reader wrote dx first (never
  // in place then: the input has two readers).
  template <typename Grad>
  void Store(float* dx, int64_t n, Grad grad) {
    if (AddsTo(0)) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
      for (int64_t i = 0; i < n; ++i) dx[i] += grad(i);
    } else {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
      for (int64_t i = 0; i < n; ++i) dx[i] = grad(i);
    }
  }
};

class ConcatOp : public Operator {
 public:
  explicit ConcatOp(const Node& node) : Operator(node) {}
  bool BackwardNeedsInputs() const override { return false; }

 protected:
  void DoForward(const OpContext& ctx) override {
    const int64_t N = t_.out.shape()[0], total = t_.out.shape().ProductFrom(1);
    int64_t offset = 0;
    for (const Tensor& part : t_.in) {
      const int64_t len = part.shape().ProductFrom(1);
      const float* pd = part.data();
      float* wd = t_.out.data();
#pragma omp parallel for schedule(static) if (N * len > kParallelMin)
      for (int64_t n = 0; n < N; ++n) {
        std::memcpy(wd + n * total + offset, pd + n * len, len * sizeof(float));
      }
      offset += len;
    }
  }
  // Undefined input gradients are skipped; the offset still advances.
  void DoBackward(const OpContext& ctx) override {
    const int64_t N = t_.out.shape()[0], total = t_.out.shape().ProductFrom(1);
    int64_t offset = 0;
    for (size_t i = 0; i < t_.in.size(); ++i) {
      const int64_t len = t_.in[i].shape().ProductFrom(1);
      if (t_.in_grads[i].defined()) {
        float* pd = t_.in_grads[i].data();
        const float* wd = t_.out_grad.data();
#pragma omp parallel for schedule(static) if (N * len > kParallelMin)
        for (int64_t n = 0; n < N; ++n) {
          std::memcpy(pd + n * len, wd + n * total + offset, len * sizeof(float));
        }
      }
      offset += len;
    }
  }
};

class AddOp : public Operator {
 public:
  explicit AddOp(const Node& node) : Operator(node) {}
  bool BackwardNeedsInputs() const override { return false; }
  // The sum may overwrite its first input, whose gradient is then the
  // output's gradient itself (no copy).
  bool CanRunInPlace() const override { return true; }
  bool CanAddToInputGradient(size_t i) const override { return true; }

 protected:
  void DoForward(const OpContext& ctx) override {
    float* y = t_.out.data();
    const int64_t n = t_.out.num_elements();
    const float* a = t_.in[0].data();
    if (a != y) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
      for (int64_t i = 0; i < n; ++i) y[i] = a[i];
    }
    for (size_t k = 1; k < t_.in.size(); ++k) {
      const float* b = t_.in[k].data();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
      for (int64_t i = 0; i < n; ++i) y[i] += b[i];
    }
  }
  void DoBackward(const OpContext& ctx) override {
    const float* dy = t_.out_grad.data();
    const int64_t n = t_.out_grad.num_elements();
    for (size_t k = 0; k < t_.in_grads.size(); ++k) {
      float* dx = t_.in_grads[k].defined() ? t_.in_grads[k].data() : nullptr;
      if (dx == nullptr || dx == dy) continue;  // in place: it is dy
      if (AddsTo(k)) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
        for (int64_t i = 0; i < n; ++i) dx[i] += dy[i];
      } else {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
        for (int64_t i = 0; i < n; ++i) dx[i] = dy[i];
      }
    }
  }
};

class DropoutOp : public Operator {
 public:
  explicit DropoutOp(const Node& node) : Operator(node) {}
  bool BackwardNeedsInputs() const override { return false; }

 protected:
  Status DoSetup(const OpContext& ctx) override {
    if (ctx.rng == nullptr) {
      return Status::InvalidArgument(StrCat("dropout '", node_.name, "' needs a random generator"));
    }
    mask_.assign(t_.out.num_elements(), 1.0f);
    return Status::Ok();
  }
  void DoForward(const OpContext& ctx) override {
    const float* x = t_.in[0].data();
    float* y = t_.out.data();
    const int64_t n = t_.out.num_elements();
    const float p = node_.dropout.p;
    if (!ctx.is_train || p == 0.0f) {
      std::fill(mask_.begin(), mask_.end(), 1.0f);
      if (x != y) std::memcpy(y, x, n * sizeof(float));
      return;
    }
    const float scale = 1.0f / (1.0f - p);
    // 24 random bits per element from 64-bit draws: cheap and exact for p's
    // granularity of 2^-24.
    const uint32_t threshold = static_cast<uint32_t>(p * 16777216.0f);
    std::mt19937_64& rng = *ctx.rng;
    int64_t i = 0;
    while (i < n) {
      uint64_t bits = rng();
      for (int k = 0; k < 2 && i < n; ++k, ++i) {
        const uint32_t r = static_cast<uint32_t>(bits >> (k * 32)) & 0xFFFFFFu;
        mask_[i] = r < threshold ? 0.0f : scale;
      }
    }
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t j = 0; j < n; ++j) y[j] = x[j] * mask_[j];
  }
  void DoBackward(const OpContext& ctx) override {
    if (!t_.in_grads[0].defined()) return;
    const float* dy = t_.out_grad.data();
    float* dx = t_.in_grads[0].data();
    const int64_t n = t_.out.num_elements();
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
    for (int64_t j = 0; j < n; ++j) dx[j] = dy[j] * mask_[j];
  }

 private:
  std::vector<float> mask_;
};

class FlattenOp : public Operator {
 public:
  explicit FlattenOp(const Node& node) : Operator(node) {}
  bool BackwardNeedsInputs() const override { return false; }

 protected:
  void DoForward(const OpContext& ctx) override { t_.out.CopyFrom(t_.in[0]); }
  void DoBackward(const OpContext& ctx) override {
    if (t_.in_grads[0].defined()) t_.in_grads[0].CopyFrom(t_.out_grad);
  }
};

// The class of a float label, or -1 when it is not one of 0..K-1 (NaN included).
inline int64_t LabelIndex(float label, int64_t K) {
  return label >= 0.0f && label < static_cast<float>(K) ? static_cast<int64_t>(label) : -1;
}

class SoftmaxOutputOp : public Operator {
 public:
  explicit SoftmaxOutputOp(const Node& node) : Operator(node) {}
  bool BackwardNeedsOutput() const override { return true; }
  float Loss() const override { return loss_; }

 protected:
  void DoForward(const OpContext& ctx) override {
    const int64_t N = t_.out.shape()[0], K = t_.out.shape()[1];
    const float* x = t_.in[0].data();
    const float* label = t_.in[1].data();
    float* y = t_.out.data();
    double loss = 0;
#pragma omp parallel for schedule(static) reduction(+ : loss) if (N * K > kParallelMin)
    for (int64_t n = 0; n < N; ++n) {
      const float* xr = x + n * K;
      float* yr = y + n * K;
      float mx = xr[0];
      for (int64_t k = 1; k < K; ++k) mx = std::max(mx, xr[k]);
      double sum = 0;
      for (int64_t k = 0; k < K; ++k) {
        yr[k] = std::exp(xr[k] - mx);
        sum += yr[k];
      }
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t k = 0; k < K; ++k) yr[k] *= inv;
      const int64_t l = LabelIndex(label[n], K);
      if (l >= 0) loss += -std::log(std::max(yr[l], 1e-30f));
    }
    loss_ = static_cast<float>(loss / static_cast<double>(N));
  }
  void DoBackward(const OpContext& ctx) override {
    if (!t_.in_grads[0].defined()) return;
    const int64_t N = t_.out.shape()[0], K = t_.out.shape()[1];
    const float* y = t_.out.data();
    const float* label = t_.in[1].data();
    float* dx = t_.in_grads[0].data();
    const float scale = node_.softmax_grad_scale;
    for (int64_t n = 0; n < N; ++n) {
      // A label outside [0, K) contributes no target (the reader validates
      // labels; this keeps a bad one from writing out of bounds).
      const int64_t l = LabelIndex(label[n], K);
      for (int64_t k = 0; k < K; ++k) {
        dx[n * K + k] = scale * (y[n * K + k] - (k == l ? 1.0f : 0.0f));
      }
    }
  }

 private:
  float loss_ = 0.0f;
};

}  // namespace

std::unique_ptr<Operator> MakeReferenceOperator(const Node& node) {
  switch (node.op) {
    case OpType::kInput:
      return nullptr;
    case OpType::kConvolution:
      return std::make_unique<ConvolutionRef>(node);
    case OpType::kPooling:
      return std::make_unique<PoolingRef>(node);
    case OpType::kFullyConnected:
      return std::make_unique<FullyConnectedRef>(node);
    case OpType::kBatchNorm:
      return std::make_unique<BatchNormRef>(node);
    case OpType::kActivation:
      return std::make_unique<ActivationRef>(node);
    case OpType::kConcat:
      return std::make_unique<ConcatOp>(node);
    case OpType::kAdd:
      return std::make_unique<AddOp>(node);
    case OpType::kDropout:
      return std::make_unique<DropoutOp>(node);
    case OpType::kFlatten:
      return std::make_unique<FlattenOp>(node);
    case OpType::kSoftmaxOutput:
      return std::make_unique<SoftmaxOutputOp>(node);
  }
  return nullptr;
}

}  // namespace pstrain::internal
