// Initializers: MXNet's rules per parameter role, distributions, parsing.
#include "nn/initializer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "models/models.h"
#include "nn/executor.h"
#include "tests/test_util.h"

namespace pstrain {
namespace {

void Moments(const Tensor& t, double* mean, double* stddev, double* max_abs) {
  double s = 0, sq = 0, m = 0;
  for (int64_t i = 0; i < t.num_elements(); ++i) {
    s += t.at(i);
    sq += double(t.at(i)) * t.at(i);
    m = std::max(m, std::fabs(double(t.at(i))));
  }
  *mean = s / t.num_elements();
  *stddev = std::sqrt(sq / t.num_elements() - *mean * *mean);
  *max_abs = m;
}

TEST(InitializerTest, ParsesMxnetSpecs) {
  auto x = InitializerSpec::Parse("xavier(gaussian, in, 2)");
  ASSERT_OK(x.status());
  EXPECT_EQ(x->kind, InitializerSpec::Kind::kXavier);
  EXPECT_EQ(x->rnd_type, InitializerSpec::RndType::kGaussian);
  EXPECT_EQ(x->factor_type, InitializerSpec::FactorType::kIn);
  EXPECT_FLOAT_EQ(x->magnitude, 2.0f);
  EXPECT_EQ(x->ToString(), "xavier(gaussian,in,2)");
  auto u = InitializerSpec::Parse("uniform(0.01)");
  ASSERT_OK(u.status());
  EXPECT_FLOAT_EQ(u->scale, 0.01f);
  auto n = InitializerSpec::Parse("normal");
  ASSERT_OK(n.status());
  EXPECT_FLOAT_EQ(n->sigma, 0.01f);
  for (const char* bad : {"xavier(gauss)", "uniform(abc)", "orthogonal", "normal(-1)",
                          "xavier(uniform,sideways)", "uniform(0.1"}) {
    EXPECT_FALSE(InitializerSpec::Parse(bad).ok()) << bad;
  }
}

TEST(InitializerTest, XavierScaleFollowsFanAndMagnitude) {
  // conv weight (64, 32, 3, 3): fan_in 288, fan_out 576.
  Tensor w = Tensor::Empty({64, 32, 3, 3});
  InitializeParam(*InitializerSpec::Parse("xavier(gaussian,in,2)"), ParamRole::kWeight, 3, w);
  double mean, sd, mx;
  Moments(w, &mean, &sd, &mx);
  EXPECT_NEAR(sd, std::sqrt(2.0 / 288), 0.05 * std::sqrt(2.0 / 288));
  EXPECT_NEAR(mean, 0, 0.005);
  InitializeParam(*InitializerSpec::Parse("xavier(uniform,avg,3)"), ParamRole::kWeight, 3, w);
  Moments(w, &mean, &sd, &mx);
  const double scale = std::sqrt(3.0 / ((288 + 576) / 2.0));
  EXPECT_LE(mx, scale);
  EXPECT_GT(mx, 0.99 * scale);
  EXPECT_NEAR(sd, scale / std::sqrt(3.0), 0.05 * scale);
}

TEST(InitializerTest, RolesAndDeterminism) {
  StatusOr<Graph> g = BuildModel({"neon-cifar10-conv", 0, Shape(), 0});
  ASSERT_OK(g.status());
  ExecutorOptions o;
  o.batch_size = 2;
  o.backend.num_threads = 1;
  auto a = Executor::Create(*g, o);
  auto b = Executor::Create(*g, o);
  ASSERT_OK(a.status());
  ASSERT_OK(b.status());
  const InitializerSpec spec = *InitializerSpec::Parse("uniform(0.07)");
  InitializeParams(spec, 42, a->get());
  InitializeParams(spec, 42, b->get());
  for (int p = 0; p < (*a)->num_params(); ++p) {
    const ParamInfo& info = g->params()[p];
    const Tensor& t = (*a)->param(p);
    for (int64_t i = 0; i < t.num_elements(); ++i) {
      ASSERT_EQ(t.at(i), (*b)->param(p).at(i)) << info.name;
      if (info.role == ParamRole::kBias || info.role == ParamRole::kBeta) {
        ASSERT_EQ(t.at(i), 0.0f) << info.name;
      } else if (info.role == ParamRole::kGamma) {
        ASSERT_EQ(t.at(i), 1.0f) << info.name;
      } else {
        ASSERT_LE(std::fabs(t.at(i)), 0.07f) << info.name;
      }
    }
  }
  for (int x = 0; x < (*a)->num_aux(); ++x) {
    const float want = g->aux_states()[x].role == ParamRole::kMovingVar ? 1.0f : 0.0f;
    for (int64_t i = 0; i < (*a)->aux(x).num_elements(); ++i) ASSERT_EQ((*a)->aux(x).at(i), want);
  }
  // Different parameters draw different streams.
  EXPECT_NE((*a)->param(0).at(0), (*a)->param(2).at(0));
}

}  // namespace
}  // namespace pstrain
