#include "worker/param_sync.h"

#include <map>

namespace pstrain {
namespace {

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

float WeightDecayMult(const std::string& param_name) {
  return EndsWith(param_name, "_weight") || EndsWith(param_name, "_gamma") ? 1.0f : 0.0f;
}

StatusOr<std::unique_ptr<LocalParamSync>> LocalParamSync::Create(const OptimizerConfig& cfg) {
  ASSIGN_OR_RETURN(std::unique_ptr<Optimizer> opt, Optimizer::Create(cfg));
  return std::unique_ptr<LocalParamSync>(new LocalParamSync(std::move(opt)));
}

Status LocalParamSync::Init(Executor* exec) {
  exec_ = exec;
  const auto& params = exec->graph().params();
  states_.assign(params.size(), ParamState{});
  for (size_t i = 0; i < params.size(); ++i) states_[i].wd_mult = WeightDecayMult(params[i].name);
  return Status::Ok();
}

void LocalParamSync::OnGradReady(int i) {
  const Tensor& w = exec_->param(i);
  const Tensor& g = exec_->grad(i);
  optimizer_->Update(g.data(), w.data(), static_cast<size_t>(w.num_elements()), &states_[i]);
}

std::vector<NamedArray> LocalParamSync::SaveState() const {
  std::vector<NamedArray> out;
  const auto& params = exec_->graph().params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (states_[i].momentum.empty()) continue;
    NamedArray a;
    a.kind = NamedArray::Kind::kOptimizerState;
    a.name = params[i].name + "_momentum";
    a.shape = {static_cast<int64_t>(states_[i].momentum.size())};
    a.data = states_[i].momentum;
    out.push_back(std::move(a));
  }
  return out;
}

Status LocalParamSync::LoadState(const std::vector<NamedArray>& arrays) {
  std::map<std::string, int> index;
  const auto& params = exec_->graph().params();
  for (size_t i = 0; i < params.size(); ++i)
    index[params[i].name + "_momentum"] = static_cast<int>(i);
  for (const NamedArray& a : arrays) {
    if (a.kind != NamedArray::Kind::kOptimizerState) continue;
    auto it = index.find(a.name);
    if (it == index.end()) {
      return Status::InvalidArgument(StrCat("optimizer state ", a.name, " matches no parameter"));
    }
    const int64_t n = exec_->param(it->second).num_elements();
    if (static_cast<int64_t>(a.data.size()) != n) {
      return Status::InvalidArgument(
          StrCat("optimizer state ", a.name, " has ", a.data.size(), " values, parameter has ", n));
    }
    states_[it->second].momentum = a.data;
  }
  return Status::Ok();
}

}  // namespace pstrain
