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

Status LocalParamSync::Init(ModelParams* exec) {
  exec_ = exec;
  const auto& params = exec->graph().params();
  states_.assign(params.size(), ParamState{});
  device_momentum_.assign(params.size(), Tensor());
  for (size_t i = 0; i < params.size(); ++i) states_[i].wd_mult = WeightDecayMult(params[i].name);
  return Status::Ok();
}

void LocalParamSync::OnGradReady(int i) {
  float* w = exec_->host_param(i);
  if (w != nullptr) {
    const UpdateCheck c = optimizer_->Update(
        exec_->host_grad(i), w, static_cast<size_t>(exec_->param(i).num_elements()), &states_[i]);
    MutexLock l(&mu_);
    if (!c.ok() && error_.ok()) {
      const std::string& name = exec_->graph().params()[i].name;
      error_ = Status::FailedPrecondition(
          c.bad_grad >= 0
              ? StrCat("the gradient of ", name, " holds NaN or Inf at update ",
                       states_[i].num_updates, ": training stops (the model would be broken)")
              : StrCat("update ", states_[i].num_updates, " made ", name,
                       " NaN or Inf although its gradient was finite: the learning rate is too "
                       "large (lower --lr, or clip with --clip-gradient)"));
    }
    return;
  }
  const Optimizer::Step step = optimizer_->NextStep(&states_[i]);
  if (step.uses_momentum() && !device_momentum_[i].defined()) {
    device_momentum_[i] = exec_->backend().Zeros(exec_->param(i).shape());
  }
  exec_->backend().ApplyOptimizerStep(step, exec_->grad(i), exec_->param(i), device_momentum_[i]);
}

std::vector<NamedArray> LocalParamSync::SaveState() const {
  std::vector<NamedArray> out;
  const auto& params = exec_->graph().params();
  for (size_t i = 0; i < params.size(); ++i) {
    NamedArray a;
    if (device_momentum_[i].defined()) {
      a.data.resize(static_cast<size_t>(device_momentum_[i].num_elements()));
      exec_->backend().CopyToHost(device_momentum_[i], a.data.data());
    } else if (!states_[i].momentum.empty()) {
      a.data = states_[i].momentum;
    } else {
      continue;
    }
    a.kind = NamedArray::Kind::kOptimizerState;
    a.name = params[i].name + "_momentum";
    a.shape = {static_cast<int64_t>(a.data.size())};
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
    const int i = it->second;
    const int64_t n = exec_->param(i).num_elements();
    if (static_cast<int64_t>(a.data.size()) != n) {
      return Status::InvalidArgument(
          StrCat("optimizer state ", a.name, " has ", a.data.size(), " values, parameter has ", n));
    }
    if (exec_->host_param(i) != nullptr) {
      states_[i].momentum = a.data;
    } else {
      if (!device_momentum_[i].defined()) {
        device_momentum_[i] = exec_->backend().Empty(exec_->param(i).shape());
      }
      exec_->backend().CopyFromHost(a.data.data(), device_momentum_[i]);
    }
  }
  return Status::Ok();
}

}  // namespace pstrain
