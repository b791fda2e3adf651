#include "tools/fit_flags.h"

#include <gflags/gflags.h>

#include <string>
#include <utility>
#include <vector>

#include "models/models.h"
#include "worker/train_config.h"

// Names and defaults equal the TrainConfig fields (fit_flags_test checks it).
DEFINE_string(config, "", "protobuf text file with TrainConfig fields; flags given override it");
DEFINE_string(network, "", "the network: mlp, lenet, resnet, inception-bn, ... (required)");
DEFINE_int32(num_layers, 0,
             "number of layers (resnet); 0: the network's default (resnet: 110 for images up "
             "to 32 high, else 50, as MXNet's scripts)");
DEFINE_string(image_shape, "", "C,H,W of the input images; empty: the data set's");
DEFINE_int32(num_classes, 0, "number of classes; 0: the data set's (10)");
DEFINE_string(
    initializer, "default",
    "default (Xavier(gaussian,in,2)), xavier(rnd,factor,magnitude), uniform(s), normal(s)");
DEFINE_string(data_dir, "", "directory with MNIST idx files or CIFAR-10 binary batches");
DEFINE_string(dataset, "",
              "mnist or cifar10 (or a manifest file): found in $PSTRAIN_DATA/<name>, "
              "datasets/<name> or ../shared/data/<name>, else fetched (into --data-dir if given)");
DEFINE_int64(num_examples, 0, "training examples per epoch over all workers; 0: all");
DEFINE_int32(benchmark, 0, "1: train on synthetic data of --image-shape");
DEFINE_int32(test_io, 0, "1: only read the training data and log its speed");
DEFINE_uint64(seed, 0, "seed of shuffling and initialization");
DEFINE_int32(shuffle_train, 1,
             "1: each pass over the training data in a new seeded order; 0: the file's order "
             "every pass (MXNet's ImageRecordIter without shuffle)");
DEFINE_int32(num_epochs, 100, "max number of epochs");
DEFINE_int32(batch_size, 128, "batch size per worker");
DEFINE_string(optimizer, "sgd",
              "the optimizer, MXNet's of that name: sgd, nag (both take --mom), adam, rmsprop, "
              "adagrad (their own constants at MXNet's defaults)");
DEFINE_double(
    lr, 0.05,
    "initial learning rate (MXNet train_mnist.py and train_cifar10.py: 0.05; fit.py: 0.1)");
DEFINE_double(lr_factor, 0.1, "multiply the learning rate by this at each of --lr-step-epochs");
DEFINE_string(lr_step_epochs, "", "epochs at which the learning rate drops, e.g. 30,60");
DEFINE_double(mom, 0.9, "momentum of sgd and nag (the other optimizers ignore it, as fit.py)");
DEFINE_double(wd, 0.0001, "weight decay (applied to *_weight and *_gamma)");
DEFINE_double(clip_gradient, -1, "clip each rescaled gradient to [-c, c]; <= 0: off");
DEFINE_int32(disp_batches, 20, "log speed and metrics every this many batches");
DEFINE_int32(top_k, 0, "also report top-k accuracy (top_k_accuracy_<k>) for k > 1; 0: none");
DEFINE_string(model_prefix, "", "save parameters to <prefix>-%04d.params every --save-period");
DEFINE_int32(save_period, 1, "epochs between checkpoints");
DEFINE_int32(load_epoch, 0, "resume from <prefix>-%04d.params of this epoch");
DEFINE_string(kv_store, "device", "local, device, dist_sync, dist_async, dist_device_sync");
DEFINE_string(gpus, "", "GPUs to use, e.g. 0,1 (the same GPU may be listed twice); empty: the CPU");
DEFINE_string(gpu_weights, "", "relative work of each --gpus entry, e.g. 3,1; empty: equal");
DEFINE_int32(gpu_tf32, 1,
             "1: cuDNN convolutions may use TF32 tensor cores (as PyTorch's); 0: full float");
DEFINE_int32(gpu_conv_graph, 1,
             "1: time cuDNN's graph-API engines beside its legacy algorithms for each "
             "convolution and run the faster; 0: the legacy algorithms alone");
DEFINE_int32(num_threads, 0,
             "CPU threads of the kernels; 0: OpenMP's default (OMP_NUM_THREADS, which the local "
             "launcher sets to cores / workers; else all cores)");
DEFINE_double(emulate_compute, 0,
              "seconds of emulated compute per batch (> 0): no data is read and nothing is "
              "computed, each batch waits this long and pushes gradients of the model's shapes "
              "at the points of its backward; unset: real compute");
DEFINE_double(time_dilation, 1,
              "with --emulate-compute: waits last K times longer and reported times are divided "
              "by K (for links shaped K times slower); >= 1");
DEFINE_string(gc_type, "none",
              "gradient compression: none or 2bit (MXNet's; --kv-store device or dist_*)");
DEFINE_double(gc_threshold, 0.5, "threshold t of 2bit compression: pushes send +-t or 0");

namespace pstrain {

bool IsFitFlag(const std::string& name, const std::string& file) {
  const std::string me = "fit_flags.cc";
  // The RecordIO paths are fields of the job config too (image_flags.cc defines the flags).
  if (name == "data_train" || name == "data_val") return true;
  return file.size() >= me.size() && file.compare(file.size() - me.size(), me.size(), me) == 0;
}

StatusOr<TrainConfig> MergedConfigFromFlags() {
  TrainConfig cfg;
  if (!FLAGS_config.empty()) {
    ASSIGN_OR_RETURN(cfg, ReadTrainConfigFile(FLAGS_config));
  }
  std::vector<std::pair<std::string, std::string>> given;
  std::vector<gflags::CommandLineFlagInfo> flags;
  gflags::GetAllFlags(&flags);
  for (const auto& f : flags) {
    if (!IsFitFlag(f.name, f.filename) || f.name == "config" || f.is_default) continue;
    given.emplace_back(f.name, f.current_value);
  }
  RETURN_IF_ERROR(ApplyConfigOverrides(given, &cfg));
  return cfg;
}

StatusOr<TrainConfig> TrainConfigFromFlags() {
  ASSIGN_OR_RETURN(TrainConfig cfg, MergedConfigFromFlags());
  RETURN_IF_ERROR(ValidateTrainConfig(cfg));
  return cfg;
}

StatusOr<Graph> ModelFromConfig(const TrainConfig& cfg) {
  if (cfg.network().empty()) {
    return Status::InvalidArgument("--network (or network: in the --config file) is required");
  }
  auto dims = ParseIntList(cfg.image_shape(), "--image-shape");
  if (!dims.ok() || (!dims->empty() && dims->size() != 3)) {
    return Status::InvalidArgument(StrCat("--image-shape='", cfg.image_shape(), "' must be C,H,W"));
  }
  ModelOptions mo;
  mo.name = cfg.network();
  mo.num_layers = cfg.num_layers();
  mo.image_shape = Shape(*dims);
  mo.num_classes = cfg.num_classes();
  return BuildModel(mo);
}

}  // namespace pstrain
