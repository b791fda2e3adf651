// Trainer: MXNet fit.py's loop for one worker (mxnet_facts.md 3.3, 3.5).
//
// Per epoch e (0-based, from --load-epoch): reset the training reader, run
// epoch_size = ceil(floor(N / W) / batch) batches (resetting the reader if it
// runs out first, so every worker runs the same number of batches), each one
// forward -> backward, with parameters exchanged through a ParamSync (gradient
// i handed over the moment Backward completes it; the next Forward waits for
// parameter i only before its first use). A Speedometer logs every
// --disp-batches batches and resets the metrics (MXNet's auto_reset), then per
// epoch: Train-<metric>, Time cost, the checkpoint (every --save-period
// epochs), and Validation-<metric> over the whole validation reader.
//
// --test-io 1 only iterates the training reader once and logs its speed.
//
// --emulate-compute S: no executor and no reader; the model's arrays live in a
// HostParams and each batch is a ComputeEmulator step of S x --time-dilation
// seconds driving the same ParamSync. Per epoch only the Speedometer (without
// metrics), Time cost (both divided by the dilation) and no Train-/Validation-
// lines: there is nothing real to measure accuracy on.
//
// Threads: Run() on one thread; the ParamSync callbacks run on it too.
#ifndef PSTRAIN_WORKER_TRAINER_H_
#define PSTRAIN_WORKER_TRAINER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "models/models.h"
#include "nn/device_group.h"
#include "nn/graph.h"
#include "nn/host_params.h"
#include "nn/initializer.h"
#include "proto/optimizer.pb.h"
#include "proto/train_config.pb.h"
#include "worker/compute_emulator.h"
#include "worker/param_sync.h"
#include "worker/train_data.h"
#include "worker/train_log.h"

namespace pstrain {

// The devices of a training step as `train` makes them from its config: the
// batch split over --gpus by --gpu-weights (the CPU without --gpus), each
// with --num-threads, --gpu-tf32 and --gpu-conv-graph; the merge where MXNet
// sums (`device` and `dist_device_sync` on the first GPU, the rest on the
// CPU); `device`'s 2-bit compression. `summary --gpus` measures the same.
// The flags' errors (ParseTrainingDevices, ParseGradientCompression).
StatusOr<DeviceGroupOptions> TrainingDeviceGroupOptions(const TrainConfig& cfg);

// The initializer --initializer names ("default": fit.py's
// Xavier(rnd_type='gaussian', factor_type='in', magnitude=2)); its error
// names the flag.
StatusOr<InitializerSpec> InitializerFromConfig(const TrainConfig& cfg);

// What the process around the trainer provides.
struct TrainerEnv {
  int rank = 0;
  int num_workers = 1;
  TrainLog* log = nullptr;  // REQUIRED; not owned
  // Builds the network (REQUIRED; `pstrain train` passes models/ BuildModel).
  // Called with the data set's image shape and class count.
  std::function<StatusOr<Graph>(const ModelOptions&)> build_model;
  // Creates the parameter sync for the config's kv_store from the optimizer
  // config fit.py would build. Empty: LocalParamSync, which serves `local` and
  // `device`; other kv_stores then fail with FailedPrecondition.
  std::function<StatusOr<std::unique_ptr<ParamSync>>(const OptimizerConfig&)> make_sync;
  // Opens this worker's readers. Empty: OpenTrainData (MNIST, CIFAR-10 binary,
  // synthetic); `pstrain train` sets it for RecordIO images (--data-train *.rec).
  std::function<StatusOr<TrainData>(int rank, int num_workers)> open_data;
  // Tests: changes the devices TrainingDeviceGroupOptions made from the config
  // (the CPU listed several times, or playing a device the host cannot
  // address: BackendOptions::cpu_as_device), so the paths written for GPUs run
  // through the whole loop without one.
  std::function<void(DeviceGroupOptions*)> adjust_devices;
};

struct EpochResult {
  int epoch = 0;
  MetricValues train;  // since the last Speedometer reset, as MXNet prints it
  MetricValues val;    // empty without a validation set
  double seconds = 0;
  int64_t samples = 0;  // training examples processed (batches * batch size)
};

class Trainer {
 public:
  // Validates the config, opens the data, builds the model and its executor,
  // initializes (or, with --load-epoch, loads) the parameters.
  static StatusOr<std::unique_ptr<Trainer>> Create(const TrainConfig& cfg, TrainerEnv env);
  ~Trainer();

  // Trains epochs [load_epoch, num_epochs), or runs --test-io.
  Status Run();

  const std::vector<EpochResult>& history() const { return history_; }
  // Examples per second over the whole --test-io pass (0 before Run).
  double test_io_speed() const { return test_io_speed_; }
  // The worker's devices: one executor per device, the merge buffers as params.
  // REQUIRES: compute is not emulated.
  const DeviceGroup& devices() const { return *exec_; }
  // What the parameter sync exchanges: devices(), or the emulation's arrays.
  const ModelParams& params() const { return *params_; }
  // The emulated step (--emulate-compute), else null.
  const ComputeEmulator* emulator() const { return emulator_.get(); }
  int64_t epoch_size() const { return epoch_size_; }

 private:
  Trainer(const TrainConfig& cfg, TrainerEnv env);
  Status Init();
  Status RunTestIo();
  Status TrainEpoch(int epoch);
  // The executors of real compute, or (--emulate-compute) the host arrays
  // and the emulated step; both set params_.
  Status InitDevices();
  Status InitEmulated();
  Status TrainEpochEmulated(int epoch);
  Status Validate(int epoch, EpochResult* result);
  Status SaveCheckpoint(int epoch_done);
  // Loads the parameters and aux states of epoch `epoch`; its optimizer
  // state arrays go to *states (from the .params, or an older checkpoint's
  // .states file; none: empty).
  Status LoadCheckpoint(int epoch, std::vector<NamedArray>* states);
  // The prefix a resumed run loads epoch `epoch` from: rank r > 0 its own
  // prefix-<r> when that checkpoint exists (fit.py's _load_model), else the prefix.
  std::string LoadPrefix(int epoch) const;
  // Checks the batch's labels (classes of the network's output; an error
  // names `from` and the example) and copies it to the devices.
  Status CopyBatchIn(const Batch& batch, const DataIter& from);
  // The output of the last Forward, copied to host memory.
  const float* Output();
  Status NextTrainBatch(Batch* batch);

  TrainConfig cfg_;
  TrainerEnv env_;
  TrainData data_;
  Graph graph_;
  std::unique_ptr<DeviceGroup> exec_;          // real compute
  std::unique_ptr<HostParams> host_params_;    // emulated compute
  std::unique_ptr<ComputeEmulator> emulator_;  // emulated compute
  ModelParams* params_ = nullptr;              // exec_ or host_params_
  std::unique_ptr<ParamSync> sync_;
  int64_t epoch_size_ = 0;
  int num_classes_ = 0;
  std::vector<float> output_host_;
  std::vector<EpochResult> history_;
  double test_io_speed_ = 0;
};

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_TRAINER_H_
