#include "nn/optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>
#include <vector>

namespace pstrain {
namespace {

std::unique_ptr<Optimizer> MakeSgd(float lr, float mom, float wd, float rescale, float clip) {
  OptimizerConfig cfg;
  cfg.set_type(OptimizerConfig::SGD);
  cfg.set_learning_rate(lr);
  cfg.set_momentum(mom);
  cfg.set_wd(wd);
  cfg.set_rescale_grad(rescale);
  cfg.set_clip_gradient(clip);
  auto opt = Optimizer::Create(cfg);
  CHECK(opt.ok()) << opt.status();
  return std::move(opt).value();
}

TEST(OptimizerTest, PlainSgdWithWeightDecay) {
  auto opt = MakeSgd(0.1f, 0.0f, 0.01f, 0.5f, -1);
  std::vector<float> w = {1.0f, -2.0f};
  std::vector<float> g = {4.0f, 2.0f};
  ParamState st;
  opt->Update(g.data(), w.data(), w.size(), &st);
  // w -= lr * (rescale*g + wd*w)
  EXPECT_FLOAT_EQ(w[0], 1.0f - 0.1f * (2.0f + 0.01f * 1.0f));
  EXPECT_FLOAT_EQ(w[1], -2.0f - 0.1f * (1.0f + 0.01f * -2.0f));
  EXPECT_TRUE(st.slots.empty());
}

TEST(OptimizerTest, MomentumMatchesMxnetRecurrence) {
  const float lr = 0.05f, mom = 0.9f, wd = 1e-4f;
  auto opt = MakeSgd(lr, mom, wd, 1.0f, -1);
  float w = 0.5f, m = 0.0f;
  std::vector<float> wv = {w};
  ParamState st;
  const float grads[] = {1.0f, -0.5f, 0.25f, 2.0f};
  for (float g : grads) {
    opt->Update(&g, wv.data(), 1, &st);
    m = mom * m - lr * (g + wd * w);
    w = w + m;
    EXPECT_NEAR(wv[0], w, 1e-6);
  }
  EXPECT_EQ(st.num_updates, 4);
  EXPECT_EQ(opt->num_update(), 4);
}

// A dist_sync server's round: the update of k gradients summed on the fly
// equals the update of their sum, bit for bit, for every rule and a length
// that is not a multiple of the block.
TEST(OptimizerTest, UpdateOfSeveralGradientsEqualsUpdateOfTheirSumExactly) {
  const size_t n = 3000;
  for (int k : {1, 2, 3, 5}) {
    for (float mom : {0.0f, 0.9f}) {
      for (float clip : {-1.0f, 0.02f}) {
        auto fused = MakeSgd(0.1f, mom, 1e-3f, 1.0f / k, clip);
        auto plain = MakeSgd(0.1f, mom, 1e-3f, 1.0f / k, clip);
        std::vector<std::vector<float>> g(k, std::vector<float>(n));
        std::vector<float> w1(n), w2(n);
        for (size_t i = 0; i < n; ++i) {
          w1[i] = w2[i] = std::sin(0.37f * i);
          for (int j = 0; j < k; ++j) g[j][i] = 0.01f * std::cos(0.11f * i * (j + 1)) + 1e-7f * j;
        }
        ParamState s1, s2;
        for (int step = 0; step < 3; ++step) {
          std::vector<const float*> ptrs;
          std::vector<float> sum(g[0]);
          ptrs.push_back(g[0].data());
          for (int j = 1; j < k; ++j) {
            ptrs.push_back(g[j].data());
            for (size_t i = 0; i < n; ++i) sum[i] += g[j][i];
          }
          fused->Update(ptrs.data(), ptrs.size(), w1.data(), n, &s1);
          plain->Update(sum.data(), w2.data(), n, &s2);
        }
        ASSERT_EQ(w1, w2) << "k=" << k << " mom=" << mom << " clip=" << clip;
        EXPECT_EQ(s1.slots, s2.slots);
        EXPECT_EQ(s1.num_updates, 3);
      }
    }
  }
}

// A server whose stored value is still being read updates out of place: the
// result must equal the in-place update exactly, and `in` stays untouched.
TEST(OptimizerTest, OutOfPlaceUpdateEqualsInPlaceAndLeavesTheInputAlone) {
  const size_t n = 2500;
  for (int k : {1, 2, 3}) {
    for (float mom : {0.0f, 0.9f}) {
      std::vector<std::vector<float>> g(k, std::vector<float>(n));
      std::vector<float> start(n);
      for (size_t i = 0; i < n; ++i) {
        start[i] = std::cos(0.3f * i);
        for (int j = 0; j < k; ++j) g[j][i] = 0.02f * std::sin(0.07f * i + j);
      }
      std::vector<const float*> ptrs;
      for (auto& gj : g) ptrs.push_back(gj.data());
      auto in_place = MakeSgd(0.05f, mom, 1e-3f, 0.5f, 0.05f);
      auto out_of_place = MakeSgd(0.05f, mom, 1e-3f, 0.5f, 0.05f);
      std::vector<float> w1 = start, from = start, w2(n);
      ParamState s1, s2;
      for (int step = 0; step < 3; ++step) {
        in_place->Update(ptrs.data(), ptrs.size(), w1.data(), n, &s1);
        const std::vector<float> before = from;
        out_of_place->Update(ptrs.data(), ptrs.size(), from.data(), w2.data(), n, &s2);
        ASSERT_EQ(from, before) << "the input is read only";
        ASSERT_EQ(w1, w2) << "k=" << k << " mom=" << mom << " step " << step;
        from.swap(w2);  // the fresh buffer becomes the stored value
      }
      EXPECT_EQ(s1.slots, s2.slots);
    }
  }
}

TEST(OptimizerTest, ClipAppliesAfterRescale) {
  auto opt = MakeSgd(1.0f, 0.0f, 0.0f, 0.5f, 1.0f);
  std::vector<float> w = {0.0f, 0.0f, 0.0f};
  std::vector<float> g = {10.0f, -10.0f, 1.0f};  // rescaled: 5, -5, 0.5
  ParamState st;
  opt->Update(g.data(), w.data(), 3, &st);
  EXPECT_FLOAT_EQ(w[0], -1.0f);
  EXPECT_FLOAT_EQ(w[1], 1.0f);
  EXPECT_FLOAT_EQ(w[2], -0.5f);
}

TEST(OptimizerTest, TestOptimizerAddsRescaledGradient) {
  OptimizerConfig cfg;
  cfg.set_type(OptimizerConfig::TEST);
  cfg.set_rescale_grad(2.0f);
  auto opt = Optimizer::Create(cfg);
  ASSERT_TRUE(opt.ok());
  std::vector<float> w = {1.0f};
  std::vector<float> g = {6.0f};  // e.g. sum of pushes 1+2+3 from 3 workers
  ParamState st;
  (*opt)->Update(g.data(), w.data(), 1, &st);
  EXPECT_FLOAT_EQ(w[0], 13.0f);  // 1 + rate * W(W+1)/2
}

TEST(OptimizerTest, FactorScheduleDecaysEveryStepUpdates) {
  LrSchedulerConfig sc;
  sc.set_type(LrSchedulerConfig::FACTOR);
  sc.set_step(10);
  sc.set_factor(0.5f);
  auto s = LrSchedule::Create(0.1f, sc);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FLOAT_EQ(s->LrAt(1), 0.1f);
  EXPECT_FLOAT_EQ(s->LrAt(10), 0.1f);
  EXPECT_FLOAT_EQ(s->LrAt(11), 0.05f);
  EXPECT_FLOAT_EQ(s->LrAt(21), 0.025f);
}

// A step of one update: the rate at update n costs no n multiplications
// (a server's millionth update took milliseconds per key), and it still
// follows MXNet's multiply-per-decay within float precision, floor included.
TEST(OptimizerTest, FactorScheduleOfManyDecaysIsCheapAndExact) {
  LrSchedulerConfig sc;
  sc.set_type(LrSchedulerConfig::FACTOR);
  sc.set_step(1);
  sc.set_factor(1.0f);
  auto flat = LrSchedule::Create(0.1f, sc);
  ASSERT_TRUE(flat.ok()) << flat.status();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(flat->LrAt(int64_t{1} << 40), 0.1f);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 0.1);
  sc.set_factor(0.99f);
  sc.set_stop_factor_lr(1e-3f);
  auto decaying = LrSchedule::Create(0.1f, sc);
  ASSERT_TRUE(decaying.ok()) << decaying.status();
  double lr = 0.1f;
  for (int64_t n = 2; n <= 1000; ++n) {
    lr *= 0.99f;  // MXNet: once num_update passes count + step
    const float want = lr < 1e-3f ? 1e-3f : static_cast<float>(lr);
    ASSERT_FLOAT_EQ(decaying->LrAt(n), want) << "update " << n;
  }
  EXPECT_EQ(decaying->LrAt(int64_t{1} << 40), 1e-3f);
  sc.set_factor(0.5f);
  sc.set_stop_factor_lr(0);
  auto to_zero = LrSchedule::Create(0.1f, sc);
  ASSERT_TRUE(to_zero.ok()) << to_zero.status();
  EXPECT_EQ(to_zero->LrAt(int64_t{1} << 40), 0.0f);
}

TEST(OptimizerTest, MultiFactorScheduleDecaysAtEachStep) {
  LrSchedulerConfig sc;
  sc.set_type(LrSchedulerConfig::MULTI_FACTOR);
  sc.add_steps(100);
  sc.add_steps(150);
  sc.set_factor(0.1f);
  auto s = LrSchedule::Create(1.0f, sc);
  ASSERT_TRUE(s.ok());
  EXPECT_FLOAT_EQ(s->LrAt(100), 1.0f);
  EXPECT_FLOAT_EQ(s->LrAt(101), 0.1f);
  EXPECT_NEAR(s->LrAt(151), 0.01f, 1e-9);
}

TEST(OptimizerTest, ScheduleCountsTheMaximumOverKeys) {
  OptimizerConfig cfg;
  cfg.set_learning_rate(1.0f);
  cfg.mutable_lr_scheduler()->set_type(LrSchedulerConfig::FACTOR);
  cfg.mutable_lr_scheduler()->set_step(2);
  cfg.mutable_lr_scheduler()->set_factor(0.5f);
  auto opt = std::move(Optimizer::Create(cfg)).value();
  ParamState a, b;
  float w = 0, g = 1;
  opt->Update(&g, &w, 1, &a);  // count 1, lr 1
  opt->Update(&g, &w, 1, &a);  // count 2, lr 1
  opt->Update(&g, &w, 1, &a);  // count 3, lr 0.5
  EXPECT_EQ(opt->num_update(), 3);
  float wb = 0;
  opt->Update(&g, &wb, 1, &b);  // b's count is 1, global stays 3: lr 0.5
  EXPECT_FLOAT_EQ(wb, -0.5f);
  // Built again for the same job (a worker lost, a server restarted), it
  // goes on from the count of the one it replaces.
  auto again = std::move(Optimizer::Create(cfg)).value();
  again->ContinueFrom(opt->num_update());
  again->ContinueFrom(1);  // never lowers it
  EXPECT_EQ(again->num_update(), 3);
  ParamState c;
  float wc = 0;
  again->Update(&g, &wc, 1, &c);
  EXPECT_FLOAT_EQ(wc, -0.5f);
}

TEST(OptimizerTest, RejectsBadConfig) {
  OptimizerConfig cfg;
  cfg.set_momentum(1.5f);
  EXPECT_FALSE(Optimizer::Create(cfg).ok());
  // A peer's config may hold NaN, which fails no plain comparison.
  for (float bad : {std::nanf(""), -0.1f}) {
    OptimizerConfig m;
    m.set_momentum(bad);
    EXPECT_FALSE(Optimizer::Create(m).ok()) << "momentum " << bad;
    OptimizerConfig wd;
    wd.set_wd(bad);
    EXPECT_FALSE(Optimizer::Create(wd).ok()) << "wd " << bad;
  }
  OptimizerConfig inf_wd;
  inf_wd.set_wd(INFINITY);
  EXPECT_FALSE(Optimizer::Create(inf_wd).ok());
  LrSchedulerConfig sc;
  sc.set_type(LrSchedulerConfig::MULTI_FACTOR);
  sc.set_factor(0.1f);
  sc.add_steps(20);
  sc.add_steps(10);
  auto s = LrSchedule::Create(0.1f, sc);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("steps[1] = 10"), std::string::npos) << s.status();
}

// ---- the rules beyond SGD ----

OptimizerConfig Config(OptimizerConfig::Type type) {
  OptimizerConfig c;
  c.set_type(type);
  return c;
}

std::unique_ptr<Optimizer> Make(const OptimizerConfig& cfg) {
  auto opt = Optimizer::Create(cfg);
  CHECK(opt.ok()) << opt.status();
  return std::move(opt).value();
}

// Configurations covering every rule and option: NAG with momentum and
// weight decay, and without momentum; Adam with wd and clipping, and with
// its own epsilon; RMSProp plain with clipped weights, and centered;
// AdaGrad with wd and clipping.
std::vector<OptimizerConfig> RuleConfigs() {
  std::vector<OptimizerConfig> out;
  OptimizerConfig nag = Config(OptimizerConfig::NAG);
  nag.set_learning_rate(0.05f);
  nag.set_momentum(0.9f);
  nag.set_wd(1e-3f);
  nag.set_rescale_grad(0.5f);
  // The rate changes: where MXNet 1.6+'s NAG (momentum kept times the rate)
  // parts from the older form (momentum of the gradients alone).
  nag.mutable_lr_scheduler()->set_type(LrSchedulerConfig::FACTOR);
  nag.mutable_lr_scheduler()->set_step(2);
  nag.mutable_lr_scheduler()->set_factor(0.5f);
  out.push_back(nag);
  nag.clear_lr_scheduler();
  nag.set_momentum(0.0f);
  nag.set_clip_gradient(0.3f);
  out.push_back(nag);
  OptimizerConfig adam = Config(OptimizerConfig::ADAM);
  adam.set_learning_rate(0.01f);
  adam.set_wd(1e-2f);
  adam.set_clip_gradient(0.4f);
  out.push_back(adam);
  adam.clear_clip_gradient();
  adam.set_beta1(0.8f);
  adam.set_beta2(0.99f);
  adam.set_epsilon(1e-3f);
  out.push_back(adam);
  OptimizerConfig rms = Config(OptimizerConfig::RMSPROP);
  rms.set_learning_rate(0.01f);
  rms.set_wd(1e-3f);
  rms.set_clip_weights(0.6f);
  out.push_back(rms);
  rms.set_centered(true);
  rms.set_gamma1(0.95f);
  rms.set_gamma2(0.8f);
  rms.set_epsilon(1e-4f);
  rms.clear_clip_weights();
  out.push_back(rms);
  OptimizerConfig ada = Config(OptimizerConfig::ADAGRAD);
  ada.set_learning_rate(0.1f);
  ada.set_wd(1e-2f);
  ada.set_clip_gradient(0.5f);
  ada.set_rescale_grad(2.0f);
  out.push_back(ada);
  return out;
}

// MXNet 1.x's update of one element in double, written from its Python
// optimizers and update operators independently of nn/optimizer.cc (the
// state: up to three numbers; t: this update's count).
double Reference(const OptimizerConfig& c, double w, double grad, double* st, int64_t t) {
  double lr = c.learning_rate();
  if (c.lr_scheduler().type() == LrSchedulerConfig::FACTOR) {  // FactorScheduler
    lr *= std::pow(static_cast<double>(c.lr_scheduler().factor()),
                   static_cast<double>((t - 1) / c.lr_scheduler().step()));
  }
  const double wd = c.wd();
  const double clip = c.clip_gradient();
  auto clipped = [clip](double x) { return clip > 0 ? std::min(std::max(x, -clip), clip) : x; };
  double g = c.rescale_grad() * grad;
  switch (c.type()) {
    case OptimizerConfig::NAG: {
      g = clipped(g);
      if (c.momentum() == 0) return w - lr * (g + wd * w);
      // nag_mom_update (MXNet 1.6+): mom' = mu * mom; w = w - mom' + (1 +
      // mu) * (mom' - lr * (g + wd * w)); mom = mom' - lr * (g + wd * w)
      const double mu = c.momentum();
      const double step = lr * (g + wd * w);
      const double m = mu * st[0];
      st[0] = m - step;
      return w - m + (1 + mu) * (m - step);
    }
    case OptimizerConfig::ADAM: {
      // Adam.update: lr *= sqrt(1 - beta2^t) / (1 - beta1^t); adam_update.
      const double b1 = c.beta1(), b2 = c.beta2();
      const double eps = c.has_epsilon() ? c.epsilon() : 1e-8;
      const double lr_t = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
      g = clipped(g + wd * w);
      st[0] = b1 * st[0] + (1 - b1) * g;
      st[1] = b2 * st[1] + (1 - b2) * g * g;
      return w - lr_t * st[0] / (std::sqrt(st[1]) + eps);
    }
    case OptimizerConfig::RMSPROP: {
      const double g1 = c.gamma1(), g2 = c.gamma2();
      const double eps = c.has_epsilon() ? c.epsilon() : 1e-8;
      g = clipped(g + wd * w);
      double out;
      if (!c.centered()) {  // rmsprop_update
        st[0] = (1 - g1) * g * g + g1 * st[0];
        out = w - lr * g / std::sqrt(st[0] + eps);
      } else {  // rmspropalex_update
        st[0] = (1 - g1) * g * g + g1 * st[0];
        st[1] = (1 - g1) * g + g1 * st[1];
        st[2] = g2 * st[2] - lr * g / std::sqrt(st[0] - st[1] * st[1] + eps);
        out = w + st[2];
      }
      const double cw = c.clip_weights();
      return cw > 0 ? std::min(std::max(out, -cw), cw) : out;
    }
    case OptimizerConfig::ADAGRAD: {
      // AdaGrad.update: history += square(grad); div = grad / sqrt(history +
      // eps); weight += (div + weight * wd) * -lr
      const double eps = c.has_epsilon() ? c.epsilon() : 1e-7;
      g = clipped(g);
      st[0] += g * g;
      return w + (g / std::sqrt(st[0] + eps) + w * wd) * -lr;
    }
    default:
      ADD_FAILURE() << "no reference for type " << c.type();
      return w;
  }
}

TEST(OptimizerTest, EveryRuleFollowsMxnetsFormulasOverSeveralUpdates) {
  const size_t n = 41;
  for (const OptimizerConfig& cfg : RuleConfigs()) {
    SCOPED_TRACE(cfg.ShortDebugString());
    auto opt = Make(cfg);
    std::vector<float> w(n);
    std::vector<double> ref_w(n), ref_state(3 * n, 0.0);
    for (size_t i = 0; i < n; ++i) ref_w[i] = w[i] = 0.9f * std::sin(0.7f * i);
    ParamState st;
    for (int64_t t = 1; t <= 6; ++t) {
      std::vector<float> g(n);
      // Large and small gradients, so that clipping bites where it is on.
      for (size_t i = 0; i < n; ++i) g[i] = std::cos(0.3f * i * t) * (i % 3 == 0 ? 2.0f : 0.1f);
      const UpdateCheck check = opt->Update(g.data(), w.data(), n, &st);
      EXPECT_TRUE(check.ok());
      for (size_t i = 0; i < n; ++i) {
        double s3[3] = {ref_state[i], ref_state[n + i], ref_state[2 * n + i]};
        ref_w[i] = Reference(cfg, ref_w[i], g[i], s3, t);
        ref_state[i] = s3[0];
        ref_state[n + i] = s3[1];
        ref_state[2 * n + i] = s3[2];
        ASSERT_NEAR(w[i], ref_w[i], 2e-6 * std::max(1.0, std::fabs(ref_w[i])))
            << "element " << i << " after update " << t;
      }
    }
    ASSERT_EQ(st.slots.size(), static_cast<size_t>(opt->num_slots()) * n);
    EXPECT_EQ(opt->SlotNames().size(), static_cast<size_t>(opt->num_slots()));
    for (int j = 0; j < opt->num_slots(); ++j) {
      for (size_t i = 0; i < n; ++i) {
        EXPECT_NEAR(st.slots[j * n + i], ref_state[j * n + i],
                    1e-5 * std::max(1.0, std::fabs(ref_state[j * n + i])))
            << opt->SlotNames()[j] << " " << i;
      }
    }
  }
}

// The server's paths for every rule with state: several gradients summed
// block by block (n spans several blocks, so each slot is read at its own
// stride) equal one update of their sum bit for bit, and out of place equals
// in place.
TEST(OptimizerTest, EveryRuleUpdatesSeveralGradientsAndOutOfPlaceExactly) {
  const size_t n = 3000;
  for (const OptimizerConfig& cfg : RuleConfigs()) {
    SCOPED_TRACE(cfg.ShortDebugString());
    auto fused = Make(cfg), plain = Make(cfg), outp = Make(cfg);
    std::vector<std::vector<float>> g(3, std::vector<float>(n));
    std::vector<float> w1(n), w2(n), w3(n), fresh(n);
    for (size_t i = 0; i < n; ++i) {
      w1[i] = w2[i] = w3[i] = std::sin(0.37f * i);
      for (int j = 0; j < 3; ++j) g[j][i] = 0.3f * std::cos(0.11f * i * (j + 1)) + 1e-7f * j;
    }
    std::vector<const float*> ptrs = {g[0].data(), g[1].data(), g[2].data()};
    std::vector<float> sum(n);
    for (size_t i = 0; i < n; ++i) sum[i] = (g[0][i] + g[1][i]) + g[2][i];
    ParamState s1, s2, s3;
    for (int step = 0; step < 3; ++step) {
      fused->Update(ptrs.data(), ptrs.size(), w1.data(), n, &s1);
      plain->Update(sum.data(), w2.data(), n, &s2);
      const std::vector<float> before = w3;
      outp->Update(ptrs.data(), ptrs.size(), w3.data(), fresh.data(), n, &s3);
      ASSERT_EQ(w3, before) << "the input is read only";
      w3.swap(fresh);
    }
    ASSERT_EQ(w1, w2);
    ASSERT_EQ(w1, w3);
    EXPECT_EQ(s1.slots, s2.slots);
    EXPECT_EQ(s1.slots, s3.slots);
  }
}

// Adam's bias correction reads the parameter's own count, earlier updates
// (a checkpoint's) included; the schedule's clock does not count those.
TEST(OptimizerTest, AdamsBiasCorrectionCountsTheUpdatesBeforeAResume) {
  OptimizerConfig cfg = Config(OptimizerConfig::ADAM);
  cfg.set_learning_rate(0.002f);
  auto opt = Make(cfg);
  ParamState fresh, resumed;
  resumed.earlier_updates = 10;
  const Optimizer::Step a = opt->NextStep(&fresh);
  auto opt2 = Make(cfg);
  const Optimizer::Step b = opt2->NextStep(&resumed);
  EXPECT_FLOAT_EQ(a.lr, static_cast<float>(0.002 * std::sqrt(1 - 0.999) / (1 - 0.9)));
  EXPECT_FLOAT_EQ(b.lr, static_cast<float>(0.002 * std::sqrt(1 - std::pow(0.999, 11)) /
                                           (1 - std::pow(0.9, 11))));
  EXPECT_EQ(opt2->num_update(), 1) << "the schedule's clock starts over";
  EXPECT_EQ(b.num_slots(), 2);
}

// State written by an optimizer of another kind (an SGD momentum, read by
// AdaGrad as its history of squares, would go negative under a square root)
// starts from zeros; state restored from a file (layout unknown) whose size
// fits is used.
TEST(OptimizerTest, SlotsOfAnotherOptimizerAreNotMisread) {
  const size_t n = 5;
  std::vector<float> g = {0.1f, -0.2f, 0.3f, -0.4f, 0.5f};
  auto sgd = MakeSgd(0.1f, 0.9f, 0.0f, 1.0f, -1);
  OptimizerConfig ada_cfg = Config(OptimizerConfig::ADAGRAD);
  auto ada = Make(ada_cfg);
  std::vector<float> w(n, 1.0f), w_fresh(n, 1.0f);
  ParamState st, fresh;
  sgd->Update(g.data(), w.data(), n, &st);
  ASSERT_EQ(st.slots.size(), n);
  w = std::vector<float>(n, 1.0f);
  ada->Update(g.data(), w.data(), n, &st);
  Make(ada_cfg)->Update(g.data(), w_fresh.data(), n, &fresh);
  EXPECT_EQ(w, w_fresh);
  EXPECT_EQ(st.slots, fresh.slots);

  // Adam taking over a state of SGD's five updates starts at t = 1, as a new
  // MXNet optimizer would (else its first steps would lack the correction).
  ParamState taken;
  for (int k = 0; k < 5; ++k) sgd->Update(g.data(), w.data(), n, &taken);
  OptimizerConfig adam_cfg = Config(OptimizerConfig::ADAM);
  auto adam = Make(adam_cfg);
  ParamState adam_fresh;
  std::vector<float> wa = w, wb = w;
  adam->Update(g.data(), wa.data(), n, &taken);
  Make(adam_cfg)->Update(g.data(), wb.data(), n, &adam_fresh);
  EXPECT_EQ(wa, wb);
  EXPECT_EQ(taken.slots, adam_fresh.slots);

  ParamState restored;
  restored.slots = std::vector<float>(n, 4.0f);  // a history of squares
  std::vector<float> w_restored(n, 1.0f);
  Make(ada_cfg)->Update(g.data(), w_restored.data(), n, &restored);
  EXPECT_FLOAT_EQ(restored.slots[0], 4.0f + 0.01f);
  EXPECT_NEAR(w_restored[0], 1.0f - 0.01f * 0.1f / std::sqrt(4.01f), 1e-7);
}

TEST(OptimizerTest, NamesAndSlots) {
  OptimizerConfig::Type t;
  ASSERT_TRUE(OptimizerTypeFromName("Adam", &t));
  EXPECT_EQ(t, OptimizerConfig::ADAM);
  ASSERT_TRUE(OptimizerTypeFromName("rmsprop", &t));
  EXPECT_EQ(t, OptimizerConfig::RMSPROP);
  EXPECT_FALSE(OptimizerTypeFromName("adamw", &t));
  EXPECT_FALSE(OptimizerTypeFromName("", &t));
  OptimizerConfig rms = Config(OptimizerConfig::RMSPROP);
  EXPECT_EQ(Make(rms)->SlotNames(), std::vector<std::string>({"n"}));
  rms.set_centered(true);
  EXPECT_EQ(Make(rms)->SlotNames(), std::vector<std::string>({"n", "g", "delta"}));
  EXPECT_EQ(Make(Config(OptimizerConfig::ADAM))->SlotNames(),
            std::vector<std::string>({"mean", "var"}));
  EXPECT_EQ(Make(Config(OptimizerConfig::ADAGRAD))->SlotNames(),
            std::vector<std::string>({"history"}));
  EXPECT_TRUE(MakeSgd(0.1f, 0.0f, 0, 1, -1)->SlotNames().empty());
  EXPECT_EQ(MakeSgd(0.1f, 0.5f, 0, 1, -1)->SlotNames(), std::vector<std::string>({"momentum"}));
}

TEST(OptimizerTest, RejectsBadConfigOfTheOtherRules) {
  struct Case {
    OptimizerConfig cfg;
    const char* says;
  };
  std::vector<Case> cases;
  auto add = [&cases](OptimizerConfig::Type type, auto set, const char* says) {
    OptimizerConfig c = Config(type);
    set(&c);
    cases.push_back({c, says});
  };
  const float nan = std::nanf("");
  add(
      OptimizerConfig::ADAM, [](OptimizerConfig* c) { c->set_momentum(0.9f); },
      "adam takes no momentum");
  add(
      OptimizerConfig::ADAGRAD, [](OptimizerConfig* c) { c->set_momentum(0.5f); },
      "adagrad takes no momentum");
  add(
      OptimizerConfig::NAG, [](OptimizerConfig* c) { c->set_momentum(1.0f); },
      "nag: momentum 1 must be in [0, 1)");
  add(
      OptimizerConfig::ADAM, [](OptimizerConfig* c) { c->set_beta1(1.0f); },
      "adam: beta1 1 must be in [0, 1)");
  add(
      OptimizerConfig::ADAM, [nan](OptimizerConfig* c) { c->set_beta2(nan); }, "adam: beta2 nan");
  add(
      OptimizerConfig::ADAM, [](OptimizerConfig* c) { c->set_epsilon(0.0f); },
      "adam: epsilon 0 must be finite and > 0");
  add(
      OptimizerConfig::RMSPROP, [](OptimizerConfig* c) { c->set_gamma1(-0.1f); },
      "rmsprop: gamma1 -0.1 must be in [0, 1)");
  add(
      OptimizerConfig::RMSPROP, [](OptimizerConfig* c) { c->set_gamma2(1.5f); },
      "rmsprop: gamma2 1.5");
  add(
      OptimizerConfig::RMSPROP, [nan](OptimizerConfig* c) { c->set_clip_weights(nan); },
      "clip_weights is NaN");
  add(
      OptimizerConfig::ADAGRAD, [](OptimizerConfig* c) { c->set_epsilon(-1.0f); },
      "adagrad: epsilon -1");
  for (const Case& c : cases) {
    auto opt = Optimizer::Create(c.cfg);
    ASSERT_FALSE(opt.ok()) << c.cfg.ShortDebugString();
    EXPECT_EQ(opt.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(opt.status().message().find(c.says), std::string::npos) << opt.status();
  }
}

// NaN and Inf are found in the update's own pass: in which gradient, or in
// the weights an update wrote, for every rule, one gradient or several (more
// than the 32 kept without allocation too).
TEST(OptimizerTest, UpdatesSayWhichGradientHeldNanOrInfAndWhetherTheWeightsAreBroken) {
  const float nan = std::nanf(""), inf = INFINITY;
  EXPECT_TRUE(AllFinite(std::vector<float>(100, 1.0f).data(), 100));
  EXPECT_FALSE(AllFinite(std::vector<float>{1, nan, 2}.data(), 3));
  EXPECT_FALSE(AllFinite(std::vector<float>{1, 2, -inf}.data(), 3));
  for (float mom : {0.0f, 0.9f}) {
    auto opt = MakeSgd(0.1f, mom, 1e-4f, 1.0f, -1);
    std::vector<float> w(2500, 1.0f);
    std::vector<float> good(2500, 0.5f);
    ParamState st;
    EXPECT_TRUE(opt->Update(good.data(), w.data(), w.size(), &st).ok());
    std::vector<float> bad = good;
    bad[1777] = nan;
    UpdateCheck c = opt->Update(bad.data(), w.data(), w.size(), &st);
    EXPECT_EQ(c.bad_grad, 0);
    EXPECT_TRUE(c.bad_weight);  // a NaN gradient makes a NaN weight
    for (int k : {2, 3, 40}) {
      std::vector<std::vector<float>> grads(k, good);
      grads[k - 1][5] = inf;
      grads[k / 2][2400] = nan;
      std::vector<const float*> ptrs;
      for (const auto& g : grads) ptrs.push_back(g.data());
      std::vector<float> fresh(2500, 1.0f);
      ParamState s2;
      c = opt->Update(ptrs.data(), ptrs.size(), fresh.data(), fresh.size(), &s2);
      EXPECT_EQ(c.bad_grad, k / 2) << k << " gradients, momentum " << mom;
      EXPECT_TRUE(c.bad_weight);
    }
  }
  // Finite gradients, but a rate that overflows the weights.
  auto huge = MakeSgd(3e38f, 0.0f, 0.0f, 1.0f, -1);
  std::vector<float> w(10, 1.0f), g(10, 10.0f);
  ParamState st;
  const UpdateCheck c = huge->Update(g.data(), w.data(), w.size(), &st);
  EXPECT_EQ(c.bad_grad, -1);
  EXPECT_TRUE(c.bad_weight);
}

}  // namespace
}  // namespace pstrain
