// Parameter initializers with MXNet semantics (mxnet_facts.md 1.6).
//
// Weights follow the chosen rule; the others follow MXNet's name rules:
// `*_bias` 0, `*_beta` 0, `*_gamma` 1, `*_moving_mean` 0, `*_moving_var` 1.
// moving_var = 1 is the 1.x era (the 2015 code zeroed it; with eps 1e-10 that
// makes inference divide by ~0 before the first training step, so we follow 1.x).
//
//   Uniform(scale):  U(-scale, scale)
//   Normal(sigma):   N(0, sigma^2)
//   Xavier(rnd_type, factor_type, magnitude): fan_in = prod(shape[1:]),
//     fan_out = shape[0] * prod(shape[2:]); factor = (fan_in + fan_out) / 2 |
//     fan_in | fan_out; scale = sqrt(magnitude / factor);
//     uniform: U(-scale, scale); gaussian: N(0, scale^2).
//
// Deterministic: the same spec and seed give the same values (parameter i is
// drawn from a generator seeded with (seed, i)).
#ifndef PSTRAIN_NN_INITIALIZER_H_
#define PSTRAIN_NN_INITIALIZER_H_

#include <cstdint>
#include <string>

#include "common/status.h"
#include "nn/graph.h"
#include "nn/model_params.h"
#include "nn/tensor.h"

namespace pstrain {

struct InitializerSpec {
  enum class Kind { kUniform, kNormal, kXavier };
  enum class RndType { kUniform, kGaussian };
  enum class FactorType { kAvg, kIn, kOut };
  Kind kind = Kind::kUniform;
  float scale = 0.07f;  // Uniform
  float sigma = 0.01f;  // Normal
  RndType rnd_type = RndType::kUniform;
  FactorType factor_type = FactorType::kAvg;
  float magnitude = 3.0f;

  // Parses MXNet-like specs: "uniform", "uniform(0.01)", "normal(0.01)",
  // "xavier", "xavier(gaussian,in,2)" (rnd_type, factor_type, magnitude in
  // that order, any suffix optional). InvalidArgument names the bad part.
  static StatusOr<InitializerSpec> Parse(const std::string& text);
  std::string ToString() const;
};

// Fills `t` (a parameter with the given role and shape) by the rules above.
void InitializeParam(const InitializerSpec& spec, ParamRole role, uint64_t seed, const Tensor& t);

// Initializes every parameter and aux state of `params` (an executor or a
// device group; param i with seed (seed, i); aux by their fixed rules),
// through host copies. Not thread-safe with Forward/Backward.
void InitializeParams(const InitializerSpec& spec, uint64_t seed, ModelParams* params);

}  // namespace pstrain

#endif  // PSTRAIN_NN_INITIALIZER_H_
