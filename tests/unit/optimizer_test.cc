#include "nn/optimizer.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
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
