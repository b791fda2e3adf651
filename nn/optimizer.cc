#include "nn/optimizer.h"

#include <algorithm>
#include <cmath>

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
  double lr = base_lr_;
  for (int64_t i = 0; i < decays; ++i) {
    lr *= cfg_.factor();
    if (cfg_.type() == LrSchedulerConfig::FACTOR && lr < cfg_.stop_factor_lr()) {
      return cfg_.stop_factor_lr();
    }
  }
  return static_cast<float>(lr);
}

StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerConfig& cfg) {
  if (cfg.momentum() < 0 || cfg.momentum() >= 1) {
    return Status::InvalidArgument(StrCat("momentum ", cfg.momentum(), " must be in [0, 1)"));
  }
  if (cfg.wd() < 0) return Status::InvalidArgument(StrCat("wd ", cfg.wd(), " must be >= 0"));
  if (!std::isfinite(cfg.rescale_grad())) {
    return Status::InvalidArgument("rescale_grad must be finite");
  }
  ASSIGN_OR_RETURN(LrSchedule schedule,
                   LrSchedule::Create(cfg.learning_rate(), cfg.lr_scheduler()));
  return std::unique_ptr<Optimizer>(new Optimizer(cfg, schedule));
}

int64_t Optimizer::NoteUpdate(ParamState* state) {
  int64_t count = ++state->num_updates;
  int64_t global = num_update_.load(std::memory_order_relaxed);
  while (count > global &&
         !num_update_.compare_exchange_weak(global, count, std::memory_order_relaxed)) {
  }
  return std::max(count, global);
}

float Optimizer::CurrentLr() const { return schedule_.LrAt(num_update() + 1); }

Optimizer::Step Optimizer::NextStep(ParamState* state) {
  const int64_t num_update = NoteUpdate(state);
  Step s;
  s.rescale = cfg_.rescale_grad();
  s.test = cfg_.type() == OptimizerConfig::TEST;
  if (s.test) return s;
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

void Optimizer::ApplyStep(const Step& s, const float* grad, const float* in, float* out, float* m,
                          size_t n) {
  if (s.test) {
    for (size_t i = 0; i < n; ++i) out[i] = in[i] + s.rescale * grad[i];
    return;
  }
  if (s.mom == 0.0f) {
    for (size_t i = 0; i < n; ++i) {
      float g = s.rescale * grad[i];
      if (s.do_clip) g = std::clamp(g, -s.clip, s.clip);
      out[i] = in[i] - s.lr * (g + s.wd * in[i]);
    }
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    float g = s.rescale * grad[i];
    if (s.do_clip) g = std::clamp(g, -s.clip, s.clip);
    m[i] = s.mom * m[i] - s.lr * (g + s.wd * in[i]);
    out[i] = in[i] + m[i];
  }
}

void Optimizer::Update(const float* grad, float* weight, size_t n, ParamState* state) {
  const Step s = Begin(n, state);
  ApplyStep(s, grad, weight, weight, state->momentum.empty() ? nullptr : state->momentum.data(), n);
}

void Optimizer::Update(const float* const* grads, size_t num_grads, float* weight, size_t n,
                       ParamState* state) {
  Update(grads, num_grads, weight, weight, n, state);
}

void Optimizer::Update(const float* const* grads, size_t num_grads, const float* in, float* out,
                       size_t n, ParamState* state) {
  CHECK_GE(num_grads, 1u);
  const Step s = Begin(n, state);
  float* m = state->momentum.empty() ? nullptr : state->momentum.data();
  if (num_grads == 1) {
    ApplyStep(s, grads[0], in, out, m, n);
    return;
  }
  // The sum of one block stays in L1 between the adds and the update.
  constexpr size_t kBlock = 1024;
  alignas(64) float sum[kBlock];
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t len = std::min(kBlock, n - b);
    const float* g0 = grads[0] + b;
    const float* g1 = grads[1] + b;
    for (size_t i = 0; i < len; ++i) sum[i] = g0[i] + g1[i];
    for (size_t k = 2; k < num_grads; ++k) {
      const float* g = grads[k] + b;
      for (size_t i = 0; i < len; ++i) sum[i] += g[i];
    }
    ApplyStep(s, sum, in + b, out + b, m == nullptr ? nullptr : m + b, len);
  }
}

}  // namespace pstrain
