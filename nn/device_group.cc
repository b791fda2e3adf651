#include "nn/device_group.h"

#include <algorithm>
#include <cmath>

namespace pstrain {
namespace {

// Zeroed host memory that `device`'s asynchronous copies use (pinned on a GPU).
StatusOr<Tensor> PinnedZeros(Backend& device, const Shape& s) {
  const size_t n = static_cast<size_t>(s.num_elements());
  ASSIGN_OR_RETURN(std::shared_ptr<Buffer> b, device.TryAllocatePinned(n));
  Tensor t(std::move(b), 0, s);
  std::fill_n(t.data(), n, 0.0f);
  return t;
}

}  // namespace

StatusOr<std::vector<int>> SplitBatch(int batch_size, int num_devices,
                                      const std::vector<double>& weights) {
  if (num_devices < 1) return Status::InvalidArgument("no device to split the batch over");
  std::vector<double> w = weights;
  if (w.empty()) w.assign(num_devices, 1.0);
  if (static_cast<int>(w.size()) != num_devices) {
    return Status::InvalidArgument(StrCat(w.size(), " weights for ", num_devices, " devices"));
  }
  double total = 0;
  for (double x : w) {
    if (!(x > 0) || !std::isfinite(x)) {
      return Status::InvalidArgument(StrCat("device weight ", x, " must be positive"));
    }
    total += x;
  }
  // MXNet's arithmetic under Python 3 (MXNet 1.x; Python 2's integer work
  // loads floor-divided): round(w * batch / total) with Python's rounding
  // (halves to even: nearbyint in the default mode); a shortfall goes to the
  // last device; then consecutive slices, each cut off at the batch's end.
  std::vector<double> rounded(num_devices);
  double sum = 0;
  for (int d = 0; d < num_devices; ++d) {
    rounded[d] = std::nearbyint(w[d] * batch_size / total);
    sum += rounded[d];
  }
  if (sum < batch_size) rounded.back() += batch_size - sum;
  std::vector<int> shares(num_devices);
  double end = 0;
  for (int d = 0; d < num_devices; ++d) {
    const double begin = std::min<double>(end, batch_size);
    end = std::min<double>(begin + rounded[d], batch_size);
    if (begin >= end) {
      return Status::InvalidArgument(StrCat("a batch of ", batch_size, " split over ", num_devices,
                                            " devices leaves device ", d,
                                            " no example (shares must be >= 1)"));
    }
    shares[d] = static_cast<int>(end - begin);
  }
  return shares;
}

DeviceGroup::DeviceGroup(const Graph& graph, const DeviceGroupOptions& options)
    : graph_(graph), options_(options) {}

void DeviceGroup::Reseed(uint64_t seed) {
  for (size_t d = 0; d < execs_.size(); ++d) execs_[d]->Reseed(seed + d);
}

DeviceGroup::~DeviceGroup() {
  // The merge thread finishes the jobs it holds without summing or calling
  // back (the callbacks' owner may be gone): their downloads end first.
  {
    MutexLock l(&mu_);
    stop_ = true;
    cv_.SignalAll();
  }
  if (merger_.joinable()) merger_.join();
  // Uploads from the pinned merge buffers end before those go.
  if (async_merge_) {
    for (auto& e : execs_) e->backend().Synchronize();
  }
  pinned_grad_.clear();
  // The merge buffers belong to their backend: they go first.
  merge_param_.clear();
  merge_grad_.clear();
  peer_grad_scratch_.reset();
}

StatusOr<std::unique_ptr<DeviceGroup>> DeviceGroup::Create(const Graph& graph,
                                                           const DeviceGroupOptions& options) {
  if (options.devices.empty()) return Status::InvalidArgument("a device group needs a device");
  auto kind = [](const BackendOptions& b) {
    return b.device.ToString() + (b.cpu_as_device ? " (as a device)" : "");
  };
  for (const BackendOptions& b : options.devices) {
    if (b.device.type != options.devices[0].device.type ||
        b.cpu_as_device != options.devices[0].cpu_as_device) {
      return Status::InvalidArgument(StrCat("one worker's devices must be of one kind: ", kind(b),
                                            " and ", kind(options.devices[0])));
    }
  }
  if (options.compression.enabled() &&
      (!options.devices[0].device.is_cpu() || options.devices[0].cpu_as_device)) {
    return Status::Unimplemented(
        StrCat("2-bit gradient compression in the device merge (--kv-store device) runs on the "
               "CPU only, not yet on ",
               options.devices[0].cpu_as_device ? std::string("a device the host cannot address")
                                                : options.devices[0].device.ToString(),
               " (the dist kvstores compress on the host and work with GPUs)"));
  }
  std::unique_ptr<DeviceGroup> g(new DeviceGroup(graph, options));
  RETURN_IF_ERROR(g->Init());
  return g;
}

Status DeviceGroup::Init() {
  ASSIGN_OR_RETURN(
      shares_,
      SplitBatch(options_.batch_size, static_cast<int>(options_.devices.size()), options_.weights));
  for (size_t d = 0; d < options_.devices.size(); ++d) {
    ExecutorOptions eo;
    eo.batch_size = shares_[d];
    eo.backend = options_.devices[d];
    eo.for_training = options_.for_training;
    eo.seed = options_.seed + d;
    eo.profile = options_.profile;
    auto made = Executor::Create(graph_, eo);
    if (!made.ok()) {
      return made.status().WithContext(
          StrCat("device ", d, " (", options_.devices[d].device.ToString(), ")"));
    }
    execs_.push_back(std::move(made).value());
  }
  const int P = num_params();
  grads_in_.assign(P, 0);
  // Every device starts from the merge buffers' values (device 0's own
  // parameters, with the device merge): copied before the first forward.
  stale_.assign(P, execs_.size() > 1);
  Executor& first = *execs_[0];
  separate_merge_ = execs_.size() > 1 && options_.merge == MergeDevice::kLocal;
  if (!separate_merge_) {
    merge_backend_ = &first.backend();
    for (int i = 0; i < P; ++i) {
      merge_param_.push_back(first.param(i));
      merge_grad_.push_back(options_.for_training ? first.grad(i) : Tensor());
    }
    if (execs_.size() > 1 && options_.for_training && !first.backend().host_accessible()) {
      // kDevice between GPUs: each other device's gradient is copied here
      // before it is added, one parameter at a time in the first device's
      // stream order, so one buffer of the largest parameter serves them all.
      int64_t largest = 0;
      for (int i = 0; i < P; ++i) largest = std::max(largest, first.param(i).num_elements());
      StatusOr<std::shared_ptr<Buffer>> b =
          merge_backend_->TryAllocate(static_cast<size_t>(std::max<int64_t>(largest, 1)));
      if (!b.ok()) {
        return b.status().WithContext(
            StrCat("device 0 (", options_.devices[0].device.ToString(),
                   "): the device merge's copy of another device's gradient"));
      }
      peer_grad_scratch_ = std::move(b).value();
    }
  } else {
    BackendOptions cpu;
    cpu.num_threads = options_.devices[0].device.is_cpu() ? options_.devices[0].num_threads : 0;
    ASSIGN_OR_RETURN(own_merge_backend_, Backend::Create(cpu));
    merge_backend_ = own_merge_backend_.get();
    async_merge_ = !first.backend().host_accessible();
    if (async_merge_) {
      pinned_grad_.resize(execs_.size());
      grad_fences_.resize(P);
    }
    // A zeroed host tensor for parameter i: pinned where the devices copy to
    // and from it asynchronously. The host may be short of room for a large model.
    auto host_zeros = [&first, this](int i, const char* what) -> StatusOr<Tensor> {
      const Shape& s = graph_.params()[i].shape;
      StatusOr<Tensor> t =
          async_merge_ ? PinnedZeros(first.backend(), s) : merge_backend_->TryZeros(s);
      if (!t.ok()) {
        return t.status().WithContext(
            StrCat("the host merge's ", what, " of ", graph_.params()[i].name));
      }
      return t;
    };
    for (int i = 0; i < P; ++i) {
      ASSIGN_OR_RETURN(Tensor param, host_zeros(i, "parameter"));
      merge_param_.push_back(std::move(param));
      Tensor grad;
      if (options_.for_training) {
        ASSIGN_OR_RETURN(grad, host_zeros(i, "gradient"));
      }
      merge_grad_.push_back(std::move(grad));
      for (size_t d = 1; async_merge_ && options_.for_training && d < execs_.size(); ++d) {
        ASSIGN_OR_RETURN(Tensor download, host_zeros(i, "download of a device's gradient"));
        pinned_grad_[d].push_back(std::move(download));
      }
      first.backend().CopyToHost(first.param(i), merge_param_[i].data());
    }
  }
  // Each executor reports its gradients; the group acts once all have.
  if (options_.compression.enabled() && options_.for_training) {
    residuals_.assign(execs_.size(), std::vector<std::vector<float>>(P));
  }
  for (size_t d = 0; d < execs_.size(); ++d) {
    Executor* e = execs_[d].get();
    e->SetGradReadyCallback([this, d, e](int p) {
      if (async_merge_) {
        EnqueueDownload(static_cast<int>(d), p);
        return;
      }
      if (!residuals_.empty()) {
        // Device d's gradient as its 2-bit codes say (MXNet quantizes each
        // device's gradient with its own residual, then sums the dequantized).
        const Tensor& g = e->grad(p);
        const size_t n = static_cast<size_t>(g.num_elements());
        std::vector<float>& r = residuals_[d][p];
        if (r.empty()) r.assign(n, 0.0f);
        QuantizeTwoBitInPlace(g.data(), r.data(), n, options_.compression.threshold);
      }
      if (++grads_in_[p] < num_devices()) return;
      grads_in_[p] = 0;
      if (num_devices() > 1) {
        Merge(p);
        stale_[p] = true;  // the sync updates the merged parameter from here on
      }
      if (on_grad_ready_) on_grad_ready_(p);
    });
  }
  if (async_merge_) {
    // The first broadcast uploads on each device's copy stream, which does
    // not wait for its compute stream: the set-up work queued there (the
    // parameters' zeroing; device 0's is done, CopyToHost waited for it)
    // must be done first.
    for (size_t d = 1; d < execs_.size(); ++d) execs_[d]->backend().Synchronize();
    MutexLock l(&mu_);
    merging_.assign(P, 0);
    merger_ = std::thread([this] { MergeLoop(); });
  }
  return Status::Ok();
}

void DeviceGroup::EnqueueDownload(int d, int p) {
  // Step t's merge of p has read the pinned buffers (Forward waited for it
  // unless no node reads p).
  WaitMerged(p);
  Executor& e = *execs_[d];
  float* dst = d == 0 ? merge_grad_[p].data() : pinned_grad_[d][p].data();
  e.backend().CopyToHostAsync(e.grad(p), dst);
  grad_fences_[p].push_back(e.backend().RecordFence());
  if (++grads_in_[p] < num_devices()) return;
  grads_in_[p] = 0;
  stale_[p] = true;  // the sync updates the merged parameter from here on
  MergeJob job;
  job.param = p;
  job.fences = std::move(grad_fences_[p]);
  grad_fences_[p].clear();
  MutexLock l(&mu_);
  merging_[p] = 1;
  ++in_flight_;
  jobs_.push_back(std::move(job));
  cv_.SignalAll();
}

void DeviceGroup::MergeLoop() {
  while (true) {
    MergeJob job;
    bool stop, failed;
    {
      MutexLock l(&mu_);
      // Idle until work or the destructor's stop, which bounds this wait.
      cv_.WaitUntil(Deadline::Never(), [this]() REQUIRES(mu_) { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
      stop = stop_;
      failed = failed_;
    }
    const int p = job.param;
    // The pinned gradients are complete once the fences are: each within
    // kDeviceWaitTimeout, else the group's error (TakeError), and this job
    // and the later ones neither sum nor call back (nor wait: a hung device
    // would cost each one the timeout).
    for (size_t d = 0; d < job.fences.size() && !failed; ++d) {
      const Status waited = job.fences[d]->Wait(Deadline::In(kDeviceWaitTimeout));
      if (waited.ok()) continue;
      failed = true;
      MutexLock l(&mu_);
      failed_ = true;  // TakeError does not clear it: the device stays hung
      if (error_.ok()) {
        error_ = waited.WithContext(StrCat("device ", d, "'s download of the gradient of ",
                                           graph_.params()[p].name, " for the merge"));
      }
    }
    if (!stop && !failed) {
      // Device 0's gradient is in the merge buffer already; the order of the
      // sums is the synchronous merge's.
      for (int d = 1; d < num_devices(); ++d)
        merge_backend_->Add(pinned_grad_[d][p], merge_grad_[p]);
      if (on_grad_ready_) on_grad_ready_(p);
    }
    MutexLock l(&mu_);
    merging_[p] = 0;
    --in_flight_;
    cv_.SignalAll();
  }
}

// The merges ahead take at most one fence wait (kDeviceWaitTimeout: after a
// failed one the rest skip theirs) and their callbacks, which do not block
// (an optimizer update, or a push that only enqueues): a merge still
// running twice that long later is a bug of ours.
constexpr auto kMergeWaitBound = 2 * kDeviceWaitTimeout;

void DeviceGroup::WaitMerged(int p) {
  MutexLock l(&mu_);
  CHECK(cv_.WaitUntil(Deadline::In(kMergeWaitBound),
                      [this, p]() REQUIRES(mu_) { return merging_[p] == 0; }))
      << "the merge of " << graph_.params()[p].name << " did not end within "
      << kMergeWaitBound.count() << " minutes";
}

void DeviceGroup::Drain() {
  if (!async_merge_) return;
  MutexLock l(&mu_);
  CHECK(cv_.WaitUntil(Deadline::In(kMergeWaitBound),
                      [this]() REQUIRES(mu_) { return in_flight_ == 0; }))
      << in_flight_ << " merges did not end within " << kMergeWaitBound.count() << " minutes";
}

Status DeviceGroup::TakeError() {
  if (!async_merge_) return Status::Ok();
  MutexLock l(&mu_);
  Status s = error_;
  error_ = Status::Ok();
  return s;
}

void DeviceGroup::Merge(int i) {
  const Tensor& mg = merge_grad_[i];
  Backend& mb = *merge_backend_;
  for (int d = 0; d < num_devices(); ++d) {
    if (SharesMerge(d)) continue;
    Executor& e = *execs_[d];
    const Tensor& g = e.grad(i);
    if (separate_merge_) {
      // kLocal between host devices (from GPUs the merge thread sums):
      // sum in host memory, reading the gradients in place.
      if (d == 0) {
        mb.Copy(g, mg);
      } else {
        mb.Add(g, mg);
      }
    } else if (mb.host_accessible() && e.backend().host_accessible()) {
      mb.Add(g, mg);  // kDevice between host devices: read in place
    } else {
      // kDevice between GPUs: the other device's gradient over to the first.
      const Tensor scratch(peer_grad_scratch_, 0, mg.shape());
      mb.CopyPeer(e.backend(), g, scratch);
      mb.Add(scratch, mg);
    }
  }
}

void DeviceGroup::Broadcast(int i) {
  const Tensor& mp = merge_param_[i];
  for (int d = 0; d < num_devices(); ++d) {
    if (SharesMerge(d)) continue;
    Executor& e = *execs_[d];
    if (async_merge_) {
      // From pinned memory, ahead of the kernels that read it; the device
      // finished reading e.param(i) before the fences the merge waited for.
      e.backend().CopyFromHostAsync(mp.data(), e.param(i));
    } else if (separate_merge_) {
      e.backend().CopyFromHost(mp.data(), e.param(i));
    } else {
      e.backend().CopyPeer(*merge_backend_, mp, e.param(i));
    }
  }
}

void DeviceGroup::Forward(bool is_train) {
  const int n = execs_[0]->num_nodes();
  for (NodeId i = 0; i < n; ++i) {
    for (int p : graph_.node(i).params) {
      if (async_merge_) WaitMerged(p);
      if (on_param_needed_) on_param_needed_(p);
      if (stale_[p]) {
        Broadcast(p);
        stale_[p] = false;
      }
    }
    for (auto& e : execs_) e->ForwardNode(i, is_train);
  }
}

void DeviceGroup::Backward() {
  for (NodeId i = execs_[0]->num_nodes() - 1; i >= 0; --i) {
    for (auto& e : execs_) e->BackwardNode(i);
  }
}

Status DeviceGroup::LoadData(const float* src, size_t n) {
  const size_t row = static_cast<size_t>(execs_[0]->data().shape().ProductFrom(1));
  if (n != row * static_cast<size_t>(options_.batch_size)) {
    return Status::InvalidArgument(StrCat("a batch of ", n, " values does not fit the input (",
                                          options_.batch_size, " x ", row, ")"));
  }
  size_t offset = 0;
  for (int d = 0; d < num_devices(); ++d) {
    const size_t count = row * static_cast<size_t>(shares_[d]);
    RETURN_IF_ERROR(execs_[d]->LoadData(src + offset, count));
    offset += count;
  }
  return Status::Ok();
}

Status DeviceGroup::LoadLabel(const float* src, size_t n) {
  if (n < static_cast<size_t>(options_.batch_size)) {
    return Status::InvalidArgument(
        StrCat(n, " labels for a batch of ", options_.batch_size, " examples"));
  }
  size_t offset = 0;
  for (int d = 0; d < num_devices(); ++d) {
    RETURN_IF_ERROR(execs_[d]->LoadLabel(src + offset, static_cast<size_t>(shares_[d])));
    offset += static_cast<size_t>(shares_[d]);
  }
  return Status::Ok();
}

Shape DeviceGroup::output_shape() const {
  Shape s = execs_[0]->output().shape();
  s[0] = options_.batch_size;
  return s;
}

Status DeviceGroup::ReadOutput(float* dst, size_t n) const {
  const size_t row = static_cast<size_t>(execs_[0]->output().shape().ProductFrom(1));
  if (n != row * static_cast<size_t>(options_.batch_size)) {
    return Status::InvalidArgument(StrCat("output ", output_shape().ToString(), " has ",
                                          row * options_.batch_size, " values, got ", n));
  }
  size_t offset = 0;
  for (int d = 0; d < num_devices(); ++d) {
    const size_t count = row * static_cast<size_t>(shares_[d]);
    RETURN_IF_ERROR(execs_[d]->ReadOutput(dst + offset, count));
    offset += count;
  }
  return Status::Ok();
}

float DeviceGroup::Loss() const {
  double sum = 0;
  for (int d = 0; d < num_devices(); ++d) sum += double(execs_[d]->Loss()) * shares_[d];
  return static_cast<float>(sum / options_.batch_size);
}

std::vector<MemoryStats> DeviceGroup::memory_stats() const {
  std::vector<MemoryStats> out;
  for (const auto& e : execs_) out.push_back(e->backend().memory_stats());
  if (own_merge_backend_) out.push_back(own_merge_backend_->memory_stats());
  return out;
}

Status DeviceGroup::ReadParam(int i, float* dst, size_t n) const {
  if (!separate_merge_) return execs_[0]->ReadParam(i, dst, n);
  RETURN_IF_ERROR(CheckArrayCopy("parameter", i, graph_.params(), n));
  merge_backend_->CopyToHost(merge_param_[i], dst);
  return Status::Ok();
}

Status DeviceGroup::WriteParam(int i, const float* src, size_t n) {
  if (!separate_merge_) {
    RETURN_IF_ERROR(execs_[0]->WriteParam(i, src, n));
  } else {
    RETURN_IF_ERROR(CheckArrayCopy("parameter", i, graph_.params(), n));
    if (async_merge_) {
      if (std::this_thread::get_id() == merger_.get_id()) {
        return Status::FailedPrecondition(
            StrCat("WriteParam of parameter ", i,
                   " from the merge thread (a grad-ready callback) would wait for its own merge; "
                   "the callback updates the merge buffer in place"));
      }
      // No merge writes it meanwhile, and no upload from it is in flight.
      Drain();
      for (auto& e : execs_) e->backend().Synchronize();
    }
    merge_backend_->CopyFromHost(src, merge_param_[i]);
  }
  if (num_devices() > 1) stale_[i] = true;
  return Status::Ok();
}

Status DeviceGroup::ReadGrad(int i, float* dst, size_t n) const {
  if (!separate_merge_) return execs_[0]->ReadGrad(i, dst, n);
  RETURN_IF_ERROR(CheckArrayCopy("gradient of parameter", i, graph_.params(), n));
  if (!merge_grad_[i].defined()) {
    return Status::FailedPrecondition(
        StrCat("gradient of parameter ", i, ": the devices were set up for inference only"));
  }
  merge_backend_->CopyToHost(merge_grad_[i], dst);
  return Status::Ok();
}

Status DeviceGroup::ReadAux(int i, float* dst, size_t n) const {
  return execs_[0]->ReadAux(i, dst, n);
}

Status DeviceGroup::WriteAux(int i, const float* src, size_t n) {
  for (auto& e : execs_) RETURN_IF_ERROR(e->WriteAux(i, src, n));
  return Status::Ok();
}

Status DeviceGroup::AverageAux() {
  if (num_devices() == 1) return Status::Ok();
  for (int i = 0; i < num_aux(); ++i) {
    const size_t n = static_cast<size_t>(graph_.aux_states()[i].shape.num_elements());
    std::vector<float> mean(n, 0.0f), one(n);
    // As MXNet's get_params: the sum over the devices in order, then / count.
    for (auto& e : execs_) {
      RETURN_IF_ERROR(e->ReadAux(i, one.data(), n));
      for (size_t k = 0; k < n; ++k) mean[k] += one[k];
    }
    const float count = static_cast<float>(num_devices());
    for (float& v : mean) v /= count;
    RETURN_IF_ERROR(WriteAux(i, mean.data(), n));
  }
  return Status::Ok();
}

float* DeviceGroup::host_param(int i) const {
  return merge_backend_->host_accessible() ? merge_param_[i].data() : nullptr;
}

float* DeviceGroup::host_grad(int i) const {
  return merge_backend_->host_accessible() && merge_grad_[i].defined() ? merge_grad_[i].data()
                                                                       : nullptr;
}

}  // namespace pstrain
