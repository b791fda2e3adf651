#include "nn/host_params.h"

#include <algorithm>

#include "nn/executor.h"

namespace pstrain {

StatusOr<std::unique_ptr<HostParams>> HostParams::Create(const Graph& graph) {
  if (!graph.status().ok()) return graph.status().WithContext("graph");
  std::unique_ptr<HostParams> p(new HostParams(graph));
  ASSIGN_OR_RETURN(p->backend_, Backend::Create(BackendOptions{}));
  for (const ParamInfo& info : graph.params()) {
    p->params_.push_back(p->backend_->Zeros(info.shape));
    p->grads_.push_back(p->backend_->Zeros(info.shape));
  }
  for (const ParamInfo& info : graph.aux_states()) {
    p->aux_.push_back(p->backend_->Zeros(info.shape));
  }
  p->param_mu_.reset(new Mutex[std::max<size_t>(graph.params().size(), 1)]);
  p->aux_mu_.reset(new Mutex[std::max<size_t>(graph.aux_states().size(), 1)]);
  return p;
}

HostParams::~HostParams() = default;

void HostParams::FillGrads() {
  for (const Tensor& g : grads_) {
    float* d = g.data();
    for (int64_t k = 0; k < g.num_elements(); ++k) {
      d[k] = static_cast<float>(k % 17 - 8) * 1e-5f;
    }
  }
}

Status HostParams::ReadParam(int i, float* dst, size_t n) const {
  RETURN_IF_ERROR(CheckArrayCopy("parameter", i, graph_.params(), n));
  MutexLock lock(&param_mu_[i]);
  std::copy_n(params_[i].data(), n, dst);
  return Status::Ok();
}

Status HostParams::WriteParam(int i, const float* src, size_t n) {
  RETURN_IF_ERROR(CheckArrayCopy("parameter", i, graph_.params(), n));
  MutexLock lock(&param_mu_[i]);
  std::copy_n(src, n, params_[i].data());
  return Status::Ok();
}

Status HostParams::ReadGrad(int i, float* dst, size_t n) const {
  RETURN_IF_ERROR(CheckArrayCopy("gradient of parameter", i, graph_.params(), n));
  std::copy_n(grads_[i].data(), n, dst);
  return Status::Ok();
}

Status HostParams::ReadAux(int i, float* dst, size_t n) const {
  RETURN_IF_ERROR(CheckArrayCopy("aux state", i, graph_.aux_states(), n));
  MutexLock lock(&aux_mu_[i]);
  std::copy_n(aux_[i].data(), n, dst);
  return Status::Ok();
}

Status HostParams::WriteAux(int i, const float* src, size_t n) {
  RETURN_IF_ERROR(CheckArrayCopy("aux state", i, graph_.aux_states(), n));
  MutexLock lock(&aux_mu_[i]);
  std::copy_n(src, n, aux_[i].data());
  return Status::Ok();
}

}  // namespace pstrain
