// DeviceGroup: one worker's data parallelism over several devices, MXNet's
// multi-GPU module (`--gpus 0,1,...`). Each device has an executor for its
// share of the batch (proportional to optional weights, `--gpu-weights`;
// the same device may be listed twice: each entry has its own backend,
// streams and memory). The executors run in lockstep, node by node, on the
// caller's thread (a GPU's calls only enqueue, so the devices compute
// together). The moment parameter i's gradient is complete on every device,
// the gradients are summed into a merge buffer:
//
//   kLocal   on the CPU (MXNet's `local`): each device's gradient copied to
//            host memory and added there;
//   kDevice  on the first device (MXNet's `device`): the others' gradients
//            copied over (peer copies) and added there;
//
// and the group's grad-ready callback fires once: the ParamSync updates the
// merge buffer's parameter (locally, or through the parameter servers).
// Before the first node that reads parameter i in the next forward, the
// param-needed callback fires once and the parameter is copied to every
// device that does not share the merge buffer.
//
// kLocal from devices the host cannot address (GPUs) never blocks the
// caller's thread, which enqueues every device's kernels: the moment device
// d's gradient i is complete, its download into pinned host memory (device
// 0's straight into the merge buffer, the others' into a staging buffer per
// device and parameter) and a Fence are enqueued, and the caller goes on.
// Once every device has, the merge thread waits for those fences, sums in
// host memory and fires the grad-ready callback, from that thread. Before
// the first node that reads parameter i, Forward waits for that merge only,
// then fires param-needed and enqueues the upload of the (pinned) merge
// buffer to every device ahead of the node's kernels. No pinned buffer is
// overwritten while a copy may use it: a gradient download of step t+1 is
// enqueued after step t+1's Forward waited for step t's merge of that
// parameter (the sum and the callback read the buffers there); the merge
// buffer's parameter is updated by the callback only after the merge thread
// waited for fences recorded after every device's backward of step t, and
// those devices' compute streams waited for the upload of step t before
// their forward. Drain() waits for every merge (a step's end: checkpoints
// read the merge buffers).
//
// With gradient compression (MXNet's `device` kvstore after
// kv.set_gradient_compression: its CommDevice::ReduceCompressed), each
// device's gradient is first replaced by its 2-bit quantization (+-t or 0)
// with a residual per device and parameter, the moment it is complete; the
// merge then sums those, also with one device. The residuals live in host
// memory, so this needs devices the host can address (the CPU).
//
// With one device the group is its executor: the merge buffers are that
// executor's own tensors, nothing is copied.
//
// The group is a ModelParams whose param/grad are the merge buffers. Aux
// states (BatchNorm's moving statistics) stay per device during an epoch, as
// in MXNet, and AverageAux makes them one at its end; reads come from the
// first device, writes go to all.
//
// Threads: one (the trainer's), like an executor; with a kLocal merge from
// GPUs the grad-ready callback runs on the group's merge thread (one call
// at a time; grad-ready(i) finishes before the param-needed(i) that follows).
// Unlike an executor's, the group's WriteParam is not for that callback: it
// waits for every merge, the one calling it too (FailedPrecondition there);
// the callback updates merge buffer param(i) in place.
#ifndef PSTRAIN_NN_DEVICE_GROUP_H_
#define PSTRAIN_NN_DEVICE_GROUP_H_

#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "common/gradient_compression.h"
#include "common/mutex.h"
#include "common/status.h"
#include "nn/executor.h"
#include "nn/model_params.h"

namespace pstrain {

enum class MergeDevice { kLocal, kDevice };

struct DeviceGroupOptions {
  // The whole batch of one step, split over the devices.
  int batch_size = 1;
  // One entry per device (BackendOptions::device, kernels, threads, ...).
  std::vector<BackendOptions> devices = {BackendOptions()};
  // Relative work of each device (empty: equal). The batch is split as MXNet
  // does: round(w_d / sum(w) * batch) each, the last takes the rest; every
  // share must be at least 1.
  std::vector<double> weights;
  MergeDevice merge = MergeDevice::kLocal;
  bool for_training = true;
  uint64_t seed = 1;  // dropout masks: device d uses seed + d
  bool profile = false;
  // 2-bit: every device's gradient is quantized before the merge (see above).
  GradientCompression compression;
};

// The number of examples each device gets (MXNet's _split_input_slice).
// InvalidArgument when the weights are not positive, their count is not the
// device count, or a device would get no example.
StatusOr<std::vector<int>> SplitBatch(int batch_size, int num_devices,
                                      const std::vector<double>& weights);

class DeviceGroup : public ModelParams {
 public:
  // The errors of SplitBatch and of Executor::Create for each device (with
  // ResourceExhausted when a device's share does not fit its memory, or the
  // merge's buffers do not: the device merge's scratch on device 0, the local
  // merge's host or pinned buffers), InvalidArgument for no device or devices
  // of different kinds, and Unimplemented for gradient compression on a
  // device the host cannot address.
  static StatusOr<std::unique_ptr<DeviceGroup>> Create(const Graph& graph,
                                                       const DeviceGroupOptions& options);
  ~DeviceGroup() override;

  // Once per parameter and step; see the class comment.
  void SetGradReadyCallback(std::function<void(int param_index)> fn) {
    on_grad_ready_ = std::move(fn);
  }
  void SetParamNeededCallback(std::function<void(int param_index)> fn) {
    on_param_needed_ = std::move(fn);
  }
  // Dropout masks from now on: device d draws from seed + d (as
  // options.seed at first). Between steps only.
  void Reseed(uint64_t seed);

  void Forward(bool is_train);
  void Backward();
  // Returns when every merge Backward started has finished, its grad-ready
  // callback included (at once when merges are synchronous). Call before
  // reading the merge buffers or the callbacks' state after a step.
  void Drain();
  // The first error of a merge since the last call (then cleared): a
  // device's gradient download that did not finish within
  // kDeviceWaitTimeout (DeadlineExceeded naming the device and parameter).
  // That merge and the later ones skip their sum and grad-ready callback, so
  // the caller must stop. Ok when merges are synchronous.
  Status TakeError();
  // MXNet's "sync aux params across devices" at an epoch's end (BaseModule.fit
  // calls get_params, which averages each aux state over the devices, then
  // set_params): every device's aux states (BatchNorm's moving statistics,
  // each folded from its own share of the batches) replaced by their mean.
  // Before checkpoints and validation; a no-op with one device.
  Status AverageAux();

  // The whole batch in host memory, split over the devices by rows.
  // InvalidArgument when n does not fit.
  Status LoadData(const float* src, size_t n);
  Status LoadLabel(const float* src, size_t n);
  // The whole batch's output, the devices' rows in order.
  Status ReadOutput(float* dst, size_t n) const;
  // The output's shape for the whole batch.
  Shape output_shape() const;
  // Mean cross-entropy over the whole batch.
  float Loss() const;

  int num_devices() const { return static_cast<int>(execs_.size()); }
  Executor& executor(int d) const { return *execs_[d]; }
  const std::vector<int>& shares() const { return shares_; }
  // Device memory held by each device's backend, and by the merge buffers'.
  std::vector<MemoryStats> memory_stats() const;

  // ---- ModelParams: the merge buffers ----
  const Graph& graph() const override { return graph_; }
  const Tensor& param(int i) const override { return merge_param_[i]; }
  const Tensor& grad(int i) const override { return merge_grad_[i]; }
  Backend& backend() const override { return *merge_backend_; }
  Status ReadParam(int i, float* dst, size_t n) const override;
  Status WriteParam(int i, const float* src, size_t n) override;
  Status ReadGrad(int i, float* dst, size_t n) const override;
  Status ReadAux(int i, float* dst, size_t n) const override;
  Status WriteAux(int i, const float* src, size_t n) override;
  float* host_param(int i) const override;
  float* host_grad(int i) const override;

 private:
  DeviceGroup(const Graph& graph, const DeviceGroupOptions& options);
  Status Init();
  // Sums parameter i's gradients into the merge buffer.
  void Merge(int i);
  // Copies the merge buffer's parameter i to every device that needs it.
  void Broadcast(int i);
  // kLocal from GPUs (async_merge_): the grad-ready step of device d's
  // parameter p on the caller's thread, the merge thread, and the wait for p's merge.
  void EnqueueDownload(int d, int p);
  void MergeLoop();
  void WaitMerged(int p);
  // Whether device d's param/grad tensors are the merge buffers themselves.
  bool SharesMerge(int d) const { return d == 0 && !separate_merge_; }

  const Graph graph_;
  const DeviceGroupOptions options_;
  std::vector<int> shares_;
  std::vector<std::unique_ptr<Executor>> execs_;
  // kLocal with a device backend: a CPU backend of its own; kDevice or one
  // host device: the first executor's.
  std::unique_ptr<Backend> own_merge_backend_;
  Backend* merge_backend_ = nullptr;
  bool separate_merge_ = false;
  bool async_merge_ = false;  // kLocal from devices the host cannot address
  std::vector<Tensor> merge_param_, merge_grad_;
  // kDevice between GPUs: room for the largest parameter on the first device.
  std::shared_ptr<Buffer> peer_grad_scratch_;
  // async_merge_: per device (from 1), per param, a pinned gradient (device 0
  // downloads into merge_grad_, pinned too, as is merge_param_).
  std::vector<std::vector<Tensor>> pinned_grad_;
  // async_merge_, per param: the fences of the devices' downloads so far
  // (the caller's thread only, until handed to the merge thread).
  std::vector<std::vector<std::unique_ptr<Fence>>> grad_fences_;
  struct MergeJob {
    int param = 0;
    std::vector<std::unique_ptr<Fence>> fences;
  };
  Mutex mu_;
  CondVar cv_{&mu_};  // jobs_, merging_ or stop_ changed
  std::deque<MergeJob> jobs_ GUARDED_BY(mu_);
  std::vector<char> merging_ GUARDED_BY(mu_);  // per param: a job queued or running
  int in_flight_ GUARDED_BY(mu_) = 0;          // jobs queued or running
  bool stop_ GUARDED_BY(mu_) = false;
  Status error_ GUARDED_BY(mu_);         // TakeError's
  bool failed_ GUARDED_BY(mu_) = false;  // a fence wait failed: later jobs skip theirs (sticky)
  std::thread merger_;
  // Per param, the caller's thread only: devices whose gradient is complete,
  // and whether devices hold an older value.
  std::vector<int> grads_in_;
  std::vector<bool> stale_;
  // Gradient compression: per device, per param, the residual (empty until used).
  std::vector<std::vector<std::vector<float>>> residuals_;
  std::function<void(int)> on_grad_ready_;
  std::function<void(int)> on_param_needed_;
};

}  // namespace pstrain

#endif  // PSTRAIN_NN_DEVICE_GROUP_H_
