#include "nn/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pstrain {

StatusOr<LrSchedule> LrSchedule::Create(float base_lr, const LrSchedulerConfig& cfg) {
  if (!(base_lr >= 0) || !std::isfinite(base_lr)) {
    return Status::InvalidArgument(StrCat("learning rate ", base_lr, " must be >= 0"));
  }
  if (cfg.type() != LrSchedulerConfig::NONE && !(cfg.factor() > 0 && cfg.factor() <= 1)) {
    return Status::InvalidArgument(
        StrCat("lr scheduler factor ", cfg.factor(), " must be in (0, 1]"));
  }
  if (cfg.type() == LrSchedulerConfig::FACTOR && cfg.step() < 1) {
    return Status::InvalidArgument(StrCat("lr scheduler step ", cfg.step(), " must be >= 1"));
  }
  if (cfg.type() == LrSchedulerConfig::MULTI_FACTOR) {
    for (int i = 0; i < cfg.steps_size(); ++i) {
      if (cfg.steps(i) < 1 || (i > 0 && cfg.steps(i) <= cfg.steps(i - 1))) {
        return Status::InvalidArgument(StrCat(
            "lr scheduler steps must be positive and increasing; steps[", i, "] = ", cfg.steps(i)));
      }
    }
  }
  LrSchedule s;
  s.base_lr_ = base_lr;
  s.cfg_ = cfg;
  return s;
}

float LrSchedule::LrAt(int64_t num_update) const {
  int64_t decays = 0;
  switch (cfg_.type()) {
    case LrSchedulerConfig::NONE:
      return base_lr_;
    case LrSchedulerConfig::FACTOR:
      // MXNet decays once num_update exceeds count + step, i.e. after every `step` updates.
      decays = num_update > 0 ? (num_update - 1) / cfg_.step() : 0;
      break;
    case LrSchedulerConfig::MULTI_FACTOR:
      for (int64_t s : cfg_.steps()) {
        if (num_update > s) ++decays;
      }
      break;
  }
  // MXNet multiplies once per decay (in double); so do we for the usual few
  // (a schedule by epochs), and past that take the power at once: a step of
  // one update would otherwise cost each update as many multiplications as
  // updates so far. The two agree to far below a float's precision.
  constexpr int64_t kMultiplied = 64;
  double lr = base_lr_;
  if (decays <= kMultiplied) {
    for (int64_t i = 0; i < decays; ++i) lr *= cfg_.factor();
  } else {
    lr *= std::pow(static_cast<double>(cfg_.factor()), static_cast<double>(decays));
  }
  // The FACTOR scheduler's floor (it stops decaying there).
  if (cfg_.type() == LrSchedulerConfig::FACTOR && decays > 0 && lr < cfg_.stop_factor_lr()) {
    return cfg_.stop_factor_lr();
  }
  return static_cast<float>(lr);
}

StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerConfig& cfg) {
  // Written so that NaN fails too (it comes from a peer's config).
  if (!(cfg.momentum() >= 0 && cfg.momentum() < 1)) {
    return Status::InvalidArgument(StrCat("momentum ", cfg.momentum(), " must be in [0, 1)"));
  }
  if (!(cfg.wd() >= 0) || !std::isfinite(cfg.wd())) {
    return Status::InvalidArgument(StrCat("wd ", cfg.wd(), " must be finite and >= 0"));
  }
  if (!std::isfinite(cfg.rescale_grad())) {
    return Status::InvalidArgument("rescale_grad must be finite");
  }
  ASSIGN_OR_RETURN(LrSchedule schedule,
                   LrSchedule::Create(cfg.learning_rate(), cfg.lr_scheduler()));
  return std::unique_ptr<Optimizer>(new Optimizer(cfg, schedule));
}

int64_t Optimizer::NoteUpdate(ParamState* state) {
  const int64_t count = ++state->num_updates;
  ContinueFrom(count);
  return std::max(count, num_update());
}

void Optimizer::ContinueFrom(int64_t num_update) {
  int64_t global = num_update_.load(std::memory_order_relaxed);
  while (num_update > global &&
         !num_update_.compare_exchange_weak(global, num_update, std::memory_order_relaxed)) {
  }
}

float Optimizer::CurrentLr() const { return schedule_.LrAt(num_update() + 1); }

Optimizer::Step Optimizer::NextStep(ParamState* state) {
  const int64_t num_update = NoteUpdate(state);
  Step s;
  s.rescale = cfg_.rescale_grad();
  s.test = cfg_.type() == OptimizerConfig::TEST;
  if (s.test) return s;  // (uses_momentum() is false then, as Step's)
  s.lr = schedule_.LrAt(num_update) * state->lr_mult;
  s.wd = cfg_.wd() * state->wd_mult;
  s.clip = cfg_.clip_gradient();
  s.do_clip = s.clip > 0;
  s.mom = cfg_.momentum();
  return s;
}

Optimizer::Step Optimizer::Begin(size_t n, ParamState* state) {
  const Step s = NextStep(state);
  if (s.uses_momentum() && state->momentum.size() != n) state->momentum.assign(n, 0.0f);
  return s;
}

namespace {

// 1 for NaN and +-Inf (all exponent bits set), else 0: integer operations,
// so the compiler vectorizes an OR over a loop (a float test would not be).
inline uint32_t NonFinite(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return (u & 0x7f800000u) == 0x7f800000u;
}

UpdateCheck CheckOf(uint32_t bad) {
  UpdateCheck c;
  if (bad & 1u) c.bad_grad = 0;
  c.bad_weight = (bad & 2u) != 0;
  return c;
}

}  // namespace

bool AllFinite(const float* x, size_t n) {
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad |= NonFinite(x[i]);
  return bad == 0;
}

UpdateCheck Optimizer::ApplyStep(const Step& s, const float* grad, const float* in, float* out,
                                 float* m, size_t n) {
  uint32_t bad = 0;  // bit 0: a gradient value, bit 1: a weight written
  if (s.test) {
    for (size_t i = 0; i < n; ++i) {
      out[i] = in[i] + s.rescale * grad[i];
      bad |= NonFinite(grad[i]) | NonFinite(out[i]) << 1;
    }
    return CheckOf(bad);
  }
  if (s.mom == 0.0f) {
    for (size_t i = 0; i < n; ++i) {
      float g = s.rescale * grad[i];
      if (s.do_clip) g = std::clamp(g, -s.clip, s.clip);
      out[i] = in[i] - s.lr * (g + s.wd * in[i]);
      bad |= NonFinite(grad[i]) | NonFinite(out[i]) << 1;
    }
    return CheckOf(bad);
  }
  for (size_t i = 0; i < n; ++i) {
    float g = s.rescale * grad[i];
    if (s.do_clip) g = std::clamp(g, -s.clip, s.clip);
    m[i] = s.mom * m[i] - s.lr * (g + s.wd * in[i]);
    out[i] = in[i] + m[i];
    bad |= NonFinite(grad[i]) | NonFinite(out[i]) << 1;
  }
  return CheckOf(bad);
}

UpdateCheck Optimizer::Update(const float* grad, float* weight, size_t n, ParamState* state) {
  const Step s = Begin(n, state);
  return ApplyStep(s, grad, weight, weight,
                   state->momentum.empty() ? nullptr : state->momentum.data(), n);
}

UpdateCheck Optimizer::Update(const float* const* grads, size_t num_grads, float* weight, size_t n,
                              ParamState* state) {
  return Update(grads, num_grads, weight, weight, n, state);
}

UpdateCheck Optimizer::Update(const float* const* grads, size_t num_grads, const float* in,
                              float* out, size_t n, ParamState* state) {
  CHECK_GE(num_grads, 1u);
  const Step s = Begin(n, state);
  float* m = state->momentum.empty() ? nullptr : state->momentum.data();
  if (num_grads == 1) return ApplyStep(s, grads[0], in, out, m, n);
  // The sum of one block stays in L1 between the adds and the update. Each
  // gradient is checked while it is summed; the sum is not (a non-finite sum
  // of finite gradients shows in the weights).
  constexpr size_t kBlock = 1024;
  alignas(64) float sum[kBlock];
  uint32_t few[32] = {};  // per gradient: held NaN or Inf (no allocation for W <= 32)
  std::vector<uint32_t> many(num_grads > 32 ? num_grads : 0, 0);
  uint32_t* bad_grad = num_grads > 32 ? many.data() : few;
  bool bad_weight = false;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t len = std::min(kBlock, n - b);
    const float* g0 = grads[0] + b;
    const float* g1 = grads[1] + b;
    uint32_t b0 = 0, b1 = 0;
    for (size_t i = 0; i < len; ++i) {
      sum[i] = g0[i] + g1[i];
      b0 |= NonFinite(g0[i]);
      b1 |= NonFinite(g1[i]);
    }
    bad_grad[0] |= b0;
    bad_grad[1] |= b1;
    for (size_t k = 2; k < num_grads; ++k) {
      const float* g = grads[k] + b;
      uint32_t bk = 0;
      for (size_t i = 0; i < len; ++i) {
        sum[i] += g[i];
        bk |= NonFinite(g[i]);
      }
      bad_grad[k] |= bk;
    }
    bad_weight |=
        ApplyStep(s, sum, in + b, out + b, m == nullptr ? nullptr : m + b, len).bad_weight;
  }
  UpdateCheck c;
  c.bad_weight = bad_weight;
  for (size_t k = 0; k < num_grads; ++k) {
    if (bad_grad[k]) {
      c.bad_grad = static_cast<int>(k);
      break;
    }
  }
  return c;
}

}  // namespace pstrain
