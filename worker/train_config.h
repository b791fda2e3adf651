// The training job config (proto/train_config.proto): reading it from a text
// file, overriding fields from command-line flags, validating it, and deriving
// the optimizer config from it the way MXNet's fit.py does.
#ifndef PSTRAIN_WORKER_TRAIN_CONFIG_H_
#define PSTRAIN_WORKER_TRAIN_CONFIG_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/gradient_compression.h"
#include "common/status.h"
#include "proto/optimizer.pb.h"
#include "proto/train_config.pb.h"

namespace pstrain {

inline constexpr int kTrainConfigVersion = 1;

// Parses a protobuf text file. NotFound / IOError for the file, InvalidArgument
// naming file:line:column for a syntax error or unknown field, and for a
// version newer than kTrainConfigVersion.
StatusOr<TrainConfig> ReadTrainConfigFile(const std::string& path);
StatusOr<TrainConfig> ParseTrainConfigText(const std::string& text, const std::string& source);

// Sets each named field from its text value, in order (later wins). Names are
// field names ("num_epochs"; dashes are accepted). InvalidArgument naming the
// flag for an unknown name or a value that does not parse as the field's type.
Status ApplyConfigOverrides(const std::vector<std::pair<std::string, std::string>>& values,
                            TrainConfig* cfg);

// Checks ranges and names: positive batch size, epochs, disp_batches; known
// optimizer and kv_store; image_shape, lr_step_epochs and gpus parse; a network
// unless test_io; a data_dir unless benchmark (or EmulationNeedsNoData);
// load_epoch needs model_prefix; emulate_compute, when set, > 0 and without
// test_io, gpus or model_prefix; time_dilation >= 1, and 1 unless emulating.
Status ValidateTrainConfig(const TrainConfig& cfg);

// Whether `train` may leave the data unopened: compute is emulated
// (--emulate-compute) and the flags give what the data would, the image shape
// and the number of examples (the classes default to 10, as the data sets').
bool EmulationNeedsNoData(const TrainConfig& cfg);

// The devices this worker trains on: --gpus as ordinals ({} for the CPU),
// their --gpu-weights ({} for equal shares) and the GPU backend's switches.
// InvalidArgument for a list that does not parse, a negative ordinal, weights
// that are not positive or not one per GPU, a switch other than 0 or 1.
// Whether the GPUs exist is the backend's to say.
struct TrainingDevices {
  std::vector<int> gpus;
  std::vector<double> weights;
  bool tf32 = true;        // --gpu-tf32
  bool conv_graph = true;  // --gpu-conv-graph
};
StatusOr<TrainingDevices> ParseTrainingDevices(const TrainConfig& cfg);

// InvalidArgument unless kv is local, device, dist_sync, dist_async or dist_device_sync.
Status ValidateKvStore(const std::string& kv);

// "1,28,28" -> {1, 28, 28}; "" -> {}. InvalidArgument naming `what` otherwise.
StatusOr<std::vector<int64_t>> ParseIntList(const std::string& text, const std::string& what);

// Every field with its effective value (set or default), one "name: value" per
// line in field order: what `train` logs at start.
std::string EffectiveConfigText(const TrainConfig& cfg);

// Batches per epoch per worker, as MXNet: ceil(floor(num_examples / num_workers) / batch).
int64_t EpochSize(int64_t num_examples, int num_workers, int64_t batch_size);

// The optimizer config fit.py builds: SGD with lr, mom, wd, clip; rescale_grad
// = 1 / (batch_size * (num_workers if dist_sync else 1)); when lr_factor < 1
// and lr_step_epochs are given, a multi-factor schedule whose steps are
// epoch_size * (e - begin_epoch) for the epochs after begin_epoch = load_epoch,
// with the lr already decayed for the steps before it.
StatusOr<OptimizerConfig> MakeOptimizerConfig(const TrainConfig& cfg, int64_t epoch_size,
                                              int num_workers);

// What `train` tells worker rank 0 of a dist_async job whose momentum may
// stop it from learning, or "" when nothing. Each async push is applied at
// once to weights the other workers moved since this one pulled: that
// staleness acts as momentum of about 1 - 1/W on top of --mom
// (apache/mxnet#5287). LeNet on 4 workers stays at chance with fit.py's 0.9
// (a sum of 1.65) and learns with 0.5 or 0, as it does on 2 with 0.9 (1.4):
// bench/RESULTS.md, "dist_async and momentum". Said from 3 workers on, when
// the sum passes 1.5, for the optimizers --mom reaches (sgd, nag).
std::string DistAsyncMomentumHint(const TrainConfig& cfg, int num_workers);

}  // namespace pstrain

#endif  // PSTRAIN_WORKER_TRAIN_CONFIG_H_
