#include "worker/dist_param_sync.h"

#include <string>

#include "proto/ps.pb.h"

namespace pstrain {

DistParamSync::DistParamSync(KVClient* client, const OptimizerConfig& optimizer, bool sync_mode,
                             int request_timeout_ms, int barrier_timeout_ms,
                             const GradientCompression& compression)
    : client_(client),
      optimizer_(optimizer),
      sync_mode_(sync_mode),
      compression_(compression),
      request_timeout_ms_(request_timeout_ms),
      barrier_timeout_ms_(barrier_timeout_ms) {}

DistParamSync::~DistParamSync() {
  // The executor's buffers must not be written after it is gone: settle every
  // exchange still in flight (bounded by the request deadline).
  for (size_t i = 0; i < pending_.size(); ++i) {
    if (pending_[i] != 0) (void)client_->Wait(pending_[i], RequestDeadline());
  }
}

Status DistParamSync::Init(ModelParams* exec) {
  exec_ = exec;
  const auto& params = exec->graph().params();
  ServerConfig config;
  config.set_sync_mode(sync_mode_);
  *config.mutable_optimizer() = optimizer_;
  if (compression_.enabled()) {
    GradientCompressionConfig* gc = config.mutable_gradient_compression();
    gc->set_type(GradientCompressionConfig::TWO_BIT);
    gc->set_threshold(compression_.threshold);
  }
  keys_.clear();
  lens_.clear();
  for (size_t i = 0; i < params.size(); ++i) {
    keys_.push_back(static_cast<KVClient::Key>(i));
    lens_.push_back(exec->param(static_cast<int>(i)).num_elements());
    const float wd_mult = WeightDecayMult(params[i].name);
    if (wd_mult != 1.0f) (*config.mutable_wd_mult())[i] = wd_mult;
  }
  pending_.assign(params.size(), 0);
  RETURN_IF_ERROR(
      client_->SetServerConfig(config, RequestDeadline()).WithContext("configuring the servers"));

  // Rank 0's initial values become everyone's (MXNet: init + worker barrier);
  // the client sends only rank 0's. One call covers every key, one message per server.
  std::vector<float> values;
  for (size_t i = 0; i < params.size(); ++i) {
    const size_t n = static_cast<size_t>(lens_[i]);
    values.resize(values.size() + n);
    RETURN_IF_ERROR(exec->ReadParam(static_cast<int>(i), values.data() + values.size() - n, n));
  }
  KVClient::Ticket t = client_->Init(keys_, lens_, values.data());
  RETURN_IF_ERROR(client_->Wait(t, RequestDeadline()).WithContext("initializing the parameters"));
  RETURN_IF_ERROR(client_->Barrier(Deadline::InMillis(barrier_timeout_ms_))
                      .WithContext("worker barrier after initialization"));

  std::vector<float> pulled;
  int64_t total = 0;
  for (int64_t n : lens_) total += n;
  pulled.resize(static_cast<size_t>(total));
  t = client_->Pull(keys_, lens_, pulled.data());
  RETURN_IF_ERROR(client_->Wait(t, RequestDeadline()).WithContext("pulling the initial weights"));
  const float* p = pulled.data();
  for (size_t i = 0; i < params.size(); ++i) {
    const size_t n = static_cast<size_t>(lens_[i]);
    RETURN_IF_ERROR(exec->WriteParam(static_cast<int>(i), p, n));
    p += n;
  }
  host_grad_.clear();
  host_param_.clear();
  if (!exec->backend().host_accessible()) {
    host_grad_.resize(params.size());
    host_param_.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      host_grad_[i].resize(static_cast<size_t>(lens_[i]));
      host_param_[i].resize(static_cast<size_t>(lens_[i]));
    }
  }
  return Status::Ok();
}

void DistParamSync::OnGradReady(int i) {
  if (!error_.ok()) return;
  float* grad = exec_->host_grad(i);
  float* weight = exec_->host_param(i);
  if (grad == nullptr) {
    // A device's gradient: to the host first (this waits for the backward so far).
    grad = host_grad_[i].data();
    weight = host_param_[i].data();
    Record(exec_->ReadGrad(i, grad, host_grad_[i].size()));
  }
  pending_[i] = client_->PushPull({keys_[i]}, {lens_[i]}, grad, weight, /*priority=*/-i);
}

void DistParamSync::WaitParam(int i) {
  if (pending_[i] == 0) return;
  const KVClient::Ticket t = pending_[i];
  pending_[i] = 0;
  const Status s = client_->Wait(t, RequestDeadline())
                       .WithContext(StrCat("exchanging ", exec_->graph().params()[i].name));
  Record(s);
  if (s.ok() && !host_param_.empty()) {
    Record(exec_->WriteParam(i, host_param_[i].data(), host_param_[i].size()));
  }
}

Status DistParamSync::Drain() {
  for (size_t i = 0; i < pending_.size(); ++i) WaitParam(static_cast<int>(i));
  return TakeError();
}

Status DistParamSync::TakeError() {
  Status s = error_;
  error_ = Status::Ok();
  return s;
}

Status DistParamSync::LoadState(const std::vector<NamedArray>& arrays) {
  for (const NamedArray& a : arrays) {
    if (a.kind == NamedArray::Kind::kOptimizerState) {
      LOG(WARNING) << "optimizer state " << a.name
                   << " not restored: in dist modes it lives on the servers";
      break;
    }
  }
  return Status::Ok();
}

void DistParamSync::Record(const Status& s) {
  if (error_.ok() && !s.ok()) error_ = s;
}

}  // namespace pstrain
