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

void Optimizer::Update(const float* grad, float* weight, size_t n, ParamState* state) {
  const int64_t num_update = NoteUpdate(state);
  const float rescale = cfg_.rescale_grad();
  if (cfg_.type() == OptimizerConfig::TEST) {
    for (size_t i = 0; i < n; ++i) weight[i] += rescale * grad[i];
    return;
  }
  const float lr = schedule_.LrAt(num_update) * state->lr_mult;
  const float wd = cfg_.wd() * state->wd_mult;
  const float clip = cfg_.clip_gradient();
  const bool do_clip = clip > 0;
  const float mom = cfg_.momentum();
  if (mom == 0.0f) {
    for (size_t i = 0; i < n; ++i) {
      float g = rescale * grad[i];
      if (do_clip) g = std::clamp(g, -clip, clip);
      weight[i] -= lr * (g + wd * weight[i]);
    }
    return;
  }
  if (state->momentum.size() != n) state->momentum.assign(n, 0.0f);
  float* m = state->momentum.data();
  for (size_t i = 0; i < n; ++i) {
    float g = rescale * grad[i];
    if (do_clip) g = std::clamp(g, -clip, clip);
    m[i] = mom * m[i] - lr * (g + wd * weight[i]);
    weight[i] += m[i];
  }
}

}  // namespace pstrain
