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
  // The pusher finishes the jobs it holds without pushing: their downloads
  // end before the pinned buffers go.
  {
    MutexLock l(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  if (pusher_.joinable()) pusher_.join();
  // The executor's buffers must not be written after it is gone: settle every
  // exchange still in flight (bounded by the request deadline).
  std::vector<KVClient::Ticket> pending;
  {
    MutexLock l(&mu_);
    pending = pending_;
  }
  for (KVClient::Ticket t : pending) {
    if (t != 0) (void)client_->Wait(t, RequestDeadline());
  }
  // Uploads from host_param_ still in flight end before it goes.
  if (exec_ != nullptr && !host_param_.empty()) exec_->backend().Synchronize();
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
  {
    MutexLock l(&mu_);
    pending_.assign(params.size(), 0);
    queued_.assign(params.size(), false);
  }
  RETURN_IF_ERROR(StopOnError(
      client_->SetServerConfig(config, RequestDeadline()).WithContext("configuring the servers")));

  // Rank 0's initial values become everyone's (MXNet: init + worker barrier);
  // the client sends only rank 0's. One call covers every key, one message per server.
  std::vector<float> values;
  for (size_t i = 0; i < params.size(); ++i) {
    const size_t n = static_cast<size_t>(lens_[i]);
    values.resize(values.size() + n);
    RETURN_IF_ERROR(exec->ReadParam(static_cast<int>(i), values.data() + values.size() - n, n));
  }
  KVClient::Ticket t = client_->Init(keys_, lens_, values.data());
  RETURN_IF_ERROR(
      StopOnError(client_->Wait(t, RequestDeadline()).WithContext("initializing the parameters")));
  RETURN_IF_ERROR(StopOnError(client_->Barrier(Deadline::InMillis(barrier_timeout_ms_))
                                  .WithContext("worker barrier after initialization")));

  std::vector<float> pulled;
  int64_t total = 0;
  for (int64_t n : lens_) total += n;
  pulled.resize(static_cast<size_t>(total));
  t = client_->Pull(keys_, lens_, pulled.data());
  RETURN_IF_ERROR(
      StopOnError(client_->Wait(t, RequestDeadline()).WithContext("pulling the initial weights")));
  const float* p = pulled.data();
  for (size_t i = 0; i < params.size(); ++i) {
    const size_t n = static_cast<size_t>(lens_[i]);
    RETURN_IF_ERROR(exec->WriteParam(static_cast<int>(i), p, n));
    p += n;
  }
  host_grad_.clear();
  host_param_.clear();
  if (!exec->backend().host_accessible()) {
    // The host's copies of the gradients and weights the client sends and
    // receives, pinned for the device's asynchronous copies.
    for (size_t i = 0; i < params.size(); ++i) {
      for (auto* copies : {&host_grad_, &host_param_}) {
        StatusOr<std::shared_ptr<Buffer>> b =
            exec->backend().TryAllocatePinned(static_cast<size_t>(lens_[i]));
        if (!b.ok()) return b.status().WithContext(StrCat("the host's copy of ", params[i].name));
        copies->push_back(std::move(b).value());
      }
    }
    if (!pusher_.joinable()) pusher_ = std::thread([this] { PusherLoop(); });
  }
  return Status::Ok();
}

void DistParamSync::OnGradReady(int i) {
  if (HasError()) return;
  // An exchange of i that no WaitParam settled (no forward read param(i)
  // since: not the training loop's order) is settled first, on either path:
  // its ticket, and any error, would be lost, and on a device the buffers'
  // rule would break.
  bool unsettled;
  {
    MutexLock l(&mu_);
    unsettled = queued_[i] || pending_[i] != 0;
  }
  float* grad = exec_->host_grad(i);
  if (grad != nullptr) {
    // Host memory: the client reads the gradient and writes the reply in place.
    if (unsettled) {
      WaitParam(i);
      if (HasError()) return;
    }
    const KVClient::Ticket t =
        client_->PushPull({keys_[i]}, {lens_[i]}, grad, exec_->host_param(i), /*priority=*/-i);
    MutexLock l(&mu_);
    pending_[i] = t;
    return;
  }
  Backend& b = exec_->backend();
  if (unsettled) {
    // The upload may start at once, so first let this backward's reads of
    // param(i) finish.
    b.Synchronize();
    WaitParam(i);
  }
  b.CopyToHostAsync(exec_->grad(i), host_grad_[i]->data());
  PushJob job;
  job.param = i;
  job.fence = b.RecordFence();
  MutexLock l(&mu_);
  queued_[i] = true;
  jobs_.push_back(std::move(job));
  cv_.SignalAll();
}

void DistParamSync::PusherLoop() {
  while (true) {
    PushJob job;
    {
      MutexLock l(&mu_);
      // Idle until work or shutdown (the destructor's), which bound this wait.
      cv_.WaitUntil(Deadline::Never(), [this]() REQUIRES(mu_) { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    const int i = job.param;
    // host_grad_[i] holds the gradient once the fence is done: within
    // kDeviceWaitTimeout, else the error (a hung device); after an error
    // nothing is waited for (each wait would cost the timeout) or pushed.
    if (!HasError()) {
      Record(job.fence->Wait(Deadline::In(kDeviceWaitTimeout))
                 .WithContext(StrCat("copying the gradient of ", exec_->graph().params()[i].name,
                                     " to the host")));
    }
    bool skip;
    {
      MutexLock l(&mu_);
      skip = stop_ || !error_.ok();
    }
    KVClient::Ticket t = 0;
    if (!skip) {
      t = client_->PushPull({keys_[i]}, {lens_[i]}, host_grad_[i]->data(), host_param_[i]->data(),
                            /*priority=*/-i);
    }
    MutexLock l(&mu_);
    pending_[i] = t;
    queued_[i] = false;
    cv_.SignalAll();
  }
}

void DistParamSync::WaitParam(int i) {
  KVClient::Ticket t = 0;
  {
    MutexLock l(&mu_);
    // On a device: until the pusher has pushed i (its download is done).
    if (!cv_.WaitUntil(RequestDeadline(), [this, i]() REQUIRES(mu_) { return !queued_[i]; })) {
      if (error_.ok()) {
        error_ = Status::DeadlineExceeded(
            StrCat("the gradient of ", exec_->graph().params()[i].name,
                   " was not copied to the host within ", request_timeout_ms_, " ms"));
      }
      return;
    }
    t = pending_[i];
    pending_[i] = 0;
  }
  if (t == 0) return;
  const Status s = client_->Wait(t, RequestDeadline())
                       .WithContext(StrCat("exchanging ", exec_->graph().params()[i].name));
  Record(s);
  if (s.ok() && !host_param_.empty()) {
    // In place, ahead of the kernels that read it (param(i) is no longer read
    // by earlier work: the push waited for a fence after the backward).
    exec_->backend().CopyFromHostAsync(host_param_[i]->data(), exec_->param(i));
  }
}

Status DistParamSync::StopOnError(const Status& s) {
  if (s.ok()) return s;
  // A request waited for in vain may still be answered into its buffers,
  // locals of Init, until the node stops (kv_client.h): it stops before they go.
  client_->node()->Fail(s);
  client_->node()->Stop();
  return s;
}

Status DistParamSync::Drain() {
  for (size_t i = 0; i < lens_.size(); ++i) WaitParam(static_cast<int>(i));
  return TakeError();
}

Status DistParamSync::TakeError() {
  MutexLock l(&mu_);
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
  if (s.ok()) return;
  MutexLock l(&mu_);
  if (error_.ok()) error_ = s;
}

bool DistParamSync::HasError() {
  MutexLock l(&mu_);
  return !error_.ok();
}

}  // namespace pstrain
