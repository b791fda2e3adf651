#include "nn/optimizer.h"

#include <algorithm>
#include <cctype>
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

namespace {

Optimizer::Rule RuleOf(const OptimizerConfig& cfg) {
  switch (cfg.type()) {
    case OptimizerConfig::SGD:
      return Optimizer::Rule::kSgd;
    case OptimizerConfig::TEST:
      return Optimizer::Rule::kTest;
    case OptimizerConfig::NAG:
      return Optimizer::Rule::kNag;
    case OptimizerConfig::ADAM:
      return Optimizer::Rule::kAdam;
    case OptimizerConfig::RMSPROP:
      return cfg.centered() ? Optimizer::Rule::kRmsPropCentered : Optimizer::Rule::kRmsProp;
    case OptimizerConfig::ADAGRAD:
      return Optimizer::Rule::kAdaGrad;
  }
  return Optimizer::Rule::kSgd;  // (Create refuses any other value)
}

// A decay rate in [0, 1); written so that NaN fails too (a peer's config).
Status CheckRate(const char* name, double v, OptimizerConfig::Type type) {
  if (v >= 0 && v < 1) return Status::Ok();
  return Status::InvalidArgument(
      StrCat(Optimizer::TypeName(type), ": ", name, " ", v, " must be in [0, 1)"));
}

}  // namespace

const char* Optimizer::TypeName(OptimizerConfig::Type type) {
  switch (type) {
    case OptimizerConfig::SGD:
      return "sgd";
    case OptimizerConfig::TEST:
      return "test";
    case OptimizerConfig::NAG:
      return "nag";
    case OptimizerConfig::ADAM:
      return "adam";
    case OptimizerConfig::RMSPROP:
      return "rmsprop";
    case OptimizerConfig::ADAGRAD:
      return "adagrad";
  }
  return "unknown";
}

bool OptimizerTypeFromName(const std::string& name, OptimizerConfig::Type* type) {
  std::string lower = name;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (int t = OptimizerConfig::Type_MIN; t <= OptimizerConfig::Type_MAX; ++t) {
    const auto candidate = static_cast<OptimizerConfig::Type>(t);
    if (OptimizerConfig::Type_IsValid(t) && lower == Optimizer::TypeName(candidate)) {
      *type = candidate;
      return true;
    }
  }
  return false;
}

StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerConfig& cfg) {
  const OptimizerConfig::Type type = cfg.type();
  if (!OptimizerConfig::Type_IsValid(type)) {
    return Status::InvalidArgument(StrCat("unknown optimizer type ", static_cast<int>(type)));
  }
  const char* name = TypeName(type);
  // Written so that NaN fails too (it comes from a peer's config).
  const bool has_momentum = type == OptimizerConfig::SGD || type == OptimizerConfig::NAG;
  if (has_momentum) {
    RETURN_IF_ERROR(CheckRate("momentum", cfg.momentum(), type));
  } else if (cfg.momentum() != 0.0f && type != OptimizerConfig::TEST) {
    // MXNet's optimizers other than sgd and nag take no momentum either.
    return Status::InvalidArgument(
        StrCat(name, " takes no momentum (got ", cfg.momentum(), "): only sgd and nag do"));
  }
  if (!(cfg.wd() >= 0) || !std::isfinite(cfg.wd())) {
    return Status::InvalidArgument(StrCat("wd ", cfg.wd(), " must be finite and >= 0"));
  }
  if (!std::isfinite(cfg.rescale_grad())) {
    return Status::InvalidArgument("rescale_grad must be finite");
  }
  if (type == OptimizerConfig::ADAM) {
    RETURN_IF_ERROR(CheckRate("beta1", cfg.beta1(), type));
    RETURN_IF_ERROR(CheckRate("beta2", cfg.beta2(), type));
  }
  if (type == OptimizerConfig::RMSPROP) {
    RETURN_IF_ERROR(CheckRate("gamma1", cfg.gamma1(), type));
    RETURN_IF_ERROR(CheckRate("gamma2", cfg.gamma2(), type));
    if (std::isnan(cfg.clip_weights())) {
      return Status::InvalidArgument("rmsprop: clip_weights is NaN");
    }
  }
  if (cfg.has_epsilon() && !(cfg.epsilon() > 0 && std::isfinite(cfg.epsilon()))) {
    return Status::InvalidArgument(
        StrCat(name, ": epsilon ", cfg.epsilon(), " must be finite and > 0"));
  }
  ASSIGN_OR_RETURN(LrSchedule schedule,
                   LrSchedule::Create(cfg.learning_rate(), cfg.lr_scheduler()));
  return std::unique_ptr<Optimizer>(new Optimizer(cfg, schedule));
}

Optimizer::Optimizer(const OptimizerConfig& cfg, LrSchedule schedule)
    : cfg_(cfg), rule_(RuleOf(cfg)), schedule_(schedule) {}

std::string Optimizer::SlotLayoutName() const {
  if (rule_ == Rule::kRmsPropCentered) return "rmsprop_centered";
  return TypeName(cfg_.type());
}

std::vector<std::string> Optimizer::SlotNames() const {
  switch (rule_) {
    case Rule::kSgd:
    case Rule::kNag:
      if (num_slots() == 0) return {};
      return {"momentum"};
    case Rule::kTest:
      return {};
    case Rule::kAdam:
      return {"mean", "var"};
    case Rule::kRmsProp:
      return {"n"};
    case Rule::kRmsPropCentered:
      return {"n", "g", "delta"};
    case Rule::kAdaGrad:
      return {"history"};
  }
  return {};
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
  s.rule = rule_;
  s.rescale = cfg_.rescale_grad();
  if (rule_ == Rule::kTest) return s;
  const float lr = schedule_.LrAt(num_update) * state->lr_mult;
  s.lr = lr;
  s.wd = cfg_.wd() * state->wd_mult;
  s.clip = cfg_.clip_gradient();
  s.do_clip = s.clip > 0;
  switch (rule_) {
    case Rule::kSgd:
    case Rule::kNag:
      s.mom = cfg_.momentum();
      break;
    case Rule::kAdam: {
      // MXNet's Adam.update, in double as Python computes it.
      const double t = static_cast<double>(state->earlier_updates + state->num_updates);
      const double coef1 = 1.0 - std::pow(cfg_.beta1(), t);
      const double coef2 = 1.0 - std::pow(cfg_.beta2(), t);
      s.lr = static_cast<float>(lr * std::sqrt(coef2) / coef1);
      s.beta1 = static_cast<float>(cfg_.beta1());
      s.beta2 = static_cast<float>(cfg_.beta2());
      s.eps = cfg_.has_epsilon() ? cfg_.epsilon() : 1e-8f;
      break;
    }
    case Rule::kRmsProp:
    case Rule::kRmsPropCentered:
      s.gamma1 = cfg_.gamma1();
      s.gamma2 = cfg_.gamma2();
      s.eps = cfg_.has_epsilon() ? cfg_.epsilon() : 1e-8f;
      s.clip_weights = cfg_.clip_weights();
      s.do_clip_weights = s.clip_weights > 0;
      break;
    case Rule::kAdaGrad:
      s.eps = cfg_.has_epsilon() ? cfg_.epsilon() : 1e-7f;
      break;
    case Rule::kTest:
      break;
  }
  return s;
}

Optimizer::Step Optimizer::Begin(size_t n, ParamState* state) {
  if (state->slot_layout >= 0 && state->slot_layout != SlotLayout()) {
    // Another optimizer's state (a configuration replaced mid-job): this one
    // starts afresh, its slots zero and Adam's count t from 1, as a new
    // MXNet optimizer would. (The schedule's clock goes on.)
    state->slots.clear();
    state->earlier_updates = -state->num_updates;
  }
  state->slot_layout = SlotLayout();
  const Step s = NextStep(state);
  const size_t want = static_cast<size_t>(s.num_slots()) * n;
  if (state->slots.size() != want) state->slots.assign(want, 0.0f);
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

UpdateCheck Optimizer::ApplyStep(const Step& step, const float* grad, const float* in, float* out,
                                 float* state, size_t stride, size_t n) {
  // A local copy: the loops' stores could alias the caller's Step, whose
  // fields the compiler would then reload every element (and not vectorize).
  const Step s = step;
  uint32_t bad = 0;  // bit 0: a gradient value, bit 1: a weight written
  // Every loop below is one pass, element by element, with the check in it.
  auto clip = [&s](float g) { return s.do_clip ? std::clamp(g, -s.clip, s.clip) : g; };
  auto clip_w = [&s](float w) {
    return s.do_clip_weights ? std::clamp(w, -s.clip_weights, s.clip_weights) : w;
  };
  switch (s.rule) {
    case Rule::kTest:
      for (size_t i = 0; i < n; ++i) {
        out[i] = in[i] + s.rescale * grad[i];
        bad |= NonFinite(grad[i]) | NonFinite(out[i]) << 1;
      }
      break;
    case Rule::kSgd:
      if (s.mom == 0.0f) {
        for (size_t i = 0; i < n; ++i) {
          out[i] = in[i] - s.lr * (clip(s.rescale * grad[i]) + s.wd * in[i]);
          bad |= NonFinite(grad[i]) | NonFinite(out[i]) << 1;
        }
        break;
      }
      for (size_t i = 0; i < n; ++i) {
        float* m = state;
        m[i] = s.mom * m[i] - s.lr * (clip(s.rescale * grad[i]) + s.wd * in[i]);
        out[i] = in[i] + m[i];
        bad |= NonFinite(grad[i]) | NonFinite(out[i]) << 1;
      }
      break;
    case Rule::kNag:
      if (s.mom == 0.0f) {  // nag_update: SGD's rule
        for (size_t i = 0; i < n; ++i) {
          out[i] = in[i] - s.lr * (clip(s.rescale * grad[i]) + s.wd * in[i]);
          bad |= NonFinite(grad[i]) | NonFinite(out[i]) << 1;
        }
        break;
      }
      for (size_t i = 0; i < n; ++i) {  // nag_mom_update's expressions
        const float step_i = s.lr * (clip(s.rescale * grad[i]) + s.wd * in[i]);
        const float m = s.mom * state[i];
        out[i] = in[i] - m + (s.mom + 1.0f) * (m - step_i);
        state[i] = m - step_i;
        bad |= NonFinite(grad[i]) | NonFinite(out[i]) << 1;
      }
      break;
    case Rule::kAdam: {
      float* mean = state;
      float* var = state + stride;
      for (size_t i = 0; i < n; ++i) {
        const float h = clip(s.rescale * grad[i] + s.wd * in[i]);
        const float m = s.beta1 * mean[i] + (1.0f - s.beta1) * h;
        const float v = s.beta2 * var[i] + (1.0f - s.beta2) * (h * h);
        mean[i] = m;
        var[i] = v;
        out[i] = in[i] - s.lr * m / (std::sqrt(v) + s.eps);
        bad |= NonFinite(grad[i]) | NonFinite(out[i]) << 1;
      }
      break;
    }
    case Rule::kRmsProp: {
      float* sq = state;
      for (size_t i = 0; i < n; ++i) {
        const float h = clip(s.rescale * grad[i] + s.wd * in[i]);
        const float q = (1.0f - s.gamma1) * (h * h) + s.gamma1 * sq[i];
        sq[i] = q;
        out[i] = clip_w(in[i] - s.lr * (h / std::sqrt(q + s.eps)));
        bad |= NonFinite(grad[i]) | NonFinite(out[i]) << 1;
      }
      break;
    }
    case Rule::kRmsPropCentered: {
      float* sq = state;
      float* mg = state + stride;
      float* delta = state + 2 * stride;
      // Clipping with infinite bounds when off (the same values, NaN
      // included): GCC does not vectorize this loop's body with the two
      // conditional clips (a scalar condition choosing between vectors), and
      // did not unswitch a loop this size (a 4M-float update: 14.5 ms, 7
      // vectorized; bench/RESULTS.md).
      const float lo = s.do_clip ? -s.clip : -INFINITY, hi = s.do_clip ? s.clip : INFINITY;
      const float lo_w = s.do_clip_weights ? -s.clip_weights : -INFINITY;
      const float hi_w = s.do_clip_weights ? s.clip_weights : INFINITY;
      // Six arrays need more runtime overlap checks than GCC makes (10); no
      // element depends on another's: `in` and `out` are one array or apart,
      // the three slots apart.
#if defined(__clang__)
#pragma clang loop vectorize(assume_safety)
#elif defined(__GNUC__)
#pragma GCC ivdep
#endif
      for (size_t i = 0; i < n; ++i) {
        const float h = std::clamp(s.rescale * grad[i] + s.wd * in[i], lo, hi);
        const float q = (1.0f - s.gamma1) * (h * h) + s.gamma1 * sq[i];
        const float m = (1.0f - s.gamma1) * h + s.gamma1 * mg[i];
        const float d = s.gamma2 * delta[i] - s.lr * (h / std::sqrt(q - m * m + s.eps));
        sq[i] = q;
        mg[i] = m;
        delta[i] = d;
        out[i] = std::clamp(in[i] + d, lo_w, hi_w);
        bad |= NonFinite(grad[i]) | NonFinite(out[i]) << 1;
      }
      break;
    }
    case Rule::kAdaGrad: {
      float* hist = state;
      for (size_t i = 0; i < n; ++i) {
        const float h = clip(s.rescale * grad[i]);
        const float acc = hist[i] + h * h;
        hist[i] = acc;
        out[i] = in[i] - s.lr * (h / std::sqrt(acc + s.eps) + s.wd * in[i]);
        bad |= NonFinite(grad[i]) | NonFinite(out[i]) << 1;
      }
      break;
    }
  }
  return CheckOf(bad);
}

UpdateCheck Optimizer::Update(const float* grad, float* weight, size_t n, ParamState* state) {
  const Step s = Begin(n, state);
  return ApplyStep(s, grad, weight, weight, state->slots.empty() ? nullptr : state->slots.data(), n,
                   n);
}

UpdateCheck Optimizer::Update(const float* const* grads, size_t num_grads, float* weight, size_t n,
                              ParamState* state) {
  return Update(grads, num_grads, weight, weight, n, state);
}

UpdateCheck Optimizer::Update(const float* const* grads, size_t num_grads, const float* in,
                              float* out, size_t n, ParamState* state) {
  CHECK_GE(num_grads, 1u);
  const Step s = Begin(n, state);
  float* slots = state->slots.empty() ? nullptr : state->slots.data();
  if (num_grads == 1) return ApplyStep(s, grads[0], in, out, slots, n, n);
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
    bad_weight |= ApplyStep(s, sum, in + b, out + b, slots == nullptr ? nullptr : slots + b, n, len)
                      .bad_weight;
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
