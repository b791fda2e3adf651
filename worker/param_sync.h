// ParamSync: the seam between the training loop and whatever keeps the
// parameters (the local optimizer now; the parameter-server KV client in dist
// modes).
//
// Per step, the executor drives it from its own thread:
//   Backward fires OnGradReady(i) the moment parameter i's gradient is complete
//   (last layer first): a sync may start pushing it at once;
//   the next Forward calls WaitParam(i) just before the first node that reads
//   parameter i: a sync blocks there until i's new weights are in place, so
//   the first layers compute while later layers' pulls are still in flight.
//
// Threads: WaitParam, TakeError, Drain and the rest come from the training
// loop's thread. OnGradReady comes from that thread too, or, with several
// GPUs summed on the host (a DeviceGroup's kLocal merge), from the group's
// merge thread: one call at a time, and OnGradReady(i) returns before the
// WaitParam(i) that follows it is called (the group waits for it). So a sync
// keeps what OnGradReady and TakeError share (the recorded error, tickets of
// other parameters) under a lock. The loop calls DeviceGroup::Drain before
// Drain here, so that no OnGradReady is running or due then.
//
// Errors (a dead server, a deadline) cannot be returned through the executor's
// callbacks, so a sync records the first one and reports it from
// TakeError(), which the loop checks after every Forward and Backward (an
// error of a merge still running then is reported by a later call).
#ifndef PSTRAIN_WORKER_PARAM_SYNC_H_
#define PSTRAIN_WORKER_PARAM_SYNC_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "nn/model_params.h"
#include "nn/optimizer.h"
#include "proto/optimizer.pb.h"
#include "worker/checkpoint.h"

namespace pstrain {

// MXNet 1.x's weight-decay multiplier for a parameter: 1 for names ending in
// `_weight` or `_gamma`, 0 for the rest (biases, beta). Every ParamSync uses it.
float WeightDecayMult(const std::string& param_name);

class ParamSync {
 public:
  virtual ~ParamSync() = default;

  // Binds to `params` (an executor, or a device group's merge buffers; not
  // owned; outlives this object) after they are initialized or loaded. A dist
  // sync pushes rank 0's initial values here.
  virtual Status Init(ModelParams* params) = 0;
  // During Backward (executor thread, or a device group's merge thread; see
  // above): grad(i) is complete and param(i) is no longer read by this Backward.
  virtual void OnGradReady(int param_index) = 0;
  // Executor thread, during Forward: returns when param(i) holds the weights
  // after every update this worker's earlier gradients caused.
  virtual void WaitParam(int param_index) = 0;
  // The first error since the last call (then cleared); ok if none.
  virtual Status TakeError() = 0;
  // Returns when every exchange started by OnGradReady has finished, so that
  // every param(i) holds its newest weights (before a checkpoint, at the end),
  // with the first error not taken yet (then cleared), as TakeError.
  virtual Status Drain() = 0;

  // Optimizer state for checkpoints: arrays of kind kOptimizerState named
  // "<param>_<slot>" (Optimizer::SlotNames: "_momentum", Adam's "_mean" and
  // "_var", ...), for Adam "<param>_updates", the update count its bias
  // correction reads, and "__optimizer_<Optimizer::SlotLayoutName>", which
  // says whose they are. A sync whose state lives elsewhere returns none.
  virtual std::vector<NamedArray> SaveState() const = 0;
  // Restores what SaveState wrote. InvalidArgument naming the array on a
  // name or size mismatch, another optimizer's state, or a parameter's state
  // missing one of its arrays.
  virtual Status LoadState(const std::vector<NamedArray>& arrays) = 0;
};

// `--kv-store local` and `device` in one process: the optimizer is applied in
// OnGradReady, right when each gradient is ready (on the executor's thread, or
// on a device group's merge thread for GPUs summed on the host), so WaitParam
// never waits. On the CPU it updates the weights in place in host
// memory; on a GPU the backend applies the same arithmetic on the device, in
// stream order after the gradient (the optimizer's state stays on the device
// too).
// MXNet's 1.x weight-decay rule: only parameters named *_weight or *_gamma
// are decayed.
class LocalParamSync : public ParamSync {
 public:
  // InvalidArgument for a bad optimizer config.
  static StatusOr<std::unique_ptr<LocalParamSync>> Create(const OptimizerConfig& cfg);

  Status Init(ModelParams* params) override;
  void OnGradReady(int param_index) override;
  void WaitParam(int param_index) override {}
  // A gradient or update with NaN or Inf, found in the update's pass: on the
  // CPU at once; on a device by the update kernel, read here without waiting
  // for it (Backend::TakeStepCheck), so in the step loop, whose output read
  // waits for the device, by the call after the next Forward at the latest.
  Status TakeError() override;
  // Host updates finish in OnGradReady; a device's are waited for here. An
  // error of the last ones (a device group's merge after the loop's last
  // TakeError, a device's last step) is all there is left.
  Status Drain() override;
  std::vector<NamedArray> SaveState() const override;
  Status LoadState(const std::vector<NamedArray>& arrays) override;

  const Optimizer& optimizer() const { return *optimizer_; }

 private:
  explicit LocalParamSync(std::unique_ptr<Optimizer> opt) : optimizer_(std::move(opt)) {}
  // Records the first error: parameter i's gradient, or the weights its update
  // wrote, held NaN or Inf.
  void NoteNonFinite(int i, bool bad_grad) EXCLUDES(mu_);
  // The device backend's check of its updates so far, into the error.
  void TakeDeviceCheck() EXCLUDES(mu_);

  std::unique_ptr<Optimizer> optimizer_;
  ModelParams* exec_ = nullptr;
  std::vector<ParamState> states_;  // slots here on the CPU
  // On a device backend with an optimizer that keeps state: per parameter,
  // its slots back to back, a view into one buffer allocated by Init (empty
  // otherwise).
  std::vector<Tensor> device_state_;
  // Whether an update ran on the device backend (its check is to be taken).
  std::atomic<bool> device_updates_{false};
  Mutex mu_;
  Status error_ GUARDED_BY(mu_);
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_PARAM_SYNC_H_
