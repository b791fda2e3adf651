#include "nn/initializer.h"

#include <cmath>
#include <random>
#include <sstream>
#include <vector>

namespace pstrain {

namespace {

std::string Trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

StatusOr<float> ParseFloat(const std::string& text, const std::string& what) {
  try {
    size_t pos = 0;
    float v = std::stof(text, &pos);
    if (pos == text.size() && std::isfinite(v)) return v;
  } catch (const std::exception&) {
  }
  return Status::InvalidArgument(StrCat("initializer: ", what, " '", text, "' is not a number"));
}

}  // namespace

StatusOr<InitializerSpec> InitializerSpec::Parse(const std::string& text) {
  InitializerSpec spec;
  std::string name = Trim(text), args;
  const size_t open = name.find('(');
  if (open != std::string::npos) {
    if (name.back() != ')') {
      return Status::InvalidArgument(StrCat("initializer '", text, "': missing ')'"));
    }
    args = name.substr(open + 1, name.size() - open - 2);
    name = Trim(name.substr(0, open));
  }
  std::vector<std::string> parts;
  if (!Trim(args).empty()) {
    std::stringstream ss(args);
    std::string part;
    while (std::getline(ss, part, ',')) parts.push_back(Trim(part));
  }
  if (name == "uniform" || name == "normal") {
    spec.kind = name == "uniform" ? Kind::kUniform : Kind::kNormal;
    if (parts.size() > 1) {
      return Status::InvalidArgument(StrCat("initializer '", text, "': takes one argument"));
    }
    if (!parts.empty()) {
      ASSIGN_OR_RETURN(float v, ParseFloat(parts[0], name == "uniform" ? "scale" : "sigma"));
      if (v <= 0) return Status::InvalidArgument(StrCat("initializer '", text, "': must be > 0"));
      (spec.kind == Kind::kUniform ? spec.scale : spec.sigma) = v;
    }
    return spec;
  }
  if (name == "xavier") {
    spec.kind = Kind::kXavier;
    if (parts.size() > 3) {
      return Status::InvalidArgument(
          StrCat("initializer '", text, "': xavier(rnd_type, factor_type, magnitude)"));
    }
    if (parts.size() > 0) {
      if (parts[0] == "uniform") {
        spec.rnd_type = RndType::kUniform;
      } else if (parts[0] == "gaussian") {
        spec.rnd_type = RndType::kGaussian;
      } else {
        return Status::InvalidArgument(StrCat("initializer '", text, "': rnd_type '", parts[0],
                                              "' is not uniform or gaussian"));
      }
    }
    if (parts.size() > 1) {
      if (parts[1] == "avg") {
        spec.factor_type = FactorType::kAvg;
      } else if (parts[1] == "in") {
        spec.factor_type = FactorType::kIn;
      } else if (parts[1] == "out") {
        spec.factor_type = FactorType::kOut;
      } else {
        return Status::InvalidArgument(
            StrCat("initializer '", text, "': factor_type '", parts[1], "' is not avg, in or out"));
      }
    }
    if (parts.size() > 2) {
      ASSIGN_OR_RETURN(spec.magnitude, ParseFloat(parts[2], "magnitude"));
      if (spec.magnitude <= 0) {
        return Status::InvalidArgument(StrCat("initializer '", text, "': magnitude must be > 0"));
      }
    }
    return spec;
  }
  return Status::InvalidArgument(StrCat("unknown initializer '", text,
                                        "' (known: uniform(scale), normal(sigma), "
                                        "xavier(rnd_type,factor_type,magnitude))"));
}

std::string InitializerSpec::ToString() const {
  switch (kind) {
    case Kind::kUniform:
      return StrCat("uniform(", scale, ")");
    case Kind::kNormal:
      return StrCat("normal(", sigma, ")");
    case Kind::kXavier:
      return StrCat("xavier(", rnd_type == RndType::kUniform ? "uniform" : "gaussian", ",",
                    factor_type == FactorType::kAvg  ? "avg"
                    : factor_type == FactorType::kIn ? "in"
                                                     : "out",
                    ",", magnitude, ")");
  }
  return "?";
}

void InitializeParam(const InitializerSpec& spec, ParamRole role, uint64_t seed, const Tensor& t) {
  switch (role) {
    case ParamRole::kBias:
    case ParamRole::kBeta:
    case ParamRole::kMovingMean:
      t.Fill(0.0f);
      return;
    case ParamRole::kGamma:
    case ParamRole::kMovingVar:
      t.Fill(1.0f);
      return;
    case ParamRole::kWeight:
      break;
  }
  std::mt19937_64 rng(seed);
  float* p = t.data();
  const int64_t n = t.num_elements();
  auto uniform = [&](float scale) {
    std::uniform_real_distribution<float> d(-scale, scale);
    for (int64_t i = 0; i < n; ++i) p[i] = d(rng);
  };
  auto normal = [&](float sigma) {
    std::normal_distribution<float> d(0.0f, sigma);
    for (int64_t i = 0; i < n; ++i) p[i] = d(rng);
  };
  switch (spec.kind) {
    case InitializerSpec::Kind::kUniform:
      uniform(spec.scale);
      return;
    case InitializerSpec::Kind::kNormal:
      normal(spec.sigma);
      return;
    case InitializerSpec::Kind::kXavier: {
      const Shape& s = t.shape();
      const double fan_in = s.ndim() > 1 ? static_cast<double>(s.ProductFrom(1)) : 1.0;
      const double fan_out =
          s.ndim() > 0 ? static_cast<double>(s[0]) * (s.ndim() > 2 ? s.ProductFrom(2) : 1) : 1.0;
      double factor = (fan_in + fan_out) / 2.0;
      if (spec.factor_type == InitializerSpec::FactorType::kIn) factor = fan_in;
      if (spec.factor_type == InitializerSpec::FactorType::kOut) factor = fan_out;
      const float scale = static_cast<float>(std::sqrt(spec.magnitude / factor));
      if (spec.rnd_type == InitializerSpec::RndType::kUniform) {
        uniform(scale);
      } else {
        normal(scale);
      }
      return;
    }
  }
}

void InitializeParams(const InitializerSpec& spec, uint64_t seed, ModelParams* exec) {
  const std::vector<ParamInfo>& params = exec->graph().params();
  for (int i = 0; i < exec->num_params(); ++i) {
    // One independent stream per parameter: (seed, i) mixed by splitmix64.
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    Tensor tmp = Tensor::Empty(params[i].shape);
    InitializeParam(spec, params[i].role, z, tmp);
    CHECK_OK(exec->WriteParam(i, tmp.data(), tmp.num_elements()));
  }
  const std::vector<ParamInfo>& aux = exec->graph().aux_states();
  for (int i = 0; i < exec->num_aux(); ++i) {
    Tensor tmp = Tensor::Empty(aux[i].shape);
    InitializeParam(spec, aux[i].role, 0, tmp);
    CHECK_OK(exec->WriteAux(i, tmp.data(), tmp.num_elements()));
  }
}

}  // namespace pstrain
