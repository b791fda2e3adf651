#include "worker/train_config.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "nn/optimizer.h"

namespace pstrain {

namespace pb = google::protobuf;

namespace {

class ErrorCollector : public pb::io::ErrorCollector {
 public:
  explicit ErrorCollector(std::string source) : source_(std::move(source)) {}
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (first_.empty()) first_ = StrCat(source_, ":", line + 1, ":", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string source_;
  std::string first_;
};

bool ParseInt64(const std::string& s, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

bool ParseUint64(const std::string& s, uint64_t* out) {
  if (s.empty() || s[0] < '0' || s[0] > '9') return false;  // no sign, no spaces
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = v;
  return true;
}

bool ParseDouble(const std::string& s, double* out) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (s.empty() || errno != 0 || *end != '\0' || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

// --emulate-compute and --time-dilation: their values, and the flags that
// make no sense when nothing is computed.
Status ValidateEmulation(const TrainConfig& cfg) {
  if (cfg.has_emulate_compute() &&
      !(cfg.emulate_compute() > 0 && std::isfinite(cfg.emulate_compute()))) {
    return Status::InvalidArgument(StrCat("--emulate-compute=", cfg.emulate_compute(),
                                          " must be a number of seconds per batch > 0"));
  }
  if (!(cfg.time_dilation() >= 1 && std::isfinite(cfg.time_dilation()))) {
    return Status::InvalidArgument(
        StrCat("--time-dilation=", cfg.time_dilation(), " must be a factor >= 1 (1: no dilation)"));
  }
  if (!cfg.has_emulate_compute()) {
    if (cfg.time_dilation() != 1) {
      return Status::InvalidArgument(
          StrCat("--time-dilation=", cfg.time_dilation(),
                 " needs --emulate-compute: it stretches emulated compute, not real compute"));
    }
    return Status::Ok();
  }
  const std::string emulating = StrCat("--emulate-compute=", cfg.emulate_compute());
  if (cfg.test_io() != 0) {
    return Status::InvalidArgument(
        StrCat(emulating, " reads no data: it cannot be combined with --test-io"));
  }
  if (!cfg.gpus().empty()) {
    return Status::InvalidArgument(StrCat(
        emulating, " computes on no device: it cannot be combined with --gpus=", cfg.gpus()));
  }
  if (!cfg.model_prefix().empty()) {
    return Status::InvalidArgument(
        StrCat(emulating,
               " trains no real weights: it cannot be combined with --model-prefix (checkpoints)"));
  }
  return Status::Ok();
}

}  // namespace

bool EmulationNeedsNoData(const TrainConfig& cfg) {
  return cfg.emulate_compute() > 0 && !cfg.image_shape().empty() && cfg.num_examples() > 0;
}

StatusOr<TrainConfig> ParseTrainConfigText(const std::string& text, const std::string& source) {
  TrainConfig cfg;
  ErrorCollector errors(source);
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text, &cfg)) {
    return Status::InvalidArgument(errors.first().empty() ? source + ": cannot parse config"
                                                          : errors.first());
  }
  if (cfg.version() < 1 || cfg.version() > kTrainConfigVersion) {
    return Status::InvalidArgument(StrCat(source, ": config version ", cfg.version(),
                                          " is not supported (this build reads 1..",
                                          kTrainConfigVersion, ")"));
  }
  return cfg;
}

StatusOr<TrainConfig> ReadTrainConfigFile(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return Status::InvalidArgument(StrCat("config file ", path, " is a directory"));
  }
  std::ifstream in(path);
  if (!in) return Status::NotFound(StrCat("config file ", path, " cannot be opened"));
  std::stringstream text;
  text << in.rdbuf();
  if (in.bad()) return Status::IOError(StrCat("config file ", path, ": read error"));
  return ParseTrainConfigText(text.str(), path);
}

Status ApplyConfigOverrides(const std::vector<std::pair<std::string, std::string>>& values,
                            TrainConfig* cfg) {
  const pb::Descriptor* desc = cfg->GetDescriptor();
  const pb::Reflection* refl = cfg->GetReflection();
  for (const auto& entry : values) {
    const std::string& raw_name = entry.first;
    const std::string& value = entry.second;
    std::string name = raw_name;
    for (char& c : name) {
      if (c == '-') c = '_';
    }
    // Errors name the flag as MXNet spells it, whichever way it came.
    std::string flag = raw_name;
    for (char& c : flag) {
      if (c == '_') c = '-';
    }
    const pb::FieldDescriptor* f = desc->FindFieldByName(name);
    if (f == nullptr || f->is_repeated()) {
      return Status::InvalidArgument(StrCat("--", flag, " is not a training config field"));
    }
    auto bad = [&](const char* type) {
      return Status::InvalidArgument(StrCat("--", flag, "='", value, "' is not ", type));
    };
    int64_t i = 0;
    double d = 0;
    switch (f->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_STRING:
        refl->SetString(cfg, f, value);
        break;
      case pb::FieldDescriptor::CPPTYPE_INT32:
        if (!ParseInt64(value, &i) || i < INT32_MIN || i > INT32_MAX) return bad("an integer");
        refl->SetInt32(cfg, f, static_cast<int32_t>(i));
        break;
      case pb::FieldDescriptor::CPPTYPE_INT64:
        if (!ParseInt64(value, &i)) return bad("an integer");
        refl->SetInt64(cfg, f, i);
        break;
      case pb::FieldDescriptor::CPPTYPE_UINT64: {
        uint64_t u = 0;
        if (!ParseUint64(value, &u)) return bad("a non-negative integer below 2^64");
        refl->SetUInt64(cfg, f, u);
        break;
      }
      case pb::FieldDescriptor::CPPTYPE_FLOAT:
        if (!ParseDouble(value, &d)) return bad("a number");
        refl->SetFloat(cfg, f, static_cast<float>(d));
        break;
      case pb::FieldDescriptor::CPPTYPE_DOUBLE:
        if (!ParseDouble(value, &d)) return bad("a number");
        refl->SetDouble(cfg, f, d);
        break;
      default:
        return Status::Internal(StrCat("config field ", name, " has an unsupported type"));
    }
  }
  return Status::Ok();
}

StatusOr<std::vector<int64_t>> ParseIntList(const std::string& text, const std::string& what) {
  std::vector<int64_t> out;
  if (text.empty()) return out;
  size_t start = 0;
  while (true) {
    size_t comma = text.find(',', start);
    std::string part =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    while (!part.empty() && part.front() == ' ') part.erase(part.begin());
    while (!part.empty() && part.back() == ' ') part.pop_back();
    int64_t v = 0;
    if (!ParseInt64(part, &v)) {
      return Status::InvalidArgument(StrCat(what, "='", text, "': '", part, "' is not an integer"));
    }
    out.push_back(v);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

Status ValidateKvStore(const std::string& kv) {
  if (kv != "local" && kv != "device" && kv != "dist_sync" && kv != "dist_async" &&
      kv != "dist_device_sync") {
    return Status::InvalidArgument(
        StrCat("--kv-store='", kv,
               "' is not one of local, device, dist_sync, dist_async, dist_device_sync"));
  }
  return Status::Ok();
}

StatusOr<TrainingDevices> ParseTrainingDevices(const TrainConfig& cfg) {
  TrainingDevices out;
  for (const auto& [name, value] : {std::pair<const char*, int32_t>{"gpu-tf32", cfg.gpu_tf32()},
                                    {"gpu-conv-graph", cfg.gpu_conv_graph()}}) {
    if (value != 0 && value != 1) {
      return Status::InvalidArgument(StrCat("--", name, "=", value, " must be 0 or 1"));
    }
  }
  out.tf32 = cfg.gpu_tf32() != 0;
  out.conv_graph = cfg.gpu_conv_graph() != 0;
  ASSIGN_OR_RETURN(std::vector<int64_t> gpus, ParseIntList(cfg.gpus(), "--gpus"));
  for (int64_t g : gpus) {
    if (g < 0) {
      return Status::InvalidArgument(StrCat("--gpus='", cfg.gpus(), "': GPU ", g, " is negative"));
    }
    if (g > std::numeric_limits<int>::max()) {
      return Status::InvalidArgument(
          StrCat("--gpus='", cfg.gpus(), "': GPU ", g, " is not a device number"));
    }
    out.gpus.push_back(static_cast<int>(g));
  }
  if (cfg.gpu_weights().empty()) return out;
  const std::string& text = cfg.gpu_weights();
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    const std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    char* end = nullptr;
    const double w = std::strtod(item.c_str(), &end);
    if (item.empty() || end == item.c_str() || *end != '\0' || !(w > 0) || !std::isfinite(w)) {
      return Status::InvalidArgument(
          StrCat("--gpu-weights='", text, "': '", item, "' is not a positive number"));
    }
    out.weights.push_back(w);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (out.weights.size() != std::max<size_t>(out.gpus.size(), 1)) {
    return Status::InvalidArgument(StrCat("--gpu-weights='", text, "' has ", out.weights.size(),
                                          " weights for ", out.gpus.size(), " GPUs (--gpus='",
                                          cfg.gpus(), "')"));
  }
  return out;
}

Status ValidateTrainConfig(const TrainConfig& cfg) {
  auto positive = [](const char* name, int64_t v) -> Status {
    if (v < 1) return Status::InvalidArgument(StrCat("--", name, "=", v, " must be >= 1"));
    return Status::Ok();
  };
  RETURN_IF_ERROR(positive("batch-size", cfg.batch_size()));
  RETURN_IF_ERROR(positive("num-epochs", cfg.num_epochs()));
  RETURN_IF_ERROR(positive("disp-batches", cfg.disp_batches()));
  RETURN_IF_ERROR(positive("save-period", cfg.save_period()));
  if (cfg.num_examples() < 0 || cfg.num_layers() < 0 || cfg.num_classes() < 0 || cfg.top_k() < 0 ||
      cfg.load_epoch() < 0 || cfg.num_threads() < 0) {
    return Status::InvalidArgument(
        "--num-examples, --num-layers, --num-classes, --top-k, --load-epoch and --num-threads "
        "must be >= 0");
  }
  if (cfg.top_k() == 1) {
    return Status::InvalidArgument(
        "--top-k=1: top-1 accuracy is the accuracy metric itself; give k > 1 (0: none)");
  }
  if (cfg.shuffle_train() != 0 && cfg.shuffle_train() != 1) {
    return Status::InvalidArgument(
        StrCat("--shuffle-train=", cfg.shuffle_train(), " must be 0 or 1"));
  }
  OptimizerConfig::Type opt_type;
  if (!OptimizerTypeFromName(cfg.optimizer(), &opt_type) || opt_type == OptimizerConfig::TEST) {
    return Status::InvalidArgument(StrCat("--optimizer='", cfg.optimizer(),
                                          "' is not one of sgd, nag, adam, rmsprop, adagrad"));
  }
  if (!(cfg.lr() >= 0)) return Status::InvalidArgument(StrCat("--lr=", cfg.lr(), " must be >= 0"));
  if (!(cfg.mom() >= 0 && cfg.mom() < 1)) {
    return Status::InvalidArgument(StrCat("--mom=", cfg.mom(), " must be in [0, 1)"));
  }
  if (!(cfg.wd() >= 0)) return Status::InvalidArgument(StrCat("--wd=", cfg.wd(), " must be >= 0"));
  if (!(cfg.lr_factor() > 0 && cfg.lr_factor() <= 1)) {
    return Status::InvalidArgument(StrCat("--lr-factor=", cfg.lr_factor(), " must be in (0, 1]"));
  }
  const std::string& kv = cfg.kv_store();
  RETURN_IF_ERROR(ValidateKvStore(kv));
  ASSIGN_OR_RETURN(const GradientCompression gc,
                   ParseGradientCompression(cfg.gc_type(), cfg.gc_threshold()));
  if (gc.enabled() && kv == "local") {
    // MXNet's kvstore.set_gradient_compression raises for it too.
    return Status::InvalidArgument(
        "--gc-type 2bit needs --kv-store device or dist_*: gradient compression is not "
        "supported for --kv-store local (as in MXNet)");
  }
  ASSIGN_OR_RETURN(auto shape, ParseIntList(cfg.image_shape(), "--image-shape"));
  if (!shape.empty()) {
    if (shape.size() != 3) {
      return Status::InvalidArgument(
          StrCat("--image-shape='", cfg.image_shape(), "' must be C,H,W"));
    }
    for (int64_t d : shape) {
      if (d < 1) {
        return Status::InvalidArgument(
            StrCat("--image-shape='", cfg.image_shape(), "' has a dimension < 1"));
      }
    }
  }
  ASSIGN_OR_RETURN(auto steps, ParseIntList(cfg.lr_step_epochs(), "--lr-step-epochs"));
  for (size_t i = 0; i < steps.size(); ++i) {
    if (steps[i] < 1 || (i > 0 && steps[i] <= steps[i - 1])) {
      return Status::InvalidArgument(
          StrCat("--lr-step-epochs='", cfg.lr_step_epochs(), "' must be positive and increasing"));
    }
  }
  RETURN_IF_ERROR(ParseTrainingDevices(cfg).status());
  RETURN_IF_ERROR(ValidateEmulation(cfg));
  if (cfg.test_io() == 0 && cfg.network().empty()) {
    return Status::InvalidArgument("--network is required (e.g. mlp, lenet)");
  }
  if (cfg.benchmark() == 0 && cfg.data_dir().empty() && cfg.dataset().empty() &&
      cfg.data_train().empty() && !EmulationNeedsNoData(cfg)) {
    return Status::InvalidArgument(
        "--dataset (mnist, cifar10), --data-dir (MNIST, CIFAR-10 binary) or --data-train "
        "(RecordIO) is required unless --benchmark 1 (or --emulate-compute with --image-shape "
        "and --num-examples)");
  }
  if (!cfg.dataset().empty() && !cfg.data_train().empty()) {
    return Status::InvalidArgument(StrCat("--dataset='", cfg.dataset(), "' and --data-train='",
                                          cfg.data_train(), "' name two data sets: give one"));
  }
  if (!cfg.data_val().empty() && cfg.data_train().empty()) {
    return Status::InvalidArgument(
        StrCat("--data-val='", cfg.data_val(),
               "' needs --data-train (--dataset and --data-dir bring their own validation set)"));
  }
  if (cfg.benchmark() != 0 && shape.empty()) {
    return Status::InvalidArgument("--benchmark 1 needs --image-shape C,H,W");
  }
  if (cfg.load_epoch() > 0 && cfg.model_prefix().empty()) {
    return Status::InvalidArgument("--load-epoch needs --model-prefix");
  }
  if (cfg.load_epoch() >= cfg.num_epochs()) {
    return Status::InvalidArgument(
        StrCat("--load-epoch=", cfg.load_epoch(),
               " leaves nothing to train with --num-epochs=", cfg.num_epochs()));
  }
  return Status::Ok();
}

std::string EffectiveConfigText(const TrainConfig& cfg) {
  const pb::Descriptor* desc = cfg.GetDescriptor();
  const pb::Reflection* refl = cfg.GetReflection();
  std::ostringstream out;
  for (int i = 0; i < desc->field_count(); ++i) {
    const pb::FieldDescriptor* f = desc->field(i);
    std::string value;
    pb::TextFormat::PrintFieldValueToString(cfg, f, -1, &value);
    out << f->name() << ": " << value << (refl->HasField(cfg, f) ? "" : "  # default") << "\n";
  }
  return out.str();
}

int64_t EpochSize(int64_t num_examples, int num_workers, int64_t batch_size) {
  const int64_t per_worker = num_examples / std::max(1, num_workers);
  return (per_worker + batch_size - 1) / batch_size;
}

StatusOr<OptimizerConfig> MakeOptimizerConfig(const TrainConfig& cfg, int64_t epoch_size,
                                              int num_workers) {
  OptimizerConfig opt;
  OptimizerConfig::Type type;
  if (!OptimizerTypeFromName(cfg.optimizer(), &type)) {
    return Status::InvalidArgument(StrCat("--optimizer='", cfg.optimizer(), "' is unknown"));
  }
  opt.set_type(type);
  // fit.py passes --mom to sgd and nag only (the others take none).
  if (type == OptimizerConfig::SGD || type == OptimizerConfig::NAG) opt.set_momentum(cfg.mom());
  opt.set_wd(cfg.wd());
  opt.set_clip_gradient(cfg.clip_gradient());
  // MXNet 1.x: the type contains "dist" and "_sync" ("dist_async" contains "sync" too).
  const bool sync = cfg.kv_store().find("dist") != std::string::npos &&
                    cfg.kv_store().find("_sync") != std::string::npos;
  opt.set_rescale_grad(1.0f / (static_cast<float>(cfg.batch_size()) * (sync ? num_workers : 1)));
  ASSIGN_OR_RETURN(auto step_epochs, ParseIntList(cfg.lr_step_epochs(), "--lr-step-epochs"));
  double lr = cfg.lr();
  if (cfg.lr_factor() < 1 && !step_epochs.empty()) {
    LrSchedulerConfig* sched = opt.mutable_lr_scheduler();
    const int64_t begin = cfg.load_epoch();
    for (int64_t e : step_epochs) {
      if (begin >= e) lr *= cfg.lr_factor();
    }
    for (int64_t e : step_epochs) {
      if (e - begin > 0) sched->add_steps(epoch_size * (e - begin));
    }
    if (sched->steps_size() > 0) {
      sched->set_type(LrSchedulerConfig::MULTI_FACTOR);
      sched->set_factor(cfg.lr_factor());
    } else {
      opt.clear_lr_scheduler();
    }
  }
  opt.set_learning_rate(static_cast<float>(lr));
  return opt;
}

std::string DistAsyncMomentumHint(const TrainConfig& cfg, int num_workers) {
  if (cfg.kv_store().find("async") == std::string::npos || num_workers < 3) return "";
  OptimizerConfig::Type type = OptimizerConfig::SGD;
  if (!OptimizerTypeFromName(cfg.optimizer(), &type)) return "";
  if (type != OptimizerConfig::SGD && type != OptimizerConfig::NAG) return "";
  const double staleness = 1.0 - 1.0 / num_workers;
  if (cfg.mom() + staleness <= 1.5) return "";
  return StrCat("dist_async with ", num_workers, " workers adds momentum of about ", staleness,
                " to --mom ", cfg.mom(),
                ": if the accuracy stays at chance, lower --mom (or --lr)");
}

}  // namespace pstrain
